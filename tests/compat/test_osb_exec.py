"""``osb command ...`` and ``osb file ...`` against ``sandlot serve`` and a real sandbox.

osb runs as a subprocess configured the way users do it (``OPEN_SANDBOX_DOMAIN``/
``OPEN_SANDBOX_API_KEY``, ``--config`` naming a file that does not exist). Structured
commands use ``-o json`` so assertions are exact; foreground ``command run``/``session run``
and ``file cat`` only offer raw output, which is the command's own stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer

# make test: oci; make test-heavy: docker and runsc too
pytestmark = pytest.mark.heavy_backends("docker", "runsc")


def osb(
    server: SandlotServer, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("osb", path=str(Path(sys.executable).parent)) or "osb"
    return subprocess.run(
        [exe, "--config", str(server.data_dir / "osb-none.toml"), *args],
        env=server.env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=180,
    )


def ok(server: SandlotServer, *args: str, stdin: str | None = None) -> str:
    p = osb(server, *args, stdin=stdin)
    assert p.returncode == 0, f"osb {args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


def ok_json(server: SandlotServer, *args: str, stdin: str | None = None) -> Any:
    """Run with ``-o json`` (placed before any ``--`` payload) and parse stdout."""
    cut = args.index("--") if "--" in args else len(args)
    return json.loads(ok(server, *args[:cut], "-o", "json", *args[cut:], stdin=stdin))


def failed(server: SandlotServer, *args: str) -> subprocess.CompletedProcess[str]:
    p = osb(server, *args)
    assert p.returncode != 0, f"osb {args} unexpectedly succeeded:\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def sid(sandlot_server: SandlotServer) -> Iterator[str]:
    created = ok_json(sandlot_server, "sandbox", "create", "-i", COMPAT_IMAGE, "-t", "30m")
    sandbox_id = str(created["id"])
    try:
        yield sandbox_id
    finally:
        with sandlot_server.client() as c:
            c.delete(f"/v1/sandboxes/{sandbox_id}")


def wait_finished(server: SandlotServer, sid: str, eid: str, limit: float = 120) -> Any:
    """Poll ``osb command status`` until the execution stops running (bounded)."""
    deadline = time.monotonic() + limit
    while True:
        status = ok_json(server, "command", "status", sid, eid)
        if not status["running"]:
            return status
        assert time.monotonic() < deadline, f"execution {eid} still running: {status}"
        time.sleep(0.3)


def test_command_run_foreground(sandlot_server: SandlotServer, sid: str) -> None:
    assert ok(sandlot_server, "command", "run", sid, "--", "echo", "hello", "world") == (
        "hello world\n"
    )

    # A failing command: its stdout/stderr still stream, osb exits 1 and names the code.
    p = failed(
        sandlot_server, "command", "run", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 3"
    )
    assert p.returncode == 1
    assert p.stdout == "out\n"
    assert "err\n" in p.stderr and "CommandExecError: 3" in p.stderr

    # -w sets the working directory; -o raw is the only foreground format.
    assert ok(sandlot_server, "command", "run", sid, "-w", "/tmp", "-o", "raw", "--", "pwd") == (
        "/tmp\n"
    )

    # The default payload is one shell string with every word shell-quoted: $HOME stays literal.
    assert ok(sandlot_server, "command", "run", sid, "--", "printf", "%s|", "$HOME", "a b") == (
        "$HOME|a b|\n"
    )
    # --argv sends a literal argv list: empty strings survive.
    assert ok(
        sandlot_server, "command", "run", sid, "--argv", "--", "printf", "%s|", "x", "", "a b"
    ) == ("x||a b|\n")

    # -t bounds the command: it is killed (SIGKILL) and, as with the reference, osb reports the
    # error with the exit code -1 of a signalled process.
    p = failed(
        sandlot_server, "command", "run", sid, "-t", "2s", "--", "sh", "-c", "echo start; sleep 60"
    )
    assert p.stdout == "start\n"
    assert "CommandExecError: -1" in p.stderr


def test_command_background_status_logs(sandlot_server: SandlotServer, sid: str) -> None:
    started = ok_json(
        sandlot_server,
        "command",
        "run",
        sid,
        "-d",
        "--",
        "sh",
        "-c",
        "echo one; echo two >&2; echo three; exit 4",
    )
    assert started["mode"] == "background" and started["sandbox_id"] == sid
    eid = started["execution_id"]
    assert eid

    status = wait_finished(sandlot_server, sid, eid)
    assert status["id"] == eid
    assert status["exit_code"] == 4
    assert status["content"] == "sh -c 'echo one; echo two >&2; echo three; exit 4'"
    assert status["started_at"] and status["finished_at"]

    logs = ok_json(sandlot_server, "command", "logs", sid, eid)
    assert sorted(logs["content"].splitlines()) == ["one", "three", "two"]
    cursor = logs["cursor"]
    assert isinstance(cursor, int) and cursor > 0
    # Reading from the returned cursor yields nothing new.
    assert (
        ok_json(sandlot_server, "command", "logs", sid, eid, "--cursor", str(cursor))["content"]
        == ""
    )
    raw = ok(sandlot_server, "command", "logs", sid, eid, "-o", "raw")
    assert sorted(raw.split()) == ["one", "three", "two"]

    # An unknown execution id is an error, not an empty status.
    p = failed(sandlot_server, "command", "status", sid, "0" * 32, "-o", "json")
    assert "not found" in (p.stdout + p.stderr).lower()


def processes(server: SandlotServer, sid: str) -> str:
    """Every command line in the sandbox's process table, space-joined."""
    script = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo"
    return ok(server, "command", "run", sid, "--", "sh", "-c", script)


