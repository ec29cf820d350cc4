"""``--profile``: where the time goes in a benchmark whose target is missed.

``py-spy`` (default) samples the sandlot server process, and the execd daemons a benchmark
points at, into flame graphs (SVG) under ``bench/results/``; ``pyinstrument`` profiles the
harness process itself (the SDK client side) into an HTML report.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

KINDS = ("py-spy", "pyinstrument")


def py_spy_binary() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


class Profiler:
    def __init__(self, kind: str, out_dir: Path, stem: str):
        if kind not in KINDS:
            raise ValueError(f"profiler must be one of {KINDS}")
        self.kind = kind
        self.out_dir = out_dir
        self.stem = stem
        self.spies: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.outputs: list[Path] = []
        self.errors: list[str] = []
        self._pyi: Any = None

    def attach(self, pid: int, label: str) -> None:
        """Start sampling ``pid`` (py-spy); a no-op for pyinstrument."""
        if self.kind != "py-spy":
            return
        binary = py_spy_binary()
        if binary is None:
            self.errors.append("py-spy not installed")
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{self.stem}-{label}.svg"
        proc = subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--rate", "250", "--output", str(out),
             "--format", "flamegraph", "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
        self.spies.append((proc, out))

    def start_client(self) -> None:
        if self.kind != "pyinstrument":
            return
        try:
            from pyinstrument import Profiler as Pyi
        except ImportError:
            self.errors.append("pyinstrument not installed (pip install pyinstrument)")
            return
        self._pyi = Pyi(async_mode="enabled")
        self._pyi.start()

    def stop(self) -> list[Path]:
        if self._pyi is not None:
            self._pyi.stop()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            out = self.out_dir / f"{self.stem}-client.html"
            out.write_text(self._pyi.output_html())
            self.outputs.append(out)
            self._pyi = None
        for proc, out in self.spies:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate(timeout=10)
            if out.exists():
                self.outputs.append(out)
            else:
                with contextlib.suppress(Exception):
                    self.errors.append(f"py-spy wrote no {out.name}: "
                                       f"{err.decode(errors='replace').strip()[-200:]}")
        self.spies.clear()
        return self.outputs
