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


# Counts the regular expressions parsed (re's parser runs only on a cache miss) while
# execd builds its app, with or without the zygote's preparation before it.
PARSES = textwrap.dedent("""
    import sys
    from sandlot.execd import zygote
    zygote.preload()
    if sys.argv[2] == "prepared":
        zygote.compile_routes()
    from sandlot.execd.app import build_app
    from sandlot.execd.claim import ClaimExtension
    from sandlot.execd.lazyext import DeferredCode
    from sandlot.execd.settings import Settings
    parses = []

    def watch(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == "parse" and code.co_filename.endswith(
                ("re/_parser.py", "sre_parse.py")):
            parses.append(1)

    settings = Settings(state_dir=sys.argv[1])
    sys.setprofile(watch)
    build_app(settings, extensions=[DeferredCode(settings),
                                    ClaimExtension(settings, lambda argv: None)])
    sys.setprofile(None)
    print(len(parses))
""")


def test_a_forked_execd_finds_its_route_patterns_compiled(tmp_path: Path) -> None:
    def parses(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", PARSES, str(tmp_path), mode], check=True,
                             capture_output=True, text=True, timeout=60)
        return int(out.stdout)

    assert parses("bare") > 10  # the routes' patterns: what an unprepared execd compiles
    assert parses("prepared") == 0


# What importing the code service and building its extension imports, after a zygote's
# preparation with or without ``--code``; and whether the plain one has any of it.
CODE_IMPORTS = textwrap.dedent("""
    import sys
    from sandlot.execd import zygote
    zygote.prepare(code=sys.argv[2] == "code")
    heavy = sorted(m for m in ("jupyter_client", "zmq", "tornado", "traitlets")
                   if m in sys.modules)
    print(" ".join(heavy) or "-")
    before = set(sys.modules)
    from sandlot.execd.code import build_extension
    from sandlot.execd.settings import Settings
    build_extension(Settings(state_dir=sys.argv[1]))
    print(" ".join(sorted(set(sys.modules) - before)) or "-")
""")


def test_only_the_code_zygote_has_the_code_service_and_it_has_all_of_it(
        tmp_path: Path) -> None:
    def run(flavour: str) -> tuple[list[str], list[str]]:
        out = subprocess.run([sys.executable, "-c", CODE_IMPORTS, str(tmp_path), flavour],
                             check=True, capture_output=True, text=True, timeout=60)
        heavy, loaded = out.stdout.splitlines()
        return heavy.split(), loaded.split()

    heavy, loaded = run("code")
    assert heavy == ["jupyter_client", "tornado", "traitlets", "zmq"]
    assert loaded == ["-"]  # a code image's execd loads its service from shared pages
    heavy, loaded = run("plain")
    assert heavy == ["-"]  # none of it in the pages every plain sandbox's execd inherits
    assert "jupyter_client" in loaded and "sandlot.execd.code" in loaded
