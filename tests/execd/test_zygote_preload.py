"""The execd zygote imports everything a forked execd would import at start-up.

A module first imported after the fork costs every sandbox its own copy (issue 15's idle
memory): this catches a new service module missing from ``zygote.PRELOAD``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys, threading
    from sandlot.execd import zygote
    zygote.preload()
    assert threading.active_count() == 1, "a preloaded module started a thread"
    before = set(sys.modules)
    from sandlot.execd.app import build_app
    from sandlot.execd.handoff import HandoffReceiver, bind_receiver
    from sandlot.execd.lazyext import DeferredCode
    from sandlot.execd.main import parse_args
    from sandlot.execd.settings import Settings
    settings = Settings(state_dir=sys.argv[1])
    parse_args(["--listen", "tcp:127.0.0.1:44772", "--token-stdin", "--handoff", "--",
                "sleep", "1"])
    build_app(settings, extensions=[DeferredCode(settings)])
    print(" ".join(sorted(set(sys.modules) - before)))
""")


def test_building_execd_imports_nothing_the_zygote_did_not(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], check=True,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == []
