"""``sandlot serve`` with ``[runtime] type = "docker"``: upstream's own example config file
runs unchanged; containers removed behind sandlot's back become Failed (while it runs and
across a kill -9 restart); surviving sandboxes are found again from their labels; a PTY
session works in a sandbox of the engine."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from websockets.sync.client import connect

from sandlot.runtime.docker.container import container_name
from tests.compat.conftest import (
    COMPAT_IMAGE,
    RAW_CREATE_BODY,
    SandlotServer,
    wait_state,
)
from tests.conftest import BUNDLE_CACHE, free_port
from tests.docker_engine import PrivateDockerd
from tests.execd.test_pty import stdin
from tests.security.running import EXECD_PORT

pytestmark = pytest.mark.backends("docker")

UPSTREAM_EXAMPLE = (Path(__file__).parents[1] / "runtime" / "docker" / "fixtures"
                    / "upstream-example-docker.toml")
BODY = RAW_CREATE_BODY


def _remove_container(server: SandlotServer, sid: str) -> None:
    assert server.docker is not None and server.docker.client is not None
    server.docker.client.containers.get(container_name(sid)).remove(force=True)


def test_removed_behind_sandlots_back_is_failed(fresh_server: SandlotServer) -> None:
    server = fresh_server
    with server.client() as c:
        gone, stopped, kept = (c.post("/v1/sandboxes", json=BODY).json()["id"] for _ in "abc")
        for sid in (gone, stopped, kept):
            wait_state(c, sid, "Running")
        # while the server runs: the engine's events say so
        _remove_container(server, gone)
        body = wait_state(c, gone, "Failed", timeout=30)
        assert body["status"]["reason"] == "CONTAINER_EXITED_ERROR"  # the reference's reason
        assert server.docker is not None and server.docker.client is not None
        server.docker.client.api.kill(container_name(stopped))
        body = wait_state(c, stopped, "Failed", timeout=30)
        assert body["status"]["reason"] == "CONTAINER_EXITED_ERROR"
        assert "exited" in body["status"]["message"]
        # a failed sandbox's container is not kept running or stopped in the engine
        assert server.runtime_ids() == {kept}
        assert c.delete(f"/v1/sandboxes/{gone}").status_code == 204

        # across a kill -9: found again from the labels; one removed meanwhile is Failed
        server.kill9()
        vanished_while_down = kept
        _remove_container(server, vanished_while_down)
        server.start()
        body = wait_state(c, vanished_while_down, "Failed", timeout=30)
        assert body["status"]["reason"] == "CONTAINER_EXITED_ERROR"  # the reference's reason


def test_sandboxes_survive_a_restart(fresh_server: SandlotServer) -> None:
    server = fresh_server
    with server.client() as c:
        sid = c.post("/v1/sandboxes", json=BODY).json()["id"]
        wait_state(c, sid, "Running")
        assert c.post(f"/v1/sandboxes/{sid}/pause").status_code in (200, 202, 204)
        wait_state(c, sid, "Paused")
        server.kill9()
        server.start()
        wait_state(c, sid, "Paused")
        assert c.post(f"/v1/sandboxes/{sid}/resume").status_code in (200, 202, 204)
        wait_state(c, sid, "Running")
        assert server.runtime_ids() == {sid}


@pytest.fixture
def example_data_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sldex-", dir="/tmp"))
    BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
    (d / "execd-bundle").symlink_to(BUNDLE_CACHE)
    yield d


async def test_upstream_example_config_runs_unchanged(
    private_dockerd: PrivateDockerd, docker_base_image: str, example_data_dir: Path
) -> None:
    """``init-config --example docker``'s file, as written: only the port, the data dir and
    the engine (DOCKER_HOST, as for the reference server) come from outside it."""
    port = free_port()
    key = "example-key"
    log = example_data_dir / "server.log"
    env = {**os.environ, "DOCKER_HOST": private_dockerd.host,
           "OPENSANDBOX_SERVER_API_KEY": key, "HOME": str(example_data_dir)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandlot", "serve", "--config", str(UPSTREAM_EXAMPLE),
             "--port", str(port), "--data-dir", str(example_data_dir)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        assert "execd_image" in text  # named as ignored, not silently dropped
        cfg = ConnectionConfig(domain=f"127.0.0.1:{port}", api_key=key,
                               request_timeout=timedelta(seconds=60))
        sandbox = await Sandbox.create(COMPAT_IMAGE, connection_config=cfg,
                                       ready_timeout=timedelta(seconds=60))
        try:
            ex = await sandbox.commands.run("echo hello from $(hostname)")
            assert ex.logs.stdout[0].text.strip() == f"hello from {sandbox.id[:63]}"
            assert private_dockerd.client is not None
            attrs = private_dockerd.client.api.inspect_container(container_name(sandbox.id))
            assert attrs["HostConfig"]["NetworkMode"] == "bridge"
        finally:
            await sandbox.kill()
    finally:
        proc.terminate()
        proc.wait(30)
        assert private_dockerd.client is not None
        owner = (example_data_dir / "docker-owner").read_text().strip()
        left = private_dockerd.client.containers.list(
            all=True, filters={"label": f"io.sandlot.owner={owner}"})
        shutil.rmtree(example_data_dir, ignore_errors=True)
        assert left == []  # the sandbox's container went with its delete


def _pty_round(url: str, headers: dict[str, str]) -> str:
    """Open a PTY session on execd behind ``url``, run a line in it, return what it printed."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        r = c.post("/pty", json={"cwd": "/tmp", "cols": 90, "rows": 20})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        ws_url = url.replace("http://", "ws://", 1) + f"/pty/{sid}/ws"
        with connect(ws_url, additional_headers=headers) as ws:
            stdin(ws, "stty size; tty; echo X$((6*7))X\n")
            text = ""
            deadline = time.monotonic() + 60
            while "X42X" not in text:  # output frames (the first byte: their kind), JSON aside
                raw = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
                if isinstance(raw, bytes):
                    text += raw[1:].decode(errors="replace")
        assert c.delete(f"/pty/{sid}").status_code in (200, 204)
    return text


async def test_pty_session_in_a_docker_sandbox(sandlot_server: SandlotServer) -> None:
    """A terminal under sandlot's seccomp profile in the engine: openpty, job control, resize
    settings (the PTY suite itself runs execd on the host: tests/execd/test_pty.py)."""
    sandbox = await Sandbox.create(COMPAT_IMAGE, connection_config=sandlot_server.sdk_config(),
                                   ready_timeout=timedelta(seconds=120))
    try:
        ep = await sandbox.get_endpoint(EXECD_PORT)
        url = ep.endpoint if "://" in ep.endpoint else f"http://{ep.endpoint}"
        text = await asyncio.to_thread(_pty_round, url, dict(ep.headers))
        assert "20 90" in text and "/dev/pts/" in text, text
    finally:
        await sandbox.kill()
        await sandbox.close()
