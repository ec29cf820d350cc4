"""Shared helpers for runtime and security tests: a real OciRuntime, leak checks, exec."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandlot.config import Config
from sandlot.errors import ImageNotFound
from sandlot.images.model import Image
from sandlot.runtime.base import ImageRef, SandboxSpec
from sandlot.runtime.oci import OciRuntime, removal
from sandlot.runtime.oci import cgroups as cg
from sandlot.runtime.oci.layout import netns_name, rootfs_folder
from sandlot.server.sandbox_transport import SandboxTransport


def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("the OCI runtime needs root and runc")


def short_tmpdir(prefix: str) -> Path:
    """A short path: unix socket paths under it must stay below 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@dataclass
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


def runc_exec(
    rt: OciRuntime, sandbox_id: str, script: str, timeout: float = 60, token: str | None = None
) -> ExecResult:
    """Run ``sh -c script`` inside the sandbox as its workload runs: started by execd (PID 1),
    so with the container's namespaces, cgroups, capabilities, seccomp and no_new_privs.

    (Not ``runc exec``: runc 1.1 joins the user namespace before the network namespace,
    which a user-namespaced sandbox's host-owned network namespace then refuses.) Callable
    from sync code and from a running test loop alike: it runs on a loop of its own.
    """
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _exec(rt, sandbox_id, script, timeout, token)).result()


async def _exec(
    rt: OciRuntime, sandbox_id: str, script: str, timeout: float, token: str | None
) -> ExecResult:
    headers = {"X-EXECD-ACCESS-TOKEN": token} if token else {}
    out: list[str] = []
    err: list[str] = []
    code = -1
    async with execd_client(rt, sandbox_id, headers=headers, timeout=timeout) as client:
        deadline = time.monotonic() + 30
        while True:  # execd may still be starting
            try:
                if (await client.get("/ping")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"execd of {sandbox_id} does not answer")
            await asyncio.sleep(0.02)
        body = {"command": f"sh -c {shlex.quote(script)}", "timeout": int(timeout * 1000)}
        async with client.stream("POST", "/command", json=body) as r:
            if r.status_code != 200:
                return ExecResult(255, "", (await r.aread()).decode(errors="replace"))
            async for line in r.aiter_lines():
                event = stream_event(line)
                if event is None:
                    continue
                kind = event.get("type")
                if kind == "stdout":
                    out.append(line_of(event))
                elif kind == "stderr":
                    err.append(line_of(event))
                elif kind == "execution_complete":
                    code = int(event.get("exit_code") or 0)
                elif kind == "error" and code == -1:
                    with contextlib.suppress(ValueError, TypeError):
                        code = int(event["error"]["evalue"])
    return ExecResult(code, "".join(out), "".join(err))


def stream_event(line: str) -> dict | None:
    """One event of an execd stream line: the reference framing (a JSON object per line) or
    standard SSE (``data: {...}``); None for blank, ``id:`` and comment lines."""
    line = line[5:].strip() if line.startswith("data:") else line.strip()
    if not line.startswith("{"):
        return None
    event = json.loads(line)
    return event if isinstance(event, dict) else None


def line_of(event: dict) -> str:
    """A stdout/stderr event's text as the line it was (events carry one line each, without
    its newline; an empty line comes as "\\n", as the reference sends it)."""
    text = str(event.get("text", ""))
    return text if text.endswith("\n") else text + "\n"


def spawn_detached(rt: OciRuntime, sandbox_id: str, script: str) -> None:
    """Start ``sh -c script`` in the sandbox in the background (like ``runc exec -d``)."""

    async def start() -> None:
        async with execd_client(rt, sandbox_id, timeout=30) as client:
            r = await client.post("/command", json={"command": f"sh -c {shlex.quote(script)}",
                                                    "background": True})
            assert r.status_code == 200, r.text

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, start()).result()


def execd_client(rt: OciRuntime, sandbox_id: str, **kw: object) -> httpx.AsyncClient:
    """An HTTP client to the sandbox's execd, connected through ``rt.connect``."""

    async def connect(port: int) -> socket.socket:
        if sandbox_id.startswith("_pool-"):  # a warm container: no sandbox id of its own yet
            return await rt._connect_container(sandbox_id, port)
        return await rt.connect(sandbox_id, port)

    return httpx.AsyncClient(transport=SandboxTransport(connect),
                             base_url=f"http://execd:{rt.execd_port}", **kw)  # type: ignore[arg-type]


