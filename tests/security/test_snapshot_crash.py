"""A server killed during a snapshot's copy (issue 11, chaos): the next start leaves no frozen
sandbox and no half-made layer behind (the suite in test_reliability.py hits these points at
random; this one makes them happen every time)."""

from __future__ import annotations

from pathlib import Path

from sandlot.images.model import Image
from sandlot.runtime.base import ContainerState
from sandlot.runtime.oci import OciRuntime
from sandlot.server.models import utcnow
from sandlot.server.snapshot_models import SnapshotRecord, SnapshotState
from sandlot.server.snapshots import SnapshotService
from tests.runtime.helpers import leftovers, open_runtime, spec, wait_ping


async def test_a_start_thaws_a_sandbox_frozen_by_an_interrupted_snapshot(
    oci_runtime: OciRuntime, rt_image: Image, runtime_data_dir: Path
) -> None:
    rt = oci_runtime
    await rt.create(spec("snapcrash", rt_image))
    await wait_ping(rt, "snapcrash")
    # What a server killed in the middle of ``snapshot`` leaves: the container frozen for the
    # copy (with the runtime's mark of it) and the copy half made.
    rt.paths("snapcrash").snapshot_freeze.touch()
    await rt.runc.pause("snapcrash")
    half = rt.snapshots.root / ".tmp-interrupted"
    (half / "layer").mkdir(parents=True)
    await rt.close()  # gives up the data dir, as a dead server does

    again = await open_runtime(runtime_data_dir)
    try:
        assert (await again.inspect("snapcrash")).state == ContainerState.RUNNING
        assert not again.paths("snapcrash").snapshot_freeze.exists()
        assert not half.exists()
        await wait_ping(again, "snapcrash")
        await again.delete("snapcrash")
        assert leftovers(again, "snapcrash") == []
    finally:
        await again.close()


async def test_a_sandbox_paused_by_its_user_stays_paused_across_a_start(
    oci_runtime: OciRuntime, rt_image: Image, runtime_data_dir: Path
) -> None:
    rt = oci_runtime
    await rt.create(spec("userpaused", rt_image))
    await wait_ping(rt, "userpaused")
    await rt.pause("userpaused")
    await rt.close()
    again = await open_runtime(runtime_data_dir)
    try:
        assert (await again.inspect("userpaused")).state == ContainerState.PAUSED
        await again.delete("userpaused")
    finally:
        await again.close()


class _Store:
    """The snapshot store as a dead server left it (one capture in progress)."""

    def __init__(self, records: list[SnapshotRecord]) -> None:
        self.records = {r.id: r for r in records}

    async def load_all(self) -> list[SnapshotRecord]:
        return list(self.records.values())

    async def save(self, rec: SnapshotRecord) -> None:
        self.records[rec.id] = rec


class _Runtime:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.deleted.append(snapshot_id)


async def test_an_interrupted_capture_fails_and_its_layer_is_removed() -> None:
    now = utcnow()
    creating = SnapshotRecord("s-creating", "sb", None, SnapshotState.CREATING, "base", [],
                              now, now)
    ready = SnapshotRecord("s-ready", "sb", None, SnapshotState.READY, "base", [], now, now)
    runtime, store = _Runtime(), _Store([creating, ready])
    await SnapshotService(runtime, store).start()  # type: ignore[arg-type]
    assert store.records["s-creating"].state == SnapshotState.FAILED
    assert store.records["s-ready"].state == SnapshotState.READY
    # the capture may have finished its copy before the server died: a Failed snapshot
    # must not keep it
    assert runtime.deleted == ["s-creating"]
