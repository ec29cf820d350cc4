"""Hibernation under gVisor: a paused sandbox's processes and memory go to disk and back.

``hibernate`` asks execd to let go of what runsc cannot save (its listeners and the
connections on them; SIGUSR2 through ``runsc kill``) and waits for execd's answer, a line
``sandlot-hibernation: ok`` (or the reason it cannot) on execd's stderr, which is the
container log on the host. It then ``runsc checkpoint``s the container into ``<sandbox
dir>/hibernate/`` (the sentry exits: its memory is freed) and, after answering, deletes
runsc's state of it.
``restore`` starts it again from that image with ``runsc restore`` (processes, memory, open
files and sockets as they were), tells execd to listen again (SIGUSR1) and waits for
``/ping``. The image on disk is all that is needed, so a hibernated sandbox survives a
restart (or ``kill -9``) of the server.

The image is written with the fastest options the installed runsc has (``runsc.SaveOptions``:
uncompressed and ``O_DIRECT`` on gVisor 2024, compressed on Debian bookworm's 2022 build), and
names the runsc that wrote it (``runsc-version``): gVisor reads images of its own build only,
so after a runsc upgrade a resume is refused with that reason instead of runsc's panic.

Limits of Debian's 2022 runsc build (the 2024 one still refuses the first): it cannot save
TCP sockets in
TIME_WAIT and similar states, nor TCP sockets a process watches with epoll; execd checks
for both before the checkpoint and refuses with the reason (the sandbox keeps running),
because a failed ``runsc checkpoint`` ends the sandbox. A process in the sandbox could
write a false answer to execd's stderr: that only makes its own sandbox's checkpoint fail.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path

from sandlot.errors import Conflict, RuntimeFailure
from sandlot.runtime import execd_client
from sandlot.runtime.oci import runsc
from sandlot.runtime.oci.layout import SandboxPaths
from sandlot.runtime.oci.runc import Runc

QUIESCE_SIGNAL = "USR2"  # execd: close listeners and connections, answer on stderr
RELISTEN_SIGNAL = "USR1"  # execd: listen again (after a restore, or after a refusal)
ANSWER_PREFIX = "sandlot-hibernation: "  # execd/hibernation.py writes it
QUIESCE_TIMEOUT = 10.0
READY_TIMEOUT = 60.0
IMAGE_FILE = "checkpoint.img"
VERSION_FILE = "runsc-version"
SENTRY_PID_FILE = "sentry-pid"  # the checkpointed sandbox's pid: runsc calls it running a while
REASON = "hibernated"

log = logging.getLogger(__name__)
# Deferred ``runsc delete`` of just-checkpointed containers, by container id.
_deleting: dict[str, asyncio.Task[None]] = {}


def image_dir(p: SandboxPaths) -> Path:
    return p.root / "hibernate"


def is_hibernated(p: SandboxPaths) -> bool:
    return (image_dir(p) / IMAGE_FILE).exists() and not (image_dir(p) / ".partial").exists()


def is_hibernated_state(p: SandboxPaths, status_stopped: bool, pid: int | None) -> bool:
    """Whether a container runsc reports so (stopped or gone, or running as ``pid``) is in
    fact hibernated. gVisor 2024's ``runsc checkpoint`` returns while the sentry it saved is
    still exiting (1-2 s on a loaded host): runsc reports it running until then, with the pid
    the checkpoint recorded; a restored one runs with another pid."""
    if not is_hibernated(p):
        return False
    if status_stopped:
        return True
    try:
        return pid is not None and int((image_dir(p) / SENTRY_PID_FILE).read_text()) == pid
    except (OSError, ValueError):
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def _wait_answer(log_file: Path, offset: int, timeout: float) -> str:
    """execd's answer: the first answer line written to ``log_file`` after ``offset``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with open(log_file, "rb") as fh:
            fh.seek(offset)
            for raw in fh.read().decode(errors="replace").splitlines():
                if raw.startswith(ANSWER_PREFIX):
                    return raw[len(ANSWER_PREFIX):].strip()
        if loop.time() > deadline:
            raise RuntimeFailure(f"execd did not prepare for hibernation within {timeout:.0f}s")
        await asyncio.sleep(0.01)


