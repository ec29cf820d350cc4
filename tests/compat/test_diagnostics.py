"""Diagnostics through the released clients: why did my sandbox die?

A sandbox whose entrypoint prints to stderr and exits 3, and one whose entrypoint is killed
for memory: ``SandboxManagerSync.get_diagnostic_logs/events`` and ``osb diagnostics`` say so,
on every backend; both stay readable after the sandboxes are deleted (the retention time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync import SandboxManagerSync

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, wait_state
from tests.compat.test_osb_cli import osb

pytestmark = [pytest.mark.timeout(900), pytest.mark.backends("oci", "docker", "runsc")]

EXIT_3 = ["sh", "-c", "echo about-to-fail; echo disk-is-on-fire >&2; exit 3"]
# `tail` keeps the last line in memory, and /dev/zero has no newline: it grows until killed.
MEMORY_HOG = ["sh", "-c", "echo filling-memory; exec tail /dev/zero"]


def _create(c: httpx.Client, entrypoint: list[str], memory: str = "256Mi") -> str:
    r = c.post("/v1/sandboxes", json={
        "image": {"uri": COMPAT_IMAGE}, "entrypoint": entrypoint,
        "resourceLimits": {"cpu": "500m", "memory": memory}, "timeout": 900,
        "metadata": {"suite": "diagnostics"}})
    assert r.status_code == 202, r.text
    sid: str = r.json()["id"]
    wait_state(c, sid, "Running", timeout=180)
    return sid


def _until(fetch: Callable[[], str], *needles: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = fetch()
        if all(n in text for n in needles):
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needles} never appeared in:\n{text}")


@pytest.fixture(scope="module")
def manager(sandlot_server: SandlotServer) -> Iterator[SandboxManagerSync]:
    config = ConnectionConfigSync(domain=sandlot_server.domain, api_key=sandlot_server.api_key)
    m = SandboxManagerSync.create(config)
    try:
        yield m
    finally:
        m.close()


@pytest.fixture(scope="module")
def dying(sandlot_server: SandlotServer) -> Iterator[tuple[str, str]]:
    """(sandbox whose entrypoint exits 3, sandbox whose entrypoint is OOM-killed)."""
    with sandlot_server.client() as c:
        exits = _create(c, EXIT_3)
        hog = _create(c, MEMORY_HOG, memory="64Mi")
        try:
            yield exits, hog
        finally:
            for sid in (exits, hog):
                c.delete(f"/v1/sandboxes/{sid}")


def _logs(manager: SandboxManagerSync, sid: str, scope: str = "container") -> str:
    content = manager.get_diagnostic_logs(sid, scope)
    assert content.kind == "logs" and content.delivery == "inline" and content.scope == scope
    return content.content or ""


def _events(manager: SandboxManagerSync, sid: str, scope: str = "runtime") -> str:
    content = manager.get_diagnostic_events(sid, scope)
    assert content.kind == "events" and content.delivery == "inline"
    return content.content or ""


def test_an_entrypoint_that_exits_3_says_so_in_logs_and_events(
    manager: SandboxManagerSync, dying: tuple[str, str]
) -> None:
    sid = dying[0]
    logs = _until(lambda: _logs(manager, sid), "exited with code 3")
    assert "about-to-fail" in logs and "disk-is-on-fire" in logs  # stdout and stderr
    events = _until(lambda: _events(manager, sid), "EntrypointExited")
    assert "entrypoint exited with code 3" in events
    assert "Pending -> Running" in events
    assert "disk-is-on-fire" in _logs(manager, sid, "all")


def test_an_entrypoint_killed_for_memory_says_so(
    manager: SandboxManagerSync, dying: tuple[str, str], compat_backend: str
) -> None:
    sid = dying[1]
    if compat_backend == "runsc":
        # gVisor runs the whole sandbox in one host process (the sentry): the kernel's OOM
        # kill ends the sandbox, and the entrypoint's log (in the sandbox's memory) with it.
        events = _until(lambda: _events(manager, sid), "OOMKilled", "-> Failed", timeout=120)
        assert "memory limit" in events
        assert "state Failed" in _logs(manager, sid, "all")
        return
    events = _until(lambda: _events(manager, sid, "all"), "OOMKilled", "EntrypointKilled",
                    timeout=120)
    assert "memory limit" in events
    logs = _logs(manager, sid)
    assert "filling-memory" in logs and "killed by signal 9 (SIGKILL)" in logs


def test_osb_diagnostics_prints_them(sandlot_server: SandlotServer,
                                     dying: tuple[str, str]) -> None:
    sid = dying[0]
    _until(lambda: osb(sandlot_server, "diagnostics", "logs", sid, "--scope", "container",
                       "-o", "raw").stdout, "exited with code 3", "disk-is-on-fire")
    p = osb(sandlot_server, "diagnostics", "events", sid, "--scope", "runtime", "-o", "raw")
    assert p.returncode == 0 and "EntrypointExited" in p.stdout, p.stderr
    p = osb(sandlot_server, "diagnostics", "logs", sid, "--scope", "lifecycle")
    assert p.returncode != 0 and "DIAGNOSTICS_SCOPE_UNSUPPORTED" in p.stdout + p.stderr
    for command in ("inspect", "summary"):
        p = osb(sandlot_server, "devops", command, sid)
        assert p.returncode == 0 and sid in p.stdout, p.stderr
    assert "disk-is-on-fire" in osb(sandlot_server, "devops", "summary", sid).stdout


def test_events_and_logs_outlive_the_sandbox(
    sandlot_server: SandlotServer, manager: SandboxManagerSync
) -> None:
    with sandlot_server.client() as c:
        sid = _create(c, EXIT_3)
        _until(lambda: _logs(manager, sid), "exited with code 3")
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
    events = _events(manager, sid)
    assert "Stopping -> Terminated" in events and "EntrypointExited" in events
    content = manager.get_diagnostic_logs(sid, "container")
    assert "disk-is-on-fire" in (content.content or "")
    assert any("ended" in w for w in content.warnings or [])
    with pytest.raises(SandboxApiException):
        manager.get_diagnostic_events("no-such-sandbox", "runtime")


def test_a_restart_is_an_event_and_earlier_events_survive_it(fresh_server: SandlotServer) -> None:
    with fresh_server.client() as c:
        sid = _create(c, ["sleep", "infinity"])
    fresh_server.kill9()
    fresh_server.start()
    with fresh_server.client() as c:
        wait_state(c, sid, "Running")
        r = c.get(f"/v1/sandboxes/{sid}/diagnostics/events", params={"scope": "runtime"})
        assert r.status_code == 200, r.text
        events = r.json()["content"]
        assert "Pending -> Running" in events and "Restarted" in events
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
