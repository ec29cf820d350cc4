"""kill -9 the server and start it again: sandboxes still answer, expiry still fires, the
runtime and the store agree (no duplicates, no orphans, vanished containers reported)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig

from sandlot.images.store import ImageStore
from sandlot.runtime.base import ImageRef, SandboxSpec
from tests.compat.conftest import (
    COMPAT_IMAGE,
    RAW_CREATE_BODY,
    SandlotServer,
    _in_thread,
    wait_state,
)

pytestmark = [pytest.mark.backends("oci", "docker"), pytest.mark.heavy_backends("runsc")]

BODY = RAW_CREATE_BODY


async def _runtime_op(server: SandlotServer, op: str, sid: str, image_store: ImageStore) -> None:
    rt = await server.open_runtime()
    try:
        if op == "delete":
            await rt.delete(sid)
        else:
            assert image_store.get(COMPAT_IMAGE) is not None
            await rt.create(SandboxSpec(sandbox_id=sid, image=ImageRef(COMPAT_IMAGE),
                                        entrypoint=[]))
    finally:
        await rt.close()


async def test_kill9_restart(fresh_server: SandlotServer, image_store: ImageStore) -> None:
    server = fresh_server
    with server.client() as c:
        keep, expiring, vanishing = (c.post("/v1/sandboxes", json=BODY).json()["id"] for _ in "abc")
        for sid in (keep, expiring, vanishing):
            wait_state(c, sid, "Running")
        ep = c.get(f"/v1/sandboxes/{keep}/endpoints/44772").json()
        # From [server] endpoint_ports, below the kernel's ephemeral ports: no outgoing
        # connection can take it while the server is down.
        assert 20000 <= int(ep["endpoint"].rsplit(":", 1)[1]) <= 32767, ep
        soon = datetime.now(UTC) + timedelta(seconds=20)
        r = c.post(
            f"/v1/sandboxes/{expiring}/renew-expiration",
            json={"expiresAt": soon.isoformat().replace("+00:00", "Z")},
        )
        assert r.status_code == 200

    server.kill9()
    # While it is down: one container disappears, and a stray container appears.
    _in_thread(_runtime_op(server, "delete", vanishing, image_store))
    _in_thread(_runtime_op(server, "create", "stray-container", image_store))
    assert "stray-container" in server.runtime_ids()
    server.start()

    with server.client() as c:
        kept = c.get(f"/v1/sandboxes/{keep}").json()["status"]
        assert kept["state"] == "Running", (kept, server.log_tail())
        failed = c.get(f"/v1/sandboxes/{vanishing}").json()["status"]
        assert failed["state"] == "Failed" and failed["reason"] == "CONTAINER_EXITED_ERROR"
        assert "stray-container" not in server.runtime_ids()

        # The direct endpoint handed out before the crash still works, at the same address.
        assert c.get(f"/v1/sandboxes/{keep}/endpoints/44772").json() == ep
        with httpx.Client(base_url=f"http://{ep['endpoint']}", headers=ep["headers"]) as d:
            try:
                pong = d.get("/ping")
            except httpx.HTTPError as exc:
                raise AssertionError(f"direct endpoint: {exc!r}\n{server.log_tail()}") from exc
            assert pong.status_code == 200

        # The SDK reconnects and runs a command.
        cfg = ConnectionConfig(domain=server.domain, api_key=server.api_key)
        sandbox = await Sandbox.connect(keep, connection_config=cfg)
        try:
            execution = await sandbox.commands.run("echo still-here")
            assert "still-here" in "".join(m.text for m in execution.logs.stdout)
        finally:
            await sandbox.close()

        # The expiry armed before the crash fires after the restart.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and c.get(f"/v1/sandboxes/{expiring}").status_code != 404:
            time.sleep(0.2)
        last = c.get(f"/v1/sandboxes/{expiring}")
        assert last.status_code == 404, (last.text, server.log_tail())
        assert expiring not in server.runtime_ids()

        items = c.get("/v1/sandboxes").json()["items"]
        assert sorted(i["id"] for i in items) == sorted([keep, vanishing])
        assert server.runtime_ids() == {keep}
