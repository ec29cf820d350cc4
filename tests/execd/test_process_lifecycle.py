"""execd as a process: entrypoint, private-environment scrubbing, reaping, SIGTERM clean-up,
unix-socket listening."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from sandlot.execd.protocol import parse_entrypoint_exit
from tests.execd.conftest import TOKEN, start_execd, stop_execd


def wait_for(predicate, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_entrypoint_runs_with_scrubbed_environment(tmp_path: Path) -> None:
    log = tmp_path / "entry.log"
    ex = start_execd(
        tmp_path,
        "--entrypoint-log",
        str(log),
        "--",
        "sh",
        "-c",
        "echo entry-started; env; sleep 300",
        env={
            "SANDLOT_EXECD_PRIVATE_ENV": "MY_SECRET,PYTHONSAFEPATH",
            "MY_SECRET": "s3cr3t",
            "PYTHONSAFEPATH": "1",
            "VISIBLE_VAR": "yes",
        },
    )
    try:
        assert wait_for(lambda: log.exists() and "VISIBLE_VAR=yes" in log.read_text())
        text = log.read_text()
        assert "entry-started" in text
        for hidden in ("MY_SECRET", "s3cr3t", "SANDLOT_EXECD", TOKEN, "PYTHONSAFEPATH"):
            assert hidden not in text
        with ex.client() as c:
            out = c.post("/command", json={"command": "env"}).text
        assert "VISIBLE_VAR=yes" in out and "s3cr3t" not in out and TOKEN not in out
        # The entrypoint is in its own process group, child of execd.
        kids = psutil.Process(ex.proc.pid).children()
        entry = [k for k in kids if "entry-started" in " ".join(k.cmdline())]
        assert entry and os.getpgid(entry[0].pid) == entry[0].pid
    finally:
        stop_execd(ex)


def test_the_entrypoint_end_is_the_last_line_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "entry.log"
    ex = start_execd(tmp_path, "--entrypoint-log", str(log), "--",
                     "sh", "-c", "echo out; echo err >&2; exit 3")
    try:
        assert wait_for(lambda: log.exists() and "[sandlot] entrypoint" in log.read_text())
        lines = log.read_text().splitlines()
        assert lines[-1] == "[sandlot] entrypoint exited with code 3"
        assert "out" in lines and "err" in lines
        assert parse_entrypoint_exit(log.read_text()) == "exited with code 3"
        with ex.client() as c:  # execd (PID 1 in a sandbox) stays up
            assert c.get("/ping").status_code == 200
    finally:
        stop_execd(ex)


def test_an_entrypoint_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    log = tmp_path / "entry.log"
    ex = start_execd(tmp_path, "--entrypoint-log", str(log), "--",
                     "sh", "-c", "echo going; kill -KILL $$")
    try:
        assert wait_for(lambda: log.exists() and "[sandlot] entrypoint" in log.read_text())
        assert log.read_text().splitlines()[-1] == (
            "[sandlot] entrypoint was killed by signal 9 (SIGKILL)")
    finally:
        stop_execd(ex)


def test_orphans_are_reaped_and_sigterm_kills_everything(tmp_path: Path) -> None:
    ex = start_execd(tmp_path)
    try:
        with ex.client() as c:
            # Daemonised grandchildren are re-parented to execd (subreaper): no lingering zombies.
            c.post("/command", json={"command": "(sleep 0.2 &); (sleep 0.3 &); true"})
            c.post(
                "/command", json={"command": "(setsid sleep 300 &); sleep 300", "background": True}
            )
            pids = []
            assert wait_for(lambda: len(_sleepers(ex.proc.pid, "300")) >= 2)
            pids = [p.pid for p in _sleepers(ex.proc.pid, "300")]

        def no_zombies() -> bool:
            return not [
                p
                for p in psutil.Process(ex.proc.pid).children(recursive=True)
                if p.status() == psutil.STATUS_ZOMBIE
            ]

        time.sleep(0.6)
        assert wait_for(no_zombies)
        ex.proc.send_signal(signal.SIGTERM)
        assert ex.proc.wait(timeout=15) == 0
        assert wait_for(
            lambda: (
                not [
                    p
                    for p in pids
                    if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                ]
            )
        )
        assert not (ex.state_dir.exists() and any(ex.state_dir.iterdir()))
    finally:
        stop_execd(ex)


def _sleepers(root: int, arg: str) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if p.cmdline() == ["sleep", arg]:
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_unix_socket_listener(tmp_path: Path) -> None:
    sock = tmp_path / "execd.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandlot.execd",
            "--listen",
            f"unix:{sock}",
            "--no-code",
            "--token",
            "abc",
            "--workdir",
            str(tmp_path),
        ],
    )
    try:
        assert wait_for(sock.exists)
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://execd") as c:
            assert wait_for(lambda: _ok(c))
            r = c.post("/command", json={"command": "pwd"}, headers={"X-EXECD-ACCESS-TOKEN": "abc"})
            assert str(tmp_path) in r.text
            assert c.get("/metrics").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    assert not sock.exists()


def _ok(c: httpx.Client) -> bool:
    try:
        return c.get("/ping").status_code == 200
    except httpx.HTTPError:
        return False


def test_finished_executions_hold_no_descriptors(execd) -> None:  # type: ignore[no-untyped-def]
    with execd.client() as c:
        c.post("/command", json={"command": "true"})
        before = psutil.Process(execd.proc.pid).num_fds()
        for i in range(60):
            c.post("/command", json={"command": f"echo {i}"})
        c.post("/command", json={"command": "sleep 0.1", "background": True})
        time.sleep(0.5)
        after = psutil.Process(execd.proc.pid).num_fds()
    assert after - before < 10, (before, after)
