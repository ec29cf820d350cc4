"""Smoke run of the benchmark suite (``python -m bench --quick``) so it cannot rot.

It starts its own ``sandlot serve`` with the shared test image cache, runs every benchmark at
tiny N (about a minute), and checks that the table, the JSON and the chart were produced and
that every benchmark reported each of its rows (measured, or marked skipped with a reason,
e.g. the code benchmark when the ``code-interpreter`` image is not built).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NEEDED_MODULES = ("sandlot.server.main", "sandlot.execd.main", "sandlot.images.store",
                  "sandlot.runtime.oci.runtime")


def _missing_pieces() -> list[str]:
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if shutil.which("runc") is None:
        missing.append("runc")
    if os.geteuid() != 0:
        missing.append("root (the OCI runtime needs it)")
    return missing


def _image_cache() -> Path:
    # The data dir whose images/ is the test suite's shared image store (see tests/conftest.py).
    images = Path(os.environ.get("SANDLOT_TEST_IMAGES", "/var/tmp/sandlot-test/images"))
    return images.parent if images.name == "images" else images


# slow: ~160-200 s on the 2-core VM, which kept ``make test`` over its 45 minutes;
# ``make test-heavy`` (run by .ci/run after ``make test``) runs it.
@pytest.mark.slow
@pytest.mark.timeout(1200)  # may build the base image first (debootstrap)
def test_bench_quick_produces_every_row(tmp_path: Path) -> None:
    missing = _missing_pieces()
    if missing:
        pytest.skip(f"benchmark smoke run needs: {', '.join(missing)}")
    sys.path.insert(0, str(REPO))
    from bench.benchmarks import BENCHMARKS, EXPECTED_KEYS

    proc = subprocess.run(
        # --budget: the quick run's own 300 s ran out on a loaded 2-core VM (four benchmarks
        # not run, seen 2026-12-03); it takes ~160 s when the machine is not shared.
        [sys.executable, "-m", "bench", "--quick", "--no-docker", "--out", str(tmp_path),
         "--image-cache", str(_image_cache()), "--budget", "800"],
        cwd=REPO, capture_output=True, text=True, timeout=1100, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    output = proc.stdout + proc.stderr
    assert "sandlot benchmarks" in output, output[-3000:]  # the table was printed
    results = list(tmp_path.glob("*.json"))
    assert len(results) == 1, output[-3000:]
    assert list(tmp_path.glob("*.png")), "no latency chart written"
    report = json.loads(results[0].read_text())
    assert report["quick"] is True
    by_name = {b["name"]: b for b in report["benchmarks"]}
    assert set(by_name) == set(BENCHMARKS), report["notes"]
    for name, bench in by_name.items():
        keys = [row["key"] for row in bench["rows"]]
        for prefix in EXPECTED_KEYS[name]:
            assert any(k == prefix or k.startswith(prefix + ".") for k in keys), (name, prefix)
        assert bench["error"] is None, (name, bench["error"],
                                        report["environment"].get("tracebacks", {}).get(name),
                                        report["environment"].get("server_log_tail"))
        for row in bench["rows"]:
            if row["sandlot"] is None:
                assert row["note"], f"{row['key']} skipped without a reason"
    # Everything the harness needs from the rest of sandlot was there: the core figures exist.
    measured = {row["key"] for b in report["benchmarks"] for row in b["rows"] if row["sandlot"]}
    for key in ("create.serial", "create.delete", "commands.true_rtt", "files.upload_small",
                "proxy.true_rtt"):
        assert key in measured, f"{key} was not measured: {report['notes']}"
    assert proc.returncode == 0, output[-3000:]
    # The server must leave nothing of its sandboxes behind when it stops (the harness removes
    # whatever it finds, and reports it here).
    assert not report["environment"].get("leftovers"), (
        report["environment"]["leftovers"][:5], report["environment"].get("server_log_tail"))
