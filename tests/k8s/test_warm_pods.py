"""Warm Pods on a real cluster: the server's warm pool and a named pool (``/v1/pools``,
``extensions.poolRef``) keep pre-started Pods that creates claim (relabelled, execd handed
the sandbox's env, token and entrypoint), refill, survive a kill -9 of the server (claimed
Pods re-adopted by label, stale warm Pods swept), and leave nothing behind; and the create's
``resourceRequests`` become the Pod's requests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.compat.conftest import COMPAT_IMAGE, RAW_CREATE_BODY, SandlotServer, wait_state
from tests.k8s.test_pods import pod_of, run
from tests.k8s_cluster import Cluster

pytestmark = [pytest.mark.backends("kubernetes"), pytest.mark.timeout(900)]

POOL_LIMITS = {"cpu": "250m", "memory": "192Mi"}
POOL = {
    "name": "duo",
    "template": {"spec": {"containers": [{"name": "sandbox", "image": COMPAT_IMAGE,
                                          "resources": {"limits": POOL_LIMITS}}]}},
    "capacitySpec": {"bufferMax": 1, "bufferMin": 1, "poolMax": 5, "poolMin": 0},
}


def warm_pods(cluster: Cluster, running: bool = True) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-l", "sandlot.io/warm=true", "-o", "json")
    pods = json.loads(out.stdout)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and (not running or p["status"].get("phase") == "Running")]


def wait_for(what: str, check: Any, timeout: float = 240) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def pod_name_of(cluster: Cluster, sandbox_id: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "pods", "-l", f"sandlot.io/sandbox-id={sandbox_id}",
                          "-o", "json")
    pods = json.loads(out.stdout)["items"]
    assert len(pods) == 1, pods
    return pods[0]  # type: ignore[no-any-return]


@pytest.fixture
def server(request: pytest.FixtureRequest, compat_image_root: Any) -> Iterator[SandlotServer]:
    """A server keeping one warm Pod of the test image in the default shape."""
    cluster: Cluster = request.getfixturevalue("k8s_images")
    server = SandlotServer(compat_image_root, backend="kubernetes", k8s=cluster)
    text = server.config.read_text().replace(
        'type = "kubernetes"\n', f'type = "kubernetes"\nwarm_pool_images = ["{COMPAT_IMAGE}"]\n'
        'default_resources = { cpu = "500m", memory = "256Mi" }\n')
    server.config.write_text(text + "warm_pool_size = 1\n")
    server.start()
    try:
        yield server
        server.delete_all_sandboxes()
    finally:
        server.destroy()
    deadline = time.monotonic() + 120
    while cluster.sandlot_objects() and time.monotonic() < deadline:
        time.sleep(1)
    assert cluster.sandlot_objects() == {}, "sandlot left objects in the namespace"


def test_warm_pods_are_claimed_refilled_readopted_and_pooled(server: SandlotServer) -> None:
    cluster = server.k8s
    assert cluster is not None
    with server.client() as c:
        first = wait_for("a warm Pod", lambda: warm_pods(cluster))[0]["metadata"]["name"]
        assert first.startswith("sandlot-warm-")

        # A create in the default shape claims it: the same Pod, now the sandbox's.
        body = {k: v for k, v in RAW_CREATE_BODY.items() if k != "resourceLimits"}
        r = c.post("/v1/sandboxes", json={**body, "env": {"GREETING": "warm"},
                                          "metadata": {"via": "warm"}})
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        assert wait_state(c, sid, "Running")["metadata"] == {"via": "warm"}
        pod = pod_name_of(cluster, sid)
        assert pod["metadata"]["name"] == first
        assert "sandlot.io/warm" not in pod["metadata"]["labels"]
        assert json.loads(pod["metadata"]["annotations"]["sandlot.io/metadata"]) == \
            {"via": "warm"}
        assert pod["spec"]["containers"][0]["resources"]["limits"] == \
            {"cpu": "500m", "memory": str(256 << 20)}
        assert run(server, sid, "echo $GREETING").strip() == "warm"
        # the pool refills with a new Pod
        wait_for("a refill", lambda: [p for p in warm_pods(cluster)
                                      if p["metadata"]["name"] != first])

        # Another shape starts cold (its own Pod), with its resourceRequests.
        r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY,
                                          "resourceRequests": {"cpu": "50m", "memory": "64Mi"}})
        assert r.status_code == 202, r.text
        cold = r.json()["id"]
        wait_state(c, cold, "Running")
        spec = pod_of(cluster, cold)["spec"]["containers"][0]
        assert spec["resources"]["requests"] == {"cpu": "50m", "memory": str(64 << 20)}
        assert spec["resources"]["limits"] == {"cpu": "500m", "memory": str(256 << 20)}
        r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY,
                                          "resourceRequests": {"cpu": "4"}})
        assert r.status_code == 400 and "exceeds" in r.json()["message"]

        # A named pool: its own warm Pod in the pool's shape, claimed by poolRef.
        r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY, "extensions": {"poolRef": "duo"}})
        assert r.status_code == 404 and r.json()["code"] == "KUBERNETES::POOL_NOT_FOUND"
        r = c.post("/v1/pools", json=POOL)
        assert r.status_code == 201, r.text
        wait_for("the pool's warm Pod",
                 lambda: c.get("/v1/pools/duo").json()["status"]["available"] == 1)
        r = c.post("/v1/sandboxes", json={"entrypoint": ["tail", "-f", "/dev/null"],
                                          "extensions": {"poolRef": "duo"}, "timeout": 600})
        assert r.status_code == 202, r.text
        pooled = r.json()["id"]
        wait_state(c, pooled, "Running")
        pod = pod_name_of(cluster, pooled)
        assert pod["metadata"]["name"].startswith("sandlot-warm-")
        assert pod["spec"]["containers"][0]["resources"]["limits"] == \
            {"cpu": "250m", "memory": str(192 << 20)}
        assert c.get("/v1/pools/duo").json()["status"]["allocated"] == 1

        # kill -9: claimed Pods are re-adopted by their labels, stale warm Pods swept.
        before = {p["metadata"]["name"] for p in warm_pods(cluster, running=False)}
        server.kill9()
        server.start()
        for s in (sid, pooled, cold):
            assert wait_state(c, s, "Running")["status"]["state"] == "Running"
        assert run(server, sid, "echo $GREETING").strip() == "warm"
        assert run(server, pooled, "echo ok").strip() == "ok"
        wait_for("fresh warm Pods after the restart", lambda: (
            (names := {p["metadata"]["name"] for p in warm_pods(cluster)})
            and not names & before and len(names) == 2))

        # A deleted sandbox's claimed Pod goes, with its Secrets; deleting the pool removes
        # its warm Pod.
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        wait_for("the claimed Pod to go", lambda: cluster.kubectl(
            "get", "pod", first, check=False).returncode != 0, timeout=120)
        assert not cluster.kubectl("get", "secrets", "-o", "name").stdout.count(
            first.removeprefix("sandlot-"))
        assert c.delete("/v1/pools/duo").status_code == 204
        wait_for("one warm Pod (the server's) left", lambda: len(
            warm_pods(cluster, running=False)) == 1, timeout=120)

