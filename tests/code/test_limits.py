"""Output caps, secret stripping, timeouts and keep-alives, against an execd with tight settings."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from .conftest import TOKEN, Execd, start_execd, stop_execd


@pytest.fixture(scope="module")
def tight() -> Iterator[Execd]:
    server = start_execd({
        "SANDLOT_CODE_PRESTART": "python",
        "SANDLOT_CODE_MAX_OUTPUT_BYTES": "2000",
        "SANDLOT_CODE_MAX_RESULT_BYTES": "500",
        "SANDLOT_CODE_EXEC_TIMEOUT": "3",
        "SANDLOT_CODE_KEEPALIVE": "0.5",
        "SANDLOT_CODE_STRIP_ENV": "*_SECRET*,*token*",
        "MY_APP_SECRET_KEY": "hunter2",
        "GITHUB_TOKEN": "ghp_x",
        "PLAIN_SETTING": "visible",
    })
    yield server
    stop_execd(server)


def stream(execd: Execd, body: dict) -> tuple[list[dict], list[str]]:
    """Events and raw lines of one POST /code."""
    events: list[dict] = []
    lines: list[str] = []
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", execd.url + "/code", json=body,
                           headers={"X-EXECD-ACCESS-TOKEN": TOKEN}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("{"):  # the reference's framing: JSON lines
                    events.append(json.loads(line))
    return events, lines


def test_stdout_is_capped_with_marker(tight):
    events, _ = stream(tight, {"code": "for i in range(2000): print('line', i)"})
    out = "".join(e["text"] for e in events if e["type"] == "stdout")
    assert "[output truncated" in out
    assert len(out.encode()) < 2000 + 200
    assert "line 1999" not in out
    assert events[-1]["type"] == "execution_complete"


def test_result_is_capped(tight):
    events, _ = stream(tight, {"code": "'x' * 5000"})
    result = next(e for e in events if e["type"] == "result")["results"]
    assert "[output truncated" in result["text"]  # text/plain travels as "text"
    assert len(result["text"]) < 700 and "text/plain" not in result


def test_secret_env_is_stripped(tight):
    events, _ = stream(tight, {"code": "import os; sorted(k for k in os.environ "
                                       "if k in ('MY_APP_SECRET_KEY', 'GITHUB_TOKEN', "
                                       "'PLAIN_SETTING'))"})
    result = next(e for e in events if e["type"] == "result")["results"]["text"]
    assert result == "['PLAIN_SETTING']"


def test_timeout_interrupts_and_context_survives(tight):
    with httpx.Client(base_url=tight.url, headers={"X-EXECD-ACCESS-TOKEN": TOKEN}) as c:
        ctx = c.post("/code/context", json={"language": "python"}).json()
    stream(tight, {"code": "z = 3", "context": ctx})
    events, lines = stream(tight, {"code": "import time\nwhile True: time.sleep(0.1)",
                                   "context": ctx})
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["error"]["ename"] == "TimeoutError"
    assert events[-1]["type"] == "error"  # cut short: the error ends the stream
    # Quiet for 3 s with keep-alives every 0.5 s: the stream carried some, as the reference's
    # ping events.
    assert any(e["type"] == "ping" for e in events)
    events, _ = stream(tight, {"code": "z + 1", "context": ctx})
    assert next(e for e in events if e["type"] == "result")["results"]["text"] == "4"


def test_request_timeout_field(tight):
    events, _ = stream(tight, {"code": "import time; time.sleep(30)", "timeout": 1})
    errors = [e for e in events if e["type"] == "error"]
    assert errors and errors[0]["error"]["ename"] == "TimeoutError"
    assert "1 s" in errors[0]["error"]["evalue"]
