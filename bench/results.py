"""What a benchmark reports: rows of sandlot figures, each with its target and baselines."""

from __future__ import annotations

import json
import platform
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from bench.stats import Summary


@dataclass(frozen=True)
class Target:
    """A performance target from an issue: ``stat op value`` (e.g. p50 <= 60 ms)."""

    op: Literal["<=", ">="]
    value: float
    stat: str = "p50"
    source: str = ""

    def met(self, summary: Summary) -> bool:
        actual = summary.stat(self.stat)
        return actual <= self.value if self.op == "<=" else actual >= self.value

    def text(self) -> str:
        return f"{self.stat} {self.op} {self.value:g}"


@dataclass
class Measured:
    """A set of samples of one quantity, from sandlot or from a baseline."""

    name: str
    samples: list[float]

    @property
    def summary(self) -> Summary:
        return Summary.of(self.samples)


@dataclass
class Row:
    key: str  # stable id, e.g. "create.serial"; the smoke test looks these up
    bench: str
    label: str
    unit: str  # "ms", "MB/s", "MB", "%", "count"
    sandlot: Measured | None
    target: Target | None = None
    baselines: list[Measured] = field(default_factory=list)
    higher_is_better: bool = False
    note: str = ""
    # Which statistic the ratio to the baselines compares (the target's if there is one).
    headline: str = "p50"

    @property
    def stat_name(self) -> str:
        return self.target.stat if self.target else self.headline

    def ratios(self) -> list[tuple[str, float]]:
        """sandlot / baseline on the headline statistic, one per baseline."""
        if self.sandlot is None or not self.sandlot.samples:
            return []
        mine = self.sandlot.summary.stat(self.stat_name)
        out = []
        for b in self.baselines:
            if b.samples:
                theirs = b.summary.stat(self.stat_name)
                if theirs > 0:  # a noisy machine-wide delta can be <= 0: no ratio then
                    out.append((b.name, mine / theirs))
        return out

    def target_met(self) -> bool | None:
        if self.target is None or self.sandlot is None or not self.sandlot.samples:
            return None
        return self.target.met(self.sandlot.summary)

    def to_dict(self) -> dict[str, Any]:
        def measured(m: Measured) -> dict[str, Any]:
            return {"name": m.name, "summary": m.summary.to_dict() if m.samples else None,
                    "samples": [round(x, 6) for x in m.samples]}

        return {
            "key": self.key,
            "bench": self.bench,
            "label": self.label,
            "unit": self.unit,
            "sandlot": measured(self.sandlot) if self.sandlot else None,
            "target": (
                {"op": self.target.op, "value": self.target.value, "stat": self.target.stat,
                 "source": self.target.source}
                if self.target else None
            ),
            "target_met": self.target_met(),
            "baselines": [measured(b) for b in self.baselines],
            "ratios": {name: r for name, r in self.ratios()},
            "stat": self.stat_name,
            "higher_is_better": self.higher_is_better,
            "note": self.note,
        }


def ratio_target(op: Literal["<=", ">="], factor: float, base: Measured | None,
                 source: str, stat: str = "p50") -> Target | None:
    """A target that is a ratio to a same-run baseline's p50 (issue 15's), as this run's
    value; None when the baseline was not measured."""
    if base is None or not base.samples:
        return None
    return Target(op, round(factor * base.summary.stat("p50"), 3), stat,
                  f"{source}: {factor:g}x {base.name} p50")


def skipped(key: str, bench: str, label: str, unit: str, note: str,
            target: Target | None = None) -> Row:
    """A row for a figure that could not be measured in this run, with the reason."""
    return Row(key=key, bench=bench, label=label, unit=unit, sandlot=None, target=target,
               note=note)


@dataclass
class BenchOutcome:
    name: str
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


@dataclass
class RunReport:
    started: datetime
    quick: bool
    outcomes: list[BenchOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> list[Row]:
        return [r for o in self.outcomes for r in o.rows]

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started.isoformat(),
            "host": socket.gethostname(),
            "quick": self.quick,
            "platform": platform.platform(),
            "environment": self.environment,
            "notes": self.notes,
            "benchmarks": [
                {"name": o.name, "seconds": round(o.seconds, 3), "error": o.error,
                 "rows": [r.to_dict() for r in o.rows]}
                for o in self.outcomes
            ],
        }


def result_stem(started: datetime) -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return f"{started.strftime('%Y-%m-%dT%H%M%S')}-{host}"


def write_json(report: RunReport, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result_stem(report.started)}.json"
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return path


def now() -> datetime:
    return datetime.now(UTC)


def ms(seconds: Sequence[float]) -> list[float]:
    return [s * 1000.0 for s in seconds]