async def wait_ping(rt: OciRuntime, sandbox_id: str, timeout: float = 30) -> httpx.Response:
    """Poll execd's /ping (through the runtime's connect) until it answers."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    async with execd_client(rt, sandbox_id) as client:
        while time.monotonic() < deadline:
            try:
                r = await client.get("/ping", timeout=5)
                if r.status_code == 200:
                    return r
            except httpx.TransportError as exc:
                last = exc
            await asyncio.sleep(0.02)
    log = rt.paths(sandbox_id).container_log
    tail = log.read_text()[-2000:] if log.exists() else ""
    raise AssertionError(f"execd did not answer /ping: {last!r}\ncontainer log:\n{tail}")


def leftovers(rt: OciRuntime, sandbox_id: str) -> list[str]:
    """Everything of ``sandbox_id`` still on the host (empty when deletion was complete)."""
    found = []
    root = str(rt.paths(sandbox_id).root)
    with open("/proc/self/mountinfo") as fh:
        found += [f"mount {ln.split()[4]}" for ln in fh if root in ln.split()[4]]
    found += [f"cgroup {d}" for d in cg.sandbox_cgroup_dirs(sandbox_id)]
    if Path("/run/netns", netns_name(sandbox_id)).exists():
        found.append("netns")
    if Path(root).exists():
        found.append(f"dir {root}")
    if (rt.runc.root / sandbox_id).exists():
        found.append("runc state")
    return found


class TestImages:
    """The runtime's image source in tests: images made by fixtures, by name."""

    def __init__(self) -> None:
        self.images: dict[str, Image] = {}

    def add(self, image: Image) -> ImageRef:
        self.images[image.name] = image
        return ImageRef(image.name)

    def get(self, name: str) -> Image | None:
        return self.images.get(name)

    async def pull(self, name: str, auth: object = None, progress: object = None) -> Image:
        raise ImageNotFound(f"image {name} is not in the test images")


TEST_IMAGES = TestImages()


def spec(sandbox_id: str, image: Image, **kw: object) -> SandboxSpec:
    """A spec for ``image`` (made known to runtimes opened by ``open_runtime``)."""
    ref = TEST_IMAGES.add(image)
    return SandboxSpec(sandbox_id=sandbox_id, image=ref, entrypoint=[], **kw)  # type: ignore[arg-type]


# Shell: execd's pid inside a sandbox (1 when runc starts it; under the zygote, the waiter is
# PID 1 and execd its first neighbour). The pattern does not match this command's own line.
EXECD_PID = ("$(for d in /proc/[0-9]*; do tr '\\0' ' ' <$d/cmdline 2>/dev/null | "
             "grep -q 'sandlot[.]execd' && echo ${d#/proc/}; done | sort -n | head -1)")


async def open_runtime(data_dir: Path) -> OciRuntime:
    cfg = Config(data_dir=data_dir)
    cfg.runtime.snapshot_pool_size = 0  # cold creates from snapshots (test_snapshot_pools.py)
    return await OciRuntime.open(cfg, images=TEST_IMAGES)


async def runtime_fixture(data_dir: Path) -> AsyncIterator[OciRuntime]:
    rt = await open_runtime(data_dir)
    try:
        yield rt
    finally:
        ids = await rt.list_ids()
        for sid in ids:
            await rt.delete(sid)
        await rt.close()
        left = {sid: what for sid in ids if (what := leftovers(rt, sid))}
        assert not left, f"sandboxes left traces behind: {left}"
        # A delete removes the sandbox's directory (renamed to trash first) entirely.
        trash = [n for n in os.listdir(data_dir / "sandboxes") if removal.is_trash(n)]
        assert not trash, f"deleted sandboxes' directories left as trash: {trash}"
        # The data dir's folder of rootfs mount points goes once no sandbox is in it.
        folder = rootfs_folder(data_dir)
        assert not folder.exists(), sorted(os.listdir(folder))


def process_gone(pid: int, timeout: float = 10) -> bool:
    """True once ``pid`` no longer runs (gone, or a zombie waiting for its reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False
