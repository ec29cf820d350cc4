"""Fake warm-container starts for the pool tests (``WarmPool``, ``SnapshotPools``): each ends
at once, or, with ``hold``, when the test releases it (or makes it fail)."""

from __future__ import annotations

import asyncio
import itertools

from sandlot.images.model import Image
from sandlot.runtime.oci.pool import Warm


class Starts:
    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.begun = 0
        self.discarded: list[str] = []
        self._ids = itertools.count()
        self._gates: list[asyncio.Future[bool]] = []

    async def make(self, image: Image) -> Warm:
        self.begun += 1
        if self.hold:
            gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._gates.append(gate)
            if not await gate:
                raise RuntimeError("warm start failed")
        return Warm(f"_pool-{next(self._ids)}", "tok", image.id)

    async def discard(self, cid: str) -> None:
        self.discarded.append(cid)

    def release(self, ok: bool = True) -> None:
        """End the oldest held start (``ok`` False: it fails)."""
        next(g for g in self._gates if not g.done()).set_result(ok)

    def release_all(self) -> None:
        for gate in self._gates:
            if not gate.done():
                gate.set_result(True)


async def until(check: object, timeout: float = 5.0) -> None:
    """Poll ``check()`` until it is true (``TimeoutError`` after ``timeout`` seconds)."""
    async with asyncio.timeout(timeout):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.005)
