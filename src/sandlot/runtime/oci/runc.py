"""A thin asyncio driver for an OCI runtime binary (runc, crun, runsc share this CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandlot.errors import RuntimeFailure
from sandlot.runtime.hosttools import run_tool


class RuncError(RuntimeFailure):
    pass


class Runc:
    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.root = root  # runc's state directory (--root): kept in the data dir

    async def _run(self, *args: str, check: bool = True, log: Path | None = None) -> str:
        pre = ["--root", str(self.root)]
        if log is not None:
            pre += ["--log", str(log), "--log-format", "json"]
        res = await run_tool([self.binary, *pre, *args])
        if check and not res.ok:
            msg = res.stderr.decode(errors="replace").strip()
            raise RuncError(f"{self.binary} {args[0]} failed: {msg}")
        return res.stdout.decode()

    async def run_detached(self, container_id: str, bundle: Path, stdio: Path, log: Path) -> None:
        """``run --detach``: create and start in one call.

        The container's stdio are files, never pipes to us, so it outlives the server and
        runc returns as soon as the init process runs.
        """
        with open(stdio, "ab") as out:
            res = await run_tool(
                [self.binary, "--root", str(self.root), "--log", str(log), "--log-format", "json",
                 "run", "--detach", "--bundle", str(bundle), container_id],
                output=out,
            )
        if not res.ok:
            raise RuncError(f"{self.binary} run failed: {last_error(log) or stdio_tail(stdio)}")

    async def state(self, container_id: str) -> dict[str, Any] | None:
        if not (self.root / container_id).is_dir():
            return None
        res = await run_tool([self.binary, "--root", str(self.root), "state", container_id])
        if not res.ok:
            return None
        result: dict[str, Any] = json.loads(res.stdout)
        return result

    async def pause(self, container_id: str) -> None:
        await self._run("pause", container_id)

    async def resume(self, container_id: str) -> None:
        await self._run("resume", container_id)

    async def delete_force(self, container_id: str) -> None:
        """Kill every process of the container and remove its cgroups and state."""
        if (self.root / container_id).is_dir():
            await self._run("delete", "--force", container_id, check=False)

    def ids(self) -> set[str]:
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
