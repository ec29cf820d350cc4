"""Order statistics over a list of samples (no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

STATS = ("min", "p50", "p90", "p99", "max")


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0..100) of already sorted samples."""
    if not sorted_samples:
        raise ValueError("no samples")
    if len(sorted_samples) == 1:
        return float(sorted_samples[0])
    pos = (len(sorted_samples) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    frac = pos - lo
    return float(sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * frac)


@dataclass(frozen=True)
class Summary:
    n: int
    min: float
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        s = sorted(float(x) for x in samples)
        return cls(
            n=len(s),
            min=s[0],
            p50=percentile(s, 50),
            p90=percentile(s, 90),
            p99=percentile(s, 99),
            max=s[-1],
            mean=sum(s) / len(s),
        )

    def stat(self, name: str) -> float:
        value = getattr(self, name)
        return float(value)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)
