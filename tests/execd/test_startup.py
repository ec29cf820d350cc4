"""Start-up shape of execd: the warm-pool claim route (only with --pooled, only once) and the
code service loaded after execd listens rather than before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.execd.conftest import TOKEN, Execd, free_port, start_execd, stop_execd
from tests.execd.test_http_contract import sse_events

CLAIM = "/_sandlot/claim"


def _run(ex: Execd, command: str, token: str) -> str:
    r = httpx.post(f"{ex.url}/command", json={"command": command},
                   headers={"X-EXECD-ACCESS-TOKEN": token}, timeout=30)
    assert r.status_code == 200, r.text
    return "".join(d.get("text", "") for _, d in sse_events(r.text) if d.get("type") == "stdout")


def test_claim_route_needs_pooled(tmp_path: Path) -> None:
    ex = start_execd(tmp_path)
    try:
        r = httpx.post(f"{ex.url}{CLAIM}", json={"token": "x"}, headers=ex.headers)
        assert r.status_code == 404
        assert r.json()["code"] == "NOT_FOUND"
    finally:
        stop_execd(ex)


def test_pooled_execd_is_claimed_once(tmp_path: Path) -> None:
    marker = tmp_path / "work" / "entrypoint-ran"
    ex = start_execd(tmp_path, "--pooled")
    try:
        body = {"env": {"SANDBOX_VAR": "from-claim"}, "token": "new-token",
                "entrypoint": ["sh", "-c", f"echo $SANDBOX_VAR > {marker}"]}
        # the pool token is required: no token, or a wrong one, is refused
        assert httpx.post(f"{ex.url}{CLAIM}", json=body).status_code == 401
        r = httpx.post(f"{ex.url}{CLAIM}", json=body, headers=ex.headers)
        assert r.status_code == 200, r.text
        # the pool token stops working, the sandbox's works
        assert httpx.get(f"{ex.url}/metrics", headers=ex.headers).status_code == 401
        assert _run(ex, "echo $SANDBOX_VAR", "new-token").strip() == "from-claim"
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.read_text().strip() == "from-claim"
        # only once, whichever token is used
        again = httpx.post(f"{ex.url}{CLAIM}", json=body,
                           headers={"X-EXECD-ACCESS-TOKEN": "new-token"})
        assert again.status_code == 404
        assert httpx.post(f"{ex.url}{CLAIM}", json=body, headers=ex.headers).status_code == 401
    finally:
        stop_execd(ex)


def test_bad_claim_bodies_are_400_and_do_not_claim(tmp_path: Path) -> None:
    ex = start_execd(tmp_path, "--pooled")
    try:
        bads: list[object] = [{"env": {"A": 1}}, {"entrypoint": "sh"}, {"token": ""}, []]
        for bad in bads:
            r = httpx.post(f"{ex.url}{CLAIM}", json=bad, headers=ex.headers)
            assert r.status_code == 400, (bad, r.text)
        r = httpx.post(f"{ex.url}{CLAIM}", json={"token": None}, headers=ex.headers)
        assert r.status_code == 200
        # token null: no authentication from now on (a sandbox created without a token)
        assert httpx.get(f"{ex.url}/metrics").status_code == 200
    finally:
        stop_execd(ex)


def test_code_service_loads_after_listening(tmp_path: Path) -> None:
    """Without --no-code the /code routes still exist; they are served once loaded."""
    port = free_port()
    env = {**os.environ, "SANDLOT_EXECD_TOKEN": TOKEN, "SANDLOT_CODE_READY_PORT": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandlot.execd", "--listen", f"tcp:127.0.0.1:{port}",
         "--workdir", str(tmp_path), "--state-dir", str(tmp_path / "state")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        r = httpx.get(f"{url}/code/contexts", params={"language": "python"},
                      headers={"X-EXECD-ACCESS-TOKEN": TOKEN}, timeout=60)
        assert r.status_code == 200, r.text
        assert isinstance(json.loads(r.text), list)
        assert httpx.get(f"{url}/code/contexts").status_code == 401
        assert httpx.post(f"{url}/code/nope", headers={"X-EXECD-ACCESS-TOKEN": TOKEN},
                          timeout=30).status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_code_service_loads_eagerly_only_in_code_images() -> None:
    from sandlot.execd.lazyext import wanted_at_start

    assert not wanted_at_start({"PATH": "/usr/bin"})
    assert not wanted_at_start({"SANDLOT_CODE_PRESTART": ""})
    assert wanted_at_start({"JUPYTER_PORT": "44771"})
    assert wanted_at_start({"SANDLOT_CODE_PRESTART": "python"})
