"""The kubernetes runtime's Pod manifests, its configuration and the deployment manifest,
without a cluster (the cluster tests are in tests/k8s)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from sandlot.config import STORE_URL_ENV, Config, KubernetesConfig
from sandlot.errors import InvalidRequest, Unsupported
from sandlot.images.model import RegistryAuth
from sandlot.runtime.base import ImageRef, SandboxSpec, VolumeSpec
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.kubernetes.pod import PodPlan, check_id, registry_of

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def plan(**cfg: object) -> PodPlan:
    return PodPlan(cfg=KubernetesConfig.model_validate(cfg), bundle=ExecdBundle(Path("/b")),
                   bundle_image="sandlot.local/execd-bundle:abc", owner="o1", execd_port=44772)


def spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {"sandbox_id": "0b5e-42", "image": ImageRef("python:3.12"),
                               "entrypoint": ["sleep", "inf"], "execd_token": "tok"}
    return SandboxSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_limits_requests_hardening_and_identity() -> None:
    pod = plan(request_fraction=0.25).pod(spec(cpu_cores=0.5, memory_bytes=512 << 20,
                                               disk_bytes=1 << 30, metadata={"a": "b"}))
    assert pod["metadata"]["name"] == "sandlot-0b5e-42"
    assert pod["metadata"]["labels"]["sandlot.io/owner"] == "o1"
    assert json.loads(pod["metadata"]["annotations"]["sandlot.io/metadata"]) == {"a": "b"}
    main = pod["spec"]["containers"][0]
    assert main["resources"] == {
        "limits": {"cpu": "500m", "memory": str(512 << 20), "ephemeral-storage": str(1 << 30)},
        "requests": {"cpu": "125m", "memory": str(128 << 20),
                     "ephemeral-storage": str(1 << 30)}}
    sc = main["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"SYS_ADMIN", "NET_RAW"} <= set(sc["capabilities"]["drop"])
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["restartPolicy"] == "Never"
    assert main["command"][-3:] == ["--", "sleep", "inf"]
    token = [e for e in main["env"] if e["name"] == "SANDLOT_EXECD_TOKEN"]
    assert token == [{"name": "SANDLOT_EXECD_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "sandlot-0b5e-42-execd", "key": "execd-token"}}}]
    init = pod["spec"]["initContainers"][0]
    assert init["image"] == "sandlot.local/execd-bundle:abc"
    assert init["securityContext"]["readOnlyRootFilesystem"] is True


def test_resource_requests_of_the_create_win_over_the_fraction() -> None:
    pod = plan(request_fraction=0.25).pod(spec(cpu_cores=1.0, memory_bytes=1 << 30,
                                               cpu_request_cores=0.1,
                                               memory_request_bytes=64 << 20))
    assert pod["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1000m", "memory": str(1 << 30)},
        "requests": {"cpu": "100m", "memory": str(64 << 20)}}
    # requests without limits (Burstable, capped by the node only)
    only = plan().pod(spec(memory_request_bytes=64 << 20))["spec"]["containers"][0]
    assert only["resources"] == {"requests": {"memory": str(64 << 20)}}


def test_no_limits_means_no_resources() -> None:
    assert plan().pod(spec())["spec"]["containers"][0]["resources"] == {}


def test_placement_runtime_class_and_pull_secret() -> None:
    p = PodPlan(cfg=KubernetesConfig(node_selector={"pool": "sb"}, service_account="sa",
                                     tolerations=[{"key": "k", "operator": "Exists"}],
                                     image_pull_secrets=["shared"]),
                bundle=ExecdBundle(Path("/b")), bundle_image="b:1", owner="o",
                execd_port=44772, runtime_class="gvisor")
    s = spec(image=ImageRef("reg.example:5000/team/app:1", auth=RegistryAuth("u", "p")))
    pod = p.pod(s, pull_secret=True)["spec"]
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["nodeSelector"] == {"pool": "sb"} and pod["serviceAccountName"] == "sa"
    assert pod["imagePullSecrets"] == [{"name": "shared"}, {"name": "sandlot-0b5e-42-pull"}]
    secret = p.pull_secret(s)
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config["auths"]["reg.example:5000"]["username"] == "u"
    assert registry_of("python:3.12") == "https://index.docker.io/v1/"


def test_volumes_map_to_hostpath_and_pvc() -> None:
    vols = [VolumeSpec("h", "host", "/srv/data", "/data", read_only=True),
            VolumeSpec("c", "pvc", "claim-1", "/work", sub_path="x")]
    pod = plan().pod(spec(volumes=vols))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["vol-0"]["hostPath"] == {"path": "/srv/data", "type": "Directory"}
    assert volumes["vol-1"]["persistentVolumeClaim"]["claimName"] == "claim-1"
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "vol-1", "mountPath": "/work", "readOnly": False, "subPath": "x"} in mounts
    with pytest.raises(Unsupported, match="ossfs"):
        plan().pod(spec(volumes=[VolumeSpec("o", "ossfs", "b", "/o")]))


@pytest.mark.parametrize("bad", ["Upper", "has_underscore", "-lead", "x" * 60])
def test_ids_that_cannot_name_a_pod_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="kubernetes"):
        check_id(bad)


def test_upstream_kubernetes_keys_load_and_inapplicable_ones_are_warned(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[runtime]\ntype = "kubernetes"\n[kubernetes]\nnamespace = "sb"\n'
                    'image_pull_policy = "Never"\ninformer_enabled = true\nread_qps = 5\n'
                    '[secure_runtime]\ntype = "gvisor"\nk8s_runtime_class = "gvisor"\n')
    cfg = Config.load(path)
    assert cfg.kubernetes.namespace == "sb" and cfg.kubernetes.image_pull_policy == "Never"
    assert cfg.secure_runtime.k8s_runtime_class == "gvisor"
    assert any("informer_enabled" in w for w in cfg.warnings())
    assert any("read_qps" in w for w in cfg.warnings())
    assert cfg.refusals() == []


def test_deployment_manifest_parses_and_its_config_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = [d for f in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "Role", "RoleBinding", "StatefulSet"} <= kinds
    secret = next(d for d in docs if d["kind"] == "Secret"
                  and d["metadata"]["name"] == "sandlot-secrets")
    path = tmp_path / "sandlot.toml"
    path.write_text(secret["stringData"]["sandlot.toml"])
    # the store's DSN comes from the Secret sandlot-postgres, as the Deployment's env says
    server = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env[STORE_URL_ENV]["valueFrom"]["secretKeyRef"]
    db = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"])
    monkeypatch.setenv(STORE_URL_ENV, db["stringData"][ref["key"]])
    cfg = Config.load(path)
    assert cfg.runtime.type == "kubernetes" and cfg.refusals() == []
    assert cfg.store_url.startswith("postgresql+asyncpg://")
    assert db["stringData"]["POSTGRES_PASSWORD"] in cfg.store_url
    role = next(d for d in docs if d["kind"] == "Role")
    verbs = {r["resources"][0]: set(r["verbs"]) for r in role["rules"]}
    assert {"create", "watch", "delete"} <= verbs["pods"]
