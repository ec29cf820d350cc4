"""PTY sessions through a real WebSocket client: input, resize, signal, exit code, reattach."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.execd.conftest import Execd


def read_until(ws, needle: str, timeout: float = 15.0) -> tuple[str, list[dict]]:  # type: ignore[no-untyped-def]
    text, frames = "", []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = json.loads(ws.recv(timeout=max(0.05, deadline - time.monotonic())))
        frames.append(frame)
        text += frame.get("data", "")
        if needle in text or (needle == "<exit>" and frame["type"] == "exit"):
            return text, frames
    raise AssertionError(f"{needle!r} not seen in {text!r}")


def ws_url(execd: Execd, sid: str, since: int | None = None) -> str:
    q = f"?since={since}" if since is not None else ""
    return f"ws://{execd.endpoint}/pty/{sid}/ws{q}"


def test_pty_interactive_resize_signal_exit(execd: Execd) -> None:
    with execd.client() as c:
        r = c.post("/pty", json={"cwd": "/tmp", "cols": 100, "rows": 30})
        assert r.status_code == 201
        sid = r.json()["session_id"]
        try:
            with connect(ws_url(execd, sid), additional_headers=execd.headers) as ws:
                ws.send(json.dumps({"type": "stdin", "data": "stty size; tty; echo X$((6*7))X\n"}))
                text, frames = read_until(ws, "X42X")
                assert "30 100" in text and "/dev/pts/" in text
                ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
                ws.send(json.dumps({"type": "stdin", "data": "stty size\n"}))
                read_until(ws, "40 120")
                ws.send(json.dumps({"type": "stdin", "data": "sleep 100\n"}))
                time.sleep(0.3)
                ws.send(json.dumps({"type": "signal", "signal": "SIGINT"}))
                ws.send(json.dumps({"type": "stdin", "data": "echo after-$((1+1))\n"}))
                read_until(ws, "after-2")
                ws.send(json.dumps({"type": "ping"}))
                while json.loads(ws.recv(timeout=5))["type"] != "pong":
                    pass
            # Dropped connection: the terminal keeps running.
            status = c.get(f"/pty/{sid}").json()
            assert status["running"] is True and status["output_offset"] > 0
            with connect(ws_url(execd, sid, since=0), additional_headers=execd.headers) as ws:
                first = json.loads(ws.recv(timeout=5))
                assert first["type"] == "replay" and "X42X" in first["data"]
                ws.send(json.dumps({"type": "stdin", "data": "exit 5\n"}))
                _, frames = read_until(ws, "<exit>")
                assert frames[-1] == {"type": "exit", "exit_code": 5}
            assert c.get(f"/pty/{sid}").json()["running"] is False
        finally:
            assert c.delete(f"/pty/{sid}").status_code == 200
        assert c.get(f"/pty/{sid}").status_code == 404


def test_pty_websocket_needs_token_and_session(execd: Execd) -> None:
    with execd.client() as c:
        sid = c.post("/pty", json={"command": "sleep 30"}).json()["session_id"]
        try:
            with pytest.raises(InvalidStatus) as info:
                connect(ws_url(execd, sid))
            assert info.value.response.status_code == 401
            with pytest.raises(InvalidStatus) as info:
                connect(ws_url(execd, "nope"), additional_headers=execd.headers)
            assert info.value.response.status_code == 404
        finally:
            c.delete(f"/pty/{sid}")
    assert httpx.post(f"{execd.url}/pty", json={}).status_code == 401
