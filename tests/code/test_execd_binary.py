"""The code routes inside the real ``python -m sandlot.execd``, plus the readiness port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from .conftest import TOKEN, Execd, free_port, make_codes, stop_execd


@pytest.fixture
def real_execd():
    port, ready = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix="sandlot-code-test-")
    env = {**os.environ, "SANDLOT_CODE_READY_PORT": str(ready), "SANDLOT_CODE_PRESTART": "python"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandlot.execd", "--listen", f"tcp:127.0.0.1:{port}",
         "--token", TOKEN, "--workdir", workdir, "--log-level", "warning"],
        env=env, start_new_session=True)
    server = Execd(f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", proc, workdir)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(server.url + "/ping", timeout=2,
                             headers={"X-EXECD-ACCESS-TOKEN": TOKEN}).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield server, ready
    finally:
        stop_execd(server)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_real_execd_serves_code_and_opens_ready_port(real_execd):
    server, ready = real_execd
    deadline = time.monotonic() + 60
    while not _port_open(ready) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _port_open(ready)
    with httpx.Client(base_url=server.url) as c:
        assert c.post("/code", json={"code": "1"}).status_code == 401  # execd's auth applies
    codes = make_codes(server.endpoint)
    try:
        ex = await codes.run("print('Hello from Python!'); 2 + 2", language="python")
        assert [m.text for m in ex.logs.stdout] == ["Hello from Python!\n"]
        assert ex.result[0].text == "4"
        assert ex.execution_count == 1
    finally:
        await codes.aclose()
