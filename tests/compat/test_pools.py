"""Named pools (``/v1/pools``, the reference server's shape) and ``extensions.poolRef``: a
pool of 3 serves creates (with and without an image, through the released SDK too), starts
cold when drained with the same result, refills, and comes back after a restart. The server's
own warm pool is off: it would serve these creates too (its image is the same)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import httpx
from opensandbox import Sandbox

from sandlot.runtime.oci.layout import claims_folder
from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, wait_state

LIMITS = {"cpu": "500m", "memory": "256Mi"}
POOL = {
    "name": "trio",
    "template": {"spec": {"containers": [{"name": "sandbox", "image": COMPAT_IMAGE,
                                          "resources": {"limits": LIMITS}}]}},
    "capacitySpec": {"bufferMax": 3, "bufferMin": 1, "poolMax": 10, "poolMin": 0},
}
POOLED = {"entrypoint": ["tail", "-f", "/dev/null"], "extensions": {"poolRef": "trio"},
          "timeout": 600}


def wait_available(c: httpx.Client, name: str, n: int, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = c.get(f"/v1/pools/{name}").json()
        if body["status"]["available"] == n:
            return body  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"pool {name} never had {n} ready: {body}")


def claimed(server: SandlotServer, sid: str) -> bool:
    """The sandbox runs in a pre-started (pool) container."""
    return (claims_folder(server.data_dir) / sid).exists()


def run_text(c: httpx.Client, sid: str, command: str) -> str:
    """The raw event stream of ``command`` run through the sandbox's execd endpoint."""
    ep = c.get(f"/v1/sandboxes/{sid}/endpoints/44772").json()
    with httpx.Client(base_url=f"http://{ep['endpoint']}", headers=ep["headers"],
                      timeout=30) as d:
        r = d.post("/command", json={"command": command})
        assert r.status_code == 200
        return r.text


def memory_max(server: SandlotServer, c: httpx.Client, sid: str) -> str:
    return run_text(c, sid, "cat /sys/fs/cgroup/memory.max "
                    "/sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null")


async def test_pool_serves_refills_and_survives_restart(
    fresh_server_without_warm_pool: SandlotServer,
) -> None:
    server = fresh_server_without_warm_pool
    with server.client() as c:
        r = c.post("/v1/pools", json=POOL)
        assert r.status_code == 201, r.text
        assert r.json()["capacitySpec"]["bufferMax"] == 3
        r = c.post("/v1/pools", json=POOL)
        assert r.status_code == 409 and r.json()["code"] == "KUBERNETES::POOL_ALREADY_EXISTS"
        bad = {**POOL, "name": "bad", "template": {"spec": {"containers": [
            {"image": COMPAT_IMAGE, "securityContext": {"privileged": True}}]}}}
        r = c.post("/v1/pools", json=bad)
        assert r.status_code == 400 and "securityContext" in r.json()["message"]
        assert [p["name"] for p in c.get("/v1/pools").json()["items"]] == ["trio"]
        wait_available(c, "trio", 3)

        # No image: the pool's image and shape.
        sid = c.post("/v1/sandboxes", json=POOLED).json()["id"]
        info = wait_state(c, sid, "Running")
        assert info["image"]["uri"] == COMPAT_IMAGE
        assert claimed(server, sid)
        assert str(256 * 1024 * 1024) in memory_max(server, c, sid)
        status = c.get("/v1/pools/trio").json()["status"]
        assert status["allocated"] == 1

        # The released SDK (it always sends an image: the pool's is accepted).
        sdk = await Sandbox.create(COMPAT_IMAGE, connection_config=server.sdk_config(),
                                   extensions={"poolRef": "trio"},
                                   timeout=timedelta(minutes=10),
                                   ready_timeout=timedelta(seconds=90))
        assert claimed(server, sdk.id)
        ex = await sdk.commands.run("echo pooled > /workspace/x && cat /workspace/x")
        assert "".join(m.text for m in ex.logs.stdout).strip() == "pooled"

        # A create its pool cannot serve starts cold with the same result: with bufferMax 0
        # the pool serves and starts none (a create on a drained pool takes one being
        # started, runtime/oci/pool.py, so only then is a cold start certain), and its ready
        # ones are deleted (they would idle unused). Then back to 3, whose ready ones serve
        # three creates.
        wait_available(c, "trio", 3)
        empty = {**POOL["capacitySpec"], "bufferMax": 0, "bufferMin": 0}
        r = c.put("/v1/pools/trio", json={"capacitySpec": empty})
        assert r.status_code == 200 and r.json()["status"]["available"] == 0, r.text
        more = [c.post("/v1/sandboxes", json=POOLED).json()["id"]]
        r = c.put("/v1/pools/trio", json={"capacitySpec": POOL["capacitySpec"]})
        assert r.status_code == 200
        wait_available(c, "trio", 3)
        more += [c.post("/v1/sandboxes", json=POOLED).json()["id"] for _ in range(3)]
        for m in more:
            info = wait_state(c, m, "Running")
            assert info["image"]["uri"] == COMPAT_IMAGE
            assert str(256 * 1024 * 1024) in memory_max(server, c, m)
        assert [claimed(server, m) for m in more] == [False, True, True, True]
        wait_available(c, "trio", 3)  # refilled

        other = {**POOLED, "image": {"uri": "some/other:image"}}
        r = c.post("/v1/sandboxes", json=other)
        assert r.status_code == 400 and "differs" in r.json()["message"]
        r = c.post("/v1/sandboxes", json={**POOLED, "extensions": {"poolRef": "nope"}})
        assert r.status_code == 404

    server.stop()
    server.start()
    with server.client() as c:
        assert c.get("/v1/pools/trio").json()["status"]["allocated"] == 6
        wait_available(c, "trio", 3)
        r = c.put("/v1/pools/trio", json={"capacitySpec": {**POOL["capacitySpec"],
                                                            "bufferMax": 1}})
        assert r.status_code == 200 and r.json()["status"]["revision"] == "4"
        assert r.json()["status"]["available"] == 1  # the surplus two deleted
        assert c.delete("/v1/pools/trio").status_code == 204
        r = c.get("/v1/pools/trio")
        assert r.status_code == 404 and r.json()["code"] == "KUBERNETES::POOL_NOT_FOUND"
        r = c.post("/v1/sandboxes", json=POOLED)
        assert r.status_code == 404
