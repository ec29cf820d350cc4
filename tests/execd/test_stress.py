"""Bounded stress: 1 GiB of stdout, 200 concurrent background commands, 1 GiB upload and
download — with execd's memory growth measured (psutil), never its speed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from pathlib import Path

import pytest
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import WriteEntry

from tests.execd.conftest import Execd, sdk_services

GIB = 1 << 30
RSS_BUDGET = 50 << 20

pytestmark = pytest.mark.timeout(900)


class PeakRss:
    """Samples a process's RSS in a thread until stopped."""

    def __init__(self, ex: Execd) -> None:
        self.ex = ex
        self.base = ex.rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.ex.rss())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


def test_one_gib_of_stdout_streams_with_bounded_memory(fresh_execd: Execd) -> None:
    ex = fresh_execd
    received = 0
    last_type = None
    with PeakRss(ex) as rss, ex.client() as c:
        with c.stream(
            "POST",
            "/command",
            # 4 KiB lines: each line is one event (the reference framing), and 2^18 events
            # keep the client's share of the test short.
            json={"command": f"yes \"$(head -c 4095 /dev/zero | tr '\\0' a)\" | head -c {GIB}"},
        ) as r:
            for line in r.iter_lines():  # one JSON event per line (the reference framing)
                if line.startswith('{"type":"stdout"'):
                    # One event per output line, its newline stripped; the text needs no
                    # escapes here, so its length is read off the line without parsing it.
                    received += len(line) - (line.index('"text":"') + 8) - 2 + 1
                    last_type = "stdout"
                elif line:
                    last_type = json.loads(line)["type"]
    assert last_type == "execution_complete"
    assert received == GIB
    assert rss.growth <= RSS_BUDGET, f"execd RSS grew by {rss.growth / 2**20:.1f} MiB"


def test_two_hundred_background_commands_complete_with_full_logs(fresh_execd: Execd) -> None:
    commands, _, _ = sdk_services(fresh_execd)
    n, lines = 200, 50

    async def scenario() -> None:
        script = 'for i in $(seq 1 {lines}); do echo "cmd{n}-line$i"; done; echo "cmd{n}-err" >&2'
        started = await asyncio.gather(
            *[
                commands.run(script.format(n=k, lines=lines), opts=RunCommandOpts(background=True))
                for k in range(n)
            ]
        )
        ids = [e.id for e in started]
        assert len(set(ids)) == n
        for _ in range(600):
            statuses = await asyncio.gather(*[commands.get_command_status(i) for i in ids])
            if not any(s.running for s in statuses):
                break
            await asyncio.sleep(0.1)
        assert all(s.exit_code == 0 for s in statuses)
        logs = await asyncio.gather(*[commands.get_background_command_logs(i) for i in ids])
        for k, log in enumerate(logs):
            got = log.content.splitlines()
            expected = [f"cmd{k}-line{i}" for i in range(1, lines + 1)] + [f"cmd{k}-err"]
            assert sorted(got) == sorted(expected)
            assert [x for x in got if "line" in x] == expected[:-1]

    asyncio.run(scenario())


def _write_big_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    block = bytearray(hashlib.sha256(b"seed").digest() * (1 << 15))  # 1 MiB pattern
    with open(path, "wb") as fh:
        written = 0
        counter = 0
        while written < size:
            block[:8] = counter.to_bytes(8, "little")  # every MiB differs
            chunk = bytes(block[: size - written])
            fh.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            counter += 1
    return digest.hexdigest()


def test_one_gib_upload_and_download_are_identical(fresh_execd: Execd, tmp_path: Path) -> None:
    src = tmp_path / "big.src"
    expected = _write_big_file(src, GIB)
    target = fresh_execd.workdir / "big.dst"
    _, files, _ = sdk_services(fresh_execd)

    async def scenario() -> str:
        with open(src, "rb") as fh:
            await files.write_files([WriteEntry(path=str(target), data=fh, mode=644)])
        digest = hashlib.sha256()
        size = 0
        async for chunk in await files.read_bytes_stream(str(target), chunk_size=1 << 20):
            digest.update(chunk)
            size += len(chunk)
        assert size == GIB
        return digest.hexdigest()

    try:
        with PeakRss(fresh_execd) as rss:
            got = asyncio.run(scenario())
        assert target.stat().st_size == GIB
        assert got == expected
        assert rss.growth <= RSS_BUDGET, f"execd RSS grew by {rss.growth / 2**20:.1f} MiB"
    finally:
        target.unlink(missing_ok=True)
        src.unlink(missing_ok=True)
