"""Commands execd starts are preferred OOM victims, so execd (a sandbox's PID 1) survives."""

from __future__ import annotations

import json
from pathlib import Path

from tests.execd.conftest import Execd


def _adj(pid: int | str) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_commands_and_their_children_score_above_execd(execd: Execd) -> None:
    own = _adj(execd.proc.pid)
    with execd.client() as c:
        # The command reports its own score and that of a process it forks. execd raises the
        # command right after the (v)fork; a process the command forks in the first moments
        # would inherit execd's own score (a known, harmless race: see oomscore), so the
        # command waits until its own score was raised before forking.
        script = (
            f"for i in $(seq 200); do [ \"$(cat /proc/$$/oom_score_adj)\" != {own} ] && break; "
            "sleep 0.01; done; "
            "cat /proc/$$/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"
        )
        r = c.post("/command", json={"command": script})
        assert r.status_code == 200
    lines = [
        json.loads(line)["text"]  # the reference's framing: one JSON object per line
        for line in r.text.splitlines()
        if line.startswith("{") and '"stdout"' in line
    ]
    scores = [int(x) for text in lines for x in text.split()]
    assert len(scores) == 2, r.text
    want = max(0, min(1000, own + 999))
    assert scores == [want, want]
    assert want > own
