"""Removing the execd bundles of earlier sandlot versions from a data dir's cache.

Every code version adds a bundle to ``execd-bundle/`` (~6.6 MB: hard links to its base's
files plus sandlot's own code) and every interpreter or distribution change a base; nothing
removed them. A bundle is removed only when nothing can still need it:

- it is not the bundle being served, nor that bundle's base (``keep``);
- the runtime's own sandboxes do not name it (``referenced``: their config.json or their
  containers' mounts, stopped and hibernated ones included, which a restore mounts again);
- nothing on the host uses it now: no mount of it in any mount namespace (a container's
  ``/opt/sandlot``, a zygote's private namespace) and no process runs a file of it.

A cache that is a symbolic link is shared by several data dirs (the test suite's and the
bench's are) and is left alone: another server's stopped sandboxes cannot be seen from here.
Their harnesses prune it with ``execd_bundle.prune_shared`` instead, which keeps what was
served recently rather than asking the data dirs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

# A bundle's or a base's folder name (``execd_bundle._build_once``); anything else is kept.
_BUNDLE_NAME = re.compile(r"(base-)?[0-9a-f]{16}")
# Where an OCI data dir keeps each sandbox's config (``oci/layout.py``), named here so that
# a runtime need not import the OCI package (and its nftables binding) to ask.
OCI_CONFIGS = "sandboxes/*/bundle/config.json"


def prune_unused(cache_root: Path, keep: Collection[Path],
                 referenced: Callable[[], Iterable[Path]]) -> list[Path]:
    """Remove the bundles under ``cache_root`` that nothing needs (see the module's
    docstring); the removed paths. The caller holds the cache's lock, so no build runs
    meanwhile. ``referenced`` is only asked when there is something to remove."""
    if cache_root.is_symlink():
        return []
    kept = {p.resolve() for p in keep}
    candidates = [d for d in sorted(cache_root.iterdir())
                  if _BUNDLE_NAME.fullmatch(d.name) and d.is_dir() and not d.is_symlink()
                  and d.resolve() not in kept]
    if not candidates:
        return []
    # By key, not by path: a config written before the data dir was moved names it too.
    named = {Path(p).name for p in referenced()}
    candidates = [d for d in candidates if d.name not in named]
    live = used_on_host(candidates)
    removed = []
    for bundle in candidates:
        if bundle in live:
            continue
        trash = cache_root / f".tmp-prune-{bundle.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(bundle, trash)  # gone at once; a crash leaves a .tmp-* the next build sweeps
        except OSError as exc:
            log.warning("execd bundle %s: not removed: %s", bundle, exc)
            continue
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(bundle)
    if removed:
        log.info("removed %d execd bundle(s) of earlier versions no sandbox uses: %s",
                 len(removed), ", ".join(p.name for p in removed))
    return removed


def named_in_oci_configs(data_dir: Path, mount_point: str) -> set[Path]:
    """The bundles that the config.json of each OCI sandbox under ``data_dir`` binds at
    ``mount_point``: running, stopped and hibernated ones (a restore mounts its config's
    again). An unreadable config names none."""
    found: set[Path] = set()
    for config_json in data_dir.glob(OCI_CONFIGS):
        try:
            mounts = json.loads(config_json.read_text()).get("mounts") or []
        except (OSError, ValueError, AttributeError):
            continue
        found.update(Path(m["source"]) for m in mounts
                     if isinstance(m, dict) and m.get("destination") == mount_point
                     and isinstance(m.get("source"), str))
    return found


def used_on_host(bundles: list[Path]) -> set[Path]:
    """The ``bundles`` some mount namespace on the host mounts (all or a part of), or some
    process's executable lies in. A mount is found by the bundle's folder name (its 16-digit
    key) anywhere in the namespace's mountinfo: the kernel keeps no bind mount's source
    path, only its root in the file system; the key holds no character mountinfo escapes,
    and a false match only keeps a bundle. A caller that is not root cannot read other
    users' processes, any of which could be using them: then all are reported used."""
    if not bundles:
        return set()
    if os.geteuid() != 0:
        return set(bundles)
    by_name = {b.name: b for b in bundles}
    keys = "|".join(map(re.escape, by_name))
    mounted = re.compile(f"/({keys})(?=[/ ]|$)", re.MULTILINE)
    homes = {str(b.resolve()) + "/": b for b in bundles}
    used: set[Path] = set()
    namespaces: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            exe = os.readlink(f"/proc/{pid}/exe")
            used.update(b for home, b in homes.items() if exe.startswith(home))
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/mnt")
            if namespace in namespaces:
                continue
            namespaces.add(namespace)
            with open(f"/proc/{pid}/mountinfo") as fh:
                text = fh.read()
        except OSError:
            continue  # a process that ended meanwhile, or a kernel thread
        used.update(by_name[name] for name in mounted.findall(text))
    return used
