"""Raw-HTTP behaviour: auth, error shapes, SSE framing, keep-alives, resume, binary output."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.execd.conftest import Execd, start_execd, stop_execd


def sse_events(text: str) -> list[tuple[str | None, dict]]:
    """(id, event) of every event in a body of either framing: the reference's (the JSON and a
    blank line) or standard SSE (``id:``/``data:`` lines), read as the SDKs read them."""
    out = []
    for frame in text.split("\n\n"):
        ev_id, data = None, None
        for line in frame.splitlines():
            if line.startswith("id: "):
                ev_id = line[4:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line.startswith("{"):
                data = json.loads(line)
        if data is not None:
            out.append((ev_id, data))
    return out


def test_ping_is_open_everything_else_needs_the_token(execd: Execd) -> None:
    assert httpx.get(f"{execd.url}/ping").status_code == 200
    for method, path in [("GET", "/metrics"), ("POST", "/command"), ("GET", "/files/info?path=/")]:
        r = httpx.request(method, f"{execd.url}{path}")
        assert r.status_code == 401
        assert r.json()["code"] == "UNAUTHORIZED" and r.json()["message"]
        r = httpx.request(method, f"{execd.url}{path}", headers={"X-EXECD-ACCESS-TOKEN": "wrong"})
        assert r.status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"command": ""}',
        b'{"command": "true", "timeout": -1}',
        b'{"argv": []}',
        b'{"command": "true", "cwd": "/does/not/exist"}',
        b'{"command": "x", "gid": 5}',
    ],
)
def test_bad_command_requests_are_400(execd: Execd, body: bytes) -> None:
    with execd.client() as c:
        r = c.post("/command", content=body)
    assert r.status_code == 400
    assert set(r.json()) == {"code", "message"}


def test_unknown_ids_get_the_reference_statuses_and_codes(execd: Execd) -> None:
    # Read off the reference's controllers (command.go, codeinterpreting.go, pty_controller.go).
    with execd.client() as c:
        for r, status, code in (
            (c.get("/command/status/nope"), 404, "INVALID_REQUEST_BODY"),
            (c.get("/command/nope/logs"), 400, "INVALID_REQUEST_BODY"),
            (c.delete("/command", params={"id": "nope"}), 500, "RUNTIME_ERROR"),
            (c.delete("/command"), 400, "MISSING_QUERY"),
            (c.post("/session/nope/run", json={"command": "true"}), 500, "RUNTIME_ERROR"),
            (c.delete("/session/nope"), 404, "CONTEXT_NOT_FOUND"),
            (c.get("/pty/nope"), 404, "CONTEXT_NOT_FOUND"),
        ):
            assert r.status_code == status, r.request.url
            assert set(r.json()) == {"code", "message"}
            assert r.json()["code"] == code, r.request.url
        r = c.get("/no/such/route")
        assert r.status_code == 404 and set(r.json()) == {"code", "message"}


def test_file_error_paths_get_the_reference_statuses_and_codes(
    execd: Execd, tmp_path: Path
) -> None:
    # Each status/code read off the reference's filesystem controllers: a missing path is
    # 404 FILE_NOT_FOUND, any other failure 500 RUNTIME_ERROR, a missing query 400
    # MISSING_QUERY, a malformed request 400 INVALID_REQUEST_BODY.
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "taken").write_text("y")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    missing = str(tmp_path / "missing")
    with execd.client() as c:
        cases = [
            (c.get("/files/info", params={"path": missing}), 404, "FILE_NOT_FOUND"),
            (c.get("/files/download", params={"path": missing}), 404, "FILE_NOT_FOUND"),
            (c.get("/files/download"), 400, "MISSING_QUERY"),
            (c.get("/files/download", params={"path": str(tmp_path / "f"), "offset": "0"}),
             400, "INVALID_REQUEST_BODY"),
            (c.get("/files/download", params={"path": str(tmp_path / "f"), "limit": "x"}),
             400, "INVALID_REQUEST_BODY"),
            (c.get("/files/download", params={"path": str(tmp_path / "f"), "offset": "1"},
                   headers={"Range": "bytes=0-1"}), 400, "INVALID_REQUEST_BODY"),
            (c.delete("/files", params={"path": str(tmp_path / "d")}), 500, "RUNTIME_ERROR"),
            (c.get("/directories/list"), 400, "MISSING_QUERY"),
            (c.get("/directories/list", params={"path": str(tmp_path / "f")}),
             400, "INVALID_REQUEST_BODY"),
            (c.get("/directories/list", params={"path": str(tmp_path / "link")}),
             400, "INVALID_REQUEST_BODY"),
            (c.get("/directories/list", params={"path": str(tmp_path), "depth": "-1"}),
             400, "INVALID_REQUEST_BODY"),
            (c.get("/directories/list", params={"path": missing}), 404, "FILE_NOT_FOUND"),
            (c.get("/files/search"), 400, "MISSING_QUERY"),
            (c.get("/files/search", params={"path": missing}), 404, "FILE_NOT_FOUND"),
            (c.post("/files/mv", json=[{"src": missing, "dest": str(tmp_path / "x")}]),
             404, "FILE_NOT_FOUND"),
            (c.post("/files/mv", json=[{"src": str(tmp_path / "f"),
                                        "dest": str(tmp_path / "taken")}]),
             500, "RUNTIME_ERROR"),
            (c.post("/files/mv", content=b"{"), 400, "INVALID_REQUEST_BODY"),
            (c.post("/directories", json={str(tmp_path / "f" / "sub"): {"mode": 755}}),
             500, "RUNTIME_ERROR"),
            (c.post("/directories", content=b"[1"), 400, "INVALID_REQUEST_BODY"),
            (c.post("/files/replace", json={str(tmp_path / "f"): {"old": "", "new": "y"}}),
             400, "INVALID_REQUEST_BODY"),
            (c.post("/files/permissions", json={missing: {"mode": 644}}), 500, "RUNTIME_ERROR"),
            (c.post("/files/permissions", json={str(tmp_path / "f"): {"owner": "no-such-user"}}),
             500, "RUNTIME_ERROR"),
            # an id chown(2) cannot take is bad input, not a crash (found by the fuzz suite)
            (c.post("/files/permissions", json={str(tmp_path / "f"): {"group": -5}}),
             400, "INVALID_REQUEST_BODY"),
            (c.post("/files/permissions", json={str(tmp_path / "f"): {"owner": 2**40}}),
             400, "INVALID_REQUEST_BODY"),
        ]
        for r, status, code in cases:
            assert r.status_code == status, (r.request.method, r.request.url, r.text)
            assert set(r.json()) == {"code", "message"}, r.text
            assert r.json()["code"] == code, (r.request.method, r.request.url, r.text)
        r = c.get("/files/download", params={"path": str(tmp_path / "f")},
                  headers={"Range": "bytes=5-9"})
        assert r.status_code == 416 and r.json() == {"code": "UNKNOWN"}
        # Upload errors carry the reference's file codes.
        meta = ("metadata", ("m.json", json.dumps({"path": str(tmp_path / "u")}), "text/plain"))
        for r, code in (
            (c.post("/files/upload", content=b"x", headers={"content-type": "text/plain"}),
             "INVALID_FILE"),
            (c.post("/files/upload", files=[("file", ("u", b"data", "text/plain"))]),
             "INVALID_FILE_METADATA"),
            (c.post("/files/upload", files=[meta]), "INVALID_FILE_CONTENT"),
            (c.post("/files/upload", files=[("metadata", ("m.json", "{}", "text/plain")),
                                            ("file", ("u", b"data", "text/plain"))]),
             "INVALID_FILE_METADATA"),
        ):
            assert r.status_code == 400 and r.json()["code"] == code, r.text


def test_streams_use_the_reference_framing_json_lines_and_blank_lines(execd: Execd) -> None:
    with execd.client() as c:
        r = c.post("/command", json={"command": "echo out; echo err >&2; exit 2"})
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = r.text.split("\n\n")
    assert frames[-1] == "" and all("\n" not in f for f in frames)
    events = [json.loads(f) for f in frames[:-1]]  # every frame is one JSON object
    assert [e["type"] for e in events] == ["init", "stdout", "stderr", "error"]


def test_sse_frames_have_ids_and_the_sdk_shapes(execd: Execd) -> None:
    with execd.client() as c:
        r = c.post("/command", params={"sse": "1"},
                   json={"command": "echo out; echo err >&2; exit 2"})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.startswith("id: 0\ndata: {")
    events = sse_events(r.text)
    types = [e["type"] for _, e in events]
    assert types[0] == "init" and types[-1] == "error"
    assert "execution_complete" not in types  # a failure ends with the error alone
    assert all(i is not None for i, _ in events)
    assert len({i for i, _ in events}) == len(events)
    assert all(isinstance(e["timestamp"], int) for _, e in events)
    err = events[-1][1]["error"]
    assert err == {"ename": "CommandExecError", "evalue": "2", "traceback": ["exit status 2"]}
    with execd.client() as c:
        done = sse_events(c.post("/command", json={"command": "echo ok"}).text)
    assert [e["type"] for _, e in done] == ["init", "stdout", "execution_complete"]
    assert isinstance(done[-1][1]["execution_time"], int)


def test_reconnect_with_last_event_id_resumes(execd: Execd) -> None:
    with execd.client() as c:
        seen: list[tuple[str | None, dict]] = []
        with c.stream(
            "POST",
            "/command",
            params={"sse": "1"},  # standard SSE frames carry the ids to resume from
            json={"command": "for i in 1 2 3 4 5 6; do echo n$i; sleep 0.2; done"},
        ) as r:
            buf = ""
            for chunk in r.iter_text():
                buf += chunk
                seen = sse_events(buf.rsplit("\n\n", 1)[0] + "\n\n")
                if any(e.get("text") == "n2" for _, e in seen):
                    break  # drop the connection mid-stream
        exec_id = seen[0][1]["text"]
        last_id = seen[-1][0]
        r = c.get(f"/command/{exec_id}/stream", headers={"Last-Event-ID": str(last_id)})
        rest = sse_events(r.text)
    lines = [e.get("text", "") for _, e in seen[1:] + rest if e["type"] == "stdout"]
    assert lines == [f"n{i}" for i in range(1, 7)]
    assert rest[-1][1]["type"] == "execution_complete"
    assert all(int(i) > int(last_id) for i, _ in rest)


def test_silent_streams_carry_ping_events_or_sse_comments(tmp_path: Path) -> None:
    ex = start_execd(tmp_path, "--keepalive", "0.2")
    try:
        with ex.client() as c:
            r = c.post("/command", json={"command": "sleep 1; echo done"})
            types = [e["type"] for _, e in sse_events(r.text)]
            assert types.count("ping") >= 2 and ": keep-alive" not in r.text  # as the reference
            assert types[-1] == "execution_complete"
            r = c.post("/command", params={"sse": "1"}, json={"command": "sleep 1; echo done"})
            assert r.text.count(": keep-alive") >= 2
            assert [e["type"] for _, e in sse_events(r.text)][-1] == "execution_complete"
    finally:
        stop_execd(ex)


def test_stream_ends_when_output_is_complete(execd: Execd) -> None:
    with execd.client() as c:
        t0 = time.monotonic()
        r = c.post("/command", json={"command": "true"})
        elapsed = time.monotonic() - t0
    assert [e["type"] for _, e in sse_events(r.text)] == ["init", "execution_complete"]
    assert elapsed < 5  # no fixed multi-second grace delay


def test_daemonised_child_does_not_hold_the_stream(execd: Execd) -> None:
    with execd.client() as c:
        t0 = time.monotonic()
        r = c.post("/command", json={"command": "sleep 30 & echo started"})
        elapsed = time.monotonic() - t0
    assert "started" in r.text
    assert elapsed < 10


def test_binary_and_invalid_utf8_output(execd: Execd) -> None:
    with execd.client() as c:
        r = c.post(
            "/command",
            json={
                "command": r"printf 'ok\377\376bad\0nul \342\202'; printf '\254 euro\n';"
                " head -c 65536 /dev/urandom"
            },
        )
        events = sse_events(r.text)
        # One event per line: a character split between two writes arrives whole.
        assert events[1][1] == {**events[1][1], "type": "stdout",
                                "text": "ok\ufffd\ufffdbad\x00nul € euro"}
        assert events[-1][1]["type"] == "execution_complete"
        logs = c.get(f"/command/{events[0][1]['text']}/logs")
        assert logs.content.startswith(b"ok\xff\xfebad\x00nul \xe2\x82\xac euro\n")
        assert len(logs.content) == len(b"ok\xff\xfebad\x00nul \xe2\x82\xac euro\n") + 65536


def test_download_ranges(execd: Execd, tmp_path: Path) -> None:
    data = os.urandom(10_000)
    (tmp_path / "blob").write_bytes(data)
    with execd.client() as c:
        full = c.get("/files/download", params={"path": str(tmp_path / "blob")})
        assert full.status_code == 200 and full.content == data
        assert full.headers["content-length"] == "10000"
        part = c.get(
            "/files/download",
            params={"path": str(tmp_path / "blob")},
            headers={"Range": "bytes=100-199"},
        )
        assert part.status_code == 206 and part.content == data[100:200]
        assert part.headers["content-range"] == "bytes 100-199/10000"
        tail = c.get(
            "/files/download",
            params={"path": str(tmp_path / "blob")},
            headers={"Range": "bytes=-10"},
        )
        assert tail.content == data[-10:]
        open_end = c.get(
            "/files/download",
            params={"path": str(tmp_path / "blob")},
            headers={"Range": "bytes=9990-"},
        )
        assert open_end.content == data[9990:]


def test_upload_with_owner_and_relative_path(execd: Execd) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    files = [
        (
            "metadata",
            (
                "metadata",
                json.dumps({"path": "rel/up.txt", "mode": 600, "owner": "nobody"}),
                "application/json",
            ),
        ),
        ("file", ("up.txt", b"relative upload", "application/octet-stream")),
    ]
    with execd.client() as c:
        r = c.post("/files/upload", files=files)
    assert r.status_code == 200, r.text
    target = execd.workdir / "rel" / "up.txt"
    assert target.read_bytes() == b"relative upload"
    assert target.stat().st_uid == nobody.pw_uid
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]


def test_identity_scoped_file_routes_say_unsupported(execd: Execd) -> None:
    with execd.client() as c:
        r = c.get("/v1/filesystem/1000/1000/files/info", params={"path": "/"})
    assert r.status_code == 501
    assert r.json()["code"] == "NOT_SUPPORTED" and "uid/gid" in r.json()["message"]


def test_metrics_watch_streams(execd: Execd) -> None:
    with execd.client() as c, c.stream("GET", "/metrics/watch") as r:
        got = []
        for line in r.iter_lines():  # the reference's shape: one JSON line per sample
            got.append(json.loads(line))
            if len(got) == 2:
                break
    for m in got:
        assert {"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"} <= set(m)
    assert got[1]["timestamp"] > got[0]["timestamp"]
