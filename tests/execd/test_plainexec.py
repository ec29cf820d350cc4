"""Plain commands skip bash's start-up; what the program sees and what the client gets match
``bash -c`` exactly, and anything bash would interpret still goes through bash."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from sandlot.execd.plainexec import bash_like_env, plain_argv
from tests.execd.conftest import Execd
from tests.execd.test_http_contract import sse_events


@pytest.mark.parametrize("command,argv", [
    ("true", ["true"]),
    ("  ls -la /tmp  ", ["ls", "-la", "/tmp"]),
    ("python3 -m http.server 8000", ["python3", "-m", "http.server", "8000"]),
    ("dd if=/dev/zero of=/dev/null bs=1M count=1", ["dd", "if=/dev/zero", "of=/dev/null",
                                                     "bs=1M", "count=1"]),
    ("./run.sh --flag=a,b:c@d+e%f", ["./run.sh", "--flag=a,b:c@d+e%f"]),
])
def test_plain_commands(command: str, argv: list[str]) -> None:
    assert plain_argv(command, {"PATH": "/usr/bin:/bin"}) == argv


@pytest.mark.parametrize("command", [
    "echo hi", "cd /tmp", "export A=1", "A=1 env", "ls *", "ls ~", "echo $HOME", "ls 'a b'",
    'ls "a"', "ls a\\ b", "ls > out", "ls | wc", "ls; ls", "ls && ls", "ls &", "(ls)",
    "ls # comment", "ls {a,b}", "ls\tx", "ls\nls", "exec ls", "pwd", "kill 1", "test -e /",
    "[ -e / ]", "source x", ". x", "if true; then :; fi", "time ls", "ls `x`", "ls $(x)", "",
])
def test_commands_bash_must_run(command: str) -> None:
    assert plain_argv(command, {"PATH": "/usr/bin:/bin"}) is None


def test_startup_files_and_exported_functions_keep_bash() -> None:
    assert plain_argv("ls", {"BASH_ENV": "/etc/x"}) is None
    assert plain_argv("ls", {"ENV": "/etc/x"}) is None
    assert plain_argv("ls", {"BASH_FUNC_ls%%": "() { echo shadowed; }"}) is None


def _env_seen(argv: list[str], env: dict[str, str], cwd: str, *, via_bash: bool) -> dict[str, str]:
    if via_bash:
        out = subprocess.run(["bash", "-c", " ".join(argv)], env=env, cwd=cwd,
                             capture_output=True, check=True).stdout
    else:
        direct = bash_like_env(env, argv, cwd)
        assert direct is not None
        out = subprocess.run(argv, env=direct, cwd=cwd, capture_output=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if item)


@pytest.mark.parametrize("extra", [
    {}, {"SHLVL": "3"}, {"SHLVL": "abc"}, {"SHLVL": "007"}, {"PWD": "/nonexistent"},
    {"PWD": "relative"}, {"PWD": "LINK"}, {"PWD": "DOTDOT"},
])
def test_the_program_sees_what_bash_would_give_it(tmp_path: Path, extra: dict[str, str]) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    env = {"PATH": "/usr/bin:/bin", "A": "1"}
    for key, value in extra.items():
        env[key] = {"LINK": str(link), "DOTDOT": f"{real}/../real"}.get(value, value)
    cwd = str(link)
    seen_bash = _env_seen(["env", "-0"], env, cwd, via_bash=True)
    seen_direct = _env_seen(["env", "-0"], env, cwd, via_bash=False)
    assert seen_direct == seen_bash
    assert {"PWD", "SHLVL", "_"} <= seen_direct.keys()


def test_a_program_given_by_path_sees_what_bash_would_give_it(tmp_path: Path) -> None:
    script = tmp_path / "show"
    script.write_text("#!/bin/sh\nexec env -0\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": "/usr/bin:/bin"}
    for program in ("./show", str(script)):
        assert (_env_seen([program], env, str(tmp_path), via_bash=False)
                == _env_seen([program], env, str(tmp_path), via_bash=True))


def test_not_found_and_relative_path_entries_are_left_to_bash() -> None:
    assert bash_like_env({"PATH": "/usr/bin:/bin"}, ["no-such-program-xyz"], "/") is None
    assert bash_like_env({"PATH": "bin:/usr/bin"}, ["ls"], "/") is None
    assert bash_like_env({"PATH": "/usr/bin::/bin"}, ["ls"], "/") is None


def _run(execd: Execd, command: str, cwd: str | None = None) -> tuple[str, str, int | None]:
    body: dict[str, object] = {"command": command}
    if cwd:
        body["cwd"] = cwd
    r = httpx.post(f"{execd.url}/command", json=body, headers=execd.headers, timeout=30)
    assert r.status_code == 200
    out = err = ""
    code = None
    for _, ev in sse_events(r.text):  # one event per line: put the newlines back
        if ev["type"] == "stdout":
            out += ev["text"] + "\n"
        elif ev["type"] == "stderr":
            err += ev["text"] + "\n"
        elif ev["type"] == "error":
            code = int(ev["error"]["evalue"])
    return out, err, code


def test_through_execd_results_match_bash(execd: Execd, tmp_path: Path) -> None:
    assert _run(execd, "true") == ("", "", None)
    assert _run(execd, "false")[2] == 1
    out, err, code = _run(execd, "no-such-program-xyz --help")
    assert code == 127 and "command not found" in err  # bash's own message
    noshebang = tmp_path / "noshebang"
    noshebang.write_text("echo from-script\nexit 3\n")
    noshebang.chmod(0o755)
    assert _run(execd, "./noshebang", cwd=str(tmp_path)) == ("from-script\n", "", 3)
    notexec = tmp_path / "notexec"
    notexec.write_text("echo x\n")
    out, err, code = _run(execd, "./notexec", cwd=str(tmp_path))
    assert code == 126 and "Permission denied" in err
    out, _, code = _run(execd, f"ls {tmp_path}")
    assert code is None and set(out.split()) == {"noshebang", "notexec"}
    assert os.path.exists(noshebang)
