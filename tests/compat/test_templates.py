"""Templates through the released SDK: built from base + set-up commands (asynchronously,
Pending/Building -> Succeeded), sandboxes from it have the result; a failing build reaches
Failed with its log; a template in use is not deleted (its snapshot is refused, 409)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxException
from opensandbox.models.templates import CreateTemplateRequest, TemplateFilter

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, wait_state
from tests.compat.test_pools import claimed, run_text, wait_available

pytestmark = pytest.mark.backends("oci", "docker", "runsc")

SETUP = ("mkdir -p /opt/tool && echo 'print(42)' > /opt/tool/run.py && "
         "echo built-by-template && echo $FLAVOUR > /opt/tool/flavour")


async def _wait_built(manager: SandboxManager, template_id: str) -> str:
    for _ in range(1200):
        phase = (await manager.get_template(template_id)).status.phase
        if phase in ("Succeeded", "Failed"):
            return phase
        await asyncio.sleep(0.1)
    raise AssertionError(f"template {template_id} never finished building")


def _pool_of_template(server: SandlotServer, template_id: str) -> None:
    """A pool of the template: creates naming it get pre-started sandboxes with the result."""
    with server.client() as c:
        pool = {"name": "from-tpl", "capacitySpec": {"bufferMax": 1, "bufferMin": 0,
                                                     "poolMax": 5, "poolMin": 0},
                "template": {"spec": {"containers": [
                    {"image": f"template:{template_id}"}]}}}
        assert c.post("/v1/pools", json=pool).status_code == 201
        wait_available(c, "from-tpl", 1)
        r = c.post("/v1/sandboxes", json={"extensions": {"poolRef": "from-tpl"},
                                          "entrypoint": ["tail", "-f", "/dev/null"],
                                          "timeout": 600})
        assert r.status_code == 202, r.text
        pooled = r.json()["id"]
        wait_state(c, pooled, "Running")
        assert claimed(server, pooled)
        assert "mint" in run_text(c, pooled, "cat /opt/tool/flavour")
        refused = c.delete(f"/v1/templates/{template_id}")  # the pool stands on it
        assert refused.status_code == 409
        assert c.delete(f"/v1/sandboxes/{pooled}").status_code == 204
        assert c.delete("/v1/pools/from-tpl").status_code == 204


async def test_template_build_use_and_failure(sandlot_server: SandlotServer) -> None:
    server = sandlot_server
    manager = await SandboxManager.create(connection_config=server.sdk_config())
    tpl = await manager.create_template(CreateTemplateRequest(
        image=COMPAT_IMAGE, publish="local", entrypoint=["sh", "-c", SETUP],
        env={"FLAVOUR": "mint"}, metadata={"case": "tpl"},
        readiness={"probe": "test -f /opt/tool/run.py"},  # type: ignore[arg-type]
    ))
    assert tpl.status.phase in ("Pending", "Building")
    assert await _wait_built(manager, tpl.template_id) == "Succeeded"
    done = await manager.get_template(tpl.template_id)
    assert done.status.manifest_ref
    with server.client() as c:
        assert "built-by-template" in c.get(f"/v1/templates/{tpl.template_id}/logs").text
    listed = await manager.list_templates(TemplateFilter(metadata={"case": "tpl"}))
    assert [t.template_id for t in listed.template_infos] == [tpl.template_id]

    if server.backend == "docker":  # named pools are the oci runtime's
        with server.client() as c:
            assert c.post("/v1/pools", json={"name": "p"}).status_code in (422, 501)
    else:
        _pool_of_template(server, tpl.template_id)

    sb = await Sandbox.create_from_template(tpl.template_id, timeout=timedelta(minutes=10),
                                            ready_timeout=timedelta(seconds=90),
                                            connection_config=server.sdk_config())
    ex = await sb.commands.run("python3 /opt/tool/run.py; cat /opt/tool/flavour; echo $FLAVOUR")
    assert [m.text.strip() for m in ex.logs.stdout] == ["42", "mint", "mint"]
    with pytest.raises(SandboxException):  # its snapshot is in use by sb
        await manager.delete_template(tpl.template_id)
    await manager.kill_sandbox(sb.id)
    await manager.delete_template(tpl.template_id)
    with pytest.raises(SandboxException):
        await manager.get_template(tpl.template_id)

    bad = await manager.create_template(CreateTemplateRequest(
        image=COMPAT_IMAGE, publish="local",
        entrypoint=["sh", "-c", "echo about-to-fail; echo oops >&2; exit 3"],
    ))
    assert await _wait_built(manager, bad.template_id) == "Failed"
    failed = await manager.get_template(bad.template_id)
    assert "about-to-fail" in (failed.status.message or "")
    assert "oops" in (failed.status.message or "")
    with pytest.raises(SandboxException):  # not Succeeded: 409
        await Sandbox.create_from_template(bad.template_id, timeout=timedelta(minutes=10),
                                           connection_config=server.sdk_config())
    await manager.delete_template(bad.template_id)
    with server.client() as c:  # no build sandbox is left behind (its delete may still run)
        for _ in range(600):
            left = c.get("/v1/sandboxes", params={"metadata": "sandlot.template-build="
                                                  + bad.template_id}).json()["items"]
            if not left or any(i["status"]["state"] != "Stopping" for i in left):
                break
            await asyncio.sleep(0.1)
        assert left == []
