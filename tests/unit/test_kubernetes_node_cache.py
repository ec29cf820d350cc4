"""``[kubernetes] execd_delivery = "node-cache"``: the Pod specs (fill init container, or
none when bound to nodes that hold the entry) and the fill itself on a local directory
(atomic, verified, read-only; a tampered or partial entry is never used as it is)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from sandlot.config import KubernetesConfig
from sandlot.errors import InvalidRequest
from sandlot.runtime.base import ImageRef, SandboxSpec, VolumeSpec
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.kubernetes import bundle_fill
from sandlot.runtime.kubernetes.node_cache import NodeCache
from sandlot.runtime.kubernetes.pod import PodPlan

NAME = "ab" * 16


def plan(**cfg: object) -> PodPlan:
    return PodPlan(cfg=KubernetesConfig.model_validate(
        {"execd_delivery": "node-cache", "node_cache_dir": "/var/lib/sl-cache", **cfg}),
        bundle=ExecdBundle(Path("/b")), bundle_image="sandlot.local/execd-bundle:abc",
        owner="o1", execd_port=44772, cache_name=NAME)


def spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {"sandbox_id": "0b5e-42", "image": ImageRef("python:3.12"),
                               "entrypoint": ["sleep", "inf"]}
    return SandboxSpec(**{**base, **kw})  # type: ignore[arg-type]


def volumes(pod: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def test_unknown_node_gets_the_fill_init_container_with_the_only_writable_cache_mount() -> None:
    pod = plan().pod(spec())
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == "sandlot-execd-cache"
    assert init["command"][-2:] == ["/sandlot-cache", NAME]
    assert init["volumeMounts"] == [{"name": "sandlot-execd-cache",
                                     "mountPath": "/sandlot-cache"}]
    vols = volumes(pod)
    assert vols["sandlot-execd-cache"]["hostPath"] == {"path": "/var/lib/sl-cache",
                                                       "type": "DirectoryOrCreate"}
    assert vols["sandlot-execd"]["hostPath"] == {"path": f"/var/lib/sl-cache/{NAME}"}
    main = pod["spec"]["containers"][0]
    bundle = [m for m in main["volumeMounts"] if m["name"] == "sandlot-execd"]
    assert bundle == [{"name": "sandlot-execd", "mountPath": "/opt/sandlot", "readOnly": True}]
    assert not any(m["name"] == "sandlot-execd-cache" for m in main["volumeMounts"])
    assert "affinity" not in pod["spec"]


def test_pod_bound_to_cached_nodes_has_no_init_container_and_no_cache_root() -> None:
    pod = plan().pod(spec(), cached_on=("node-a", "node-b"))
    assert pod["spec"]["initContainers"] == []
    assert "sandlot-execd-cache" not in volumes(pod)
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                            "operator": "In", "values": ["node-a", "node-b"]}]}]


def test_copy_mode_is_unchanged() -> None:
    pod = plan(execd_delivery="copy").pod(spec())
    assert pod["spec"]["initContainers"][0]["name"] == "sandlot-execd-installer"
    assert volumes(pod)["sandlot-execd"] == {"name": "sandlot-execd", "emptyDir": {}}


@pytest.mark.parametrize("source", ["/var/lib/sl-cache", "/var/lib/sl-cache/x", "/var/lib",
                                    "/", "/var/lib/sl-cache/../sl-cache"])
def test_host_volumes_reaching_the_cache_are_refused(source: str) -> None:
    vol = VolumeSpec(name="v", kind="host", source=source, mount_path="/mnt", read_only=False)
    with pytest.raises(InvalidRequest, match="node cache"):
        plan().pod(spec(volumes=[vol]))
    other = VolumeSpec(name="v", kind="host", source="/var/lib/sl-cache-other", mount_path="/m",
                       read_only=False)
    assert plan().pod(spec(volumes=[other]))


def _bundle(root: Path) -> Path:
    src = root / "src"
    (src / "lib").mkdir(parents=True)
    (src / "bin").mkdir()
    (src / "lib" / "a.py").write_text("print('a')\n")
    (src / "bin" / "python3").write_bytes(b"\x7fELF...")
    (src / "bin" / "python3").chmod(0o755)
    (src / "lib" / "link").symlink_to("a.py")
    return src


def test_fill_is_verified_read_only_then_only_verified(tmp_path: Path) -> None:
    src = _bundle(tmp_path)
    digest = bundle_fill.tree_digest(str(src))
    cache = tmp_path / "cache"
    cache.mkdir()
    assert bundle_fill.fill(str(src), str(cache), NAME) == "filled"
    entry = cache / NAME
    assert bundle_fill.tree_digest(str(entry)) == digest
    assert not stat.S_IMODE(os.stat(entry / "lib" / "a.py").st_mode) & 0o222
    assert not stat.S_IMODE(os.stat(entry / "lib").st_mode) & 0o222
    assert sorted(p.name for p in cache.iterdir()) == [NAME]  # no temporary left
    assert bundle_fill.fill(str(src), str(cache), NAME) == "verified"


@pytest.mark.parametrize("damage", ["tampered", "partial", "extra", "file"])
def test_a_damaged_entry_is_replaced_not_used(tmp_path: Path, damage: str) -> None:
    src = _bundle(tmp_path)
    digest = bundle_fill.tree_digest(str(src))
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = cache / NAME
    if damage == "file":
        entry.write_text("not a directory")
    else:
        bundle_fill.fill(str(src), str(cache), NAME)
        bundle_fill._writable(str(entry))
        if damage == "tampered":
            (entry / "lib" / "a.py").write_text("print('evil')\n")
        elif damage == "partial":
            (entry / "bin" / "python3").unlink()
        else:
            (entry / "lib" / "sitecustomize.py").write_text("import evil\n")
    assert bundle_fill.fill(str(src), str(cache), NAME) == "filled"
    assert (entry / "lib" / "a.py").read_text() == "print('a')\n"
    assert bundle_fill.tree_digest(str(entry)) == digest
    assert sorted(p.name for p in cache.iterdir()) == [NAME]


def test_an_entry_of_another_build_is_replaced_by_the_images(tmp_path: Path) -> None:
    """The image is the reference, not whatever a node holds under the name."""
    old, new = tmp_path / "old", tmp_path / "new"
    _bundle(old)
    _bundle(new)
    (new / "src" / "lib" / "a.py").write_text("print('new build')\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    bundle_fill.fill(str(old / "src"), str(cache), NAME)
    assert bundle_fill.fill(str(new / "src"), str(cache), NAME) == "filled"
    assert (cache / NAME / "lib" / "a.py").read_text() == "print('new build')\n"


class _Core:
    """list_node of a cluster whose nodes are given (a fake beside the kit test)."""

    def __init__(self, nodes: list[SimpleNamespace], status: int | None = None) -> None:
        self.nodes = nodes
        self.status = status
        self.calls = 0

    async def list_node(self, label_selector: str = "") -> SimpleNamespace:
        self.calls += 1
        if self.status is not None:
            raise ApiException(status=self.status, reason="Forbidden")
        return SimpleNamespace(items=self.nodes)


def _node(name: str, ready: bool = True, taint: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name),
        spec=SimpleNamespace(unschedulable=False,
                             taints=[SimpleNamespace(effect=taint)] if taint else None),
        status=SimpleNamespace(conditions=[SimpleNamespace(type="Ready",
                                                           status=str(ready))]))


def _filled_pod(node: str, path: str, exit_code: int = 0) -> SimpleNamespace:
    done = SimpleNamespace(exit_code=exit_code)
    return SimpleNamespace(
        spec=SimpleNamespace(node_name=node, volumes=[SimpleNamespace(
            name="sandlot-execd", host_path=SimpleNamespace(path=path))]),
        status=SimpleNamespace(init_container_statuses=[SimpleNamespace(
            name="sandlot-execd-cache", state=SimpleNamespace(terminated=done))]))


def test_pods_skip_the_init_container_only_when_every_eligible_node_holds_the_entry() -> None:
    p = plan()
    core = _Core([_node("a"), _node("b"), _node("down", ready=False),
                  _node("tainted", taint="NoSchedule")])
    cache = NodeCache(core, p)  # type: ignore[arg-type]
    entry = p.cache_entry()
    cache.note(_filled_pod("a", entry))
    cache.note(_filled_pod("b", entry, exit_code=1))  # a failed fill proves nothing
    cache.note(_filled_pod("b", "/elsewhere/" + NAME))  # another bundle's entry
    assert asyncio.run(cache.bound_nodes()) is None  # b is not known to hold it
    cache.note(_filled_pod("b", entry))
    assert asyncio.run(cache.bound_nodes()) == ("a", "b")
    cache.forget(_filled_pod("b", entry))
    assert asyncio.run(cache.bound_nodes()) is None


def test_a_server_that_may_not_list_nodes_keeps_the_init_container() -> None:
    p = plan()
    core = _Core([], status=403)
    cache = NodeCache(core, p)  # type: ignore[arg-type]
    cache.note(_filled_pod("a", p.cache_entry()))
    assert asyncio.run(cache.bound_nodes()) is None
    assert asyncio.run(cache.bound_nodes()) is None
    assert core.calls == 1  # asked once, not at every create
