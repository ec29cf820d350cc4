"""Where one sandbox's files live on the host: everything under ``data_dir/sandboxes/<id>/``,
but the mount points of user-namespaced sandboxes' root file systems (``rootfs_folder``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

NETNS_PREFIX = "sandlot-"
# Mount points of user-namespaced sandboxes' root file systems (``OciRuntime.rootfs_of``
# says why not under the data dir), one folder per data dir.
ROOTS_DIR = Path("/run/sandlot-rootfs")


def rootfs_folder(data_dir: Path) -> Path:
    """``data_dir``'s folder under ``ROOTS_DIR`` (named by a digest of its path)."""
    return ROOTS_DIR / hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def claims_folder(data_dir: Path) -> Path:
    """Where the warm pool records which pool container each claimed sandbox runs in (one
    file per sandbox id, holding the container id; ``pool.ClaimStore``)."""
    return data_dir / "pool" / "claims"


@dataclass(frozen=True)
class SandboxPaths:
    root: Path

    @classmethod
    def of(cls, data_dir: Path, sandbox_id: str) -> SandboxPaths:
        return cls(data_dir / "sandboxes" / sandbox_id)

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def rootfs(self) -> Path:
        """The overlay mount point; runc's bundle rootfs."""
        return self.bundle / "rootfs"

    @property
    def config_json(self) -> Path:
        return self.bundle / "config.json"

    @property
    def rw(self) -> Path:
        """Holds the overlay's upper and work dirs: a plain directory, or the mount point of
        the sandbox's own size-capped file system (``disklimit``)."""
        return self.root / "rw"

    @property
    def lower(self) -> Path:
        """Idmapped mounts of the image layers (one per layer: ``lower/0``, ...)."""
        return self.root / "lower"

    @property
    def upper(self) -> Path:
        return self.rw / "upper"

    @property
    def work(self) -> Path:
        return self.rw / "work"

    @property
    def volumes(self) -> Path:
        """Staged bind mounts of the sandbox's volumes (``volumes``)."""
        return self.root / "volumes"

    @property
    def etc(self) -> Path:
        """Generated files bind-mounted over the image's (hosts, hostname)."""
        return self.root / "etc"

    @property
    def snapshot_freeze(self) -> Path:
        """Present while a snapshot holds the container frozen for its copy."""
        return self.root / "snapshot-freeze"

    @property
    def container_log(self) -> Path:
        """stdout/stderr of the container's init process (execd)."""
        return self.root / "container.log"

    @property
    def runc_log(self) -> Path:
        return self.root / "runc.log"


def netns_name(sandbox_id: str) -> str:
    """A short, stable network namespace name (``ip netns`` names are file names)."""
    digest = hashlib.sha256(sandbox_id.encode()).hexdigest()[:12]
    return NETNS_PREFIX + digest
