"""The benchmarks, in the order ``python -m bench`` runs them (density, the heaviest, then
observability, which skips itself when the budget is short)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bench.benchmarks import (
    code,
    commands,
    console,
    create,
    density,
    docker_backend,
    execd_launch,
    files,
    gvisor,
    jupyter,
    kubernetes,
    network,
    observability,
    proxy,
    restart,
    state,
    volumes,
)
from bench.env import BenchEnv
from bench.results import Row

Benchmark = Callable[[BenchEnv], Awaitable[list[Row]]]

BENCHMARKS: dict[str, Benchmark] = {
    "create": create.run,
    "execd_launch": execd_launch.run,
    "commands": commands.run,
    "files": files.run,
    "code": code.run,
    "jupyter": jupyter.run,
    "proxy": proxy.run,
    "network": network.run,
    "docker": docker_backend.run,
    "volumes": volumes.run,
    "state": state.run,
    "restart": restart.run,
    "gvisor": gvisor.run,
    "kubernetes": kubernetes.run,
    "density": density.run,
    "observability": observability.run,  # it skips itself when the budget is short
    # After the rest: 100 sandboxes and a browser take minutes; when the budget is spent the
    # runner reports it as not run (`python -m bench console` runs it alone).
    "console": console.run,
}

# Images a benchmark measures besides ``base`` (always built): a full run builds the missing
# ones first, so that a first run on a fresh machine skips no row.
IMAGES: dict[str, tuple[str, ...]] = {
    "code": (code.IMAGE,),
    "jupyter": (jupyter.IMAGE,),
}

# Row keys (prefixes) each benchmark always reports, measured or marked skipped.
EXPECTED_KEYS: dict[str, tuple[str, ...]] = {
    "create": create.KEYS,
    "execd_launch": execd_launch.KEYS,
    "commands": commands.KEYS,
    "files": files.KEYS,
    "code": code.KEYS,
    "jupyter": jupyter.KEYS,
    "proxy": proxy.KEYS,
    "network": network.KEYS,
    "docker": docker_backend.KEYS,
    "volumes": volumes.KEYS,
    "state": state.KEYS,
    "restart": restart.KEYS,
    "gvisor": gvisor.KEYS,
    "console": console.KEYS,
    "kubernetes": kubernetes.KEYS,
    "density": density.KEYS,
    "observability": observability.KEYS,
}
