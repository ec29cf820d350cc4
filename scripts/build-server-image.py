"""Build the images of deploy/kubernetes/ without Docker or Docker Hub; print where they are.

  .venv/bin/python scripts/build-server-image.py [--out DIR] [--store DIR]

Three docker-archives (load them with ``ctr -n k8s.io images import FILE`` on each node, or
push them with ``skopeo copy docker-archive:FILE docker://REGISTRY/NAME``):

- ``sandlot.local/server:VERSION``: Debian bookworm (the recipe
  deploy/kubernetes/images/server-base.toml, built by sandlot's own recipe builder with
  debootstrap) plus a venv at /opt/sandlot holding sandlot from this checkout, its
  dependencies pinned to the versions of the running venv (``pip freeze``), installed from a
  wheelhouse the host builds (nothing is compiled in the image).
- ``sandlot.local/execd-bundle:KEY``: the execd bundle that server builds, made by running
  ``sandlot kubernetes bundle-image`` inside the server's rootfs, so its key is the one the
  server computes in its Pod.
- ``sandlot.local/postgres:15``: Debian's PostgreSQL 15 (deploy/kubernetes/images/postgres.toml).

Everything is cached: the Debian rootfs in the image store under ``--store`` (by recipe), the
archives under ``--out`` by a hash of the recipes, sandlot's sources and the pinned versions.
Prints one JSON object: ``{"server": {"image", "archive"}, "bundle": ..., "postgres": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from sandlot.images.model import Image
from sandlot.images.store import ImageStore
from sandlot.runtime.kubernetes.archive import gnu_tar_layer, write_docker_archive

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "deploy" / "kubernetes" / "images"
CACHE = Path(os.environ.get("SANDLOT_SERVER_IMAGE_CACHE", "/var/tmp/sandlot-test/server-image"))
VENV = "/opt/sandlot"
SERVER_UID = 10001  # the manifest's runAsUser
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Inputs of the server image besides the recipe: what `pip wheel .` reads.
SOURCES = ("pyproject.toml", "README.md", "src/sandlot")


def version() -> str:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def pinned() -> str:
    """The running venv's versions (sandlot itself left out) as pip constraints."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable",
                          "--exclude", "sandlot"], capture_output=True, text=True, check=True)
    return "".join(line + "\n" for line in sorted(out.stdout.splitlines())
                   if "==" in line and not line.startswith("-"))


