"""Issue 9 (execd side): what released clients observe of commands, sessions and files matches
the reference execd (``/work/ref/components/execd``; see docs/compatibility-execd.md).

Each test is named after the reference behaviour it pins and drives a real sandbox of a real
``sandlot serve`` through the released Python SDK (async and sync), raw HTTP, or the npm
JavaScript SDK (``@alibaba-group/opensandbox``, installed by the ``js_sdk`` fixture).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from opensandbox import Sandbox, SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.constants import DEFAULT_EXECD_PORT
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import MoveEntry, SearchEntry, WriteEntry

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer

pytestmark = [pytest.mark.timeout(900), pytest.mark.heavy_backends("docker", "runsc")]

# Every framing case of the reference's readFromPos in one command: \r\n once, \r alone,
# a blank line (sent as "\n"), \r\n after a blank, an unterminated last line, and a
# 100 000-byte line (the reference holds a line of any length and sends it whole).
FRAMING = (
    r"printf 'a\r\nb\n\nc\rd\r'; printf 'x\n\r\ntail-1'; echo; "
    r"head -c 100000 /dev/zero | tr '\0' y; echo; printf 'no-newline'"
)
FRAMED = ["a", "b", "\n", "c", "d", "x", "\n", "tail-1", "y" * 100000, "no-newline"]

JS_SDK_VERSION = "0.1.11"
JS_SDK_DIR = Path(os.environ.get("SANDLOT_TEST_JS_SDK", "/var/tmp/sandlot-test/js-sdk"))


def sync_config(server: SandlotServer, *, proxy: bool = False) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=server.domain,
        api_key=server.api_key,
        use_server_proxy=proxy,
        request_timeout=timedelta(seconds=60),
    )


@pytest.fixture(scope="module")
def box(sandlot_server: SandlotServer) -> Iterator[str]:
    """One sandbox for the module (its id); every test connects to it."""
    sandbox = SandboxSync.create(
        COMPAT_IMAGE,
        connection_config=sync_config(sandlot_server),
        ready_timeout=timedelta(seconds=120),
        timeout=timedelta(minutes=30),
    )
    try:
        yield sandbox.id
    finally:
        try:
            sandbox.kill()
        finally:
            sandbox.close()


async def connect(server: SandlotServer, sid: str, *, proxy: bool = False) -> Sandbox:
    return await Sandbox.connect(sid, connection_config=server.sdk_config(proxy=proxy))


def texts(messages: list[Any]) -> list[str]:
    return [m.text for m in messages]


def raw_events(server: SandlotServer, sid: str, path: str, body: dict[str, Any], *,
               proxy: bool = False) -> list[dict[str, Any]]:
    """The events of an SSE route, read off the wire."""
    sandbox = SandboxSync.connect(sid, connection_config=sync_config(server, proxy=proxy))
    try:
        ep = sandbox.get_endpoint(DEFAULT_EXECD_PORT)
    finally:
        sandbox.close()
    headers = {"OPEN-SANDBOX-API-KEY": server.api_key, **ep.headers}
    events: list[dict[str, Any]] = []
    with httpx.Client(timeout=120) as client, client.stream(
        "POST", f"http://{ep.endpoint}{path}", headers=headers, json=body
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:  # the reference's framing: every non-empty line is one JSON event
                events.append(json.loads(line))
    return events


def execd_http(server: SandlotServer, sid: str) -> httpx.Client:
    """A raw client on the sandbox's execd (direct endpoint)."""
    sandbox = SandboxSync.connect(sid, connection_config=sync_config(server))
    try:
        ep = sandbox.get_endpoint(DEFAULT_EXECD_PORT)
    finally:
        sandbox.close()
    return httpx.Client(base_url=f"http://{ep.endpoint}", headers=dict(ep.headers), timeout=60)


