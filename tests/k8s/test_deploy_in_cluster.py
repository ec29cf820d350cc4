"""The deployment manifest (``deploy/kubernetes/``) really running: the server, execd bundle
and PostgreSQL images built by ``scripts/build-server-image.py`` (no Docker Hub) and loaded
into the kit's node, every object applied, and a sandbox created, used and deleted with the
released ``opensandbox`` SDK through the ``sandlot`` Service (``kubectl port-forward``).

What the kit lacks, and so what this test changes in the shipped manifest: there is no cluster
DNS, no kube-proxy and no volume provisioner, so the store's DSN names the PostgreSQL Pod's
address (patched into the Secret once the Pod is Ready), PostgreSQL's data is an ``emptyDir``
instead of the PersistentVolumeClaim, the server reaches the API server through a relay on the
Pod bridge's address (``api_relay``: ``KUBERNETES_SERVICE_HOST``/``PORT`` and a hostAlias), the
namespaces (and the ClusterRole's name) are the test's own. The sandbox's requests are a
twentieth of its limits (a 2-core node).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig

from tests.k8s.api_relay import api_relay
from tests.k8s.deploy_manifest import KIT_CLUSTER_IP, manifests
from tests.k8s_cluster import REPO_ROOT, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
BUILD = REPO_ROOT / "scripts" / "build-server-image.py"
MANAGED = "app.kubernetes.io/managed-by=sandlot"


@pytest.fixture(scope="module")
def images() -> dict[str, dict[str, str]]:
    """The three images (built once, then cached by content hash)."""
    out = subprocess.run([sys.executable, str(BUILD)], capture_output=True, text=True,
                         timeout=1800, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def ctr_import(cluster: Cluster, archive: str) -> None:
    """Always imported (a reused node may hold an older build under the same tag)."""
    assert cluster.kit_dir is not None
    subprocess.run([str(cluster.kit_dir / "ctr"), "images", "import", archive], check=True,
                   capture_output=True, timeout=900)


def for_the_kit(docs: list[dict[str, Any]], names: dict[str, str], api_key: str,
                suffix: str) -> list[dict[str, Any]]:
    """The kit's deviations from the shipped manifest (see the module docstring)."""
    kept = []
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind == "PersistentVolumeClaim":
            continue
        if kind == "StatefulSet":
            doc["spec"]["template"]["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
        if kind in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] += "-" + suffix
            if kind == "ClusterRoleBinding":
                doc["roleRef"]["name"] += "-" + suffix
        if kind == "Secret" and meta["name"] == "sandlot-secrets":
            data = doc["stringData"]
            data["api-key"] = api_key
            data["sandlot.toml"] = (
                data["sandlot.toml"]
                .replace('"sandlot-sandboxes"', f'"{names["sandlot-sandboxes"]}"')
                .replace('"10.96.0.53"', f'"{KIT_CLUSTER_IP}"')
                .replace("[kubernetes]\n", "[kubernetes]\nrequest_fraction = 0.05\n"))
            assert names["sandlot-sandboxes"] in data["sandlot.toml"]
        kept.append(doc)
    return kept


STUCK = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull",
         "CreateContainerConfigError", "InvalidImageName"}


def through_relay(deployment: dict[str, Any], address: str, port: int) -> None:
    """The server's in-cluster client pointed at the API relay (see api_relay)."""
    pod = deployment["spec"]["template"]["spec"]
    pod["hostAliases"] = [{"ip": address, "hostnames": ["kubernetes.default.svc"]}]
    pod["containers"][0]["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "kubernetes.default.svc"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)}]


def wait_ready(cluster: Cluster, ns: str, app: str, timeout: float = 600) -> dict[str, Any]:
    """The Pod of ``app`` once Ready; fails at once (with its events and logs) when it is
    stuck, so a broken image does not cost the whole timeout."""
    deadline = time.monotonic() + timeout
    problem = "not Ready in time"
    while time.monotonic() < deadline:
        out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"app={app}", "-o", "json",
                              namespaced=False)
        for pod in json.loads(out.stdout)["items"]:
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return pod  # type: ignore[no-any-return]
            for status in pod["status"].get("containerStatuses", []):
                reason = status["state"].get("waiting", {}).get("reason")
                if reason in STUCK:
                    problem = reason
                    deadline = 0
        time.sleep(1)
    described = cluster.kubectl("describe", "pods", "-n", ns, "-l", f"app={app}",
                                namespaced=False, check=False).stdout
    logs = cluster.kubectl("logs", "-n", ns, "-l", f"app={app}", "--tail=50", "--previous",
                           namespaced=False, check=False)
    pytest.fail(f"{app}: {problem}\n{described[-3000:]}\n{logs.stdout[-3000:]}{logs.stderr}")


