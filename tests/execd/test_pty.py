"""PTY sessions through a real WebSocket client, in the reference's frame protocol
(``pkg/web/controller/pty_ws.go``): binary output/replay/stdin frames, JSON control frames,
one client at a time with takeover."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.execd.conftest import Execd


def read_until(ws, needle: str, timeout: float = 15.0) -> tuple[str, list[Any]]:  # type: ignore[no-untyped-def]
    """Output (binary 0x01 frames) and JSON frames until ``needle`` (or ``<exit>``)."""
    text, frames = "", []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = ws.recv(timeout=max(0.05, deadline - time.monotonic()))
        if isinstance(raw, bytes):
            assert raw[0] == 0x01, raw[:9]
            text += raw[1:].decode(errors="replace")
            frames.append(raw)
        else:
            frame = json.loads(raw)
            frames.append(frame)
            if needle == "<exit>" and frame["type"] == "exit":
                return text, frames
        if needle != "<exit>" and needle in text:
            return text, frames
    raise AssertionError(f"{needle!r} not seen in {text!r}")


def stdin(ws, data: str) -> None:  # type: ignore[no-untyped-def]
    ws.send(b"\x00" + data.encode())  # the reference's binary stdin frame


def ws_url(execd: Execd, sid: str, query: str = "") -> str:
    return f"ws://{execd.endpoint}/pty/{sid}/ws{query}"


def test_pty_interactive_resize_signal_exit_in_the_reference_frames(execd: Execd) -> None:
    with execd.client() as c:
        r = c.post("/pty", json={"cwd": "/tmp", "cols": 100, "rows": 30})
        assert r.status_code == 201
        sid = r.json()["session_id"]
        try:
            with connect(ws_url(execd, sid), additional_headers=execd.headers) as ws:
                first = json.loads(ws.recv(timeout=5))
                assert first == {"type": "connected", "session_id": sid, "mode": "pty"}
                stdin(ws, "stty size; tty; echo X$((6*7))X\n")
                text, _ = read_until(ws, "X42X")
                assert "30 100" in text and "/dev/pts/" in text
                ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
                ws.send(json.dumps({"type": "stdin", "data": "stty size\n"}))  # JSON stdin too
                read_until(ws, "40 120")
                stdin(ws, "sleep 100\n")
                time.sleep(0.3)
                ws.send(json.dumps({"type": "signal", "signal": "SIGINT"}))
                stdin(ws, "echo after-$((1+1))\n")
                read_until(ws, "after-2")
                ws.send(json.dumps({"type": "ping"}))
                while True:
                    raw = ws.recv(timeout=5)
                    if isinstance(raw, str) and json.loads(raw) == {"type": "pong"}:
                        break
            # Dropped connection: the terminal keeps running.
            status = c.get(f"/pty/{sid}").json()
            assert status["running"] is True and status["output_offset"] > 0
            with connect(ws_url(execd, sid, "?since=0"), additional_headers=execd.headers) as ws:
                replay = ws.recv(timeout=5)
                assert isinstance(replay, bytes) and replay[0] == 0x03
                assert int.from_bytes(replay[1:9], "big") == 0 and b"X42X" in replay[9:]
                assert json.loads(ws.recv(timeout=5))["type"] == "connected"
                stdin(ws, "exit 5\n")
                _, frames = read_until(ws, "<exit>")
                assert frames[-1] == {"type": "exit", "exit_code": 5}
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
            assert c.get(f"/pty/{sid}").json()["running"] is False
        finally:
            assert c.delete(f"/pty/{sid}").status_code == 200
        assert c.get(f"/pty/{sid}").status_code == 404


def test_pty_one_client_at_a_time_and_takeover(execd: Execd) -> None:
    with execd.client() as c:
        sid = c.post("/pty", json={"command": "sleep 30"}).json()["session_id"]
        try:
            with connect(ws_url(execd, sid), additional_headers=execd.headers) as first:
                assert json.loads(first.recv(timeout=5))["type"] == "connected"
                with pytest.raises(InvalidStatus) as info:
                    connect(ws_url(execd, sid), additional_headers=execd.headers)
                assert info.value.response.status_code == 409
                assert json.loads(info.value.response.body)["code"] == "ALREADY_CONNECTED"
                with connect(ws_url(execd, sid, "?takeover=1"),
                             additional_headers=execd.headers) as second:
                    assert json.loads(second.recv(timeout=5))["type"] == "connected"
                    with pytest.raises(ConnectionClosed) as closed:
                        first.recv(timeout=5)
                    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
        finally:
            c.delete(f"/pty/{sid}")


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
            assert json.loads(info.value.response.body)["code"] == "CONTEXT_NOT_FOUND"
        finally:
            c.delete(f"/pty/{sid}")
    assert httpx.post(f"{execd.url}/pty", json={}).status_code == 401
