"""Snapshots through the released SDK: fork a sandbox's work three times, keep it across a
server restart, refuse to delete it while a sandbox stands on it (docs/snapshots.md)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import docker
import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxException
from opensandbox.models.sandboxes import SnapshotFilter

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer

pytestmark = pytest.mark.backends("oci", "docker", "runsc")

# "pip-style" work: files written and a package tree unpacked (with a deletion, which the
# snapshot must keep as an overlay whiteout).
SETUP = (
    "mkdir -p /opt/pkg/lib/demo && cd /opt/pkg && "
    "for i in 1 2 3 4 5; do echo mod$i > lib/demo/m$i.py; done && "
    "tar czf /tmp/demo.tgz -C /opt/pkg lib && mkdir -p /opt/site && "
    "tar xzf /tmp/demo.tgz -C /opt/site && echo hello > /workspace/notes.txt && "
    "rm -f /etc/motd && rm /tmp/demo.tgz"
)


async def _run(sb: Sandbox, cmd: str) -> str:
    ex = await sb.commands.run(cmd)
    assert ex.error is None, f"{cmd}: {ex.error}"
    return "".join(m.text for m in ex.logs.stdout).strip()


async def _wait_ready(manager: SandboxManager, snapshot_id: str) -> str:
    for _ in range(600):
        state = (await manager.get_snapshot(snapshot_id)).status.state
        if state != "Creating":
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"snapshot {snapshot_id} stayed Creating")


async def _sandbox(server: SandlotServer, **kw: object) -> Sandbox:
    return await Sandbox.create(connection_config=server.sdk_config(),  # type: ignore[arg-type]
                                timeout=timedelta(minutes=10),
                                ready_timeout=timedelta(seconds=90), **kw)


async def test_snapshot_fork_restart_and_delete(fresh_server: SandlotServer) -> None:
    server = fresh_server
    manager = await SandboxManager.create(connection_config=server.sdk_config())
    source = await _sandbox(server, image=COMPAT_IMAGE)
    await _run(source, SETUP)
    base_has_motd = await _run(await _sandbox(server, image=COMPAT_IMAGE),
                               "test -e /etc/motd && echo yes || echo no")

    snap = await source.create_snapshot(name="after-setup")
    assert snap.sandbox_id == source.id and snap.name == "after-setup"
    assert snap.status.state in ("Creating", "Ready")
    assert await _wait_ready(manager, snap.id) == "Ready"
    assert await source.is_healthy()  # the source kept running
    if server.docker is not None:  # execd's private variables are not part of the commit
        client = docker.DockerClient(base_url=server.docker.host)
        try:
            env = client.images.get(f"sandlot-snapshots:{snap.id}").attrs["Config"]["Env"]
        finally:
            client.close()
        assert not [e for e in env if e.startswith("SANDLOT_") and not e.endswith("=")], env
    assert await _run(source, "cat /workspace/notes.txt") == "hello"

    listed = await manager.list_snapshots(SnapshotFilter(sandbox_id=source.id))
    assert [s.id for s in listed.snapshot_infos] == [snap.id]
    named = await manager.list_snapshots(SnapshotFilter(name="nothing-by-this-name"))
    assert named.snapshot_infos == []

    forks = [await _sandbox(server, snapshot_id=snap.id) for _ in range(3)]
    for i, fork in enumerate(forks):
        assert await _run(fork, "cat /workspace/notes.txt") == "hello"
        assert await _run(fork, "cat /opt/site/lib/demo/m3.py") == "mod3"
        assert await _run(fork, "test -e /tmp/demo.tgz && echo yes || echo no") == "no"
        if base_has_motd == "yes":
            assert await _run(fork, "test -e /etc/motd && echo yes || echo no") == "no"
        await _run(fork, f"echo fork{i} > /workspace/mine.txt")
    for i, fork in enumerate(forks):  # each fork's change is its own
        assert await _run(fork, "cat /workspace/mine.txt") == f"fork{i}"
    assert await _run(source, "test -e /workspace/mine.txt && echo yes || echo no") == "no"

    # In use by the forks: deleting it is refused (409), and it stays Ready.
    with pytest.raises(SandboxException) as refused:
        await manager.delete_snapshot(snap.id)
    assert "409" in str(refused.value) or "in use" in str(refused.value)
    assert (await manager.get_snapshot(snap.id)).status.state == "Ready"

    server.stop()
    server.start()
    manager = await SandboxManager.create(connection_config=server.sdk_config())
    assert (await manager.get_snapshot(snap.id)).status.state == "Ready"
    after = await _sandbox(server, snapshot_id=snap.id)
    assert await _run(after, "cat /opt/site/lib/demo/m1.py") == "mod1"

    for sb in (*forks, after):
        await manager.kill_sandbox(sb.id)
    await manager.delete_snapshot(snap.id)
    with pytest.raises(SandboxException):
        await manager.get_snapshot(snap.id)
    assert not (server.data_dir / "snapshots" / snap.id).exists()
    if server.docker is not None:  # the commit's image went with it
        client = docker.DockerClient(base_url=server.docker.host)
        try:
            assert not client.images.list(name=f"sandlot-snapshots:{snap.id}")
        finally:
            client.close()
    with pytest.raises(SandboxException):
        await _sandbox(server, snapshot_id=snap.id)
