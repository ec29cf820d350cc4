"""Per-sandbox uid/gid ranges for user namespaces: uid 0 inside is ``base`` on the host.

Each container gets its own range of ``RANGE_SIZE`` ids, so a process escaping one sandbox
is an unprivileged stranger to the host and to every other sandbox. Ranges start at
``FIRST_BASE`` (2^30), far above any real account, and are handed out lowest-free-first.
The choice is recorded in the container's directory, so a restarted server knows which
ranges are taken.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

RANGE_SIZE = 65536
FIRST_BASE = 1 << 30
SLOTS = (1 << 31) // RANGE_SIZE - FIRST_BASE // RANGE_SIZE  # bases stay below 2^31
RECORD = "uid-base"


class UidRanges:
    def __init__(self, sandboxes_dir: Path) -> None:
        self.dir = sandboxes_dir
        self._taken: dict[str, int] = {}
        if sandboxes_dir.is_dir():
            for d in sandboxes_dir.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    self._taken[d.name] = int((d / RECORD).read_text())

    def base_of(self, container_id: str) -> int | None:
        return self._taken.get(container_id)

    def allocate(self, container_id: str, root: Path) -> int:
        """A free range for ``container_id``, recorded in its directory ``root``."""
        known = self._taken.get(container_id)
        if known is not None:
            return known
        used = set(self._taken.values())
        for slot in range(SLOTS):
            base = FIRST_BASE + slot * RANGE_SIZE
            if base not in used:
                break
        else:  # pragma: no cover - 16384 live sandboxes on one host
            raise RuntimeError("no free uid range left for a sandbox")
        (root / RECORD).write_text(str(base))
        self._taken[container_id] = base
        return base

    def release(self, container_id: str) -> None:
        self._taken.pop(container_id, None)