# --- commands: framing and ends --------------------------------------------------------------
@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
async def test_output_is_one_event_per_line_terminator_stripped(
    sandlot_server: SandlotServer, box: str, proxy: bool
) -> None:
    sandbox = await connect(sandlot_server, box, proxy=proxy)
    try:
        ex = await sandbox.commands.run(FRAMING + "; echo err-line >&2")
        assert texts(ex.logs.stdout) == FRAMED
        assert texts(ex.logs.stderr) == ["err-line"]
        assert ex.exit_code == 0 and ex.complete is not None and ex.error is None
        # The quick start's read: stdout[0].text is the line, not "2\n".
        quick = await sandbox.commands.run("python -c 'print(1 + 1)'")
        assert quick.logs.stdout[0].text == "2"
    finally:
        await sandbox.close()


def test_sync_sdk_sees_the_same_lines_and_ends(sandlot_server: SandlotServer, box: str) -> None:
    sandbox = SandboxSync.connect(box, connection_config=sync_config(sandlot_server))
    try:
        ex = sandbox.commands.run(FRAMING)
        assert texts(ex.logs.stdout) == FRAMED and ex.complete is not None
        bad = sandbox.commands.run("echo before; exit 3")
        assert texts(bad.logs.stdout) == ["before"]
        assert bad.exit_code == 3 and bad.complete is None
        assert bad.error is not None and bad.error.name == "CommandExecError"
        assert bad.error.value == "3" and bad.error.traceback == ["exit status 3"]
    finally:
        sandbox.close()


def test_failure_ends_with_error_only_success_with_complete_on_the_wire(
    sandlot_server: SandlotServer, box: str
) -> None:
    ok = raw_events(sandlot_server, box, "/command", {"command": "echo hi"})
    assert [e["type"] for e in ok] == ["init", "stdout", "execution_complete"]
    assert ok[1]["text"] == "hi" and isinstance(ok[-1]["execution_time"], int)
    bad = raw_events(sandlot_server, box, "/command", {"command": "exit 4"}, proxy=True)
    assert [e["type"] for e in bad] == ["init", "error"]
    assert bad[-1]["error"] == {
        "ename": "CommandExecError", "evalue": "4", "traceback": ["exit status 4"]
    }


async def test_timeout_is_sigkill_exit_minus_one_signal_killed(
    sandlot_server: SandlotServer, box: str
) -> None:
    sandbox = await connect(sandlot_server, box)
    try:
        ex = await sandbox.commands.run(
            "trap '' TERM; echo start; sleep 60; echo never",
            opts=RunCommandOpts(timeout=timedelta(milliseconds=700)),
        )
        assert texts(ex.logs.stdout) == ["start"]
        assert ex.exit_code == -1 and ex.complete is None
        assert ex.error is not None and ex.error.traceback == ["signal: killed"]
        signalled = await sandbox.commands.run("echo hi; kill -TERM $$")
        assert signalled.exit_code == -1  # Go's ExitCode() after a signal, not 128+N
        assert signalled.error is not None and signalled.error.traceback == ["signal: terminated"]
    finally:
        await sandbox.close()


def test_interrupt_is_sigterm_then_sigkill_and_answers_after_the_process_is_gone(
    sandlot_server: SandlotServer, box: str
) -> None:
    sandbox = SandboxSync.connect(box, connection_config=sync_config(sandlot_server))
    try:
        stubborn = sandbox.commands.run(
            "trap '' TERM INT; echo trapped; while true; do sleep 0.1; done",
            opts=RunCommandOpts(background=True),
        )
        assert stubborn.id
        # Interrupt only once the trap is set: a SIGTERM that beats bash to its `trap` (seen
        # under gVisor, where the shell starts slower) ends it as "terminated", rightly.
        for _ in range(300):
            if "trapped" in sandbox.commands.get_background_command_logs(stubborn.id).content:
                break
            time.sleep(0.1)
        sandbox.commands.interrupt(stubborn.id)
        status = sandbox.commands.get_command_status(stubborn.id)  # right after: already gone
        assert status.running is False
        assert status.exit_code == -1 and status.error == "signal: killed"
        polite = sandbox.commands.run("sleep 60", opts=RunCommandOpts(background=True))
        assert polite.id
        sandbox.commands.interrupt(polite.id)
        status = sandbox.commands.get_command_status(polite.id)
        assert status.running is False and status.error == "signal: terminated"
        with pytest.raises(Exception):  # noqa: B017 - the reference answers 500 (not running)
            sandbox.commands.interrupt(polite.id)
    finally:
        sandbox.close()


