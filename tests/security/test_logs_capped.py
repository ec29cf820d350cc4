"""Issue 11, finding 4: host-side logs are capped and rotated (real sandbox)."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

from sandlot.execd.cappedlog import CappedLog
from sandlot.execd.main import LogCap
from sandlot.images.model import Image
from sandlot.runtime.oci import OciRuntime
from tests.runtime.helpers import runc_exec, spec, wait_ping


def test_capped_log_rotates_at_its_cap(tmp_path: Path) -> None:
    log = CappedLog(str(tmp_path / "x.log"), max_bytes=1000)
    for _ in range(50):
        log.write(b"y" * 333)
    log.close()
    assert (tmp_path / "x.log").stat().st_size <= 1000
    assert (tmp_path / "x.log.1").stat().st_size == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.log", "x.log.1"]


def test_execd_own_log_cap_counts_what_is_written() -> None:
    """execd's log (the host-side container.log) stays near its cap even when each line is
    a short format with long arguments a request supplied, or a long traceback."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(LogCap(max_bytes=20_000))
    log = logging.getLogger("test-execd-cap")
    log.addHandler(handler)
    log.propagate = False
    try:
        for _ in range(200):
            log.warning("bad path %s", "x" * 1000)
        try:
            raise ValueError("y" * 50_000)
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    written = out.getvalue()
    assert len(written) <= 20_000 + 1000, len(written)
    assert "log cap reached" in written
    assert "y" * 1000 not in written


async def test_entrypoint_flooding_its_log_stays_under_the_cap(
    oci_runtime: OciRuntime, rt_image: Image
) -> None:
    rt = oci_runtime
    s = spec("floodlog", rt_image)
    s.entrypoint = ["sh", "-c", "yes 0123456789abcdef0123456789abcdef | head -c 40000000; "
                    "echo done-flooding; sleep 600"]
    await rt.create(s)
    await wait_ping(rt, "floodlog")
    # The log lives in the sandbox's own /run/sandlot (a tmpfs: its memory, or host disk
    # where a backend keeps it on the host): either way it must stay bounded.
    for _ in range(120):  # 40 MB through the pipe
        r = runc_exec(rt, "floodlog", "tail -c 200 /run/sandlot/entrypoint.log")
        if "done-flooding" in r.stdout:
            break
        await asyncio.sleep(0.5)
    assert "done-flooding" in r.stdout
    r = runc_exec(rt, "floodlog", "cat /run/sandlot/entrypoint.log* | wc -c; "
                  "ls /run/sandlot | grep -c entrypoint.log")
    total, files = (int(x) for x in r.stdout.split())
    assert total <= 16 << 20  # the log and one rotated file at most (8 MiB each)
    assert files == 2
