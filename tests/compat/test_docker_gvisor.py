"""gVisor under Docker: ``[secure_runtime] type = "gvisor"`` with ``docker_runtime`` naming a
runsc runtime registered in the engine (the test dockerd registers ``sandlot-runsc``).

The released SDK's lifecycle and commands run unchanged; inside, the kernel is gVisor's; an
engine without the named runtime refuses the start (no silent runc).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import Sandbox

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, _new_server
from tests.docker_engine import GVISOR_RUNTIME

pytestmark = pytest.mark.timeout(1200)


def _secure(runtime: str) -> str:
    return f'[secure_runtime]\ntype = "gvisor"\ndocker_runtime = "{runtime}"\n'


@pytest.fixture(scope="module")
def gvisor_docker_server(request: pytest.FixtureRequest,
                         compat_image_root: Path) -> Iterator[SandlotServer]:
    if shutil.which("runsc") is None:
        pytest.skip("gVisor's runsc is not installed (scripts/install-deps.sh installs it)")
    server = _new_server(request, compat_image_root, "docker")
    with server.config.open("a") as fh:
        fh.write(_secure(GVISOR_RUNTIME))
    server.start()
    try:
        yield server
    finally:
        server.destroy()


async def test_sandbox_runs_under_gvisor_in_docker(gvisor_docker_server: SandlotServer) -> None:
    server = gvisor_docker_server
    sandbox = await Sandbox.create(COMPAT_IMAGE, connection_config=server.sdk_config(),
                                   timeout=timedelta(minutes=10),
                                   ready_timeout=timedelta(seconds=120))
    try:
        run = await sandbox.commands.run("uname -r; dmesg | head -n 3; echo hi > /tmp/f; "
                                         "cat /tmp/f")
        out = "".join(m.text for m in run.logs.stdout)
        assert "gVisor" in out, out  # gVisor's own boot log, not the host kernel's
        assert out.strip().endswith("hi")
        host_kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout
        assert host_kernel.strip() not in out.splitlines()[0]
        await sandbox.files.write_file("/workspace/x.txt", "via files")
        assert await sandbox.files.read_file("/workspace/x.txt") == "via files"
        await sandbox.pause()
        assert (await sandbox.get_info()).status.state == "Paused"
        resumed = await Sandbox.resume(sandbox.id, connection_config=server.sdk_config(),
                                       resume_timeout=timedelta(seconds=60))
        try:
            run = await resumed.commands.run("cat /workspace/x.txt")
            assert "".join(m.text for m in run.logs.stdout).strip() == "via files"
        finally:
            await resumed.close()
    finally:
        await sandbox.kill()
        await sandbox.close()
    with server.client() as c:
        assert c.get(f"/v1/sandboxes/{sandbox.id}").status_code == 404
    assert "docker/" + GVISOR_RUNTIME in server.log_tail(20000)


def test_missing_engine_runtime_refuses_the_start(request: pytest.FixtureRequest,
                                                  compat_image_root: Path) -> None:
    server = _new_server(request, compat_image_root, "docker")
    with server.config.open("a") as fh:
        fh.write(_secure("no-such-runtime"))
    try:
        with pytest.raises(RuntimeError, match="sandlot serve exited"):
            server.start(timeout=120)
        server.stop()  # collect the exited process
        assert "docker_runtime = 'no-such-runtime'" in server.log_tail(20000)
        assert "no such runtime" in server.log_tail(20000)
    finally:
        server.destroy()
