"""Running a test script in a fresh Python in a network namespace of its own (``unshare
--net``): what it binds and the addresses it adds exist only there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def run_in_own_netns(script: str, timeout: float = 60) -> None:
    """Run ``script``, which prints ``ok`` when all its assertions held."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a namespace of its own")
    r = subprocess.run(["unshare", "--net", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
