"""Build images from recipes: debootstrap (or a parent image), then commands in a chroot.

Every step that mounts something (debootstrap's own /proc, our /proc, /dev and apt cache
binds for the chroot) runs under ``unshare --mount --pid --fork``: the mounts live in a
private mount namespace and every process in a private PID namespace, so when the step ends,
or is killed, the kernel drops the mounts and kills stray daemons. Nothing leaks onto the
host even when a build fails half-way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from sandlot.errors import SandlotError
from sandlot.images.mirror import host_debian_mirror
from sandlot.images.model import Image, ImageConfig
from sandlot.images.progress import Progress, ProgressFn
from sandlot.images.recipe import Recipe, load_recipe
from sandlot.images.unpack import strip_device_nodes

if TYPE_CHECKING:
    from sandlot.images.store import ImageStore

BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Services must not start inside the build chroot.
_POLICY_RC = "#!/bin/sh\nexit 101\n"
# Runs as: sh -c SCRIPT ROOTFS APT_CACHE COMMAND (inside the private namespaces).
_CHROOT_SCRIPT = """set -e
mount -t proc proc "$0/proc"
mount --bind /dev "$0/dev"
if [ -n "$1" ]; then mount --bind "$1" "$0/var/cache/apt/archives"; fi
exec chroot "$0" /bin/sh -c "$2"
"""


class ImageBuildError(SandlotError):
    status = 500
    code = "IMAGE_BUILD_FAILED"


def _unshare() -> list[str]:
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation=private", "--"]


class RecipeBuilder:
    def __init__(self, store: ImageStore):
        self.store = store
        self.mirror = host_debian_mirror()

    async def build(self, rec: Recipe, emit: ProgressFn, *, if_missing: bool) -> Image:
        """Build ``rec`` and tag it with all its tags; return the image under its first tag."""
        lock_path = self.store.cache_dir / f"build-{rec.name}.lock"
        async with _file_lock(lock_path):
            digest = recipe_digest(rec)
            if if_missing:
                present = [self.store.get(t) for t in rec.all_tags]
                if all(
                    img is not None and self.store.metadata(img.id).get("recipe_digest") == digest
                    for img in present
                ):
                    emit(Progress("done", message=f"{rec.name}: already built"))
                    return present[0]  # type: ignore[return-value]
            parent: Image | None = None
            if rec.from_:
                parent_rec = load_recipe(rec.from_, near=rec.source)
                if parent_rec.name == rec.name:
                    raise ImageBuildError(f"recipe {rec.name!r} names itself in 'from'")
                parent = self.store.get(parent_rec.all_tags[0])
                if parent is None:
                    parent = await self.build(parent_rec, emit, if_missing=True)
            with self.store.workdir("build") as work:
                return await self._build_in(work, rec, parent, digest, emit)

    async def _build_in(
        self, work: Path, rec: Recipe, parent: Image | None, digest: str, emit: ProgressFn
    ) -> Image:
        rootfs = work / "rootfs"
        if parent is not None:
            emit(Progress("build", message=f"copying {parent.name}"))
            await self._step(["cp", "-a", str(parent.lower_dirs[0]), str(rootfs)], emit, "copy")
        else:
            await self._debootstrap(rec, rootfs, emit)
        self._prepare(rootfs)
        apt_cache = self.store.cache_dir / "apt" / rec.suite
        (apt_cache / "partial").mkdir(parents=True, exist_ok=True)
        env = self._env(rec, parent)
        if parent is not None and rec.packages:
            pkgs = " ".join(rec.packages)
            await self._chroot(
                rootfs,
                "apt-get update -qq && apt-get install -y -qq --no-install-recommends " + pkgs,
                env,
                emit,
                "installing packages",
                apt_cache=apt_cache,
            )
        for cmd in rec.run:
            await self._chroot(rootfs, cmd, env, emit, f"run: {cmd}", apt_cache=apt_cache)
        self._finish(rootfs)
        for cmd in rec.smoke_test:
            await self._chroot(rootfs, cmd, env, emit, f"smoke test: {cmd}")
        config = self._config(rec, parent)
        stamp = f"{rec.text}\n{secrets.token_hex(16)}".encode()
        image_id = "sha256:" + hashlib.sha256(stamp).hexdigest()
        emit(Progress("commit", message=rec.name))
        img = await asyncio.to_thread(
            self.store.commit,
            rootfs,
            image_id,
            rec.all_tags,
            config=config,
            created=None,
            source=f"recipe:{rec.name}",
            extra={"recipe_digest": digest},
        )
        emit(Progress("done", message=f"{rec.name} built"))
        return img

    async def _debootstrap(self, rec: Recipe, rootfs: Path, emit: ProgressFn) -> None:
        if shutil.which("debootstrap") is None:
            raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
        cache = self.store.cache_dir / "debootstrap" / rec.suite
        cache.mkdir(parents=True, exist_ok=True)
        args = [
            *_unshare(),
            "debootstrap",
            f"--variant={rec.variant}",
            f"--cache-dir={cache.resolve()}",
        ]
        if rec.packages:
            args.append("--include=" + ",".join(rec.packages))
        args += [rec.suite, str(rootfs), self.mirror]
        emit(Progress("build", message=f"debootstrap {rec.suite} from {self.mirror}"))
        await self._step(args, emit, "debootstrap")

    def _prepare(self, rootfs: Path) -> None:
        """Make the chroot usable: DNS from the host, no service starts, mount points."""
        for sub in ("proc", "dev", "tmp", "var/cache/apt/archives"):
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        resolv = rootfs / "etc" / "resolv.conf"
        with contextlib.suppress(FileNotFoundError):
            resolv.unlink()
        with contextlib.suppress(OSError):
            shutil.copyfile("/etc/resolv.conf", resolv)
        policy = rootfs / "usr" / "sbin" / "policy-rc.d"
        policy.write_text(_POLICY_RC)
        policy.chmod(0o755)
        # No fsync per unpacked file: a build that dies is thrown away whole, and the image
        # is committed after the steps (281 -> 243 s for the code-interpreter packages).
        unsafe_io = rootfs / DPKG_UNSAFE_IO.lstrip("/")
        if unsafe_io.parent.is_dir():
            unsafe_io.write_text("force-unsafe-io\n")
        host_ca = _host_ca_bundle()
        if host_ca is not None:
            # Build steps (pip, npm, curl) must trust what the host trusts, e.g. a site's TLS
            # proxy; the bundle is removed again in _finish so the image does not carry it.
            shutil.copyfile(host_ca, rootfs / BUILD_CA_PATH.lstrip("/"))

    def _finish(self, rootfs: Path) -> None:
        """Undo build-only changes and drop what an image should not carry."""
        with contextlib.suppress(FileNotFoundError):
            (rootfs / "usr" / "sbin" / "policy-rc.d").unlink()
        with contextlib.suppress(FileNotFoundError):
            (rootfs / BUILD_CA_PATH.lstrip("/")).unlink()
        with contextlib.suppress(FileNotFoundError):
            (rootfs / DPKG_UNSAFE_IO.lstrip("/")).unlink()
        (rootfs / "etc" / "resolv.conf").write_text("# provided by the sandbox runtime\n")
        lists = rootfs / "var" / "lib" / "apt" / "lists"
        if lists.is_dir():
            for entry in lists.iterdir():
                if entry.is_file():
                    entry.unlink()
        for name in ("pkgcache.bin", "srcpkgcache.bin"):
            with contextlib.suppress(FileNotFoundError):
                (rootfs / "var" / "cache" / "apt" / name).unlink()
        strip_device_nodes(rootfs)

    def _env(self, rec: Recipe, parent: Image | None) -> dict[str, str]:
        env = {"PATH": BUILD_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
        if parent is not None:
            env.update(_env_dict(parent.config.env))
        env.update(rec.env)
        env["DEBIAN_FRONTEND"] = "noninteractive"
        if _host_ca_bundle() is not None:
            for name in _CA_ENV_NAMES:
                env[name] = BUILD_CA_PATH
        return env

    def _config(self, rec: Recipe, parent: Image | None) -> ImageConfig:
        base = parent.config if parent is not None else ImageConfig(env=[f"PATH={BUILD_PATH}"])
        env = _env_dict(base.env)
        env.setdefault("PATH", BUILD_PATH)
        env.update(rec.env)
        return ImageConfig(
            env=[f"{k}={v}" for k, v in env.items()],
            entrypoint=base.entrypoint,
            cmd=rec.cmd if rec.cmd is not None else base.cmd,
            working_dir=rec.working_dir or base.working_dir,
            user=base.user,
        )

    async def _chroot(
        self,
        rootfs: Path,
        command: str,
        env: dict[str, str],
        emit: ProgressFn,
        what: str,
        *,
        apt_cache: Path | None = None,
    ) -> None:
        emit(Progress("build", message=what))
        args = [*_unshare(), "/bin/sh", "-c", _CHROOT_SCRIPT, str(rootfs)]
        args += [str(apt_cache) if apt_cache else "", command]
        await self._step(args, emit, what, env=env)

    async def _step(
        self, args: list[str], emit: ProgressFn, what: str, env: dict[str, str] | None = None
    ) -> None:
        """Run one build step, streaming its output as progress; fail with its last lines."""
        tail: collections.deque[str] = collections.deque(maxlen=30)
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env or {"PATH": BUILD_PATH, "LANG": "C.UTF-8"},
        )
        assert proc.stdout is not None
        try:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    tail.append(line)
                    emit(Progress("build", message=line))
            rc = await proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # unshare --fork: killing it takes the whole PID namespace down
            await proc.wait()
            raise
        if rc != 0:
            output = "\n".join(tail)
            raise ImageBuildError(f"{what} failed (exit {rc}):\n{output}")


BUILD_CA_PATH = "/etc/sandlot-build-ca.crt"
DPKG_UNSAFE_IO = "/etc/dpkg/dpkg.cfg.d/sandlot-build-unsafe-io"  # removed again in _finish
_CA_ENV_NAMES = (
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "npm_config_cafile",
    "GIT_SSL_CAINFO",
)


def _host_ca_bundle() -> Path | None:
    """The CA bundle the host's own tools use, if there is one."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def recipe_digest(rec: Recipe) -> str:
    """Identifies what a build would produce: the recipe text and its parents' texts.

    ``--if-missing`` reuses an image only when this matches, so editing a recipe (or
    upgrading sandlot with a changed shipped recipe) rebuilds it.
    """
    h = hashlib.sha256(rec.text.encode())
    if rec.from_:
        h.update(recipe_digest(load_recipe(rec.from_, near=rec.source)).encode())
    return "sha256:" + h.hexdigest()


def _env_dict(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if sep:
            out[key] = value
    return out


@contextlib.asynccontextmanager
async def _file_lock(path: Path):  # type: ignore[no-untyped-def]
    """Serialize builds of one recipe across processes (others wait, then reuse the result)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