def test_command_interrupt(sandlot_server: SandlotServer, sid: str) -> None:
    marker = "4711"
    started = ok_json(sandlot_server, "command", "run", sid, "-d", "--", "sleep", marker)
    eid = started["execution_id"]
    status = ok_json(sandlot_server, "command", "status", sid, eid)
    assert status["running"] is True and status["exit_code"] is None
    assert f"sleep {marker}" in processes(sandlot_server, sid)

    interrupted = ok_json(sandlot_server, "command", "interrupt", sid, eid)
    assert interrupted == {"status": "ok", "message": f"Interrupted: {eid}"}

    status = wait_finished(sandlot_server, sid, eid, limit=60)
    assert status["exit_code"] not in (None, 0)
    assert status["finished_at"]
    # The sleep is gone from the sandbox's process table.
    assert f"sleep {marker}" not in processes(sandlot_server, sid)


def test_command_session(sandlot_server: SandlotServer, sid: str) -> None:
    created = ok_json(sandlot_server, "command", "session", "create", sid, "-w", "/tmp")
    assert created["sandbox_id"] == sid and created["working_directory"] == "/tmp"
    session = created["session_id"]
    assert session

    def run(*cmd: str) -> str:
        return ok(sandlot_server, "command", "session", "run", sid, session, "--", *cmd)

    assert run("pwd") == "/tmp\n"
    assert run("mkdir", "-p", "/srv/sess") == ""
    assert run("cd", "/srv/sess") == ""
    assert run("export", "SESSION_VAR=bar42") == ""
    assert run("pwd") == "/srv/sess\n"  # cwd persists across runs
    assert run("printenv", "SESSION_VAR") == "bar42\n"  # so do exported variables
    # -w overrides the directory for that run.
    assert (
        ok(sandlot_server, "command", "session", "run", sid, session, "-w", "/", "--", "pwd")
        == "/\n"
    )
    # A failing command in a session reports its exit code and leaves the session usable.
    p = failed(
        sandlot_server, "command", "session", "run", sid, session, "--", "sh", "-c", "exit 5"
    )
    assert "CommandExecError: 5" in p.stderr
    assert run("printenv", "SESSION_VAR") == "bar42\n"

    # The session's state does not leak into ordinary commands.
    failed(sandlot_server, "command", "run", sid, "--", "printenv", "SESSION_VAR")

    deleted = ok_json(sandlot_server, "command", "session", "delete", sid, session)
    assert deleted == {"status": "ok", "message": f"Deleted session: {session}"}
    p = failed(sandlot_server, "command", "session", "run", sid, session, "--", "pwd")
    assert "not found" in (p.stdout + p.stderr).lower()


def info(server: SandlotServer, sid: str, *paths: str) -> dict[str, Any]:
    rows = ok_json(server, "file", "info", sid, *paths)
    assert isinstance(rows, list)
    return {row["path"]: row for row in rows}


