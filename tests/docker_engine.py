"""A private dockerd for the docker runtime's tests, and the test images imported into it.

Nothing of the machine's own Docker (if any) is used and nothing is pulled from a registry:

- the daemon has its own data root, exec root, pid file and unix socket; its data root is
  kept under ``/var/tmp/sandlot-test/dockerd`` between runs (the imported images stay) while
  one test session holds its lock, else a throw-away one is used;
- its default bridge is a bridge device of its own on a random /24 of 198.18.0.0/15 (the
  benchmarking range, never a private or a real range; not 192.0.2.0/24, the uplink), and
  user-defined networks come from another random /24 of that range. No iptables rules, no
  masquerading, no IP forwarding: containers reach nothing beyond the host;
- images are made by ``docker import`` of a rootfs of the sandlot test image store (the
  ``base`` recipe's rootfs), labelled with the store's image id so a changed image is
  imported again.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import psutil
import pytest
from docker.errors import DockerException, ImageNotFound

from sandlot.images.model import Image

PERSISTENT_ROOT = Path(os.environ.get("SANDLOT_TEST_DOCKERD", "/var/tmp/sandlot-test/dockerd"))
SOURCE_LABEL = "io.sandlot.test.source"
BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")
GVISOR_RUNTIME = "sandlot-runsc"  # runsc as an engine runtime (when installed)
# The test Kubernetes kit's ranges (service range, node address, Pod network): a dockerd of
# the same session must not take them, or the cluster's up.sh refuses to start.
K8S_KIT_RANGES = (ipaddress.ip_network("198.18.0.0/23"), ipaddress.ip_network("198.19.0.0/24"))


def _routed_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                         text=True, check=False).stdout
    nets = []
    for line in out.splitlines():
        first = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if first not in ("default", "local", "broadcast"):
                nets.append(ipaddress.ip_network(first, strict=False))
            elif len(line.split()) > 1 and first in ("local", "broadcast"):
                nets.append(ipaddress.ip_network(line.split()[1], strict=False))
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def free_test_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """``count`` /24s of 198.18.0.0/15 that no route of this host touches yet."""
    used = [*_routed_networks(), *K8S_KIT_RANGES]
    candidates = list(BENCHMARK_RANGE.subnets(new_prefix=24))
    random.shuffle(candidates)
    picked = [n for n in candidates if not any(n.overlaps(u) for u in used)][:count]
    if len(picked) < count:
        raise RuntimeError("no free /24 left in 198.18.0.0/15 for a test dockerd")
    return picked


class PrivateDockerd:
    """One dockerd of the tests' own (see module docstring)."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="sldk-", dir="/tmp"))
        self.sock = self.workdir / "docker.sock"
        self.bridge = "sld" + secrets.token_hex(4)
        self.bridge_net, self.user_pool = free_test_subnets(2)
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self.data_root = self._data_root()
        self.client: docker.DockerClient | None = None

    @property
    def host(self) -> str:
        """The ``DOCKER_HOST`` value that reaches this daemon."""
        return f"unix://{self.sock}"

    def _data_root(self) -> Path:
        PERSISTENT_ROOT.mkdir(parents=True, exist_ok=True)
        fd = os.open(PERSISTENT_ROOT / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return self.workdir / "root"  # another session runs one: a throw-away root
        self._lock_fd = fd
        root = PERSISTENT_ROOT / "root"
        _stop_orphans(root)
        return root

    def _runtime_args(self) -> list[str]:
        """gVisor registered as engine runtime ``GVISOR_RUNTIME`` when runsc is installed.

        As a host would register it: a small wrapper giving runsc its flags (dockerd's
        command line takes a runtime's path only). ``--network=host``: gVisor's sockets are
        the container namespace's own, where the server reaches execd (this Debian runsc
        cannot start its own network stack on Linux >= 6 without sandlot's oci workaround).
        """
        runsc = shutil.which("runsc")
        if runsc is None:
            return []
        wrapper = self.workdir / "runsc-docker"
        # --overlay2=none: writes reach the engine's own layer (docker commit, snapshots), not
        # an overlay inside gVisor (gVisor >= 2023's default).
        wrapper.write_text(f'#!/bin/sh\nexec {runsc} --platform=ptrace --network=host '
                           '--overlay2=none "$@"\n')
        wrapper.chmod(0o755)
        return ["--add-runtime", f"{GVISOR_RUNTIME}={wrapper}"]

    def start(self, timeout: float = 90) -> None:
        gateway = next(self.bridge_net.hosts())
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{gateway}/{self.bridge_net.prefixlen}", "dev",
                        self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        log = open(self.workdir / "dockerd.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            ["dockerd", *self._runtime_args(), "--data-root", str(self.data_root),
             "--exec-root", str(self.workdir / "exec"), "--host", self.host,
             "--pidfile", str(self.workdir / "docker.pid"), "--bridge", self.bridge,
             "--default-address-pool", f"base={self.user_pool},size=28",
             "--iptables=false", "--ip6tables=false", "--ip-masq=false",
             "--ip-forward=false", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if self.sock.exists():
                with contextlib.suppress(DockerException):
                    client = docker.DockerClient(base_url=self.host, timeout=300)
                    client.ping()
                    self.client = client
                    self._remove_leftovers()
                    return
            time.sleep(0.2)
        raise RuntimeError(f"dockerd did not answer in {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        log = self.workdir / "dockerd.log"
        return log.read_text(errors="replace")[-n:] if log.exists() else ""

    def _remove_leftovers(self) -> None:
        """Containers, networks and pulled test images left in the kept data root."""
        assert self.client is not None
        for c in self.client.containers.list(all=True):
            with contextlib.suppress(DockerException):
                c.remove(force=True, v=True)
        self.client.networks.prune()
        for image in self.client.images.list():  # pulled from the tests' loopback registries
            if any(tag.startswith("127.0.0.1:") for tag in image.tags):
                with contextlib.suppress(DockerException):
                    self.client.images.remove(image.id, force=True)

    def import_image(self, image: Image, *tags: str) -> str:
        """``docker import`` of a one-layer store image's rootfs as ``tags``; its id."""
        assert self.client is not None
        api = self.client.api
        with contextlib.suppress(ImageNotFound):
            attrs = api.inspect_image(tags[0])
            if ((attrs.get("Config") or {}).get("Labels") or {}).get(SOURCE_LABEL) == image.id:
                for tag in tags[1:]:
                    self.client.images.get(attrs["Id"]).tag(tag)
                return str(attrs["Id"])
        if len(image.lower_dirs) != 1:
            raise RuntimeError(f"{image.name} has {len(image.lower_dirs)} layers; one expected")
        changes = [f"ENV {e}" for e in image.config.env]
        if image.config.working_dir:
            changes.append(f"WORKDIR {image.config.working_dir}")
        changes.append(f"LABEL {SOURCE_LABEL}={image.id}")
        tar = subprocess.Popen(["tar", "-C", str(image.lower_dirs[0]), "--numeric-owner",
                                "-cf", "-", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        try:
            repo, _, tag = tags[0].rpartition(":")
            api.import_image(src=tar.stdout, repository=repo, tag=tag, changes=changes,
                             stream_src=True)
        finally:
            tar.stdout.close()
            tar.wait(timeout=120)
        image_id = str(api.inspect_image(tags[0])["Id"])
        for tag in tags[1:]:
            self.client.images.get(image_id).tag(tag)
        # an earlier import these tags pointed at is kept in the data root no longer
        self.client.images.prune(filters={"dangling": True})
        return image_id

    def create_network(self, name: str) -> None:
        """A user-defined bridge network (its subnet from the daemon's private pool)."""
        assert self.client is not None
        self.client.networks.create(name, driver="bridge")

    def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(DockerException):
                self._remove_leftovers()
            self.client.close()
        stop_dockerd(self.proc, self.workdir, self.data_root)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)


def _stop_orphans(data_root: Path) -> None:
    """A dockerd a crashed session left running on the kept data root (we hold its lock now,
    so it is nobody's): stopped before another daemon opens that root."""
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if proc.info["name"] == "dockerd" and str(data_root) in cmd:
                proc.terminate()
                try:
                    proc.wait(30)
                except psutil.TimeoutExpired:
                    proc.kill()
        except psutil.Error:
            continue


def stop_dockerd(proc: subprocess.Popen[bytes] | None, *mount_roots: Path) -> None:
    """End a dockerd started in a session of its own (SIGTERM to its process group, shims
    included; SIGKILL after 30 s), then lazily unmount what it left under ``mount_roots``.

    Used by the tests' private dockerd and by the bench's docker baseline.
    """
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    for root in mount_roots:
        _unmount_under(root)


def _unmount_under(root: Path) -> None:
    prefix = str(root) + "/"
    try:
        with open("/proc/self/mountinfo") as fh:
            points = [ln.split()[4] for ln in fh if ln.split()[4].startswith(prefix)]
    except OSError:
        return
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def needs_dockerd() -> None:
    if os.geteuid() != 0:
        pytest.skip("the docker runtime's tests need root (they start a dockerd)")
    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is missing: run scripts/install-deps.sh (installs docker.io)")


@contextlib.contextmanager
def running_dockerd() -> Iterator[PrivateDockerd]:
    needs_dockerd()
    engine = PrivateDockerd()
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()
