"""The server exempts its start-up objects from garbage collection (gcfreeze.py)."""

from __future__ import annotations

import gc
import weakref


class _Node:
    peer: object = None


def _cycle() -> tuple[_Node, weakref.ref[_Node]]:
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    return a, weakref.ref(a)


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    from sandlot.server import gcfreeze

    try:
        held, before_ref = _cycle()  # alive at the freeze, so it is among the frozen
        frozen = gcfreeze.freeze_start_up()
        # Other threads of the test process may free a frozen object in the meantime,
        # which shrinks the count; it never grows without another freeze.
        assert frozen > 0 and 0 < gc.get_freeze_count() <= frozen

        del held
        gc.collect()
        assert before_ref() is not None  # frozen: the collector no longer walks it

        after, after_ref = _cycle()  # a cycle made after the freeze
        del after
        gc.collect()
        assert after_ref() is None  # still found and freed
    finally:
        gc.unfreeze()
        gc.collect()
