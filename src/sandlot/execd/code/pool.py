"""Warm kernels: one idle, already started kernel per configured language.

Handing out a warm kernel turns "create a context and run the first cell" from a kernel start
(hundreds of ms to seconds) into a message round trip; the pool refills itself in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .kernels.base import Kernel

log = logging.getLogger(__name__)

Starter = Callable[[str], Coroutine[Any, Any, Kernel]]


class WarmPool:
    def __init__(self, start: Starter):
        self._start = start
        self._slots: dict[str, asyncio.Task[Kernel]] = {}
        self._closed = False

    def fill(self, language: str) -> None:
        if self._closed:
            return
        slot = self._slots.get(language)
        if slot is None or slot.done():
            self._slots[language] = asyncio.create_task(self._start(language))

    async def wait_ready(self) -> None:
        """Wait until every slot has finished starting (successfully or not)."""
        await asyncio.gather(*self._slots.values(), return_exceptions=True)

    async def take(self, language: str) -> Kernel | None:
        """A started kernel for ``language``, or None when there is none (the caller starts one)."""
        slot = self._slots.pop(language, None)
        if slot is None:
            return None
        # A ready kernel is replaced at once. One still starting (a take right after
        # another) is replaced once it is up: it then has the CPU to itself instead of
        # sharing it with its replacement (two kernels starting at once on a small sandbox
        # each take about twice as long, and this caller waits for the first).
        if slot.done():
            self.fill(language)
        try:
            kernel = await slot
        except Exception as exc:  # a failed warm start: the caller starts one cold
            log.warning("warm %s kernel failed to start: %s", language, exc)
            return None
        finally:
            self.fill(language)
        if not await kernel.is_alive():
            await kernel.shutdown()
            return None
        return kernel

    async def close(self) -> None:
        self._closed = True
        slots, self._slots = list(self._slots.values()), {}
        # Not cancelled: a kernel half-way through starting is easier to stop once it is up.
        for slot in slots:
            with contextlib.suppress(BaseException):
                kernel = await slot
                await kernel.shutdown()
