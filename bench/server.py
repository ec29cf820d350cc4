"""A private ``sandlot serve`` for one benchmark run: own data dir, shared image cache.

The server gets a fresh data dir under a temp dir (its own database and sandbox folders) whose
``images/`` is a symlink to the image cache's store, so cached images (``base``,
``code-interpreter``) are built once and reused by every run, and whose ``execd-bundle/`` is a
symlink to a bundle cache (``$SANDLOT_BENCH_BUNDLE``), built on the first run only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sandlot import datadir
from sandlot.runtime.oci import cgroups, mounts
from sandlot.runtime.oci.layout import claims_folder, netns_name, rootfs_folder
from sandlot.runtime.oci.runsc import access_netns_name

REPO = Path(__file__).resolve().parent.parent
DEFAULT_IMAGE_CACHE = Path(os.environ.get("SANDLOT_BENCH_IMAGE_DATA_DIR", "/var/lib/sandlot"))
# The read-only execd bundle the server builds once per data dir; shared between runs.
BUNDLE_CACHE = Path(
    os.environ.get("SANDLOT_BENCH_BUNDLE", "/var/tmp/sandlot-bench-cache/execd-bundle"))


def sandlot_cli() -> list[str]:
    """The ``sandlot`` command of this interpreter's environment."""
    exe = Path(sys.executable).with_name("sandlot")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "sandlot"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def image_cache_images(cache_dir: Path) -> Path:
    """``cache_dir/images``, the cache made 0700 when missing: its default is sandlot's own
    data dir (``/var/lib/sandlot``), which ``sandlot serve`` refuses once other users can
    reach it, so a bench run before ``make run`` must not leave it 0755."""
    images = datadir.create(cache_dir) / "images"
    images.mkdir(exist_ok=True)
    return images


