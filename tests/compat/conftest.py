"""A real ``sandlot serve`` subprocess (real OciRuntime, real image store) for the released
OpenSandbox clients to drive.

The backend is ``oci`` unless a module asks for more with ``pytestmark =
pytest.mark.backends("oci", "docker")``: its tests then run once per backend (a module-scoped
``compat_backend`` parameter); ``heavy_backends("runsc")`` adds slow-marked runs on more
backends for ``make test-heavy``, and ``SANDLOT_COMPAT_BACKENDS=runsc`` selects backends.
``docker`` servers drive the session's private dockerd
(``private_dockerd``, with ``base`` imported as ``python:3.12``).

Each server gets its own short data dir (unix socket paths must stay below 108 bytes) whose
``images`` is the shared test image cache (``image_store``, with ``base`` tagged as
``python:3.12``) and whose ``execd-bundle`` is a cache shared by all compat servers, so
neither is rebuilt per server. Teardown deletes every sandbox through the API, stops the
server, removes anything a crash left in the runtime, and deletes the data dir.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from unittest import mock

import httpx
import pytest
from opensandbox.config import ConnectionConfig

from sandlot.config import Config
from sandlot.images.model import Image
from sandlot.images.store import ImageStore
from sandlot.runtime.base import Runtime
from sandlot.runtime.registry import runtime_class
from tests.conftest import BUNDLE_CACHE, free_port
from tests.docker_engine import PrivateDockerd
from tests.k8s_cluster import Cluster

COMPAT_IMAGE = "python:3.12"


def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("sandlot serve's OCI runtime needs root and runc")


# Backends: "oci" (runc), "docker", and "runsc" (the oci runtime under gVisor). A module's
# ``backends(...)`` mark names where it runs in make test (test_gvisor*.py is the bounded
# runsc subset), ``heavy_backends(...)`` where it also runs in make test-heavy (the full
# suite per backend). Unmarked modules run on the first of SANDLOT_COMPAT_BACKENDS, else
# on SANDLOT_COMPAT_BACKEND (default oci).
DEFAULT_BACKEND = (os.environ.get("SANDLOT_COMPAT_BACKENDS", "").split(",")[0].strip()
                   or os.environ.get("SANDLOT_COMPAT_BACKEND", "oci"))
GVISOR_CONFIG = '[secure_runtime]\ntype = "gvisor"\n'


def needs_backend(backend: str) -> None:
    if backend == "kubernetes":
        return  # the k8s_cluster fixture skips when there is no cluster
    needs_root()
    if backend == "runsc" and shutil.which("runsc") is None:
        pytest.skip("gVisor's runsc is not installed (scripts/install-deps.sh installs it)")


class SandlotServer:
    """One ``sandlot serve`` process; ``start``/``kill9``/``stop`` may be repeated."""

    def __init__(
        self,
        image_root: Path,
        *,
        max_timeout: int = 3600,
        backend: str = "oci",
        docker: PrivateDockerd | None = None,
        k8s: Cluster | None = None,
        warm_pool_size: int | None = None,
    ):
        self.backend = backend
        # [runtime] warm_pool_size (None: the default), e.g. 0 for a test of named pools
        # alone (the server's own pool also serves their creates when its image matches).
        self._runtime_keys = ("" if warm_pool_size is None
                              else f"warm_pool_size = {warm_pool_size}\n")
        self.docker = docker
        self.k8s = k8s
        self.data_dir = Path(tempfile.mkdtemp(prefix="slc-", dir="/tmp"))
        (self.data_dir / "images").symlink_to(image_root)
        BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "execd-bundle").symlink_to(BUNDLE_CACHE)
        self.port = free_port()
        self.api_key = secrets.token_urlsafe(24)
        self.config = self.data_dir / "sandlot.toml"
        self.config.write_text(
            f'data_dir = "{self.data_dir}"\n'
            "[server]\n"
            'host = "127.0.0.1"\n'
            f"port = {self.port}\n"
            f'api_key = "{self.api_key}"\n'
            f"max_sandbox_timeout_seconds = {max_timeout}\n"
            + self._backend_config()
        )
        self.log = self.data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _backend_config(self) -> str:
        keys = self._runtime_keys
        if self.backend == "docker":
            return f'[runtime]\ntype = "docker"\n{keys}[docker]\nnetwork_mode = "bridge"\n'
        if self.backend == "kubernetes":
            assert self.k8s is not None
            return f'[runtime]\ntype = "kubernetes"\n{keys}' + self.k8s.config_toml()
        runtime = f"[runtime]\n{keys}" if keys else ""
        return (GVISOR_CONFIG if self.backend == "runsc" else "") + runtime

    @property
    def runtime_type(self) -> str:
        """The registered runtime of this backend (runsc is the oci runtime under gVisor)."""
        return "oci" if self.backend == "runsc" else self.backend

    def runtime_config(self) -> Config:
        return Config.model_validate({
            "data_dir": str(self.data_dir), "runtime": {"type": self.runtime_type},
            "docker": {"network_mode": "bridge"},
            **({"kubernetes": {"kubeconfig_path": str(self.k8s.kubeconfig),
                               "namespace": self.k8s.namespace}} if self.k8s else {}),
            **({"secure_runtime": {"type": "gvisor"}} if self.backend == "runsc" else {})})

    def _engine_env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.docker.host} if self.docker is not None else {}

    def provide_image(self, image: Image, name: str) -> None:
        """Make the store's ``image`` available as ``name`` to this server's backend."""
        if self.docker is not None:
            self.docker.import_image(image, name if ":" in name.rsplit("/", 1)[-1]
                                     else f"{name}:latest")
        if self.k8s is not None:
            self.k8s.import_image(image, name)

    @property
    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.domain}"

    def env(self) -> dict[str, str]:
        """Environment for SDK scripts and ``osb`` (no ~/.opensandbox config is read)."""
        return {
            **os.environ,
            "OPEN_SANDBOX_DOMAIN": self.domain,
            "OPEN_SANDBOX_API_KEY": self.api_key,
            "HOME": str(self.data_dir / "home"),
        }

    def sdk_config(self, *, proxy: bool = False, timeout: float = 60) -> ConnectionConfig:
        """The released SDKs' connection settings for this server."""
        return ConnectionConfig(
            domain=self.domain,
            api_key=self.api_key,
            use_server_proxy=proxy,
            request_timeout=timedelta(seconds=timeout),
        )

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"OPEN-SANDBOX-API-KEY": self.api_key}, timeout=30
        )

    def start(self, timeout: float = 600) -> None:
        """Start and wait for /health (the first start may build the execd bundle)."""
        log = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandlot", "serve", "--config", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**{k: v for k, v in os.environ.items() if k != "OPENSANDBOX_SERVER_API_KEY"},
                 **self._engine_env()},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandlot serve exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"sandlot serve did not come up:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.proc = None

    def delete_all_sandboxes(self) -> None:
        """DELETE every sandbox, several at a time (20 one by one took ~20 s on k8s)."""
        if self.proc is None or self.proc.poll() is not None:
            return  # never started, or gone
        with self.client() as c:
            items = c.get("/v1/sandboxes", params={"pageSize": 200}).json().get("items", [])
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda item: c.delete(f"/v1/sandboxes/{item['id']}"), items))

    def runtime_ids(self) -> set[str]:
        return _in_thread(self._runtime_ids())

    async def open_runtime(self) -> Runtime:
        """This server's backend, opened on its data dir from the test process."""
        with mock.patch.dict(os.environ, self._engine_env()):
            return await runtime_class(self.runtime_type).open(self.runtime_config())

    async def _runtime_ids(self) -> set[str]:
        rt = await self.open_runtime()
        try:
            return await rt.list_ids()
        finally:
            await rt.close()

    async def _purge_runtime(self) -> None:
        rt = await self.open_runtime()
        try:
            for sid in await rt.list_ids():
                await rt.delete(sid)
        finally:
            await rt.close()

    def destroy(self) -> None:
        try:
            self.delete_all_sandboxes()
        finally:
            self.stop()
            _in_thread(self._purge_runtime())
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _in_thread(coro):  # type: ignore[no-untyped-def]
    """Run a coroutine to completion from sync code, even inside a running test loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="session")
def compat_image_root(image_store: ImageStore, base_image: object) -> Path:
    needs_root()
    if image_store.get(COMPAT_IMAGE) is None:
        image_store.tag("base", COMPAT_IMAGE)
    return image_store.root


def backend_params(backends: tuple[str, ...], heavy: tuple[str, ...],
                   only: frozenset[str] | None) -> list[object]:
    """The ``compat_backend`` parameters of one test.

    ``backends`` run in ``make test``; ``heavy`` ones (not already in ``backends``) carry the
    ``slow`` mark, so ``make test-heavy`` runs the full suite on them. ``only`` (from
    ``SANDLOT_COMPAT_BACKENDS``) picks backends among both, unmarked: the whole compat
    suite on one backend is ``SANDLOT_COMPAT_BACKENDS=runsc pytest tests/compat``.
    """
    extra = tuple(b for b in heavy if b not in backends)
    if only is not None:
        return [b for b in backends + extra if b in only]
    return [*backends, *(pytest.param(b, marks=pytest.mark.slow) for b in extra)]


def _only_backends() -> frozenset[str] | None:
    raw = os.environ.get("SANDLOT_COMPAT_BACKENDS", "").strip()
    return frozenset(b.strip() for b in raw.split(",") if b.strip()) if raw else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked ``backends(...)``/``heavy_backends(...)`` run once per named backend."""
    if "compat_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    heavy = metafunc.definition.get_closest_marker("heavy_backends")
    if marker is None and heavy is None:
        return
    backends = marker.args if marker is not None else (DEFAULT_BACKEND,)
    params = backend_params(backends, heavy.args if heavy is not None else (), _only_backends())
    if not params:  # none of the asked-for backends applies to this test
        params = [pytest.param(backends[0], marks=pytest.mark.skip(
            reason="not run on the backends SANDLOT_COMPAT_BACKENDS names"))]
    metafunc.parametrize("compat_backend", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def compat_backend(request: pytest.FixtureRequest) -> str:
    backend = str(getattr(request, "param", DEFAULT_BACKEND))
    needs_backend(backend)
    return backend


def _new_server(request: pytest.FixtureRequest, image_root: Path, backend: str,
                warm_pool_size: int | None = None) -> SandlotServer:
    docker = None
    if backend == "docker":
        docker = request.getfixturevalue("private_dockerd")
        request.getfixturevalue("docker_base_image")  # python:3.12 in the engine
    k8s = request.getfixturevalue("k8s_images") if backend == "kubernetes" else None
    return SandlotServer(image_root, backend=backend, docker=docker, k8s=k8s,
                         warm_pool_size=warm_pool_size)


def _serving(request: pytest.FixtureRequest, image_root: Path, backend: str,
             warm_pool_size: int | None = None) -> Iterator[SandlotServer]:
    """A started server, destroyed after; one that fails to start is destroyed too (its data
    dir was left behind)."""
    server = _new_server(request, image_root, backend, warm_pool_size)
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def sandlot_server(
    request: pytest.FixtureRequest, compat_image_root: Path, compat_backend: str
) -> Iterator[SandlotServer]:
    yield from _serving(request, compat_image_root, compat_backend)


@pytest.fixture
def fresh_server(
    request: pytest.FixtureRequest, compat_image_root: Path, compat_backend: str
) -> Iterator[SandlotServer]:
    """A server of the test's own (for restart tests that kill it)."""
    yield from _serving(request, compat_image_root, compat_backend)


@pytest.fixture
def fresh_server_without_warm_pool(
    request: pytest.FixtureRequest, compat_image_root: Path, compat_backend: str
) -> Iterator[SandlotServer]:
    """``fresh_server`` with ``[runtime] warm_pool_size = 0``."""
    yield from _serving(request, compat_image_root, compat_backend, warm_pool_size=0)


# A raw create body and a state wait shared by the raw-HTTP compat tests.
RAW_CREATE_BODY = {
    "image": {"uri": COMPAT_IMAGE},
    "entrypoint": ["tail", "-f", "/dev/null"],
    "resourceLimits": {"cpu": "500m", "memory": "256Mi"},
    "timeout": 600,
}


def wait_state(c: httpx.Client, sid: str, state: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c.get(f"/v1/sandboxes/{sid}")
        if r.status_code == 200 and r.json()["status"]["state"] == state:
            return r.json()  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"{sid} never reached {state}: {r.status_code} {r.text}")
