"""The server exempts its start-up objects from garbage collection (gcfreeze.py)."""

from __future__ import annotations

import gc

from sandlot.server import gcfreeze


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    try:
        frozen = gcfreeze.freeze_start_up()
        assert frozen > 0 and gc.get_freeze_count() == frozen

        class Node:
            peer: object = None

        a, b = Node(), Node()
        a.peer, b.peer = b, a  # a cycle made after the freeze
        del a, b
        assert gc.collect() >= 2  # still found and freed
    finally:
        gc.unfreeze()
