"""Fixtures shared by every test package.

- ``image_store``: a session-wide ImageStore in a cache that outlives test runs
  (``/var/tmp/sandlot-test/images``, or ``$SANDLOT_TEST_IMAGES``), so the base image's
  debootstrap runs once per machine, not once per run.
- ``base_image``: the ``base`` recipe's image (built into ``image_store`` when missing or
  when the recipe changed).
- ``private_dockerd`` / ``docker_base_image``: a dockerd of the session's own (see
  ``tests/docker_engine.py``) and the ``base`` image imported into it (as
  ``sandlot-test/base:latest`` and ``python:3.12``); nothing is pulled from a registry.
- ``k8s_cluster`` / ``k8s_images``: one Kubernetes cluster per session from the kit beside
  the checkout (see ``tests/k8s_cluster.py``) with ``base`` (as ``python:3.12``) and the execd
  bundle image loaded into its node; skipped when there is no kit and no KUBECONFIG.
- ``registry`` / ``auth_registry``: a Debian ``docker-registry`` on 127.0.0.1 with a free
  port and temp storage (the second with htpasswd auth); stopped and deleted afterwards.
  ``registry.push_layout(layout, "name:tag")`` and ``registry.push_rootfs(dir, "name:tag")``
  put images into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from sandlot.images.model import Image, RegistryAuth
from sandlot.images.store import ImageStore
from tests.docker_engine import PrivateDockerd, running_dockerd
from tests.k8s_cluster import Cluster, running_cluster

# Servers and runtimes of the tests run in the machine's own network namespace, where they
# must not create veths, nft tables or forwarding: loopback-only sandboxes unless a test says
# otherwise (tests/net runs isolated networking inside namespaces it creates).
os.environ.setdefault("SANDLOT_NETWORK_MODE", "none")

DEFAULT_TEST_IMAGES = Path("/var/tmp/sandlot-test/images")
# The execd bundle cache every test data dir links to (built once per code version).
BUNDLE_CACHE = Path(os.environ.get("SANDLOT_TEST_BUNDLE", "/var/tmp/sandlot-test/execd-bundle"))
REGISTRY_BIN = "/usr/bin/docker-registry"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Bundles of earlier code versions leave the shared cache once no run has served them
    for a day (``prune_shared``)."""
    from sandlot.runtime.execd_bundle import prune_shared

    try:
        prune_shared(BUNDLE_CACHE)
    except Exception as exc:  # noqa: BLE001 - a cache left as it was fails no test
        warnings.warn(f"the test bundle cache was not pruned: {exc}", stacklevel=1)


@pytest.fixture(scope="session")
def image_store() -> ImageStore:
    root = Path(os.environ.get("SANDLOT_TEST_IMAGES", str(DEFAULT_TEST_IMAGES)))
    return ImageStore(root)


@pytest.fixture(scope="session")
def base_image(image_store: ImageStore) -> Image:
    return asyncio.run(image_store.build("base", if_missing=True))


DOCKER_BASE_TAGS = ("sandlot-test/base:latest", "python:3.12")


@pytest.fixture(scope="session")
def private_dockerd() -> Iterator[PrivateDockerd]:
    with running_dockerd() as engine:
        yield engine


@pytest.fixture(scope="session")
def docker_base_image(private_dockerd: PrivateDockerd, base_image: Image) -> str:
    """The ``base`` image in the private dockerd; returns its first tag."""
    private_dockerd.import_image(base_image, *DOCKER_BASE_TAGS)
    return DOCKER_BASE_TAGS[0]


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def k8s_images(k8s_cluster: Cluster, base_image: Image) -> Cluster:
    """``base`` as ``python:3.12`` and the execd bundle image (of the shared bundle cache
    the compat servers use) in the cluster's node."""
    from sandlot.runtime.execd_bundle import ensure_bundle

    k8s_cluster.import_image(base_image, "python:3.12")
    k8s_cluster.load_bundle(ensure_bundle(BUNDLE_CACHE))
    return k8s_cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _htpasswd_line(user: str, password: str) -> str:
    # docker-registry only accepts bcrypt entries.
    try:
        import bcrypt

        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    except ImportError:  # pragma: no cover - the stdlib fallback (removed in Python 3.13)
        import crypt

        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=32))
    return f"{user}:{hashed}\n"


@dataclass
class LocalRegistry:
    """A running test registry: ``address`` is "127.0.0.1:PORT"; ``auth`` its credentials."""

    address: str
    workdir: Path
    auth: RegistryAuth | None = None
    pushed: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.address

    def ref(self, name: str) -> str:
        return f"{self.address}/{name}"

    def push_layout(self, layout: Path, name: str, ref_name: str = "latest") -> str:
        """Copy the image ``ref_name`` of an OCI layout to ``<address>/<name>``; return its ref."""
        dest = self.ref(name)
        args = [
            "skopeo",
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
        ]
        if self.auth is not None:
            args += ["--dest-creds", f"{self.auth.username}:{self.auth.password}"]
        args += [f"oci:{layout}:{ref_name}", f"docker://{dest}"]
        subprocess.run(args, check=True, capture_output=True, timeout=300)
        self.pushed.append(dest)
        return dest

    def push_rootfs(self, rootfs: Path, name: str, config: dict | None = None) -> str:
        """Push a directory as a one-layer image (e.g. the base image's rootfs)."""
        from tests.images.oci_util import tar_directory, write_oci_layout

        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            layer = tar_directory(rootfs, Path(tmp) / "layer.tar")
            layout = Path(tmp) / "layout"
            # Layers are read into memory by the helper: fine for test-sized images.
            write_oci_layout(layout, [layer.read_bytes()], config=config)
            layer.unlink()
            return self.push_layout(layout, name)


@contextlib.contextmanager
def run_registry(with_auth: bool) -> Iterator[LocalRegistry]:
    if not os.path.exists(REGISTRY_BIN):
        pytest.fail(f"{REGISTRY_BIN} missing: run scripts/install-deps.sh")
    workdir = Path(tempfile.mkdtemp(prefix="sandlot-registry-"))
    port = free_port()
    auth = None
    auth_section = ""
    if with_auth:
        auth = RegistryAuth(username="tester", password=secrets.token_urlsafe(12))
        (workdir / "htpasswd").write_text(_htpasswd_line(auth.username, auth.password))
        auth_section = (
            f"auth:\n  htpasswd:\n    realm: sandlot-test\n    path: {workdir / 'htpasswd'}\n"
        )
    config = workdir / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n" + auth_section
    )
    log = open(workdir / "registry.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
                if r.status_code in (200, 401):
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "docker-registry did not start: " + (workdir / "registry.log").read_text()
                )
            time.sleep(0.1)
        yield LocalRegistry(address=f"127.0.0.1:{port}", workdir=workdir, auth=auth)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def registry() -> Iterator[LocalRegistry]:
    with run_registry(with_auth=False) as reg:
        yield reg


@pytest.fixture
def auth_registry() -> Iterator[LocalRegistry]:
    with run_registry(with_auth=True) as reg:
        yield reg
