"""``SANDLOT_BENCH_BURSTS``: the bursts it names, and time for them (bench/env.py)."""

from __future__ import annotations

from bench.env import BURST_SECONDS, FULL, QUICK, with_bursts


def test_bursts_replace_the_scales_and_get_time_for_themselves() -> None:
    assert with_bursts(QUICK, "") == QUICK
    big = with_bursts(QUICK, "50x1, 100")
    assert big.create_concurrency == ((50, 1), (100, 1))
    # 150 creates: more than the quick scale's 120 s, which cut the 100-burst before
    assert big.bench_timeout == 60.0 + BURST_SECONDS * 150 > QUICK.bench_timeout
    small = with_bursts(FULL, "10x3")
    assert small.create_concurrency == ((10, 3),)
    assert small.bench_timeout == FULL.bench_timeout  # never less than the scale's own


def test_the_100_burst_note_gives_the_like_for_like_p99_ratio() -> None:
    from bench.benchmarks.create import _p99_against_raw_p99
    from bench.results import Measured

    raw = Measured("runc run+exec", [float(x) for x in range(1, 101)])  # p99 ~99
    note = _p99_against_raw_p99([2.0 * x for x in range(1, 101)], raw)
    assert note == "; p99 against the raw bursts' own p99: 2.00x"
    assert _p99_against_raw_p99([1.0], None) == ""
    assert _p99_against_raw_p99([], raw) == ""
