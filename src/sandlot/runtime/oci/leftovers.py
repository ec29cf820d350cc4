"""Removing a crashed server's unclaimed warm containers after the new one answers.

They belong to nobody (no sandbox, no claim), so nothing a request does waits for them:
a restart used to tear them down one by one before the API came up (~1 s each on a
loaded host, runc delete, cgroups, mounts, netns). Here they are removed in the
background, a few at a time; ``wait()`` is for ``close()`` and for tests that check
nothing is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from sandlot.bounded import each_bounded

log = logging.getLogger(__name__)

# Teardowns at once: each is a few host tools (runc delete, umount, ip netns) that mostly
# wait; more than this only queues on the 2-core CI machines.
PARALLEL_TEARDOWNS = 4


async def teardown_all(container_ids: Iterable[str],
                       teardown: Callable[[str], Awaitable[None]],
                       parallel: int = PARALLEL_TEARDOWNS) -> list[str]:
    """Tear ``container_ids`` down, ``parallel`` at a time; the ids that failed (logged)."""

    async def one(cid: str) -> None:
        try:
            await teardown(cid)
        except Exception:  # noqa: BLE001 - the next start tries again
            log.warning("cannot remove stale warm container %s", cid, exc_info=True)
            raise

    return [cid for cid, _ in await each_bounded(sorted(container_ids), one, parallel)]


class BackgroundSweep:
    """One background removal of stale warm containers, started at most once."""

    def __init__(self) -> None:
        self._task: asyncio.Task[list[str]] | None = None

    def start(self, container_ids: set[str],
              teardown: Callable[[str], Awaitable[None]]) -> None:
        if container_ids:
            log.info("removing %d stale warm container(s) in the background",
                     len(container_ids))
            self._task = asyncio.create_task(teardown_all(container_ids, teardown),
                                             name="sandlot-stale-warm-sweep")

    async def wait(self) -> None:
        """Until the sweep (if any) has finished; its failures were logged."""
        if self._task is not None:
            await asyncio.shield(self._task)
