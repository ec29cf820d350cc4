"""A sandbox's uid range gets its user namespace (for the idmapped layers) off the event
loop, once per range (``OciRuntime._userns_fd``)."""

from __future__ import annotations

import asyncio
import os
import threading
from types import SimpleNamespace

import pytest

from sandlot.runtime.oci import idmap
from sandlot.runtime.oci.runtime import OciRuntime


class FakeNamespaces:
    """Stands in for ``idmap.userns_fd``: a pipe's read end per call, and which thread
    made it; ``gate`` holds every call until set."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.made: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, base: int, count: int) -> int:
        self.threads.append(threading.get_ident())
        self.gate.wait(5)
        r, w = os.pipe()
        os.close(w)
        self.made.append(r)
        return r


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNamespaces:
    made = FakeNamespaces()
    monkeypatch.setattr(idmap, "userns_fd", made)
    return made


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


async def test_made_on_a_worker_thread_once_per_range(fake: FakeNamespaces) -> None:
    runtime = SimpleNamespace(_userns_fds={})
    first = await OciRuntime._userns_fd(runtime, 1 << 30)  # type: ignore[arg-type]
    again = await OciRuntime._userns_fd(runtime, 1 << 30)  # type: ignore[arg-type]
    other = await OciRuntime._userns_fd(runtime, 2 << 30)  # type: ignore[arg-type]
    assert first == again != other
    assert len(fake.threads) == 2
    assert threading.get_ident() not in fake.threads  # never the event loop's thread
    for fd in fake.made:
        os.close(fd)


async def test_the_loop_serves_others_while_one_is_made(fake: FakeNamespaces) -> None:
    runtime = SimpleNamespace(_userns_fds={})
    fake.gate.clear()
    making = asyncio.ensure_future(OciRuntime._userns_fd(runtime, 1 << 30))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not making.done()  # still waiting on the helper, and this coroutine ran meanwhile
    fake.gate.set()
    os.close(await making)


async def test_two_makers_of_one_range_keep_one_namespace(fake: FakeNamespaces) -> None:
    runtime = SimpleNamespace(_userns_fds={})
    fake.gate.clear()
    both = asyncio.gather(*(OciRuntime._userns_fd(runtime, 1 << 30)  # type: ignore[arg-type]
                            for _ in range(2)))
    await asyncio.sleep(0.05)
    fake.gate.set()
    a, b = await both
    assert a == b and runtime._userns_fds == {1 << 30: a}
    assert len(fake.made) == 2
    assert [_is_open(fd) for fd in fake.made] == [fd == a for fd in fake.made]  # no leak
    os.close(a)
