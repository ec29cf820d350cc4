"""The released SDK's ``commands`` API against a real execd."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from opensandbox.models.execd import ExecutionHandlers, RunCommandOpts

from tests.execd.conftest import Execd


async def test_run_collects_stdout_stderr_and_exit_code(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ok = await commands.run("echo hello; echo oops >&2")
    assert ok.exit_code == 0
    assert [m.text for m in ok.logs.stdout] == ["hello"]  # one message per line, no newline
    assert [m.text for m in ok.logs.stderr] == ["oops"]
    assert ok.id and ok.complete is not None and ok.error is None

    bad = await commands.run("exit 7")
    assert bad.exit_code == 7
    assert bad.error is not None and bad.error.value == "7"
    assert bad.error.traceback == ["exit status 7"]
    assert bad.complete is None  # a failure ends with the error alone


async def test_argv_mode_passes_arguments_literally(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run(["printf", "%s|", "$HOME", "a b", ""])
    assert ex.exit_code == 0
    assert "".join(m.text for m in ex.logs.stdout) == "$HOME|a b||"
    missing = await commands.run(["/nonexistent/binary"])
    assert missing.exit_code == 127


async def test_cwd_envs_and_closed_stdin(sdk, execd: Execd, tmp_path) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run(
        'pwd; echo "$FOO"; cat; echo "stdin-done"',
        opts=RunCommandOpts(working_directory=str(tmp_path), envs={"FOO": "bar baz"}),
    )
    assert ex.exit_code == 0
    assert [m.text for m in ex.logs.stdout] == [str(tmp_path), "bar baz", "stdin-done"]


async def test_private_env_is_not_visible(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run("env")
    out = "".join(m.text for m in ex.logs.stdout)
    assert "SANDLOT_EXECD_TOKEN" not in out
    assert "test-token-123" not in out


async def test_timeout_kills_the_command(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    t0 = time.monotonic()
    ex = await commands.run(
        "echo start; sleep 30; echo never", opts=RunCommandOpts(timeout=timedelta(milliseconds=500))
    )
    assert time.monotonic() - t0 < 20
    # As the reference: SIGKILL, exit code -1, "signal: killed", no execution_complete.
    assert ex.exit_code == -1 and ex.complete is None
    assert ex.error is not None and ex.error.traceback == ["signal: killed"]
    assert [m.text for m in ex.logs.stdout] == ["start"]


async def test_streaming_handlers_see_output_before_exit(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    seen: list[tuple[str, float]] = []
    done = asyncio.Event()

    async def on_stdout(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append((msg.text, time.monotonic()))

    async def on_complete(_c) -> None:  # type: ignore[no-untyped-def]
        done.set()

    start = time.monotonic()
    ex = await commands.run(
        "echo first; sleep 1.5; echo second",
        handlers=ExecutionHandlers(on_stdout=on_stdout, on_execution_complete=on_complete),
    )
    assert ex.exit_code == 0 and done.is_set()
    texts = [t for t, _ in seen]
    assert texts == ["first", "second"]
    # "first" must have arrived while the command was still sleeping.
    first_at = next(ts for t, ts in seen if "first" in t)
    assert first_at - start < time.monotonic() - start - 1.0


async def test_background_status_logs_and_cursor(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.2; done; echo warn >&2",
        opts=RunCommandOpts(background=True),
    )
    assert ex.id
    status = await commands.get_command_status(ex.id)
    assert status.id == ex.id
    for _ in range(200):
        status = await commands.get_command_status(ex.id)
        if not status.running:
            break
        await asyncio.sleep(0.05)
    assert status.running is False and status.exit_code == 0
    assert status.finished_at is not None
    logs = await commands.get_background_command_logs(ex.id)
    assert logs.content == "line1\nline2\nline3\nwarn\n"
    assert logs.cursor == 4
    tail = await commands.get_background_command_logs(ex.id, cursor=2)
    assert tail.content == "line3\nwarn\n"
    assert tail.cursor == 4
    empty = await commands.get_background_command_logs(ex.id, cursor=4)
    assert empty.content == ""


async def test_incremental_logs_while_running(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run(
        "echo a; sleep 0.5; echo b; sleep 0.5; echo c", opts=RunCommandOpts(background=True)
    )
    collected = ""
    cursor = 0
    for _ in range(100):
        part = await commands.get_background_command_logs(ex.id, cursor=cursor)
        collected += part.content
        cursor = part.cursor if part.cursor is not None else cursor
        status = await commands.get_command_status(ex.id)
        if not status.running and cursor >= 3:
            break
        await asyncio.sleep(0.1)
    assert collected == "a\nb\nc\n"


async def test_interrupt_stops_the_process_group(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run("sleep 60 & sleep 60; wait", opts=RunCommandOpts(background=True))
    await asyncio.sleep(0.3)
    await commands.interrupt(ex.id)
    for _ in range(200):
        status = await commands.get_command_status(ex.id)
        if not status.running:
            break
        await asyncio.sleep(0.05)
    assert status.running is False
    assert status.exit_code != 0


async def test_interrupt_is_sigterm_then_sigkill_and_answers_once_it_is_gone(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    ex = await commands.run(
        "trap '' INT TERM; echo ready; while true; do sleep 0.1; done",
        opts=RunCommandOpts(background=True),
    )
    await asyncio.sleep(0.3)
    await commands.interrupt(ex.id)  # returns after the SIGKILL that follows the ignored TERM
    status = await commands.get_command_status(ex.id)
    assert status.running is False
    assert status.exit_code == -1 and status.error == "signal: killed"
    plain = await commands.run("sleep 30", opts=RunCommandOpts(background=True))
    await asyncio.sleep(0.2)
    await commands.interrupt(plain.id)
    status = await commands.get_command_status(plain.id)
    assert status.running is False and status.error == "signal: terminated"


async def test_set_env_persists_for_later_commands(sdk) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    await commands.set_env("SANDLOT_PERSISTED", "it's here")
    ex = await commands.run('echo "$SANDLOT_PERSISTED"')
    assert [m.text for m in ex.logs.stdout] == ["it's here"]


async def test_unknown_command_id_is_not_found(sdk) -> None:  # type: ignore[no-untyped-def]
    from opensandbox.exceptions import SandboxException

    commands, _, _ = sdk
    with pytest.raises(SandboxException):
        await commands.get_command_status("does-not-exist")


async def test_sessions_keep_cwd_and_exports(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    commands, _, _ = sdk
    sid = await commands.create_session(working_directory=str(tmp_path))
    try:
        r1 = await commands.run_in_session(sid, "mkdir -p sub && cd sub && export GREETING=hi")
        assert r1.exit_code == 0 and r1.id == sid  # the init event carries the session id
        r2 = await commands.run_in_session(sid, 'pwd; echo "$GREETING"')
        assert [m.text for m in r2.logs.stdout] == [f"{tmp_path}/sub", "hi"]
        r3 = await commands.run_in_session(sid, "echo err >&2; false")
        assert r3.exit_code == 1 and r3.complete is None
        assert [m.text for m in r3.logs.stdout] == ["err"] and r3.logs.stderr == []  # merged
        r4 = await commands.run_in_session(sid, "pwd", working_directory="/")
        assert [m.text for m in r4.logs.stdout] == ["/"]
        r5 = await commands.run_in_session(sid, "pwd")  # a run's cwd persists
        assert [m.text for m in r5.logs.stdout] == ["/"]
        r6 = await commands.run_in_session(sid, "sleep 30", timeout=timedelta(milliseconds=300))
        assert r6.exit_code == -1
        r7 = await commands.run_in_session(sid, "echo still-alive")
        assert [m.text for m in r7.logs.stdout] == ["still-alive"]
    finally:
        await commands.delete_session(sid)