def sandbox_pods(cluster: Cluster, ns: str) -> list[str]:
    return cluster.kubectl("get", "pods", "-n", ns, "-l", MANAGED, "-o", "name",
                           namespaced=False, check=False).stdout.split()


@pytest.fixture
def deployed(k8s_images: Cluster, images: dict[str, dict[str, str]],
             tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, str], str]]:
    """Everything of the manifest applied and Ready; deleted again afterwards."""
    cluster = k8s_images
    if cluster.kit_dir is None:
        pytest.skip("needs the kit's node to load the built images into")
    for image in images.values():
        ctr_import(cluster, image["archive"])
    suffix = secrets.token_hex(3)
    names = {"sandlot": f"sltdep-{suffix}", "sandlot-sandboxes": f"sltdep-{suffix}-sbx"}
    api_key = secrets.token_urlsafe(16)
    docs = for_the_kit(manifests(names), names, api_key, suffix)
    server = next(d for d in docs if d["kind"] == "Deployment")
    rest = [d for d in docs if d["kind"] != "Deployment"]
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(yaml.safe_dump_all([*rest, server]))
    ns = names["sandlot"]
    relay = contextlib.ExitStack()
    try:
        first = tmp_path / "first.yaml"
        first.write_text(yaml.safe_dump_all(rest))
        cluster.kubectl("apply", "-f", str(first), namespaced=False)
        db = wait_ready(cluster, ns, "sandlot-postgres")
        secret = next(d for d in rest if d["metadata"]["name"] == "sandlot-postgres")
        secret["stringData"]["url"] = secret["stringData"]["url"].replace(
            "sandlot-postgres.sandlot.svc", db["status"]["podIP"])  # applied again below
        # the bridge's address: the first of the Pod subnet (host-local's gateway)
        bridge = db["status"]["podIP"].rsplit(".", 1)[0] + ".1"
        through_relay(server, bridge,
                      relay.enter_context(api_relay(str(cluster.kubeconfig), bridge)))
        manifest.write_text(yaml.safe_dump_all([*rest, server]))
        cluster.kubectl("apply", "-f", str(manifest), namespaced=False)
        wait_ready(cluster, ns, "sandlot")
        yield cluster, names, api_key
    finally:
        cluster.kubectl("delete", "-f", str(manifest), "--ignore-not-found", "--wait=true",
                        "--timeout=300s", namespaced=False, check=False, timeout=360)
        relay.close()


def run_a_sandbox(domain: str, api_key: str,
                  while_running: Callable[[str], None]) -> str:
    """Create a sandbox, run a command in it, call ``while_running(its id)``, delete it: the
    command's stdout."""
    config = ConnectionConfig(domain=domain, api_key=api_key, use_server_proxy=True,
                              request_timeout=timedelta(seconds=120))

    async def go() -> str:
        sandbox = await Sandbox.create("python:3.12", connection_config=config,
                                       ready_timeout=timedelta(seconds=600))
        try:
            execution = await sandbox.commands.run("echo in-cluster-$((6 * 7))")
            await asyncio.to_thread(while_running, sandbox.id)
            return "".join(m.text for m in execution.logs.stdout)
        finally:
            await sandbox.kill()
            await sandbox.close()
    return asyncio.run(go())


def test_the_manifest_runs_sandlot_in_the_cluster(
        deployed: tuple[Cluster, dict[str, str], str]) -> None:
    cluster, names, api_key = deployed
    ns, sbx = names["sandlot"], names["sandlot-sandboxes"]

    def in_postgres_and_a_pod(sandbox_id: str) -> None:
        """The sandbox is a Pod of the sandbox namespace, recorded in PostgreSQL."""
        rows = cluster.kubectl("exec", "-n", ns, "sandlot-postgres-0", "--", "psql", "-h",
                               "/tmp", "-U", "sandlot", "-d", "sandlot", "-tAc",
                               "select id from sandboxes", namespaced=False, check=False)
        assert sandbox_id in rows.stdout.split(), rows.stdout + rows.stderr
        assert any(sandbox_id in p for p in sandbox_pods(cluster, sbx)), sandbox_pods(cluster, sbx)

    # The Service, through the API server (the kit has no kube-proxy).
    with subprocess.Popen(
            ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "-n", ns, "port-forward",
             "service/sandlot", ":8080", "--address", "127.0.0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as forward:
        try:
            assert forward.stdout is not None
            line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
            assert "Forwarding from 127.0.0.1:" in line, line + forward.stderr.read()
            port = int(line.split("127.0.0.1:")[1].split()[0])
            stdout = run_a_sandbox(f"127.0.0.1:{port}", api_key, in_postgres_and_a_pod)
        finally:
            forward.terminate()
    assert stdout.strip() == "in-cluster-42"
    deadline = time.monotonic() + 180
    while sandbox_pods(cluster, sbx) and time.monotonic() < deadline:
        time.sleep(1)
    assert sandbox_pods(cluster, sbx) == []