# --- bash sessions --------------------------------------------------------------------------
async def test_bash_session_runs_restore_env_and_cwd_like_the_reference(
    sandlot_server: SandlotServer, box: str
) -> None:
    sandbox = await connect(sandlot_server, box)
    commands = sandbox.commands
    sid = await commands.create_session(working_directory="/tmp/wire-session")
    try:
        first = await commands.run_in_session(
            sid, "mkdir -p sub && cd sub && export GREETING=hi; LOCAL=no; echo err >&2"
        )
        assert first.id == sid  # the init event carries the session id
        assert texts(first.logs.stdout) == ["err"] and first.logs.stderr == []  # merged
        again = await commands.run_in_session(sid, 'pwd; echo "$GREETING/${LOCAL:-unset}"')
        assert texts(again.logs.stdout) == ["/tmp/wire-session/sub", "hi/unset"]
        blank = await commands.run_in_session(sid, "echo one; echo; printf 'two\\r\\n'")
        assert texts(blank.logs.stdout) == ["one", "two"]  # blank lines are not sent
        ended = await commands.run_in_session(sid, "echo bye; exit 5")
        assert ended.exit_code == 5 and ended.complete is None
        assert ended.error is not None and ended.error.value == "5"
        alive = await commands.run_in_session(sid, "echo still-here; pwd")  # exit ended one run
        assert texts(alive.logs.stdout) == ["still-here", "/tmp/wire-session/sub"]
        moved = await commands.run_in_session(sid, "true", working_directory="/usr")
        assert moved.complete is not None
        kept = await commands.run_in_session(sid, "pwd")  # a run's cwd persists
        assert texts(kept.logs.stdout) == ["/usr"]
        # Runs may overlap: the first waits for a file only the second creates.
        waiter = asyncio.create_task(commands.run_in_session(
            sid, "while [ ! -e /tmp/wire-session/flag ]; do sleep 0.05; done; echo waited",
            timeout=timedelta(seconds=60),
        ))
        await asyncio.sleep(0.3)
        maker = await commands.run_in_session(sid, "touch /tmp/wire-session/flag; echo made")
        assert texts(maker.logs.stdout) == ["made"]
        assert texts((await waiter).logs.stdout) == ["waited"]
    finally:
        await commands.delete_session(sid)
        await sandbox.close()


# --- files and directories ------------------------------------------------------------------
async def test_files_behave_as_the_reference(sandlot_server: SandlotServer, box: str) -> None:
    sandbox = await connect(sandlot_server, box)
    files = sandbox.files
    root = "/tmp/wire-files"
    try:
        await files.write_files([
            WriteEntry(path=f"{root}/lines.txt", data="l1\r\nl2\nl3\n"),
            WriteEntry(path=f"{root}/a.py", data="x"),
            WriteEntry(path=f"{root}/deep/b.txt", data="y"),
            WriteEntry(path=f"{root}/deep/c.md", data="z"),
        ])
        # Line reads: endings stripped, joined by \n, none after the last line.
        assert await files.read_file(f"{root}/lines.txt", offset=2, limit=5) == "l2\nl3"
        # Search: doublestar against base names, {a,b} alternatives.
        found = await files.search(SearchEntry(path=root, pattern="*.{py,md}"))
        assert sorted(os.path.basename(e.path) for e in found) == ["a.py", "c.md"]
        assert await files.search(SearchEntry(path=root, pattern="deep/*.txt")) == []
        # Deleting what is not there is not an error.
        await files.delete_files([f"{root}/no-such-file"])
        await files.delete_directories([f"{root}/no-such-dir"])
        # mv creates the destination's parents.
        await files.move_files([MoveEntry(src=f"{root}/a.py", dest=f"{root}/new/parents/a.py")])
        assert await files.read_file(f"{root}/new/parents/a.py") == "x"
        # /files/info describes a symlink itself; ~ and $VAR are expanded.
        await sandbox.commands.run(f"ln -s {root}/deep {root}/link && echo hi > ~/home-file")
        info = await files.get_file_info([f"{root}/link"])
        assert info[f"{root}/link"].entry_type == "symlink"
        assert await files.read_file("~/home-file") == "hi\n"
        assert await files.read_file("$HOME/home-file") == "hi\n"
    finally:
        await sandbox.commands.run(f"rm -rf {root} ~/home-file")
        await sandbox.close()


