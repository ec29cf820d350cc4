"""What the released clients (SDK async and sync, ``osb``) see from ``sandlot serve`` matches
what they see from the reference server: list order, error codes, endpoint strings, renew
and label rules. One test per behaviour; docs/compatibility.md lists them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.config import ConnectionConfig
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync import SandboxManagerSync

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer
from tests.compat.test_osb_cli import osb

# make test: oci; make test-heavy: docker and runsc too
pytestmark = pytest.mark.heavy_backends("docker", "runsc")

SUITE = {"suite": "wire"}


def body(**overrides: object) -> dict:
    return {
        "image": {"uri": COMPAT_IMAGE},
        "entrypoint": ["tail", "-f", "/dev/null"],
        "resourceLimits": {"cpu": "500m", "memory": "256Mi"},
        "metadata": SUITE,
        "timeout": 900,
        **overrides,
    }


@pytest.fixture(scope="module")
def pair(sandlot_server: SandlotServer) -> Iterator[tuple[str, str]]:
    """Two Running sandboxes created one after the other; the second has no timeout."""
    with sandlot_server.client() as c:
        first = c.post("/v1/sandboxes", json=body()).json()["id"]
        second = c.post("/v1/sandboxes", json=body(timeout=None)).json()["id"]
        try:
            deadline = time.monotonic() + 180  # a loaded machine may answer Pending first
            while time.monotonic() < deadline:
                states = {c.get(f"/v1/sandboxes/{s}").json()["status"]["state"]
                          for s in (first, second)}
                if states == {"Running"}:
                    break
                time.sleep(0.2)
            assert states == {"Running"}, states
            yield first, second
        finally:
            for sid in (first, second):
                c.delete(f"/v1/sandboxes/{sid}")


def sync_config(server: SandlotServer, **kw: object) -> ConnectionConfigSync:
    return ConnectionConfigSync(domain=server.domain, api_key=server.api_key, **kw)


def api_error(exc: pytest.ExceptionInfo[BaseException], status: int, code: str) -> None:
    assert isinstance(exc.value, SandboxApiException), exc.value
    assert exc.value.status_code == status
    assert exc.value.error.code == code, exc.value


async def test_sdk_lists_newest_first(sandlot_server: SandlotServer, pair: tuple[str, str]) -> None:
    async with await SandboxManager.create(sandlot_server.sdk_config()) as manager:
        page = await manager.list_sandbox_infos(SandboxFilter(metadata=SUITE))
    assert [i.id for i in page.sandbox_infos] == [pair[1], pair[0]]
    assert page.pagination.total_items == 2 and page.pagination.total_pages == 1


def test_sync_sdk_lists_newest_first(sandlot_server: SandlotServer, pair: tuple[str, str]) -> None:
    with SandboxManagerSync.create(sync_config(sandlot_server)) as manager:
        page = manager.list_sandbox_infos(SandboxFilter(metadata=SUITE, page_size=1, page=2))
    assert [i.id for i in page.sandbox_infos] == [pair[0]]
    assert page.pagination.has_next_page is False and page.pagination.total_pages == 2


async def test_sdk_sees_sandbox_not_found(sandlot_server: SandlotServer) -> None:
    async with await SandboxManager.create(sandlot_server.sdk_config()) as manager:
        with pytest.raises(SandboxApiException) as exc:
            await manager.get_sandbox_info("no-such-sandbox")
    api_error(exc, 404, "DOCKER::SANDBOX_NOT_FOUND")


def test_sync_sdk_sees_sandbox_not_found(sandlot_server: SandlotServer) -> None:
    with SandboxManagerSync.create(sync_config(sandlot_server)) as manager:
        with pytest.raises(SandboxApiException) as exc:
            manager.kill_sandbox("no-such-sandbox")
    api_error(exc, 404, "DOCKER::SANDBOX_NOT_FOUND")


async def test_sdk_sees_invalid_api_key(sandlot_server: SandlotServer) -> None:
    cfg = ConnectionConfig(domain=sandlot_server.domain, api_key="not-the-key")
    async with await SandboxManager.create(cfg) as manager:
        with pytest.raises(SandboxApiException) as exc:
            await manager.list_sandbox_infos(SandboxFilter())
    api_error(exc, 401, "INVALID_API_KEY")


def test_sync_sdk_sees_missing_api_key(
    sandlot_server: SandlotServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPEN_SANDBOX_API_KEY", raising=False)
    with SandboxManagerSync.create(ConnectionConfigSync(domain=sandlot_server.domain)) as manager:
        with pytest.raises(SandboxApiException) as exc:
            manager.list_sandbox_infos(SandboxFilter())
    api_error(exc, 401, "MISSING_API_KEY")


async def test_sdk_pause_and_resume_on_wrong_states(
    sandlot_server: SandlotServer, pair: tuple[str, str]
) -> None:
    sid = pair[0]
    async with await SandboxManager.create(sandlot_server.sdk_config()) as manager:
        with pytest.raises(SandboxApiException) as exc:
            await manager.resume_sandbox(sid)
        api_error(exc, 409, "DOCKER::SANDBOX_NOT_PAUSED")
        await manager.pause_sandbox(sid)
        try:
            info = await manager.get_sandbox_info(sid)
            assert (info.status.state, info.status.reason) == ("Paused", "CONTAINER_PAUSED")
            with pytest.raises(SandboxApiException) as exc:
                await manager.pause_sandbox(sid)
            api_error(exc, 409, "DOCKER::SANDBOX_NOT_RUNNING")
        finally:
            await manager.resume_sandbox(sid)
        info = await manager.get_sandbox_info(sid)
        assert (info.status.state, info.status.reason) == ("Running", "CONTAINER_RUNNING")
        assert info.status.message == "Sandbox container is running."


def test_sync_sdk_renew_without_timeout_is_invalid_expiration(
    sandlot_server: SandlotServer, pair: tuple[str, str]
) -> None:
    with SandboxManagerSync.create(sync_config(sandlot_server)) as manager:
        assert manager.get_sandbox_info(pair[1]).expires_at is None
        with pytest.raises(SandboxApiException) as exc:
            manager.renew_sandbox(pair[1], timedelta(minutes=30))
        api_error(exc, 409, "DOCKER::INVALID_EXPIRATION")
        renewed = manager.renew_sandbox(pair[0], timedelta(minutes=5))  # may shorten
        assert manager.get_sandbox_info(pair[0]).expires_at == renewed.expires_at


async def test_sdk_create_refuses_metadata_a_label_cannot_hold(
    sandlot_server: SandlotServer,
) -> None:
    with pytest.raises(SandboxApiException) as exc:
        await Sandbox.create(
            COMPAT_IMAGE,
            connection_config=sandlot_server.sdk_config(),
            metadata={"owner": "Jane Doe"},
            ready_timeout=timedelta(seconds=30),
        )
    api_error(exc, 400, "SANDBOX::INVALID_METADATA_LABEL")


async def test_sdk_patch_of_a_reserved_key_is_invalid_metadata_label(
    sandlot_server: SandlotServer, pair: tuple[str, str]
) -> None:
    async with await SandboxManager.create(sandlot_server.sdk_config()) as manager:
        with pytest.raises(SandboxApiException) as exc:
            await manager.patch_sandbox_metadata(pair[0], {"opensandbox.io/owner": "me"})
        api_error(exc, 400, "INVALID_METADATA_LABEL")
        info = await manager.patch_sandbox_metadata(pair[0], {"stage": "two"})
    assert info.metadata == {**SUITE, "stage": "two"}


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
async def test_sdk_endpoint_strings(
    sandlot_server: SandlotServer, pair: tuple[str, str], proxy: bool
) -> None:
    sandbox = await Sandbox.connect(
        pair[0], connection_config=sandlot_server.sdk_config(proxy=proxy)
    )
    try:
        endpoint = await sandbox.get_endpoint(44772)
        if proxy:  # the reference's unversioned proxy path on the server's own address
            assert endpoint.endpoint == f"{sandlot_server.domain}/sandboxes/{pair[0]}/proxy/44772"
        else:
            host, port = endpoint.endpoint.split(":")
            assert host == "127.0.0.1" and port.isdigit()
        assert await sandbox.is_healthy()  # reached through that endpoint
    finally:
        await sandbox.close()


def test_osb_create_refuses_metadata_a_label_cannot_hold(sandlot_server: SandlotServer) -> None:
    p = osb(sandlot_server, "sandbox", "create", "-i", COMPAT_IMAGE, "-m", "team=a b")
    assert p.returncode != 0
    assert "SANDBOX::INVALID_METADATA_LABEL" in p.stdout + p.stderr


def test_osb_lists_newest_first(sandlot_server: SandlotServer, pair: tuple[str, str]) -> None:
    p = osb(sandlot_server, "sandbox", "list", "-m", "suite=wire", "-o", "json")
    assert p.returncode == 0, p.stderr
    assert [i["id"] for i in json.loads(p.stdout)["items"]] == [pair[1], pair[0]]


def test_osb_diagnostics_answers_and_names_unsupported_scopes(
    sandlot_server: SandlotServer, pair: tuple[str, str]
) -> None:
    p = osb(sandlot_server, "diagnostics", "events", pair[0], "--scope", "all", "-o", "raw")
    assert p.returncode == 0 and "Pending -> Running" in p.stdout, p.stderr
    p = osb(sandlot_server, "diagnostics", "logs", pair[0], "--scope", "network")
    assert p.returncode != 0
    assert "DIAGNOSTICS_SCOPE_UNSUPPORTED" in p.stdout + p.stderr  # not "sandbox not found"


def test_osb_reports_the_reference_codes_for_wrong_states(
    sandlot_server: SandlotServer, pair: tuple[str, str]
) -> None:
    sid = pair[1]  # created without a timeout
    renew = osb(sandlot_server, "sandbox", "renew", sid, "-t", "30m")
    assert renew.returncode != 0 and "DOCKER::INVALID_EXPIRATION" in renew.stdout + renew.stderr
    resume = osb(sandlot_server, "sandbox", "resume", sid)
    assert resume.returncode != 0 and "DOCKER::SANDBOX_NOT_PAUSED" in resume.stdout + resume.stderr


def test_a_raw_client_reaches_execd_through_the_proxy_with_the_api_key_alone(
    sandlot_server: SandlotServer, pair: tuple[str, str]
) -> None:
    with sandlot_server.client() as c:
        ep = c.get(
            f"/v1/sandboxes/{pair[0]}/endpoints/44772", params={"use_server_proxy": "true"}
        ).json()
        r = c.get(f"http://{ep['endpoint']}/ping")  # endpoint headers ignored, as many do
    assert r.status_code == 200, r.text