def ensure_image(name: str, cache_dir: Path, timeout: float = 900.0) -> tuple[bool, str]:
    """``sandlot image build NAME --data-dir CACHE --if-missing``; (ok, output tail)."""
    image_cache_images(cache_dir)
    try:
        proc = subprocess.run(
            [*sandlot_cli(), "image", "build", name, "--data-dir", str(cache_dir), "--if-missing"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"image build {name} took over {timeout:.0f}s"
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return proc.returncode == 0, " | ".join(tail)


def image_present(name: str, cache_dir: Path) -> bool:
    """Whether ``sandlot image ls`` lists ``name`` (without building anything)."""
    try:
        proc = subprocess.run(
            [*sandlot_cli(), "image", "ls", "--quiet", "--data-dir", str(cache_dir)],
            capture_output=True, text=True, timeout=60, check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    if proc.returncode != 0:
        return False
    names = {line.strip().removesuffix(":latest") for line in proc.stdout.splitlines()}
    return name in names


@dataclass
class SandlotServer:
    image_cache: Path = DEFAULT_IMAGE_CACHE
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    root: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # Sized for the 10-concurrent create burst; reported with the create rows.
    warm_pool_size: int = 10
    # The bench server runs in the machine's own namespace: no veths, nft or forwarding
    # there. The network benchmark runs its servers in namespaces it makes, with its own.
    network_toml: str = '[network]\nmode = "none"\n'
    # "[runtime] type" and any more config (e.g. a [docker] section) for other backends.
    runtime_type: str = "oci"
    # More [runtime] keys, e.g. SANDLOT_BENCH_RUNTIME_TOML="max_concurrent_starts = 100" for
    # an A/B run of one setting (the run's environment records it).
    extra_config: str = field(
        default_factory=lambda: os.environ.get("SANDLOT_BENCH_RUNTIME_TOML", "").replace(";", "\n"))

    @property
    def data_dir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def domain(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.domain}"

    @property
    def log_path(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sandlot-bench-", dir=data_dir_base()))
        self.data_dir.mkdir(mode=0o700)  # sandlot serve refuses a data dir others can reach
        (self.data_dir / "images").symlink_to(image_cache_images(self.image_cache))
        BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "execd-bundle").symlink_to(BUNDLE_CACHE)
        self.port = self.port or free_port()
        config = self.root / "config.toml"
        config.write_text(
            f'data_dir = "{self.data_dir}"\n\n[server]\nhost = "{self.host}"\nport = {self.port}\n'
            f'api_key = "{self.api_key}"\n\n[runtime]\ntype = "{self.runtime_type}"\n'
            f"warm_pool_size = {self.warm_pool_size}\n" + self.extra_config
            + f"\n{self.network_toml}"
        )
        self._launch(timeout, poll=0.1)

    def relaunch(self, timeout: float = 60.0) -> float:
        """``sandlot serve`` again on the same data dir (after ``kill9`` or ``stop``); the
        seconds from its start until /health answered 200 (polled every 10 ms)."""
        return self._launch(timeout, poll=0.01)

    def kill9(self) -> None:
        """SIGKILL, as a crash: the sandboxes and warm containers stay behind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def _launch(self, timeout: float, poll: float) -> float:
        assert self.root is not None
        env = {**os.environ, **self.extra_env}
        env.pop("OPENSANDBOX_SERVER_API_KEY", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [*sandlot_cli(), "serve", "--config", str(self.root / "config.toml"),
             "--host", self.host, "--port", str(self.port), "--data-dir", str(self.data_dir)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
        log.close()
        try:
            return self._await_health(t0, t0 + timeout, poll)
        except BaseException:
            # A start that failed leaves no server behind: one still starting would refuse
            # the caller's clean-up (its sweep) and outlive the run.
            self.kill9()
            raise

    def _await_health(self, t0: float, deadline: float, poll: float) -> float:
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandlot serve exited with {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                r = httpx.get(f"{self.base_url}/health", timeout=1.0)
                if r.status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(poll)
        raise RuntimeError(f"sandlot serve did not answer /health in "
                           f"{deadline - t0:.0f}s: {self.log_tail()}")

    def container_ids(self, sandbox_ids: Collection[str]) -> list[str]:
        """The runc container of each sandbox: its own id, or the warm-pool container it
        claimed (the OCI runtime records it in ``<data dir>/pool/claims/<sandbox id>``). A
        sandbox's processes run in its container's cgroup, so finding them by the sandbox's
        id alone misses every sandbox served from the pool."""
        claims = claims_folder(self.data_dir)
        out = []
        for sid in sandbox_ids:
            try:
                out.append((claims / sid).read_text().strip() or sid)
            except OSError:
                out.append(sid)
        return out

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``grace``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def remove(self) -> None:
        """Delete the temp dir (not the shared caches it links to)."""
        if self.root is not None and os.environ.get("SANDLOT_BENCH_KEEP") != "1":
            for shared in ("images", "execd-bundle"):
                link = self.data_dir / shared
                if link.is_symlink():
                    link.unlink()
            shutil.rmtree(self.root, ignore_errors=True)


def data_dir_base() -> str | None:
    """Where the servers' data dirs are made (None: the temp dir). Not /tmp, which may be a
    small tmpfs: the 1 GiB file benchmark wants a real disk."""
    for candidate in (os.environ.get("SANDLOT_BENCH_TMP"), "/var/tmp"):
        if candidate and os.path.isdir(candidate):
            return candidate
    return None


def leftovers(root: Path) -> list[str]:
    """Mounts and processes still referring to ``root`` (there should be none after a run)."""
    found: list[str] = []
    prefix = str(root)
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                mount_point = line.split()[4]
                if mount_point.startswith(prefix):
                    found.append(f"mount {mount_point}")
    except OSError:
        pass
    import psutil

    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if prefix in cmd or (proc.info["cwd"] or "").startswith(prefix):
                found.append(f"process {proc.info['pid']}: {cmd[:120]}")
        except (psutil.Error, TypeError):
            continue
    return found


def _cgroup_dirs(pid: int) -> list[Path]:
    """The cgroup directories ``pid`` is in (v1 controllers and v2), as host paths."""
    dirs: list[Path] = []
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if not controllers:
            dirs += [Path("/sys/fs/cgroup/unified") / rel, Path("/sys/fs/cgroup") / rel]
            continue
        for c in controllers.split(","):
            dirs.append(Path("/sys/fs/cgroup") / c.removeprefix("name=") / rel)
    return dirs


def reap_leftovers(root: Path) -> list[str]:
    """Remove what the private server left of its sandboxes after it stopped: processes in
    the cgroups of sandboxes under ``root`` (only those: every one was made by this run),
    their cgroups (empty ones too), their network namespaces, and mounts under ``root`` and
    in its rootfs folder. Returns what it found, for the report."""
    import psutil

    found: list[str] = []
    sandboxes = root / "data" / "sandboxes"
    ids = {p.name for p in sandboxes.iterdir()} if sandboxes.is_dir() else set()
    if ids:
        for proc in psutil.process_iter(["pid"]):
            pid = int(proc.info["pid"])
            dirs = _cgroup_dirs(pid)
            if any(d.name in ids for d in dirs):
                found.append(f"process {pid} of sandbox "
                             f"{next(d.name for d in dirs if d.name in ids)}")
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        time.sleep(0.5)
    # Their root file systems are mounted in the data dir's folder under /run (layout.py).
    roots = rootfs_folder(root / "data")
    for point in mounts.mounts_under(root, roots):  # deepest first
        found.append(f"mount {point}")
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    # Empty ones too: a run killed whole (its sandboxes' processes with it) leaves those.
    for sid in sorted(ids):
        if cgroups.sandbox_cgroup_dirs(sid):
            found.append(f"cgroup {sid}")
            with contextlib.suppress(OSError):
                cgroups.remove_sandbox_cgroups(sid)
    # A gVisor sandbox has a second namespace beside its own, the host's way in (runsc.py).
    names = {netns_name(sid) for sid in ids}
    for name in sorted(names | {access_netns_name(n) for n in names}):
        if (Path("/run/netns") / name).exists():
            found.append(f"netns {name}")
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    if roots.is_dir() and not mounts.mounts_under(roots):  # never remove through a mount
        found.append(f"folder {roots}")
        shutil.rmtree(roots, ignore_errors=True)
    return found
