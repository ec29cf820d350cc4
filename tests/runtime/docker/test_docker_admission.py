"""The docker backend's cold starts go through the start gate (runtime/admission.py), as the
OCI backend's do: a burst runs ``max_concurrent_starts`` container starts (each until its
execd answers) at a time, and every slot is given back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandlot.config import Config
from sandlot.runtime.docker import DockerRuntime
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.conftest import closing
from tests.runtime.docker.helpers import dspec, wait_ready


async def test_a_burst_of_cold_creates_queues_at_the_start_gate(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    rt = await DockerRuntime.open(Config.model_validate({
        "data_dir": str(docker_data_dir), "docker": {"network_mode": "bridge"},
        "runtime": {"max_concurrent_starts": 1}}))
    try:
        assert rt.starts.slots == 1
        seen_running: list[int] = []
        seen_waiting: list[int] = []

        async def watch() -> None:
            while True:
                seen_running.append(rt.starts.running)
                seen_waiting.append(rt.starts.waiting)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        try:
            results = await asyncio.gather(*(
                rt.create(dspec(f"dk-gate-{i}", docker_base_image, entrypoint=["sleep", "600"]))
                for i in range(3)))
        finally:
            watcher.cancel()
        # Each create held its slot until its execd answered, so it reports execd ready.
        assert [r.execd_ready for r in results] == [True, True, True]
        assert max(seen_running) == 1  # never two starts at once
        assert rt.starts.running == 0 and rt.starts.waiting == 0  # every slot given back
        for i in range(3):
            await wait_ready(rt, f"dk-gate-{i}")
    finally:
        await closing(rt, private_dockerd)
