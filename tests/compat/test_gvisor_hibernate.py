"""Hibernation on gVisor, end to end through the released SDK and a real server.

A sandbox (``extensions["sandlot.pause.mode"] = "hibernate"``) runs a Python process that
holds 200 MiB of data and a TCP listener. Pausing it checkpoints it to disk: its host memory
is released. The server is killed with SIGKILL and started again; the sandbox is still
Paused ("Hibernated"), and resuming it brings back the same process, with its data, whose
listener answers.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.models.filesystem import WriteEntry

from sandlot.runtime.oci import OciRuntime, cgroups
from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, _in_thread, needs_backend

MIB = 1 << 20
HOLDER = """
import os, socket
data = bytearray(200 * 1024 * 1024)
for i in range(0, len(data), 4096):
    data[i] = (i // 4096) % 251
check = sum(data[::4096])
log = open("/tmp/holder.log", "w")  # an open file, written again after the restore
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 9000))
srv.listen()
open("/tmp/holder.ready", "w").write(f"{os.getpid()} {check}")
while True:  # blocking accept: this gVisor build cannot save epoll-watched TCP sockets
    conn, _ = srv.accept()
    log.write("served\\n"); log.flush()
    conn.sendall(f"{os.getpid()} {sum(data[::4096])}".encode())
    conn.close()
"""
ASK = ("python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', 9000)); "
       "print(s.recv(100).decode())\"")


def container_memory(server: SandlotServer, sandbox_id: str) -> int:
    """Host memory charged to the sandbox's container (0 when it has no cgroup any more)."""

    async def cid() -> str:
        rt = await OciRuntime.open(server.runtime_config())
        try:
            return rt.container_id(sandbox_id)
        finally:
            await rt.close()

    d = cgroups.controller_dir(_in_thread(cid()), "memory")
    if d is None:
        return 0
    return int((d / "memory.usage_in_bytes").read_text())


async def stdout_of(sandbox: Sandbox, command: str) -> str:
    run = await sandbox.commands.run(command)
    assert run.exit_code == 0, run
    return "\n".join(m.text.rstrip("\n") for m in run.logs.stdout).strip()


@pytest.fixture
def gvisor_server(compat_image_root: Path) -> SandlotServer:
    needs_backend("runsc")
    if not Path("/sys/fs/cgroup/memory").is_dir():
        pytest.skip("measures host memory through the cgroup v1 memory controller")
    server = SandlotServer(compat_image_root, backend="runsc")
    server.start()
    try:
        yield server  # type: ignore[misc]
    finally:
        server.destroy()


async def test_hibernate_survives_server_kill9(gvisor_server: SandlotServer) -> None:
    server = gvisor_server
    sandbox = await Sandbox.create(
        COMPAT_IMAGE, connection_config=server.sdk_config(timeout=120),
        resource={"cpu": "1", "memory": "1Gi"}, timeout=timedelta(minutes=20),
        ready_timeout=timedelta(seconds=120),
        extensions={"sandlot.pause.mode": "hibernate"},
    )
    sid = sandbox.id
    try:
        await sandbox.files.write_files([WriteEntry(path="/tmp/holder.py", data=HOLDER)])
        await sandbox.commands.run("nohup python3 /tmp/holder.py >/tmp/holder.out 2>&1 &")
        for _ in range(300):
            ready = await stdout_of(sandbox, "cat /tmp/holder.ready 2>/dev/null || true")
            if ready:
                break
            await asyncio.sleep(0.2)
        pid, check = ready.split()
        before = container_memory(server, sid)
        assert before > 200 * MIB, before

        manager = await SandboxManager.create(connection_config=server.sdk_config())
        try:
            await manager.pause_sandbox(sid)
            info = await manager.get_sandbox_info(sid)
        finally:
            await manager.close()
        assert info.status.state == "Paused"
        assert info.status.reason == "Hibernated", info.status
        # The pause answers once the image is complete; the sentry it saved exits (and its
        # memory is freed) behind the answer, 1-2 s later on a loaded host.
        paused_at = time.monotonic()
        after = container_memory(server, sid)
        while after >= 32 * MIB and time.monotonic() - paused_at < 30:
            await asyncio.sleep(0.2)
            after = container_memory(server, sid)
        print(f"\nFIGURE host_memory_before={before / MIB:.1f}MiB after={after / MIB:.1f}MiB "
              f"freed_within={time.monotonic() - paused_at:.1f}s")
        assert after < 32 * MIB, after  # the 200 MiB left the host's memory

        server.kill9()
        server.start()
        manager = await SandboxManager.create(connection_config=server.sdk_config())
        try:
            info = await manager.get_sandbox_info(sid)
            assert info.status.state == "Paused" and info.status.reason == "Hibernated"
        finally:
            await manager.close()

        resumed = await Sandbox.resume(sid, connection_config=server.sdk_config(timeout=120),
                                       resume_timeout=timedelta(seconds=120))
        try:
            assert (await resumed.get_info()).status.state == "Running"
            assert await stdout_of(resumed, ASK) == f"{pid} {check}"  # same process, same data
            assert await stdout_of(resumed, "cat /tmp/holder.log") == "served"
        finally:
            await resumed.close()
    finally:
        await sandbox.kill()
        await sandbox.close()
