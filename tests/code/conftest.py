"""A real execd (``python -m sandlot.execd``) on loopback, driven by the released SDK's adapter."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import psutil
import pytest
from code_interpreter.adapters.code_adapter import CodesAdapter
from opensandbox.config import ConnectionConfig
from opensandbox.models.sandboxes import SandboxEndpoint

from tests.conftest import free_port

TOKEN = "code-test-token"


@dataclass
class Execd:
    url: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    workdir: str
    # time.time() a little before execd was started (file times are coarser than this
    # clock): its JVMs' files are newer than this.
    started: float = field(default_factory=lambda: time.time() - 1.0)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-EXECD-ACCESS-TOKEN": TOKEN},
                            timeout=60)


def start_execd(env_extra: dict[str, str], preexec: list[str] | None = None) -> Execd:
    port = free_port()
    started = time.time() - 1.0  # see Execd.started
    workdir = tempfile.mkdtemp(prefix="sandlot-code-test-")
    # What execd and its kernels put in the temp dir (the Java runner's classes) goes with
    # the workdir, not into the host's /tmp.
    tmp = os.path.join(workdir, "tmp")
    os.mkdir(tmp)
    env = {**os.environ, "SANDLOT_CODE_READY_PORT": "0", "TMPDIR": tmp, **env_extra}
    argv = [sys.executable, str(Path(__file__).with_name("serve_code.py")), str(port), TOKEN,
            workdir]
    if preexec:
        argv = [*preexec, *argv]
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stop_execd(Execd(url, "", proc, workdir, started))
            raise RuntimeError(f"execd exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ping", headers={"X-EXECD-ACCESS-TOKEN": TOKEN},
                         timeout=2).status_code == 200:
                return Execd(url, f"127.0.0.1:{port}", proc, workdir, started)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_execd(Execd(url, "", proc, workdir, started))
    raise RuntimeError("execd did not answer /ping")


def stop_execd(execd: Execd) -> None:
    """Stop execd and everything it started (kernels included), then remove its workdir."""
    try:
        tree = psutil.Process(execd.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    execd.proc.send_signal(signal.SIGTERM)
    try:
        execd.proc.wait(10)
    except subprocess.TimeoutExpired:
        execd.proc.kill()
        execd.proc.wait(10)
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)
    _remove_jvm_perf_files(execd.started)
    shutil.rmtree(execd.workdir, ignore_errors=True)


def _remove_jvm_perf_files(since: float) -> None:
    """A JVM that is killed (a kernel interrupted, deleted or stopped) leaves its
    performance-data file behind, in /tmp whatever TMPDIR says (in a sandbox that is the
    sandbox's /tmp, gone with it). Removed here: the files made since ``since`` whose
    process is gone."""
    perf_dir = Path("/tmp") / f"hsperfdata_{getpass.getuser()}"
    with contextlib.suppress(OSError):
        for entry in perf_dir.iterdir():
            if (entry.name.isdigit() and not psutil.pid_exists(int(entry.name))
                    and entry.stat().st_mtime >= since):
                entry.unlink(missing_ok=True)
        perf_dir.rmdir()  # kept while any other JVM's file is in it


@pytest.fixture(scope="module")
def execd() -> Iterator[Execd]:
    server = start_execd({
        "SANDLOT_CODE_PRESTART": "python,bash",
        "SANDLOT_CODE_STRIP_ENV": "*_SECRET*,*TOKEN*",
        "SANDLOT_CODE_TEST_CANARY": "x",
        "MY_APP_SECRET_KEY": "hunter2",
        "PLAIN_SETTING": "visible",
    })
    yield server
    stop_execd(server)


def make_codes(endpoint: str) -> CodesAdapter:
    """The SDK's code service for an execd endpoint, built the way CodeInterpreter.create does."""
    config = ConnectionConfig(request_timeout=timedelta(seconds=120))
    ep = SandboxEndpoint(endpoint=endpoint, headers={"X-EXECD-ACCESS-TOKEN": TOKEN})
    return CodesAdapter(ep, config)


@pytest.fixture
async def codes(execd: Execd) -> AsyncIterator[CodesAdapter]:
    adapter = make_codes(execd.endpoint)
    yield adapter
    await adapter.aclose()


def read_path(p: str) -> str:
    return Path(p).read_text()