def sources_hash() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        root = REPO / name
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for path in files:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def chroot(rootfs: Path, command: str) -> str:
    """``command`` in ``rootfs`` with /proc, in private mount and PID namespaces (nothing
    stays mounted or running after it, even when it fails); its stdout."""
    script = 'mount -t proc proc "$0/proc" && exec chroot "$0" /bin/sh -ec "$1"'
    res = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation=private", "--",
         "/bin/sh", "-c", script, str(rootfs), command],
        capture_output=True, text=True, env={"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root"})
    if res.returncode != 0:
        raise SystemExit(f"in the image: {command}\nfailed ({res.returncode}):\n"
                         f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def built(store: ImageStore, recipe: str) -> Image:
    return asyncio.run(store.build(str(RECIPES / f"{recipe}.toml"), if_missing=True))


def drop_stale(out: Path, prefix: str, keep: Path) -> None:
    """Archives (and their .name files) of earlier builds."""
    for stale in out.glob(f"{prefix}-*"):
        if stale.stem != keep.stem:
            stale.unlink(missing_ok=True)


def build_server(store: ImageStore, out: Path, key: str) -> dict[str, dict[str, str]]:
    server_tar, bundle_tar = out / f"server-{key}.tar", out / f"bundle-{key}.tar"
    bundle_name_file = out / f"bundle-{key}.name"
    server_name = f"sandlot.local/server:{version()}"
    if server_tar.exists() and bundle_tar.exists() and bundle_name_file.exists():
        return {"server": {"image": server_name, "archive": str(server_tar)},
                "bundle": {"image": bundle_name_file.read_text().strip(),
                           "archive": str(bundle_tar)}}
    base = built(store, "server-base")
    with tempfile.TemporaryDirectory(dir=out, prefix=".server-") as work_dir:
        work = Path(work_dir)
        wheels = work / "wheels"
        constraints = work / "constraints.txt"
        constraints.write_text(pinned())
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir",
                        str(wheels), "--constraint", str(constraints), str(REPO)], check=True)
        rootfs = work / "rootfs"
        subprocess.run(["cp", "-a", str(base.lower_dirs[0]), str(rootfs)], check=True)
        shutil.copytree(wheels, rootfs / "tmp" / "wheels")
        shutil.copyfile("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")  # not used: no index
        chroot(rootfs, f"python3 -m venv {VENV}"
                       f" && {VENV}/bin/pip install --quiet --no-cache-dir --no-index"
                       " --find-links /tmp/wheels sandlot"
                       " && rm -rf /tmp/wheels"
                       f" && useradd --uid {SERVER_UID} --user-group --home-dir /var/lib/sandlot"
                       " --shell /usr/sbin/nologin sandlot"
                       f" && install -d -o {SERVER_UID} -g {SERVER_UID} /var/lib/sandlot"
                       f" && {VENV}/bin/sandlot --help >/dev/null")
        # The bundle of exactly this interpreter and these distributions (its content key).
        bundle_name = chroot(rootfs, f"{VENV}/bin/sandlot kubernetes bundle-image"
                                     " -o /tmp/bundle.tar --data-dir /tmp/bundle-data"
                             ).strip().splitlines()[-1]
        shutil.move(rootfs / "tmp" / "bundle.tar", work / "bundle.tar")
        shutil.rmtree(rootfs / "tmp" / "bundle-data")
        (rootfs / "etc" / "resolv.conf").write_text("# provided by the cluster\n")
        write_docker_archive(server_tar, server_name, rootfs,
                             env=[f"PATH={PATH}", "LANG=C.UTF-8", "HOME=/var/lib/sandlot"],
                             working_dir="/var/lib/sandlot",
                             cmd=["sandlot", "serve", "--config", "/etc/sandlot/sandlot.toml"],
                             layer_writer=gnu_tar_layer)
        shutil.move(work / "bundle.tar", bundle_tar)
        bundle_name_file.write_text(bundle_name + "\n")
    drop_stale(out, "server", server_tar)
    drop_stale(out, "bundle", bundle_tar)
    return {"server": {"image": server_name, "archive": str(server_tar)},
            "bundle": {"image": bundle_name, "archive": str(bundle_tar)}}


def build_postgres(store: ImageStore, out: Path) -> dict[str, str]:
    recipe = (RECIPES / "postgres.toml").read_bytes()
    tar = out / f"postgres-{hashlib.sha256(recipe).hexdigest()[:16]}.tar"
    name = "sandlot.local/postgres:15"
    if not tar.exists():
        img = built(store, "postgres")
        write_docker_archive(tar, name, img.lower_dirs[0], env=list(img.config.env),
                             working_dir=img.config.working_dir,
                             cmd=list(img.config.cmd or []) or None, layer_writer=gnu_tar_layer)
        drop_stale(out, "postgres", tar)
    return {"image": name, "archive": str(tar)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE / "archives",
                        help="where the archives are written and cached")
    parser.add_argument("--store", type=Path, default=CACHE / "images",
                        help="the image store holding the Debian rootfs of the recipes")
    parser.add_argument("--no-postgres", action="store_true",
                        help="only the server and bundle images (an external PostgreSQL)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    store = ImageStore(args.store)
    key_src = [(RECIPES / "server-base.toml").read_bytes(), sources_hash().encode(),
               pinned().encode(), Path(__file__).read_bytes()]
    key = hashlib.sha256(b"\0".join(key_src)).hexdigest()[:16]
    result: dict[str, dict[str, str]] = build_server(store, args.out, key)
    if not args.no_postgres:
        result["postgres"] = build_postgres(store, args.out)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
