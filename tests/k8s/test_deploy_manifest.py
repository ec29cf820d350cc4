"""The deployment manifest (``deploy/kubernetes/``) validated by a real API server:
``kubectl apply --dry-run=server`` runs admission and schema validation (RBAC rules,
Deployment, Services, StatefulSet, PVC, Secrets) without creating anything.

The two namespaces are renamed to namespaces of the test (namespaced objects need theirs
to exist even in a dry run) and the DNS Service's fixed ClusterIP is moved into the kit's
Service range; everything else is applied as shipped.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.deploy_manifest import manifests
from tests.k8s_cluster import Cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def namespaces(k8s_cluster: Cluster) -> Iterator[dict[str, str]]:
    base = "sltdeploy-" + secrets.token_hex(3)
    names = {"sandlot": base, "sandlot-sandboxes": base + "-sbx"}
    for ns in names.values():
        k8s_cluster.kubectl("create", "namespace", ns, namespaced=False)
    try:
        yield names
    finally:
        for ns in names.values():
            k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false", namespaced=False,
                                check=False)


def dry_run(cluster: Cluster, docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return cluster.kubectl("apply", "--dry-run=server", "-f", str(path), "-o", "name",
                           check=False, namespaced=False)


def test_the_manifest_passes_server_side_validation(k8s_cluster: Cluster,
                                                    namespaces: dict[str, str],
                                                    tmp_path: Path) -> None:
    docs = manifests(namespaces)
    res = dry_run(k8s_cluster, docs, tmp_path)
    assert res.returncode == 0, res.stderr
    applied = set(res.stdout.split())
    for kind, name in [("deployment.apps", "sandlot"), ("service", "sandlot"),
                       ("service", "sandlot-dns"), ("statefulset.apps", "sandlot-postgres"),
                       ("role.rbac.authorization.k8s.io", "sandlot-runtime"),
                       ("rolebinding.rbac.authorization.k8s.io", "sandlot-runtime"),
                       ("clusterrole.rbac.authorization.k8s.io", "sandlot-runtimeclass-reader"),
                       ("serviceaccount", "sandlot"), ("secret", "sandlot-secrets")]:
        assert f"{kind}/{name}" in applied, res.stdout
    assert len(applied) == len(docs), res.stdout
    # nothing was created
    got = k8s_cluster.kubectl("get", "deployments,services,secrets", "-n",
                              namespaces["sandlot"], "-o", "name", namespaced=False)
    assert "sandlot" not in got.stdout.replace("secret/default-token", ""), got.stdout

    # The dry run does validate: a Role verb list of the wrong type is refused.
    broken = manifests(namespaces)
    role = next(d for d in broken if d["kind"] == "Role")
    role["rules"][0]["verbs"] = "create"
    res = dry_run(k8s_cluster, broken, tmp_path)
    assert res.returncode != 0 and "verbs" in res.stderr, res.stderr
