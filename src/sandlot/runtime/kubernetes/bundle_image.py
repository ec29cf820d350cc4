"""The execd bundle image: how execd gets into a Pod whatever image the sandbox runs.

Nodes of a cluster cannot bind-mount the server's disk, so the bundle travels as a tiny
image of its own (one layer: the bundle's files under ``/sandlot-bundle``). A Pod's init
container runs that image and, with the bundle's own interpreter (the image has no shell or
coreutils), either copies the bundle into an ``emptyDir`` (``execd_delivery = "copy"``) or
fills/verifies the node's cache entry (``"node-cache"``, ``bundle_fill``); the sandbox
container mounts it read-only at ``/opt/sandlot``: the same place, and started the same
way, as on the other backends. Its tag is the bundle's content key, so a node never runs a
stale execd.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.kubernetes import bundle_fill
from sandlot.runtime.kubernetes.archive import write_docker_archive

IN_IMAGE = "/sandlot-bundle"
DEFAULT_REPOSITORY = "sandlot.local/execd-bundle"
_COPY = (
    "import shutil, sys; "
    "shutil.copytree(sys.argv[1], sys.argv[2], symlinks=True, dirs_exist_ok=True)"
)


def image_name(bundle: ExecdBundle, repository: str = DEFAULT_REPOSITORY) -> str:
    """``repository:<bundle key>`` (the bundle directory's name is its content key)."""
    return f"{repository}:{bundle.path.name}"


def write_image(bundle: ExecdBundle, out: Path, tag: str) -> None:
    """A docker-archive of the bundle image, for ``ctr images import`` or a registry push."""
    write_docker_archive(out, tag, bundle.path, prefix=IN_IMAGE.lstrip("/"))


def copy_command(target: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the init container that copies the bundle to ``target``."""
    inside = ExecdBundle(Path(IN_IMAGE), mount_point=IN_IMAGE)
    return [*inside.python_argv(), "-c", _COPY, IN_IMAGE, target], inside.env()


def fill_command(cache: str, name: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the init container that fills (or verifies) a node's
    cache entry ``cache/name`` from the image (``bundle_fill``, run as source)."""
    inside = ExecdBundle(Path(IN_IMAGE), mount_point=IN_IMAGE)
    source = Path(bundle_fill.__file__).read_text()
    return [*inside.python_argv(), "-c", source, IN_IMAGE, cache, name], inside.env()


def cache_name(image: str) -> str:
    """The node-cache entry of a bundle image: one per image reference (the fill verifies
    the entry against the image's own content, whatever the tag)."""
    return hashlib.sha256(image.encode()).hexdigest()[:32]
