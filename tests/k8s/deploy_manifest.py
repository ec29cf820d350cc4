"""The shipped deployment manifest (``deploy/kubernetes/``) read for the tests, with its two
namespaces renamed to the test's (so runs never meet) and the DNS filter Service's fixed
ClusterIP moved into the kit's Service range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KIT_CLUSTER_IP = "198.18.0.53"  # in the kit's Service range 198.18.0.0/24


def renamed(doc: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    meta = doc["metadata"]
    if doc["kind"] == "Namespace":
        meta["name"] = names[meta["name"]]
    if "namespace" in meta:
        meta["namespace"] = names[meta["namespace"]]
    for subject in doc.get("subjects", []):
        if "namespace" in subject:
            subject["namespace"] = names[subject["namespace"]]
    if doc["kind"] == "Service" and "clusterIP" in doc["spec"]:
        doc["spec"]["clusterIP"] = KIT_CLUSTER_IP
    return doc


def manifests(names: dict[str, str]) -> list[dict[str, Any]]:
    return [renamed(d, names) for f in sorted(DEPLOY.glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]
