"""Bundles of earlier sandlot versions leave a data dir's own cache once nothing needs them:
kept while served, named by a sandbox, mounted in any mount namespace or executed; a shared
(symlinked) cache is not pruned by a runtime, only by its harness's ``prune_shared``, which
keeps what was served within a day; a real runtime's sandboxes are seen by both checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.images.model import Image
from sandlot.runtime import bundle_prune, execd_bundle
from sandlot.runtime.oci import OciRuntime
from tests.conftest import BUNDLE_CACHE
from tests.runtime.helpers import needs_root, open_runtime, short_tmpdir, spec, wait_ping

CURRENT, BASE = "a" * 16, "base-" + "b" * 16
OLD, OLD_BASE = "c" * 16, "base-" + "d" * 16
NAMED, MOUNTED, EXECUTED = "e" * 16, "f" * 16, "1" * 16


def _bundle(cache: Path, name: str) -> Path:
    d = cache / name
    (d / "bin").mkdir(parents=True)
    (d / ".complete").write_text("")
    return d


@pytest.fixture
def users(tmp_path: Path) -> Iterator[Path]:
    """A cache holding the current bundle and base, an old pair, one bundle a sandbox names,
    one bind-mounted in another mount namespace (as a container's /opt/sandlot), one whose
    copy of ``sleep`` is running, and a folder that is not a bundle."""
    needs_root()
    cache = tmp_path / "execd-bundle"
    for name in (CURRENT, BASE, OLD, OLD_BASE, NAMED, MOUNTED, EXECUTED):
        _bundle(cache, name)
    (cache / "notes").mkdir()
    target = tmp_path / "target"
    target.mkdir()
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount --bind "{cache / MOUNTED}" "{target}" && echo ready && exec sleep 60'],
        stdout=subprocess.PIPE, text=True)
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", cache / EXECUTED / "bin" / "sleep")
    runner = subprocess.Popen([str(cache / EXECUTED / "bin" / "sleep"), "60"])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{runner.pid}/exe").resolve().is_relative_to(cache / EXECUTED):
            assert time.monotonic() < deadline, "the bundle's sleep did not start"
            time.sleep(0.01)
        yield cache
    finally:
        for proc in (holder, runner):
            proc.kill()
            proc.wait()


def test_only_bundles_nothing_needs_are_removed(users: Path) -> None:
    cache = users
    # named by a config written before the data dir moved: matched by its key
    removed = bundle_prune.prune_unused(cache, (cache / CURRENT, cache / BASE),
                                        lambda: [Path("/moved/data/execd-bundle") / NAMED])
    assert sorted(p.name for p in removed) == sorted([OLD, OLD_BASE])
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted([CURRENT, BASE, NAMED, MOUNTED, EXECUTED, "notes"])
    assert bundle_prune.used_on_host([cache / MOUNTED, cache / EXECUTED, cache / NAMED]) == {
        cache / MOUNTED, cache / EXECUTED}


def test_a_caller_that_is_not_root_keeps_every_bundle(
        users: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not as root, ``used_on_host`` cannot read other users' processes (run as ``nobody``,
    the scan found none of these used, the mounted and the running one included), so it
    reports every bundle used and a prune removes nothing; root finds only the mounted and
    the running one."""
    asked = [users / MOUNTED, users / EXECUTED, users / OLD]
    assert bundle_prune.used_on_host(asked) == {users / MOUNTED, users / EXECUTED}
    monkeypatch.setattr(bundle_prune.os, "geteuid", lambda: 65534)
    assert bundle_prune.used_on_host(asked) == set(asked)
    assert bundle_prune.prune_unused(users, (), lambda: []) == []
    assert (users / OLD).is_dir() and (users / OLD_BASE).is_dir()


def test_a_shared_cache_is_left_alone_and_references_are_asked_only_when_needed(
        users: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared-link"
    shared.symlink_to(users)

    def never() -> list[Path]:
        raise AssertionError("asked for references with nothing to remove")

    assert bundle_prune.prune_unused(shared, (), never) == []
    assert (users / OLD).is_dir() and (users / OLD_BASE).is_dir()
    for name in (OLD, OLD_BASE, NAMED):
        shutil.rmtree(users / name)
    kept = (users / CURRENT, users / BASE, users / MOUNTED, users / EXECUTED)
    assert bundle_prune.prune_unused(users, kept, never) == []


def test_ensure_bundle_prunes_its_own_cache_only_when_asked(tmp_path: Path) -> None:
    """Beside the current bundle and base (as built: their real keys, marked complete), a
    stale bundle is kept by a plain ``ensure_bundle`` (the test suite's and the kubernetes
    kit's shared caches) and removed with ``referenced``; an interrupted prune's ``.tmp-``
    folder is swept as a crashed build's is."""
    needs_root()
    cache = tmp_path / "execd-bundle"
    base_name = f"base-{execd_bundle.base_key()}"
    current = _bundle(cache, execd_bundle.full_key(execd_bundle.base_key()))
    _bundle(cache, base_name)
    stale = _bundle(cache, OLD)
    (cache / f".tmp-prune-{OLD_BASE}-12345678").mkdir()
    assert execd_bundle.ensure_bundle(cache).path == current and stale.is_dir()
    assert execd_bundle.ensure_bundle(cache, lambda: []).path == current
    assert not stale.exists() and not list(cache.glob(".tmp-*"))
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == sorted(
        [current.name, base_name])


def _served_ago(bundle: Path, seconds: float) -> None:
    os.utime(bundle, (time.time() - seconds,) * 2)


def test_a_shared_cache_keeps_what_was_served_within_the_idle_time(
        users: Path, tmp_path: Path) -> None:
    """``prune_shared`` (the test suite's and the bench's caches, reached here through a link
    as their data dirs reach them): every bundle was last served two days ago except one an
    hour ago; the current code's pair (real keys), the recent one and the two the host uses
    stay, the rest go."""
    base_key = execd_bundle.base_key()
    current = (_bundle(users, f"base-{base_key}"), _bundle(users, execd_bundle.full_key(base_key)))
    for bundle in users.iterdir():
        _served_ago(bundle, 2 * 86400)
    _served_ago(users / NAMED, 3600)
    link = tmp_path / "shared-link"
    link.symlink_to(users)
    removed = execd_bundle.prune_shared(link, idle_seconds=86400)
    assert sorted(p.name for p in removed) == sorted([CURRENT, BASE, OLD, OLD_BASE])
    assert sorted(p.name for p in users.iterdir() if not p.name.startswith(".")) == sorted(
        [NAMED, MOUNTED, EXECUTED, "notes", *(p.name for p in current)])


def test_ensure_bundle_stamps_what_it_serves(tmp_path: Path) -> None:
    """The served bundle and its base are stamped, not a sibling of the same base whose
    files (``.complete`` too) are hard links to the base's, as a built bundle's are."""
    cache = tmp_path / "execd-bundle"
    base_key = execd_bundle.base_key()
    base = _bundle(cache, f"base-{base_key}")
    full = _bundle(cache, execd_bundle.full_key(base_key))
    sibling = cache / OLD
    sibling.mkdir()
    for bundle in (full, sibling):
        (bundle / ".complete").unlink(missing_ok=True)
        os.link(base / ".complete", bundle / ".complete")
    for bundle in (base, full, sibling):
        _served_ago(bundle, 2 * 86400)
    assert execd_bundle.ensure_bundle(cache).path == full
    for bundle in (base, full):
        assert time.time() - bundle.stat().st_mtime < 60
    assert time.time() - sibling.stat().st_mtime > 86400


async def test_a_runtime_s_sandboxes_name_and_mount_its_bundle(
        oci_runtime: OciRuntime, rt_image: Image, runtime_data_dir: Path) -> None:
    rt = oci_runtime
    await rt.create(spec("prune1", rt_image))
    assert (await wait_ping(rt, "prune1")).status_code == 200
    assert rt.bundle.path in bundle_prune.named_in_oci_configs(runtime_data_dir,
                                                               rt.bundle.mount_point)
    assert bundle_prune.used_on_host([rt.bundle.path]) == {rt.bundle.path}
    await rt.delete("prune1")


async def test_a_runtime_opened_on_its_own_cache_prunes_what_its_sandboxes_do_not_name(
        tmp_path: Path) -> None:
    """``OciRuntime.open`` on a data dir whose cache is its own (a hard-link copy of the
    machine-wide one's current bundle and base): a stale bundle goes, one that a (stopped)
    sandbox's config.json names stays."""
    needs_root()
    shared = execd_bundle.ensure_bundle(BUNDLE_CACHE).path
    data_dir = short_tmpdir("slprune")
    try:
        cache = data_dir / "execd-bundle"
        cache.mkdir()
        for name in (shared.name, f"base-{execd_bundle.base_key()}"):
            subprocess.run(["cp", "-al", str(BUNDLE_CACHE / name), str(cache / name)],
                           check=True)
        stale, named = _bundle(cache, OLD), _bundle(cache, NAMED)
        config = data_dir / "sandboxes" / "stopped" / "bundle" / "config.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"mounts": [
            {"destination": "/opt/sandlot", "type": "bind", "source": str(named)}]}))
        rt = await open_runtime(data_dir)
        try:
            assert rt.bundle.path == cache / shared.name
            assert not stale.exists() and named.is_dir()
        finally:
            await rt.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
