"""Diagnostics and metrics under tenants: an ended sandbox's kept events and logs stay its
tenant's (another tenant gets the unknown-id 404), and ``/metrics`` (series of every
tenant's sandboxes) is the administrator's unless ``[metrics] open``."""

from __future__ import annotations

import uuid

from tests.server.conftest import API_KEY, Harness
from tests.tenants.tenants_setup import KEY_A, KEY_B
from tests.tenants.test_tenant_api import create, same_as_unknown, tenant_harness

__all__ = ["tenant_harness"]  # the fixture, used by name


async def test_an_ended_sandboxs_diagnostics_stay_its_tenants(tenant_harness: Harness) -> None:
    h = tenant_harness
    async with h.client(KEY_A) as a, h.client(KEY_B) as b, h.client(API_KEY) as admin:
        sid = (await create(a))["id"]
        await h.wait_state(a, sid, "Running")
        assert (await a.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        unknown = str(uuid.uuid4())
        for suffix in ("/diagnostics/events?scope=runtime", "/diagnostics/logs?scope=all",
                       "/diagnostics/context"):
            mine = await a.get(f"/v1/sandboxes/{sid}{suffix}")
            assert mine.status_code == 200, mine.text
            same_as_unknown(await b.get(f"/v1/sandboxes/{sid}{suffix}"),
                            await b.get(f"/v1/sandboxes/{unknown}{suffix}"), sid, unknown)
        events = (await admin.get(f"/v1/sandboxes/{sid}/diagnostics/events",
                                  params={"scope": "runtime"})).json()["content"]
        assert "Stopping -> Terminated" in events
        r = await a.get("/metrics")
        assert r.status_code == 403 and r.json()["code"] == "ADMIN_ONLY"
        assert (await admin.get("/metrics")).status_code == 200