async def hibernate(runc: Runc, container_id: str, p: SandboxPaths, pid: int | None) -> None:
    """Checkpoint a running container (its sandbox process ``pid``) to disk and stop it (see
    module docstring)."""
    t0 = time.perf_counter()
    offset = _size(p.container_log)
    await runc.kill(container_id, QUIESCE_SIGNAL)
    t_kill = time.perf_counter()
    answer = await _wait_answer(p.container_log, offset, QUIESCE_TIMEOUT)
    t_quiet = time.perf_counter()
    if answer != "ok":
        await runc.kill(container_id, RELISTEN_SIGNAL)
        raise Conflict(f"sandbox cannot hibernate: {answer}", code="SANDBOX_STATE_CONFLICT")
    images = image_dir(p)
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(mode=0o700)
    (images / ".partial").touch()
    options = await runsc.save_options(runc.binary, images)
    (images / VERSION_FILE).write_text(options.version + "\n")
    (images / SENTRY_PID_FILE).write_text(f"{pid or ''}\n")
    try:
        await runc.checkpoint(container_id, images, p.runc_log, options.checkpoint)
    except RuntimeFailure as exc:
        shutil.rmtree(images, ignore_errors=True)
        raise RuntimeFailure(f"runsc checkpoint failed, the sandbox's processes are lost: "
                             f"{exc.message}") from exc
    t_saved = time.perf_counter()
    (images / ".partial").unlink()
    # The stopped container's state goes behind the answer: ``runsc delete`` waits for the
    # sentry to exit (1-2 s of a loaded host), and the image is complete already. A restore
    # (or the sandbox's deletion) waits for it first (``settle``).
    _deleting[container_id] = asyncio.create_task(_delete_state(runc, container_id))
    log.info("hibernated %s: signal %.0f ms, execd quiet %.0f ms, checkpoint %.0f ms (%s)",
             container_id, (t_kill - t0) * 1e3, (t_quiet - t_kill) * 1e3,
             (t_saved - t_quiet) * 1e3, " ".join(options.checkpoint) or "compressed")


async def _delete_state(runc: Runc, container_id: str) -> None:
    t0 = time.perf_counter()
    try:
        await runc.delete_force(container_id)  # the image stays
    except Exception:  # noqa: BLE001 - a restore removes what is left (remove_state)
        log.exception("deleting the checkpointed container %s failed", container_id)
    log.info("hibernated %s: runsc delete %.0f ms (after the answer)", container_id,
             (time.perf_counter() - t0) * 1e3)


def settling(container_id: str) -> bool:
    """Whether the deferred ``runsc delete`` of a just-hibernated container still runs (it
    holds the container's lock: a ``runsc state`` then waits for it, 1-2 s)."""
    task = _deleting.get(container_id)
    return task is not None and not task.done()


async def settle(container_id: str) -> None:
    """Wait for the deferred ``runsc delete`` of a just-hibernated container, if any."""
    task = _deleting.pop(container_id, None)
    if task is not None:
        await asyncio.shield(task)


def _check_written_by(images: Path, version: str) -> None:
    """``Conflict`` when another runsc build wrote the image (images of sandlot before this
    check name none and are tried)."""
    try:
        wrote = (images / VERSION_FILE).read_text().strip()
    except FileNotFoundError:
        return
    if wrote != version:
        raise Conflict(
            f"sandbox cannot resume: it was hibernated by {wrote!r} and this host now runs "
            f"{version!r}, which cannot read that image (gVisor images are specific to the "
            "runsc build); its processes are lost, delete the sandbox",
            code="SANDBOX_STATE_CONFLICT")


async def restore(
    runc: Runc, container_id: str, p: SandboxPaths, connect: execd_client.Connect
) -> None:
    """Start a hibernated container again from its image and wait for execd."""
    images = image_dir(p)
    t0 = time.perf_counter()
    options = await runsc.save_options(runc.binary, images)
    _check_written_by(images, options.version)
    await settle(container_id)
    # After a server restart nobody deferred the delete: the checkpointed sentry may still
    # be exiting (or its stopped state be left); it goes before the restore takes the id.
    await runc.delete_force(container_id)
    runc.remove_state(container_id)
    t_settled = time.perf_counter()
    await runc.restore(container_id, p.bundle, images, p.container_log, p.runc_log,
                       options.restore)
    t_restored = time.perf_counter()
    await runc.kill(container_id, RELISTEN_SIGNAL)
    t_kill = time.perf_counter()
    await execd_client.wait_ready(connect, None, READY_TIMEOUT)
    t_ping = time.perf_counter()
    shutil.rmtree(images, ignore_errors=True)
    log.info("restored %s: waited for delete %.0f ms, restore %.0f ms, signal %.0f ms, "
             "execd answers %.0f ms", container_id, (t_settled - t0) * 1e3,
             (t_restored - t_settled) * 1e3, (t_kill - t_restored) * 1e3,
             (t_ping - t_kill) * 1e3)
