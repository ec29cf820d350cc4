"""Pods on a real cluster: a server kill -9 and restart re-adopts them, a Pod deleted with
kubectl becomes a Failed sandbox with the reason, twenty concurrent creates all run with
their limits in the Pod specs, and nothing of sandlot's is left in the namespace after."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from opensandbox import Sandbox

from tests.compat.conftest import COMPAT_IMAGE, RAW_CREATE_BODY, SandlotServer, wait_state
from tests.k8s_cluster import Cluster

pytestmark = [pytest.mark.backends("kubernetes"), pytest.mark.timeout(900)]


def pod_of(cluster: Cluster, sandbox_id: str) -> dict:
    out = cluster.kubectl("get", "pod", f"sandlot-{sandbox_id}", "-o", "json")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def create(c: httpx.Client, **extra: object) -> str:
    r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY, **extra})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def run(server: SandlotServer, sandbox_id: str, command: str) -> str:
    async def go() -> str:
        sandbox = await Sandbox.connect(sandbox_id, connection_config=server.sdk_config())
        try:
            execution = await sandbox.commands.run(command)
            return "".join(m.text for m in execution.logs.stdout)
        finally:
            await sandbox.close()
    return asyncio.run(go())


@pytest.fixture
def server(fresh_server: SandlotServer) -> Iterator[SandlotServer]:
    yield fresh_server
    assert fresh_server.k8s is not None
    print(fresh_server.log_tail(200000))  # captured: shown with a failure, nothing left on disk
    fresh_server.delete_all_sandboxes()
    cluster = fresh_server.k8s
    deadline = time.monotonic() + 120
    while cluster.sandlot_objects().get("pods") and time.monotonic() < deadline:
        time.sleep(1)
    left = cluster.sandlot_objects()
    assert left == {}, f"sandlot left {left} in the namespace:\n{fresh_server.log_tail()}"


def test_kill9_restart_keeps_pods_and_a_kubectl_deleted_pod_fails(server: SandlotServer) -> None:
    assert server.k8s is not None
    with server.client() as c:
        kept, doomed = create(c), create(c)
        wait_state(c, kept, "Running")
        wait_state(c, doomed, "Running")
        assert run(server, kept, "echo before > /tmp/mark; cat /tmp/mark").strip() == "before"

        server.kill9()
        server.start()
        assert wait_state(c, kept, "Running")["status"]["state"] == "Running"
        # the same Pod, its processes and files: nothing was recreated
        assert run(server, kept, "cat /tmp/mark").strip() == "before"

        server.k8s.kubectl("delete", "pod", f"sandlot-{doomed}", "--wait=false")
        failed = wait_state(c, doomed, "Failed")
        assert "deleted" in failed["status"]["message"], failed["status"]
        assert failed["status"]["reason"] == "SANDBOX_EXITED_ERROR" or failed["status"]["reason"]
        # the survivor is untouched
        assert run(server, kept, "echo still").strip() == "still"


def test_pod_deleted_while_the_server_is_down_is_failed_after_restart(
        server: SandlotServer) -> None:
    assert server.k8s is not None
    with server.client() as c:
        sid = create(c)
        wait_state(c, sid, "Running")
        server.kill9()
        server.k8s.kubectl("delete", "pod", f"sandlot-{sid}", "--wait=true")
        server.start()
        failed = wait_state(c, sid, "Failed")
        assert "no longer exists" in failed["status"]["message"]


def test_twenty_concurrent_creates_run_with_their_limits(server: SandlotServer) -> None:
    assert server.k8s is not None

    async def make(i: int) -> str:
        sandbox = await Sandbox.create(
            COMPAT_IMAGE, connection_config=server.sdk_config(timeout=300),
            resource={"cpu": f"{100 + i}m", "memory": "128Mi"},
            # the SDK's resource_requests (resourceRequests) on every other one
            resource_requests={"memory": "32Mi"} if i % 2 else None,
            metadata={"n": str(i)}, ready_timeout=timedelta(seconds=300),
        )
        try:
            execution = await sandbox.commands.run("echo ok")
            assert "".join(m.text for m in execution.logs.stdout).strip() == "ok"
            return sandbox.id
        finally:
            await sandbox.close()

    async def all_of_them() -> list[str]:
        return list(await asyncio.gather(*(make(i) for i in range(20))))

    ids = asyncio.run(all_of_them())
    assert len(set(ids)) == 20
    with server.client() as c:
        for i, sid in enumerate(ids):
            assert c.get(f"/v1/sandboxes/{sid}").json()["status"]["state"] == "Running"
            spec = pod_of(server.k8s, sid)["spec"]["containers"][0]
            assert spec["resources"]["limits"] == {"cpu": f"{100 + i}m",
                                                   "memory": str(128 << 20)}
            assert spec["resources"]["requests"]["memory"] == \
                str(32 << 20 if i % 2 else (128 << 20) // 20)
