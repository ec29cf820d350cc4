"""``code.warm``'s second target (issue 15's ratio) says in the row's note whether the run met
it: the row's own verdict is issue 4's absolute target, which a 1.5x run also meets."""

from __future__ import annotations

from bench.benchmarks.code import _ratio_note
from bench.results import Measured, ratio_target

DIRECT = Measured("jupyter_client", [5.0, 5.1, 5.2])  # ms: the ratio's bound is 6.63 ms


def test_the_note_says_not_met_when_the_ratio_is_missed() -> None:
    note = _ratio_note(ratio_target("<=", 1.3, DIRECT, "issue 15"), [8.0, 8.1, 7.9])
    assert note.startswith("also p50 <= 6.63")
    assert note.endswith(": NOT met")


def test_the_note_says_met_when_the_ratio_is_met() -> None:
    note = _ratio_note(ratio_target("<=", 1.3, DIRECT, "issue 15"), [6.0, 6.1, 5.9])
    assert note.endswith(": met")


def test_no_note_without_a_baseline_or_samples() -> None:
    assert _ratio_note(None, [6.0]) == ""
    assert _ratio_note(ratio_target("<=", 1.3, DIRECT, "issue 15"), []) == ""
