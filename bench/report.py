"""The one table (rich) and the PNG chart of latency distributions (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.results import Row, RunReport, result_stem
from bench.stats import STATS


def _fmt(value: float) -> str:
    if value != value:  # NaN
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _target_cell(row: Row) -> str:
    if row.target is None:
        return ""
    met = row.target_met()
    mark = "" if met is None else (" [green]ok[/]" if met else " [red]MISS[/]")
    return f"{row.target.text()}{mark}"


def _baseline_cells(row: Row) -> tuple[str, str]:
    stat = row.stat_name
    values = []
    for b in row.baselines:
        if b.samples:
            values.append(f"{b.name} {_fmt(b.summary.stat(stat))}")
    ratios = [f"{name} x{_fmt(r)}" for name, r in row.ratios()]
    return "\n".join(values), "\n".join(ratios)


def build_table(report: RunReport) -> Table:
    title = "sandlot benchmarks" + (" (--quick: tiny N, figures indicative only)"
                                    if report.quick else "")
    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("bench")
    table.add_column("metric")
    table.add_column("unit")
    table.add_column("n", justify="right")
    for s in STATS:
        table.add_column(s, justify="right")
    table.add_column("target")
    table.add_column("baseline (same stat)")
    table.add_column("ratio")
    for outcome in report.outcomes:
        if outcome.error and not outcome.rows:
            table.add_row(outcome.name, "[red]failed[/]", "", "", *[""] * len(STATS), "",
                          outcome.error[:80], "")
        for row in outcome.rows:
            if row.sandlot is None or not row.sandlot.samples:
                table.add_row(row.bench, row.label, row.unit, "0", *["-"] * len(STATS),
                              _target_cell(row), f"[yellow]skipped:[/] {row.note}", "")
                continue
            summary = row.sandlot.summary
            base, ratio = _baseline_cells(row)
            label = row.label + (f"\n[dim]{row.note}[/]" if row.note else "")
            table.add_row(row.bench, label, row.unit, str(summary.n),
                          *[_fmt(summary.stat(x)) for x in STATS], _target_cell(row), base,
                          ratio)
        table.add_section()
    return table


def print_table(report: RunReport, console: Console | None = None) -> None:
    console = console or Console(width=200)
    console.print(build_table(report))
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")


def write_chart(report: RunReport, out_dir: Path) -> Path | None:
    """Box plots (log scale) of every latency row that has samples, with its baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.unit == "ms" and r.sandlot and len(r.sandlot.samples) > 0]
    if not rows:
        return None
    data: list[list[float]] = []
    labels: list[str] = []
    colors: list[str] = []
    for row in rows:
        assert row.sandlot is not None
        data.append(row.sandlot.samples)
        labels.append(f"{row.bench}: {row.label}")
        colors.append("tab:blue")
        for b in row.baselines:
            if b.samples:
                data.append(b.samples)
                labels.append(f"    baseline {b.name}")
                colors.append("tab:gray")
    height = max(4.0, 0.28 * len(data) + 1.5)
    fig, ax = plt.subplots(figsize=(11, height))
    parts = ax.boxplot(data, vert=False, whis=(0, 100), widths=0.6, patch_artist=True)
    for patch, color in zip(parts["boxes"], colors, strict=True):
        patch.set_facecolor(color)
        patch.set_alpha(0.5)
    ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log scale; whiskers = min/max, box = p25..p75)")
    ax.set_title("sandlot latency distributions (blue) beside same-run baselines (gray)"
                 + (" [--quick]" if report.quick else ""))
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result_stem(report.started)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
