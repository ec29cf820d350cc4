"""A real single-node Kubernetes for the kubernetes runtime's tests, and the test images
loaded into its node.

The cluster comes from the kit beside the checkout (``shared/k8s/up.sh``, found in a parent
directory of the checkout, or ``SANDLOT_K8S_KIT``): ONE cluster per test session, started in
a directory under /tmp and stopped with ``down.sh`` at the end. ``SANDLOT_K8S_DIR`` names a
kit cluster that already runs (a developer's; it is left running), and a ``KUBECONFIG`` alone
is used as it is (its nodes must already hold the test images). Without any of them the
kubernetes tests are skipped with that message.

Images are never pulled: ``base`` (as ``python:3.12``), ``code-interpreter`` and sandlot's
execd bundle image are written as docker-archives from the local test image store (kept in
``/var/tmp/sandlot-test/k8s-images`` by image id) and loaded with the kit's ``ctr images
import``. Each test session works in a namespace of its own, deleted at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from bench.k8s_kit import find_kit, start_kit, stop_kit

from sandlot.images.model import Image
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.kubernetes import bundle_image
from sandlot.runtime.kubernetes.archive import gnu_tar_layer, write_docker_archive

log = logging.getLogger(__name__)
ARCHIVES = Path(os.environ.get("SANDLOT_TEST_K8S_IMAGES", "/var/tmp/sandlot-test/k8s-images"))
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cluster:
    kubeconfig: Path
    kit_dir: Path | None  # None: a KUBECONFIG of someone else's (no image import)
    namespace: str = field(default_factory=lambda: "sandlot-test-" + secrets.token_hex(4))
    _loaded: set[str] = field(default_factory=set)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                namespaced: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["kubectl", "--kubeconfig", str(self.kubeconfig)]
        if namespaced:
            argv += ["-n", self.namespace]
        return subprocess.run([*argv, *args], capture_output=True, text=True, check=check,
                              timeout=timeout)

    def _has_image(self, name: str) -> bool:
        assert self.kit_dir is not None
        out = subprocess.run([str(self.kit_dir / "ctr"), "images", "ls", "-q"],
                             capture_output=True, text=True, check=True).stdout.split()
        full = name if "/" in name.split(":")[0] and "." in name.split("/")[0] \
            else f"docker.io/library/{name}" if "/" not in name else f"docker.io/{name}"
        return name in out or full in out

    def load_archive(self, archive: Path, name: str) -> None:
        if self.kit_dir is None or name in self._loaded:
            return
        if not self._has_image(name):
            subprocess.run([str(self.kit_dir / "ctr"), "images", "import", str(archive)],
                           check=True, capture_output=True, timeout=900)
        self._loaded.add(name)

    def import_image(self, image: Image, name: str) -> None:
        """A test-store image (one layer) loaded into the node as ``name``."""
        if self.kit_dir is None:
            return
        tag = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
        key = hashlib.sha256(f"{image.id}:{tag}".encode()).hexdigest()[:24]
        archive = ARCHIVES / f"{key}.tar"
        if not archive.exists():
            if len(image.lower_dirs) != 1:
                raise RuntimeError(f"{image.name} has {len(image.lower_dirs)} layers")
            write_docker_archive(archive, tag, Path(image.lower_dirs[0]),
                                 env=list(image.config.env),
                                 working_dir=image.config.working_dir,
                                 cmd=list(image.config.cmd or []) or None,
                                 layer_writer=gnu_tar_layer)
        self.load_archive(archive, tag)

    def load_bundle(self, bundle: ExecdBundle) -> str:
        name = bundle_image.image_name(bundle)
        if self.kit_dir is None:
            return name
        archive = ARCHIVES / f"bundle-{bundle.path.name}.tar"
        if not archive.exists():
            for stale in ARCHIVES.glob("bundle-*.tar"):  # of earlier sandlot code
                stale.unlink(missing_ok=True)
            bundle_image.write_image(bundle, archive, name)
        self.load_archive(archive, name)
        return name

    def config_toml(self, **extra: object) -> str:
        lines = ["[kubernetes]", f'kubeconfig_path = "{self.kubeconfig}"',
                 f'namespace = "{self.namespace}"',
                 # a 2-core test node: requests are a twentieth of the limits
                 "request_fraction = 0.05"]
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
        return "\n".join(lines) + "\n"

    def sandlot_objects(self) -> dict[str, list[str]]:
        """Names of sandlot's Pods, Secrets, PVCs and NetworkPolicies left in the session's
        namespace."""
        left: dict[str, list[str]] = {}
        for kind in ("pods", "secrets", "persistentvolumeclaims", "networkpolicies"):
            out = self.kubectl("get", kind, "-l", "app.kubernetes.io/managed-by=sandlot",
                               "-o", "name", check=False).stdout.split()
            if out:
                left[kind] = out
        return left


@contextlib.contextmanager
def running_cluster():  # type: ignore[no-untyped-def]
    """The session's cluster (see module docstring); skips when there is none."""
    running = os.environ.get("SANDLOT_K8S_DIR")
    kit = find_kit()
    started: Path | None = None
    if running:
        cluster = Cluster(Path(running) / "kubeconfig", Path(running))
    elif kit is not None and os.geteuid() == 0:
        started = start_kit(kit, "slk8s-")
        cluster = Cluster(started / "kubeconfig", started)
    elif os.environ.get("KUBECONFIG"):
        cluster = Cluster(Path(os.environ["KUBECONFIG"]), None)
    else:
        pytest.skip("no Kubernetes for the kubernetes runtime's tests: no kit (shared/k8s "
                    "beside the checkout, SANDLOT_K8S_KIT; needs root) and no KUBECONFIG")
    try:
        cluster.kubectl("create", "namespace", cluster.namespace, namespaced=False)
        yield cluster
    finally:
        log.info("tearing down the test cluster's namespace %s", cluster.namespace)
        with contextlib.suppress(Exception):
            cluster.kubectl("delete", "namespace", cluster.namespace, "--wait=false",
                            namespaced=False, check=False)
        if started is not None and kit is not None:
            log.info("stopping the test cluster in %s", started)
            stop_kit(kit, started)
