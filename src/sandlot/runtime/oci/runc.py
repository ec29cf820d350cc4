"""A thin asyncio driver for an OCI runtime binary (runc, crun, runsc share this CLI)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandlot.errors import RuntimeFailure
from sandlot.runtime.hosttools import run_tool
from sandlot.runtime.oci import runsc


class RuncError(RuntimeFailure):
    pass


# A failed ``state`` query of a container that still has state: asked this many times,
# this many seconds apart, before the failure is raised.
STATE_TRIES = 3
STATE_RETRY_PAUSE = 0.2


class Runc:
    def __init__(
        self, binary: str, root: Path, *, gvisor: bool = False,
        global_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.root = root  # the runtime's state directory (--root): kept in the data dir
        self.gvisor = gvisor
        self.global_args = list(global_args)  # e.g. runsc's --platform/--network

    def _pre(self, log: Path | None = None) -> list[str]:
        pre = [self.binary, "--root", str(self.root), *self.global_args]
        if log is not None:
            pre += ["--log", str(log), "--log-format", "json"]
        return pre

    async def _run(self, *args: str, check: bool = True, log: Path | None = None) -> str:
        res = await run_tool([*self._pre(log), *args])
        if check and not res.ok:
            msg = res.stderr.decode(errors="replace").strip() or (
                last_error(log) if log is not None else "")
            raise RuncError(f"{self.binary} {args[0]} failed: {msg}")
        return res.stdout.decode()

    def _starter(self, argv: list[str]) -> list[str]:
        return runsc.with_netns_check_hidden(argv) if self.gvisor else argv

    async def run_detached(
        self, container_id: str, bundle: Path, stdio: Path, log: Path, secret: bytes = b""
    ) -> None:
        """``run --detach``: create and start in one call.

        The container's stdout/stderr are files, never pipes to us, so it outlives the
        server and runc returns as soon as the init process runs. Its stdin is a pipe that
        holds ``secret`` and then ends: the way a secret reaches the init process without
        being in its environment or arguments (both readable in /proc).
        """
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, secret)  # a pipe holds 64 KiB: far more than a token
            os.close(write_end)
            write_end = -1
            with open(stdio, "ab") as out:
                res = await run_tool(
                    self._starter([*self._pre(log), "run", "--detach", "--bundle", str(bundle),
                                   container_id]),
                    output=out, stdin=read_end,
                )
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        if not res.ok:
            raise RuncError(f"{self.binary} run failed: {last_error(log) or stdio_tail(stdio)}")

    async def checkpoint(
        self, container_id: str, image_dir: Path, log: Path, flags: Sequence[str] = ()
    ) -> None:
        """runsc: save the container's processes and memory to ``image_dir``; it stops."""
        await self._run("checkpoint", *flags, "--image-path", str(image_dir), container_id,
                        log=log)

    async def restore(
        self, container_id: str, bundle: Path, image_dir: Path, stdio: Path, log: Path,
        flags: Sequence[str] = (),
    ) -> None:
        """runsc: start ``container_id`` again from a checkpoint, detached like ``run``."""
        with open(stdio, "ab") as out:
            res = await run_tool(
                self._starter([*self._pre(log), "restore", "--detach", *flags, "--image-path",
                               str(image_dir), "--bundle", str(bundle), container_id]),
                output=out,
            )
        if not res.ok:
            raise RuncError(
                f"{self.binary} restore failed: {last_error(log) or stdio_tail(stdio)}")

    async def kill(self, container_id: str, signal: str) -> None:
        await self._run("kill", container_id, signal)

    def has_state(self, container_id: str) -> bool:
        if self.gvisor:
            return any(p.name.endswith(".state") for p in runsc.state_files(self.root,
                                                                            container_id))
        return (self.root / container_id).is_dir()

    def remove_state(self, container_id: str) -> None:
        """Drop state the binary could not delete itself (e.g. its init already gone)."""
        if self.gvisor:
            for p in runsc.state_files(self.root, container_id):
                p.unlink(missing_ok=True)
        elif (self.root / container_id).exists():
            shutil.rmtree(self.root / container_id, ignore_errors=True)

    async def state(self, container_id: str) -> dict[str, Any] | None:
        """The binary's state of ``container_id``; None when it has no state (gone).

        A failed query of a container whose state is still there is asked again, then
        raised: reporting it gone would fail a live sandbox (seen once with runsc on a
        loaded host after a server restart).
        """
        for attempt in range(STATE_TRIES):
            if not self.has_state(container_id):
                return None
            res = await run_tool([*self._pre(), "state", container_id])
            if res.ok:
                result: dict[str, Any] = json.loads(res.stdout)
                return result
            if attempt + 1 < STATE_TRIES:
                await asyncio.sleep(STATE_RETRY_PAUSE)
        if not self.has_state(container_id):
            return None
        raise RuncError(f"{self.binary} state {container_id} failed: "
                        f"{res.stderr.decode(errors='replace').strip()}")

    async def pause(self, container_id: str) -> None:
        await self._run("pause", container_id)

    async def resume(self, container_id: str) -> None:
        await self._run("resume", container_id)

    async def delete_force(self, container_id: str) -> None:
        """Kill every process of the container and remove its cgroups and state."""
        if self.has_state(container_id):
            await self._run("delete", "--force", container_id, check=False)

    def ids(self) -> set[str]:
        if self.gvisor:
            return runsc.container_ids(self.root)
        if not self.root.is_dir():
            return set()
        return {p.name for p in self.root.iterdir() if (p / "state.json").exists()}


def last_error(log: Path) -> str:
    """The last error runc wrote to its JSON log."""
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg", ""))
    return ""


def stdio_tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_bytes()[-limit:].decode(errors="replace").strip()
    except OSError:
        return ""
