"""OCI snapshots with real runc: a running sandbox's changes (new files, deletions, a
replaced directory) become a layer that new sandboxes start from; the source keeps running;
a snapshot in use (by a sandbox or a later snapshot) cannot be deleted."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sandlot.errors import Conflict, NotFound
from sandlot.images.model import Image
from sandlot.runtime.base import ContainerState
from sandlot.runtime.oci import OciRuntime
from tests.runtime.helpers import leftovers, runc_exec, spec, wait_ping


def sh(rt: OciRuntime, sid: str, script: str) -> str:
    r = runc_exec(rt, sid, script)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


async def test_snapshot_layers_fork_and_chain(oci_runtime: OciRuntime, rt_image: Image) -> None:
    rt = oci_runtime
    await rt.create(spec("snsrc", rt_image))
    await wait_ping(rt, "snsrc")
    sh(rt, "snsrc", "echo one > /workspace/a && rm -rf /usr/share/doc && mkdir /usr/share/doc"
                    " && echo new > /usr/share/doc/only && rm /etc/debian_version")
    await rt.snapshot("snsrc", "snap-a")
    assert (await rt.inspect("snsrc")).state == ContainerState.RUNNING  # thawed
    sh(rt, "snsrc", "echo after > /workspace/later")  # not in the snapshot

    await rt.create(spec("snfork", rt_image, snapshot_id="snap-a"))
    await wait_ping(rt, "snfork")
    out = sh(rt, "snfork", "cat /workspace/a; ls /usr/share/doc; "
                           "test -e /etc/debian_version && echo has-version || echo no-version; "
                           "test -e /workspace/later && echo later || echo no-later")
    assert out.split() == ["one", "only", "no-version", "no-later"]

    # A snapshot of the fork stands on snap-a's layer (shared, not copied).
    sh(rt, "snfork", "echo two > /workspace/b")
    await rt.snapshot("snfork", "snap-b")
    chained = rt.snapshots.image("snap-b")
    assert chained.lower_dirs[1] == rt.snapshots.image("snap-a").lower_dirs[0]

    with pytest.raises(Conflict):  # the fork runs on it
        await rt.delete_snapshot("snap-a")
    await rt.delete("snfork")
    with pytest.raises(Conflict):  # snap-b stands on it
        await rt.delete_snapshot("snap-a")
    await rt.delete_snapshot("snap-b")
    await rt.delete_snapshot("snap-a")
    assert not (rt.data_dir / "snapshots" / "snap-a").exists()
    await rt.delete_snapshot("snap-a")  # idempotent
    with pytest.raises(NotFound):
        await rt.create(spec("snlate", rt_image, snapshot_id="snap-a"))
    assert leftovers(rt, "snlate") == []

    await rt.delete("snsrc")
    assert leftovers(rt, "snsrc") == [] and leftovers(rt, "snfork") == []


async def test_snapshot_of_missing_sandbox(oci_runtime: OciRuntime) -> None:
    with pytest.raises(NotFound):
        await oci_runtime.snapshot("no-such-sandbox", "snap-x")
    assert not (oci_runtime.data_dir / "snapshots" / "snap-x").exists()


async def test_pause_during_capture_is_kept(oci_runtime: OciRuntime, rt_image: Image,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A pause that comes while a snapshot is being copied leaves the sandbox paused (the
    capture's thaw used to undo it), and the snapshot is still complete."""
    rt = oci_runtime
    await rt.create(spec("snpause", rt_image))
    await wait_ping(rt, "snpause")
    sh(rt, "snpause", "echo kept > /workspace/k")
    copying, release = threading.Event(), threading.Event()
    real_commit = rt.snapshots.commit

    def held_commit(*args: object) -> None:  # the real copy, held open until the pause came
        copying.set()
        assert release.wait(30)
        real_commit(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(rt.snapshots, "commit", held_commit)
    capture = asyncio.create_task(rt.snapshot("snpause", "snap-p"))
    while not copying.is_set():
        await asyncio.sleep(0.01)
    assert (await rt.inspect("snpause")).state == ContainerState.PAUSED  # the capture's freeze
    pause = asyncio.create_task(rt.pause("snpause"))
    await asyncio.sleep(0.3)  # the pause is in, waiting for the capture
    release.set()
    await capture
    await pause
    assert (await rt.inspect("snpause")).state == ContainerState.PAUSED
    await rt.resume("snpause")
    assert (await rt.inspect("snpause")).state == ContainerState.RUNNING
    assert (rt.snapshots.image("snap-p").lower_dirs[0] / "workspace" / "k").read_text() == "kept\n"
    await rt.delete("snpause")
    await rt.delete_snapshot("snap-p")
    assert leftovers(rt, "snpause") == []