def test_file_commands(sandlot_server: SandlotServer, sid: str, tmp_path: Path) -> None:
    s = sandlot_server
    made = ok_json(s, "file", "mkdir", sid, "/work/a", "/work/b/c", "--mode", "750")
    assert made == [
        {"path": "/work/a", "status": "created"},
        {"path": "/work/b/c", "status": "created"},
    ]

    # write: from --content and from stdin, with a mode and an owner.
    text = "hello sandbox\nline two\n"
    written = ok_json(s, "file", "write", sid, "/work/a/hello.txt", "-c", text)
    assert written == {"status": "ok", "message": "Written: /work/a/hello.txt"}
    ok_json(s, "file", "write", sid, "/work/a/stdin.txt", "--mode", "600", stdin="from stdin\n")
    ok_json(
        s, "file", "write", sid, "/work/a/own.txt", "-c", "x",
        "--mode", "644", "--owner", "nobody", "--group", "nogroup",
    )  # fmt: skip
    assert ok(s, "file", "cat", sid, "/work/a/hello.txt") == text
    assert ok(s, "file", "cat", sid, "/work/a/stdin.txt", "-o", "raw") == "from stdin\n"

    got = info(s, sid, "/work/a/hello.txt", "/work/a/stdin.txt", "/work/a/own.txt", "/work/b/c")
    assert set(got) == {"/work/a/hello.txt", "/work/a/stdin.txt", "/work/a/own.txt", "/work/b/c"}
    assert got["/work/a/hello.txt"]["size"] == len(text.encode())
    assert got["/work/a/hello.txt"]["entry_type"] == "file"
    assert got["/work/a/stdin.txt"]["mode"] == 600 and got["/work/a/stdin.txt"]["size"] == 11
    assert (got["/work/a/own.txt"]["owner"], got["/work/a/own.txt"]["group"]) == (
        "nobody",
        "nogroup",
    )
    assert got["/work/a/own.txt"]["mode"] == 644
    assert got["/work/b/c"]["entry_type"] == "directory" and got["/work/b/c"]["mode"] == 750
    # Cross-check with the sandbox's own view (coreutils' stat: its statx flags work on
    # gVisor 2024, which install-deps.sh installs; Debian bookworm's own 2022 runsc refused them).
    assert ok(s, "command", "run", sid, "--", "stat", "-c", "%a %U",
              "/work/a/stdin.txt") == "600 root\n"

    # upload/download: a binary file survives the round trip byte for byte.
    blob = os.urandom(300_000) + b"\x00\xff\n"
    local = tmp_path / "blob.bin"
    local.write_bytes(blob)
    up = ok_json(s, "file", "upload", sid, str(local), "/work/a/blob.bin")
    assert up["status"] == "ok"
    back = tmp_path / "dl" / "blob.bin"
    ok_json(s, "file", "download", sid, "/work/a/blob.bin", str(back))
    assert back.read_bytes() == blob
    assert info(s, sid, "/work/a/blob.bin")["/work/a/blob.bin"]["size"] == len(blob)
    # Downloading to stdout streams the bytes.
    assert ok(s, "file", "download", sid, "/work/a/stdin.txt", "/dev/stdout") == "from stdin\n"

    # search: glob under a directory, recursive, exact set of paths.
    found = ok_json(s, "file", "search", sid, "/work", "-p", "*.txt")
    assert sorted(r["path"] for r in found) == [
        "/work/a/hello.txt",
        "/work/a/own.txt",
        "/work/a/stdin.txt",
    ]
    assert ok_json(s, "file", "search", sid, "/work", "-p", "*.nomatch") == []

    # replace: edits in place.
    replaced = ok_json(
        s, "file", "replace", sid, "/work/a/hello.txt", "--old", "line two", "--new", "line 2"
    )
    assert replaced["status"] == "ok"
    assert ok(s, "file", "cat", sid, "/work/a/hello.txt") == "hello sandbox\nline 2\n"

    # chmod: mode (and owner) change.
    ok_json(s, "file", "chmod", sid, "/work/a/hello.txt", "--mode", "640", "--owner", "daemon")
    row = info(s, sid, "/work/a/hello.txt")["/work/a/hello.txt"]
    assert (row["mode"], row["owner"]) == (640, "daemon")

    # mv: the source is gone, the destination has the content.
    moved = ok_json(s, "file", "mv", sid, "/work/a/hello.txt", "/work/b/c/moved.txt")
    assert moved["status"] == "ok"
    assert ok(s, "file", "cat", sid, "/work/b/c/moved.txt") == "hello sandbox\nline 2\n"
    p = failed(s, "file", "cat", sid, "/work/a/hello.txt")
    assert "FILE_NOT_FOUND" in p.stderr

    # cat of a directory is an error.
    failed(s, "file", "cat", sid, "/work/a")

    # rm and rmdir.
    rm = ok_json(s, "file", "rm", sid, "/work/b/c/moved.txt", "/work/a/own.txt")
    assert rm == [
        {"path": "/work/b/c/moved.txt", "status": "deleted"},
        {"path": "/work/a/own.txt", "status": "deleted"},
    ]
    failed(s, "file", "info", sid, "/work/b/c/moved.txt", "-o", "json")
    rmdir = ok_json(s, "file", "rmdir", sid, "/work/b")
    assert rmdir == [{"path": "/work/b", "status": "removed"}]
    failed(s, "file", "info", sid, "/work/b", "-o", "json")
    remaining = ok_json(s, "file", "search", sid, "/work", "-p", "*")
    assert sorted(r["path"] for r in remaining) == ["/work/a/blob.bin", "/work/a/stdin.txt"]
