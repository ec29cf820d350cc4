"""Error statuses and the contract's ``{code, message}`` body, over real HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.compat.conftest import SandlotServer, wait_state

pytestmark = [pytest.mark.backends("oci", "docker"), pytest.mark.heavy_backends("runsc")]


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    # FastAPI's own refusals (422) also carry the reference's ``detail``.
    assert set(body) - {"detail"} == {"code", "message"} and body["code"] and body["message"]
    if code is not None:
        assert body["code"] == code, body
    return body  # type: ignore[no-any-return]


def test_error_shapes(sandlot_server: SandlotServer) -> None:
    with httpx.Client(base_url=sandlot_server.url, timeout=30) as anon:
        assert anon.get("/health").json() == {"status": "healthy"}
        assert_error(anon.get("/v1/sandboxes"), 401, "MISSING_API_KEY")
        wrong = {"OPEN-SANDBOX-API-KEY": "wrong"}
        assert_error(anon.get("/sandboxes", headers=wrong), 401, "INVALID_API_KEY")

    with sandlot_server.client() as c:
        assert_error(c.get("/v1/sandboxes/not-a-sandbox"), 404, "DOCKER::SANDBOX_NOT_FOUND")
        assert_error(c.post("/v1/sandboxes/not-a-sandbox/pause"), 404)
        body = {
            "image": {"uri": "python:3.12"},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "resourceLimits": {"cpu": "500m", "memory": "256Mi"},
        }
        too_long = c.post("/v1/sandboxes", json={**body, "timeout": 999999})
        assert "3600" in assert_error(too_long, 400, "SANDBOX::INVALID_PARAMETER")["message"]
        err = assert_error(c.post("/v1/sandboxes", json={**body, "timeout": "x"}), 422)
        assert err["detail"][0]["loc"] == ["body", "timeout"]
        assert_error(c.post("/v1/sandboxes", json={"image": "not-an-object"}), 422)

        sid = c.post("/v1/sandboxes", json={**body, "timeout": 600}).json()["id"]
        try:
            # Not yet Running (or Running): resume is always a conflict here.
            assert_error(c.post(f"/v1/sandboxes/{sid}/resume"), 409, "DOCKER::SANDBOX_NOT_PAUSED")
        finally:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        assert_error(c.delete(f"/v1/sandboxes/{sid}"), 404)


def test_a_sandbox_that_stops_before_execd_answers_fails_at_once(
        sandlot_server: SandlotServer) -> None:
    """execd cannot start in 4 MiB (killed by the memory limit): the create fails as soon as
    the container stops, saying so, instead of waiting out execd's 30 + 60 s timeouts."""
    with sandlot_server.client() as c:
        started = time.monotonic()
        r = c.post("/v1/sandboxes", json={
            "image": {"uri": "python:3.12"}, "entrypoint": ["tail", "-f", "/dev/null"],
            "resourceLimits": {"cpu": "500m", "memory": "4Mi"}, "timeout": 600}, timeout=120)
        if r.status_code >= 400:  # refused up front (Docker's 6 MB minimum): fine as well
            assert_error(r, r.status_code)
            return
        sid = r.json()["id"]
        try:
            failed = wait_state(c, sid, "Failed", timeout=100)
            took = time.monotonic() - started
            message = failed["status"]["message"]
            assert failed["status"]["reason"] == "PROVISIONING_ERROR", failed["status"]
            assert "container stopped" in message or "container is gone" in message, message
            assert took < 25, (took, message)  # not the 30 s start wait, nor the 60 s after it
        finally:
            c.delete(f"/v1/sandboxes/{sid}")
