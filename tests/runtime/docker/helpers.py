"""Helpers of the docker runtime's tests: specs, readiness through connect, exec in a container."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sandlot.runtime import execd_client
from sandlot.runtime.base import ImageRef, SandboxSpec
from sandlot.runtime.docker import DockerRuntime
from sandlot.runtime.docker.container import container_name
from tests.docker_engine import PrivateDockerd

TOKEN = "test-token"


def dspec(sandbox_id: str, image: str, entrypoint: list[str] | None = None,
          **kw: object) -> SandboxSpec:
    return SandboxSpec(sandbox_id=sandbox_id, image=ImageRef(image),  # type: ignore[arg-type]
                       entrypoint=entrypoint or [], execd_token=TOKEN, **kw)


async def wait_ready(rt: DockerRuntime, sandbox_id: str, timeout: float = 60) -> None:
    """execd answers /ping through the runtime's connect (its only way in)."""
    await execd_client.wait_ready(lambda: rt.connect(sandbox_id, rt.plan.execd_port), TOKEN,
                                  timeout)


@dataclass
class ExecResult:
    exit_code: int
    output: str


def dexec(engine: PrivateDockerd, sandbox_id: str, script: str) -> ExecResult:
    """``sh -c script`` in the sandbox's container, with the container's own settings
    (namespaces, cgroups, capabilities, seccomp, no_new_privs), as ``docker exec`` does."""
    assert engine.client is not None
    container = engine.client.containers.get(container_name(sandbox_id))
    code, out = container.exec_run(["sh", "-c", script], user="0")
    return ExecResult(int(code), out.decode(errors="replace"))


async def adexec(engine: PrivateDockerd, sandbox_id: str, script: str) -> ExecResult:
    return await asyncio.to_thread(dexec, engine, sandbox_id, script)
