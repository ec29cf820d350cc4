"""Fixtures: a real execd subprocess on a free loopback port with an access token, and the
released OpenSandbox SDK's services pointed straight at it (as its AdapterFactory does)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import free_port

TOKEN = "test-token-123"


@dataclass
class Execd:
    proc: subprocess.Popen[bytes]
    port: int
    token: str
    workdir: Path
    state_dir: Path
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def headers(self) -> dict[str, str]:
        return {"X-EXECD-ACCESS-TOKEN": self.token}

    def client(self, **kw: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, **kw)  # type: ignore[arg-type]

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss


def start_execd(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Execd:
    port = free_port()
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    state = tmp / "state"
    log = tmp / "execd.log"
    full_env = {**os.environ, "SANDLOT_EXECD_TOKEN": TOKEN, **(env or {})}
    full_env.pop("EXECD_ENVS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandlot.execd",
            "--listen",
            f"tcp:127.0.0.1:{port}",
            "--workdir",
            str(workdir),
            "--state-dir",
            str(state),
            "--no-code",
            "--interrupt-grace",
            "1",
            *args,
        ],
        env=full_env,
        stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"execd did not start: {log.read_text()}")
        time.sleep(0.02)
    return Execd(proc, port, TOKEN, workdir, state, log)


def stop_execd(ex: Execd) -> None:
    children = []
    try:
        children = psutil.Process(ex.proc.pid).children(recursive=True)
    except psutil.Error:
        pass
    if ex.proc.poll() is None:
        ex.proc.send_signal(signal.SIGTERM)
        try:
            ex.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            ex.proc.kill()
            ex.proc.wait()
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def execd() -> Iterator[Execd]:
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-execd-test-"))
    ex = start_execd(tmp)
    try:
        yield ex
    finally:
        stop_execd(ex)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def fresh_execd(tmp_path: Path) -> Iterator[Execd]:
    ex = start_execd(tmp_path)
    try:
        yield ex
    finally:
        stop_execd(ex)


def sdk_services(ex: Execd):  # type: ignore[no-untyped-def]
    """(commands, files, metrics) async SDK services for ``ex``, built like AdapterFactory does."""
    from opensandbox.adapters.factory import AdapterFactory
    from opensandbox.config import ConnectionConfig
    from opensandbox.models.sandboxes import SandboxEndpoint

    config = ConnectionConfig(
        domain=ex.endpoint, protocol="http", request_timeout=timedelta(seconds=120)
    )
    endpoint = SandboxEndpoint(endpoint=ex.endpoint, headers=dict(ex.headers))
    factory = AdapterFactory(config)
    return (
        factory.create_command_service(endpoint),
        factory.create_filesystem_service(endpoint),
        factory.create_metrics_service(endpoint),
    )


@pytest.fixture
def sdk(execd: Execd):  # type: ignore[no-untyped-def]
    return sdk_services(execd)
