"""ImageStore: the local images in ``<data_dir>/images``, shared by the server and the CLI.

Layout::

    index.json          tags -> image ids -> run config (see index.py)
    .lock               flock taken by writers
    rootfs/<hex>/       one flattened rootfs per image, named by its content digest
    tmp/<op>-<pid>-*/   work in progress (pull layouts, unpacking, builds)
    cache/              debootstrap and apt downloads kept between builds

Every operation does its work in ``tmp/`` and only then, under the lock, renames the result
into ``rootfs/`` and records it in the index, so a half-finished pull or build never shows
up as an image, and a crash leaves only a ``tmp/`` entry that the next store start removes.
Flattening each image into one directory (rather than one directory per layer) keeps
overlayfs mounts to a single lower dir and makes whiteout handling a plain delete.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandlot.errors import Conflict, ImagePullError, InvalidRequest, NotFound
from sandlot.images.index import ImageIndex, IndexData
from sandlot.images.model import Image, ImageConfig, RegistryAuth
from sandlot.images.oci_layout import LayoutImage, OciLayout, digest_of, is_index, pick_platform
from sandlot.images.progress import Progress, ProgressFn, emitter
from sandlot.images.reference import Reference, parse_reference
from sandlot.images.skopeo import Skopeo
from sandlot.images.unpack import apply_layer, dir_size, open_layer

DEFAULT_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ImageStore:
    def __init__(self, root: Path, insecure_registries: Iterable[str] = ()):
        self.root = Path(root)
        self.insecure_registries = {r.strip().rstrip("/") for r in insecure_registries}
        self._index = ImageIndex(self.root)
        self._inflight: dict[str, asyncio.Future[Image]] = {}
        for sub in ("rootfs", "tmp", "cache"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            # Unpacked trees keep the images' setuid-root binaries and private files: no host
            # user but root may reach them (the overlays built on them are mounted nosuid).
            os.chmod(self.root / sub, 0o700)
        self._reap_stale_work()

    # ----------------------------------------------------------------- paths and reading
    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def rootfs_path(self, image_id: str) -> Path:
        return self.root / "rootfs" / image_id.split(":", 1)[-1]

    def _image(self, data: IndexData, key: str) -> Image | None:
        tag = data.tags.get(key)
        if tag is None:
            return None
        return self._image_by_id(data, tag["id"], tag["name"])

    def _image_by_id(self, data: IndexData, image_id: str, name: str) -> Image | None:
        meta = data.images.get(image_id)
        if meta is None:
            return None
        return Image(
            name=name,
            id=image_id,
            lower_dirs=[self.rootfs_path(image_id)],
            config=ImageConfig(**meta.get("config", {})),
            size_bytes=int(meta.get("size_bytes", 0)),
            created=meta.get("created"),
        )

    def get(self, name: str) -> Image | None:
        """The local image called ``name`` (as given or in canonical form), else None."""
        data = self._index.current()
        found = self._image(data, name) or self._image_by_id(data, name, name)
        if found is not None:
            return found
        try:
            ref = parse_reference(name)
        except InvalidRequest:
            return None
        found = self._image(data, ref.canonical)
        if found is None and ref.digest:
            found = self._image_by_id(data, ref.digest, name)
        return found

    def list(self) -> list[Image]:
        """One entry per tag, sorted by name."""
        data = self._index.current()
        images = [self._image(data, key) for key in data.tags]
        return sorted((i for i in images if i is not None), key=lambda i: i.name)

    # ----------------------------------------------------------------- tags and removal
    def tag(self, source: str, target: str) -> Image:
        """Give the image ``source`` the additional name ``target``."""
        img = self.get(source)
        if img is None:
            raise NotFound(f"image {source!r} is not in the local store")
        key = parse_reference(target).canonical
        with self._index.edit() as data:
            if img.id not in data.images:
                raise NotFound(f"image {source!r} was removed meanwhile")
            data.tags[key] = {"name": target, "id": img.id}
        self._prune()
        return self._require(target)

    def remove(self, name: str) -> None:
        """Untag ``name``; the image's files go once no tag refers to them and no mount does."""
        with self._index.edit() as data:
            key = self._tag_key(data, name)
            if key is None:
                raise NotFound(f"image {name!r} is not in the local store")
            image_id = data.tags[key]["id"]
            still_tagged = any(t["id"] == image_id for k, t in data.tags.items() if k != key)
            if not still_tagged and self._in_use(image_id):
                raise Conflict(f"image {name!r} is in use by a sandbox; delete the sandbox first")
            del data.tags[key]
        self._prune()

    def _tag_key(self, data: IndexData, name: str) -> str | None:
        if name in data.tags:
            return name
        with contextlib.suppress(InvalidRequest):
            key = parse_reference(name).canonical
            if key in data.tags:
                return key
        return None

    def _in_use(self, image_id: str) -> bool:
        """True when a mount (e.g. a sandbox's overlay lowerdir) refers to the image's rootfs."""
        path = str(self.rootfs_path(image_id))
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
                return any(path in line for line in fh)
        except OSError:
            return False

    def _prune(self) -> None:
        """Delete images no tag refers to (unless mounted) and rootfs dirs the index lacks."""
        doomed: list[Path] = []
        with self._index.edit() as data:
            referenced = {t["id"] for t in data.tags.values()}
            for image_id in list(data.images):
                if image_id not in referenced and not self._in_use(image_id):
                    del data.images[image_id]
            known = {self.rootfs_path(i).name for i in data.images}
            for entry in (self.root / "rootfs").iterdir():
                if entry.name not in known:
                    trash = self.root / "tmp" / f"trash-{os.getpid()}-{secrets.token_hex(4)}"
                    os.rename(entry, trash)
                    doomed.append(trash)
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)

    # ----------------------------------------------------------------- committing work
    @contextlib.contextmanager
    def workdir(self, op: str) -> Iterator[Path]:
        """A private scratch directory under ``tmp/``, removed afterwards whatever happens."""
        path = self.root / "tmp" / f"{op}-{os.getpid()}-{secrets.token_hex(6)}"
        path.mkdir(mode=0o700)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _reap_stale_work(self) -> None:
        """Remove ``tmp/`` entries left by processes that died mid-operation."""
        for entry in (self.root / "tmp").iterdir():
            parts = entry.name.split("-")
            if len(parts) >= 3 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
                shutil.rmtree(entry, ignore_errors=True)

    def has_id(self, image_id: str) -> bool:
        return image_id in self._index.current().images

    def metadata(self, image_id: str) -> dict[str, Any]:
        """The index entry of an image (config, size_bytes, created, source, ...)."""
        return dict(self._index.current().images.get(image_id, {}))

    def commit(
        self,
        rootfs: Path | None,
        image_id: str,
        names: builtins.list[str],
        *,
        config: ImageConfig,
        created: str | None,
        source: str,
        extra: dict[str, str] | None = None,
    ) -> Image:
        """Move a finished ``rootfs`` into the store (unless that id exists) and tag it.

        ``extra`` is kept in the image's index entry (e.g. the recipe digest of a build).
        """
        keys = [(parse_reference(n).canonical, n) for n in names]
        target = self.rootfs_path(image_id)
        doomed: list[Path] = []
        with self._index.edit() as data:
            if image_id not in data.images or not target.is_dir():
                if rootfs is None:
                    raise ImagePullError(f"image {image_id} vanished from the store meanwhile")
                if target.exists():  # a rootfs the index never recorded: replace it
                    stale = self.root / "tmp" / f"trash-{os.getpid()}-{secrets.token_hex(6)}"
                    os.rename(target, stale)
                    doomed.append(stale)
                os.chmod(rootfs, 0o755)
                os.rename(rootfs, target)
                data.images[image_id] = {
                    "config": asdict(config),
                    "size_bytes": dir_size(target),
                    "created": created or _now(),
                    "source": source,
                    **(extra or {}),
                }
            for key, name in keys:
                data.tags[key] = {"name": name, "id": image_id}
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        self._prune()
        return self._require(names[0])

    def _require(self, name: str) -> Image:
        img = self.get(name)
        if img is None:
            raise ImagePullError(f"image {name!r} disappeared right after it was stored")
        return img

    # ----------------------------------------------------------------- pulling
    def is_insecure(self, ref: Reference) -> bool:
        """Plain HTTP / unverified TLS for loopback and configured insecure registries."""
        return (
            ref.is_loopback()
            or ref.domain in self.insecure_registries
            or (ref.host in self.insecure_registries)
        )

    async def pull(
        self,
        name: str,
        auth: RegistryAuth | None = None,
        progress: ProgressFn | None = None,
        *,
        insecure: bool = False,
    ) -> Image:
        """Fetch ``name`` from its registry into the store (concurrent pulls of a name share
        one download). Raises ImageNotFound or ImagePullError."""
        ref = parse_reference(name)
        key = f"{ref.canonical}|{auth.username if auth else ''}"
        running = self._inflight.get(key)
        if running is not None:
            img = await asyncio.shield(running)
            return self.tag(img.id, name) if img.name != name else img
        fut: asyncio.Future[Image] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            img = await self._pull(ref, name, auth, emitter(progress), insecure)
            fut.set_result(img)
            return img
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: nobody else may be waiting
            raise
        finally:
            del self._inflight[key]

    async def _pull(
        self,
        ref: Reference,
        name: str,
        auth: RegistryAuth | None,
        emit: ProgressFn,
        insecure: bool,
    ) -> Image:
        tls_verify = not (insecure or self.is_insecure(ref))
        with self.workdir("pull") as work:
            skopeo = Skopeo(work, auth=auth, registry=ref.domain)
            emit(Progress("resolve", message=ref.canonical))
            raw = await skopeo.inspect_raw(ref, tls_verify=tls_verify)
            manifest, digest = _load_manifest(raw, ref)
            if is_index(manifest):
                digest = pick_platform(manifest)["digest"]
                pinned = Reference(ref.domain, ref.path, None, digest)
                manifest, _ = _load_manifest(
                    await skopeo.inspect_raw(pinned, tls_verify=tls_verify), pinned
                )
            if self.has_id(digest):
                meta = self._index.current().images[digest]
                emit(Progress("done", message=digest))
                return self.commit(
                    None,
                    digest,
                    [name],
                    config=ImageConfig(**meta["config"]),
                    created=meta.get("created"),
                    source=ref.canonical,
                )
            total = sum(int(x.get("size", 0)) for x in manifest.get("layers", []))
            total += int((manifest.get("config") or {}).get("size", 0))
            layout = work / "layout"
            await skopeo.copy_to_layout(
                f"docker://{ref.repository}@{digest}",
                layout,
                tls_verify=tls_verify,
                progress=lambda n: emit(Progress("download", min(n, total), total)),
            )
            emit(Progress("download", total, total))
            img = OciLayout(layout).image("img")
            return await self._unpack_and_commit(work, img, digest, [name], ref.canonical, emit)

    async def _unpack_and_commit(
        self,
        work: Path,
        img: LayoutImage,
        image_id: str,
        names: builtins.list[str],
        source: str,
        emit: ProgressFn,
    ) -> Image:
        rootfs = work / "rootfs"
        rootfs.mkdir(mode=0o755)
        await asyncio.to_thread(_apply_layers, img.layers, rootfs, emit)
        emit(Progress("commit", message=image_id))
        result = await asyncio.to_thread(
            self.commit,
            rootfs,
            image_id,
            names,
            config=img.config,
            created=img.created,
            source=source,
        )
        emit(Progress("done", message=image_id))
        return result

    # ----------------------------------------------------------------- importing
    async def import_tar(self, path: Path, tag: str, progress: ProgressFn | None = None) -> Image:
        """Import a ``docker save`` archive, an OCI archive or a plain rootfs tarball."""
        path = Path(path)
        parse_reference(tag)  # reject a bad name before doing any work
        emit = emitter(progress)
        if not path.is_file():
            raise NotFound(f"archive {path} does not exist")
        kind = await asyncio.to_thread(archive_kind, path)
        with self.workdir("import") as work:
            if kind == "rootfs":
                return await self._import_rootfs(work, path, tag, emit)
            transport = "docker-archive" if kind == "docker" else "oci-archive"
            layout = work / "layout"
            emit(Progress("unpack", message=f"reading {kind} archive"))
            await Skopeo(work, auth=None, registry=None).copy_to_layout(
                f"{transport}:{path}", layout
            )
            img = OciLayout(layout).image("img")
            return await self._unpack_and_commit(
                work, img, img.manifest_digest, [tag], f"{transport}:{path.name}", emit
            )

    async def _import_rootfs(self, work: Path, path: Path, tag: str, emit: ProgressFn) -> Image:
        rootfs = work / "rootfs"
        rootfs.mkdir(mode=0o755)

        def unpack() -> str:
            digest = _file_digest(path)
            emit(Progress("unpack", 0, 1, path.name))
            with open_layer(path) as stream:
                apply_layer(stream, rootfs, whiteouts=False)
            emit(Progress("unpack", 1, 1, path.name))
            return digest

        digest = await asyncio.to_thread(unpack)
        result = await asyncio.to_thread(
            self.commit,
            rootfs,
            digest,
            [tag],
            config=ImageConfig(env=[DEFAULT_PATH_ENV]),
            created=None,
            source=f"rootfs:{path.name}",
        )
        emit(Progress("done", message=digest))
        return result

    # ----------------------------------------------------------------- building
    async def build(
        self,
        recipe: Any,
        progress: ProgressFn | None = None,
        *,
        if_missing: bool = False,
    ) -> Image:
        """Build a recipe (a Recipe, a shipped recipe name or a TOML path); see build.py."""
        from sandlot.images.build import RecipeBuilder
        from sandlot.images.recipe import Recipe, load_recipe

        rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        return await RecipeBuilder(self).build(rec, emitter(progress), if_missing=if_missing)


def _load_manifest(raw: bytes, ref: Reference) -> tuple[dict[str, Any], str]:
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise ImagePullError(f"registry sent an unreadable manifest for {ref.canonical}") from exc
    if manifest.get("schemaVersion") == 1:
        raise ImagePullError(f"{ref.canonical} uses the retired Docker schema 1 manifest format")
    return manifest, digest_of(raw)


def _apply_layers(layers: list[Path], rootfs: Path, emit: ProgressFn) -> None:
    for i, layer in enumerate(layers):
        emit(Progress("unpack", i, len(layers), layer.name[:12]))
        with open_layer(layer) as stream:
            apply_layer(stream, rootfs, whiteouts=True)
    emit(Progress("unpack", len(layers), len(layers)))


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def archive_kind(path: Path) -> str:
    """ "docker" (docker save), "oci" (OCI image layout archive) or "rootfs" (anything else)."""
    names: set[str] = set()
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                name = member.name.removeprefix("./")
                if "/" not in name:
                    names.add(name)
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidRequest(f"{path.name} is not a (readable) tar archive: {exc}") from exc
    if "manifest.json" in names:
        return "docker"
    if "oci-layout" in names and "index.json" in names:
        return "oci"
    return "rootfs"