def test_non_ascii_download_names_are_rfc5987_encoded(
    sandlot_server: SandlotServer, box: str
) -> None:
    sandbox = SandboxSync.connect(box, connection_config=sync_config(sandlot_server))
    try:
        sandbox.files.write_files([WriteEntry(path="/tmp/测试文件.txt", data="cjk")])
        assert sandbox.files.read_file("/tmp/测试文件.txt") == "cjk"
    finally:
        sandbox.close()
    with execd_http(sandlot_server, box) as c:
        r = c.get("/files/download", params={"path": "/tmp/测试文件.txt"})
        assert r.status_code == 200 and r.content == b"cjk"
        encoded = urllib.parse.quote("测试文件.txt")
        assert r.headers["content-disposition"] == (
            f"attachment; filename=\"{encoded}\"; filename*=UTF-8''{encoded}"
        )
        r = c.get("/files/download", params={"path": "/tmp/测试文件.txt"},
                  headers={"Range": "bytes=50-"})
        assert r.status_code == 416 and r.json() == {"code": "UNKNOWN"}


# --- the npm JavaScript SDK -----------------------------------------------------------------
@pytest.fixture(scope="session")
def js_sdk() -> Path:
    """``@alibaba-group/opensandbox`` from npm in a cache directory outside the repository."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the JavaScript SDK")
    package = JS_SDK_DIR / "node_modules" / "@alibaba-group" / "opensandbox" / "package.json"
    if not package.exists() or json.loads(package.read_text())["version"] != JS_SDK_VERSION:
        JS_SDK_DIR.mkdir(parents=True, exist_ok=True)
        if not (JS_SDK_DIR / "package.json").exists():
            (JS_SDK_DIR / "package.json").write_text('{"private": true}\n')
        subprocess.run(
            ["npm", "install", "--no-fund", "--no-audit",
             f"@alibaba-group/opensandbox@{JS_SDK_VERSION}"],
            cwd=JS_SDK_DIR, check=True, capture_output=True, timeout=600,
        )
    return JS_SDK_DIR


# The README quick start (printing stdout[0].text), then the reference's shapes of a failure
# and of the framing, each printed as one JSON line for the test to read.
JS_SCRIPT = """
import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";

const config = new ConnectionConfig({ domain: process.env.DOMAIN, apiKey: process.env.KEY,
                                      useServerProxy: process.env.PROXY === "1" });
const sandbox = await Sandbox.connect({ sandboxId: process.env.SID, connectionConfig: config });
const execution = await sandbox.commands.run("echo 'Hello Sandbox!'");
console.log(execution.logs.stdout[0]?.text);
const bad = await sandbox.commands.run("echo out; exit 3");
console.log(JSON.stringify({ exitCode: bad.exitCode, complete: bad.complete ?? null,
                             error: bad.error, stdout: bad.logs.stdout.map((m) => m.text) }));
const framed = await sandbox.commands.run(process.env.FRAMING);
console.log(JSON.stringify(framed.logs.stdout.map((m) => m.text)));
await sandbox.close();
"""


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
def test_js_sdk_quickstart_prints_the_line(
    sandlot_server: SandlotServer, box: str, js_sdk: Path, proxy: bool
) -> None:
    script = js_sdk / "wire-execd-check.mjs"
    script.write_text(JS_SCRIPT)
    p = subprocess.run(
        ["node", str(script)], cwd=js_sdk, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DOMAIN": sandlot_server.domain, "KEY": sandlot_server.api_key,
             "SID": box, "PROXY": "1" if proxy else "0", "FRAMING": FRAMING},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    first, failure, framed = p.stdout.splitlines()[:3]
    assert first == "Hello Sandbox!"
    bad = json.loads(failure)
    assert bad["exitCode"] == 3 and bad["complete"] is None and bad["stdout"] == ["out"]
    assert bad["error"]["name"] == "CommandExecError" and bad["error"]["value"] == "3"
    assert json.loads(framed) == FRAMED
