"""``[kubernetes] execd_delivery = "node-cache"`` on a real cluster: the first Pod's init
container fills the node's entry, the next Pod starts without any init container (nothing is
copied) on the bundle mounted read-only; a tampered entry is never used as it is: the first
Pod of a restarted server verifies it, replaces it and runs."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandlot.runtime.kubernetes import bundle_fill
from tests.compat.conftest import RAW_CREATE_BODY, SandlotServer, wait_state
from tests.k8s.test_pods import create, pod_of, run
from tests.k8s_cluster import Cluster

pytestmark = [pytest.mark.backends("kubernetes"), pytest.mark.timeout(900)]


@pytest.fixture
def cache_dir(k8s_images: Cluster) -> Iterator[Path]:
    if k8s_images.kit_dir is None:
        pytest.skip("the node cache is inspected on the node's disk: needs the kit's cluster")
    path = Path(tempfile.mkdtemp(prefix="slk8s-execd-cache-", dir="/tmp"))
    yield path
    bundle_fill._remove(str(path))


@pytest.fixture
def server(compat_image_root: Any, k8s_images: Cluster,
           cache_dir: Path) -> Iterator[SandlotServer]:
    server = SandlotServer(compat_image_root, backend="kubernetes", k8s=k8s_images)
    server.config.write_text(server.config.read_text() + 'execd_delivery = "node-cache"\n'
                             f'node_cache_dir = "{cache_dir}"\n'
                             f'[storage]\nallowed_host_paths = ["{cache_dir.parent}"]\n')
    server.start()
    try:
        yield server
        server.delete_all_sandboxes()
    finally:
        server.destroy()
    deadline = time.monotonic() + 120
    while k8s_images.sandlot_objects() and time.monotonic() < deadline:
        time.sleep(1)
    assert k8s_images.sandlot_objects() == {}, "sandlot left objects in the namespace"


def init_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"].get("initContainers") or []]


def test_second_pod_skips_the_init_container_and_a_tampered_entry_is_replaced(
        server: SandlotServer, cache_dir: Path) -> None:
    cluster = server.k8s
    assert cluster is not None
    with server.client() as c:
        first = create(c)
        wait_state(c, first, "Running")
        assert init_names(pod_of(cluster, first)) == ["sandlot-execd-cache"]
        [entry] = [p for p in cache_dir.iterdir()]
        digest = bundle_fill.tree_digest(str(entry))

        second = create(c)
        wait_state(c, second, "Running")
        pod = pod_of(cluster, second)
        assert init_names(pod) == []  # nothing copied: the node's entry, read-only
        mount = [m for m in pod["spec"]["containers"][0]["volumeMounts"]
                 if m["mountPath"] == "/opt/sandlot"]
        assert mount[0]["readOnly"] is True
        assert run(server, second, "echo hi").strip() == "hi"
        assert "Read-only" in run(server, second,
                                  "touch /opt/sandlot/x 2>&1; echo $?")
        c.delete(f"/v1/sandboxes/{first}")
        c.delete(f"/v1/sandboxes/{second}")

    # Tamper with the entry while no Pod of the server is left to vouch for the node.
    deadline = time.monotonic() + 120
    while cluster.sandlot_objects().get("pods") and time.monotonic() < deadline:
        time.sleep(1)
    server.stop()
    bundle_fill._writable(str(entry))
    victim = next(p for p in sorted(entry.rglob("*.py")) if p.is_file())
    original = victim.read_bytes()
    victim.write_bytes(b"raise SystemExit('tampered')\n")
    server.start()
    with server.client() as c:
        third = create(c)
        assert wait_state(c, third, "Running")["status"]["state"] == "Running"
        assert init_names(pod_of(cluster, third)) == ["sandlot-execd-cache"]
        assert victim.read_bytes() == original
        assert bundle_fill.tree_digest(str(entry)) == digest
        assert [p.name for p in cache_dir.iterdir()] == [entry.name]  # no temporaries
        assert run(server, third, "echo ok").strip() == "ok"


def test_a_host_volume_over_the_cache_is_refused(server: SandlotServer,
                                                 cache_dir: Path) -> None:
    with server.client() as c:
        r = c.post("/v1/sandboxes", json={**RAW_CREATE_BODY, "volumes": [{
            "name": "c", "host": {"path": str(cache_dir)}, "mountPath": "/mnt"}]})
        assert r.status_code == 400, r.text
        assert "node cache" in json.dumps(r.json())
