"""A kernel killed for going over the memory limit: the out-of-memory error, then a fresh kernel.

The server runs inside a cgroup-v1 memory cgroup this test creates (and removes) with a small limit,
as a sandbox's limit would be; kernels inherit it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_interpreter.models.code import SupportedLanguage

from .conftest import Execd, make_codes, start_execd, stop_execd

LIMIT = 450 * 1024 * 1024


def _own_memory_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        rel = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines()
                   if ln.startswith("0::")).split(":", 2)[2]
        return Path("/sys/fs/cgroup") / rel.lstrip("/")
    return None


@pytest.fixture
def limited_cgroup() -> Iterator[Path]:
    parent = _own_memory_cgroup()
    if os.geteuid() != 0 or parent is None or not parent.is_dir():
        pytest.skip("needs root and a memory cgroup to create a limited child in")
    cg = parent / f"sandlot-code-oom-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        if (cg / "memory.limit_in_bytes").exists():  # cgroup v1
            (cg / "memory.limit_in_bytes").write_text(str(LIMIT))
            if (cg / "memory.memsw.limit_in_bytes").exists():
                (cg / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        else:  # cgroup v2
            (cg / "memory.max").write_text(str(LIMIT))
            (cg / "memory.swap.max").write_text("0")
        yield cg
    finally:
        deadline = time.monotonic() + 10
        while (cg / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.rmdir(cg)


@pytest.fixture
def confined(limited_cgroup: Path) -> Iterator[Execd]:
    enter = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(limited_cgroup)]
    server = start_execd({"SANDLOT_CODE_PRESTART": "python"}, preexec=enter)
    yield server
    stop_execd(server)


async def test_oom_gives_memory_error_then_fresh_context(confined):
    codes = make_codes(confined.endpoint)
    try:
        ctx = await codes.create_context(SupportedLanguage.PYTHON)
        await codes.run("before = 'set before the OOM'", context=ctx)
        ex = await codes.run("hog = b'\\x01' * (2 << 30)", context=ctx)
        assert ex.error is not None
        assert ex.error.name == "OutOfMemoryError"
        assert "out of memory" in ex.error.value and "smaller pieces" in ex.error.value
        ex = await codes.run("print('alive'); 6 * 7", context=ctx)
        assert ex.error is None
        assert ex.result[0].text == "42"
        ex = await codes.run("before", context=ctx)
        assert ex.error is not None and ex.error.name == "NameError"
        await codes.delete_context(ctx.id)
    finally:
        await codes.aclose()
