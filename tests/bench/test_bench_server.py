"""The bench's private server: a failed start leaves no process, and a clean-up that cannot
reach its server says so and still stops it (CI saw a bare ConnectError from a sweep once,
2026-12-04, and the second server of that benchmark was never stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
from bench.procs import execd_pids
from bench.sdk import Sandboxes
from bench.server import SandlotServer, image_cache_images, leftovers, reap_leftovers

from sandlot.images.model import Image
from sandlot.images.store import ImageStore
from sandlot.runtime.oci import cgroups
from sandlot.runtime.oci.layout import netns_name, rootfs_folder
from sandlot.runtime.oci.runsc import access_netns_name

needs_runc = pytest.mark.skipif(shutil.which("runc") is None, reason="needs runc")


def test_a_missing_image_cache_is_made_private(tmp_path: Path) -> None:
    """The cache's default is sandlot's data dir: a bench run first on a fresh machine made
    it 0755, and ``make run`` then refused it ("accessible to other users")."""
    cache = tmp_path / "var-lib-sandlot"
    images = image_cache_images(cache)
    assert images == cache / "images" and images.is_dir()
    assert cache.stat().st_mode & 0o777 == 0o700
    image_cache_images(cache)  # an existing cache is left as it is
    assert cache.stat().st_mode & 0o777 == 0o700


def _server(tmp_path: Path) -> SandlotServer:
    # No images are needed: nothing is created, and the warm pool is off.
    return SandlotServer(image_cache=tmp_path / "cache", warm_pool_size=0)


@needs_runc
def test_a_start_that_times_out_leaves_no_process(tmp_path: Path) -> None:
    server = _server(tmp_path)
    with pytest.raises(RuntimeError, match="did not answer /health"):
        server.start(timeout=0.05)  # far less than a server start takes
    assert server.proc is not None
    assert server.proc.poll() is not None, "the server that did not start is still running"
    server.remove()


@needs_runc
def test_a_sweep_of_a_server_that_does_not_answer_says_so_and_stops_it(tmp_path: Path) -> None:
    server = _server(tmp_path)
    server.start()
    try:
        # The server is alive but no longer at its address (as while it starts or stops).
        server.port = 1  # privileged, served by nothing here: refused at once
        boxes = Sandboxes(server, "test-run")
        with pytest.raises(RuntimeError, match=r"sweep: the server \(pid \d+, running: True\)"):
            asyncio.run(boxes.shut_down())
        assert server.proc is not None and server.proc.poll() is not None
        assert not server.data_dir.exists(), "the server's data dir was left behind"
    finally:
        server.stop()
        server.remove()


def test_the_last_resort_clean_up_takes_what_a_run_killed_whole_left(tmp_path: Path) -> None:
    """A run killed with its sandboxes' processes (a session's end) left their cgroups empty,
    which the reaper, finding them through processes, never removed; and a gVisor sandbox's
    second network namespace (the host's way in, ``-a``), one per sandbox."""
    sandbox_id = "sbx-reaper-" + secrets.token_hex(4)
    (tmp_path / "data" / "sandboxes" / sandbox_id).mkdir(parents=True)
    names = [netns_name(sandbox_id), access_netns_name(netns_name(sandbox_id))]
    made = [m / cgroups.PARENT / sandbox_id for m in cgroups.cgroup_mounts()
            if (m / cgroups.PARENT).is_dir()]
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True)
        for d in made:
            d.mkdir()
        found = reap_leftovers(tmp_path)
        assert sorted(found) == sorted([f"cgroup {sandbox_id}"] * bool(made)
                                       + [f"netns {n}" for n in names])
        assert not any((Path("/run/netns") / n).exists() for n in names)
        assert cgroups.sandbox_cgroup_dirs(sandbox_id) == []
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()


@needs_runc
def test_the_last_resort_clean_up_takes_a_stopped_servers_sandboxes_whole(
    image_store: ImageStore, base_image: Image
) -> None:
    """``reap_leftovers`` (the harness's clean-up when a run ends with sandboxes its server
    no longer deletes) also unmounts their root file systems, mounted under /run outside the
    data dir, and deletes their network namespaces: found left by an aborted run, 102 of
    each."""
    server = SandlotServer(image_cache=image_store.root.parent, warm_pool_size=0)
    server.start()
    try:
        async def create() -> str:
            boxes = Sandboxes(server, "test-run")
            sandbox, _ = await boxes.create(base_image.name)
            await boxes.aclose()
            return str(sandbox.id)

        sandbox_id = asyncio.run(create())
        server.stop()  # sandboxes outlive their server (a restart finds them)
        assert server.root is not None
        roots = rootfs_folder(server.data_dir)
        netns = Path("/run/netns") / netns_name(sandbox_id)
        assert netns.exists() and roots.is_dir()
        found = reap_leftovers(server.root)
        assert any(f.startswith("process ") for f in found), found
        assert f"netns {netns.name}" in found and f"folder {roots}" in found
        assert f"cgroup {sandbox_id}" in found and not cgroups.sandbox_cgroup_dirs(sandbox_id)
        assert not netns.exists() and not roots.exists()
        assert leftovers(server.root) == []
    finally:
        server.stop()
        if server.root is not None:
            reap_leftovers(server.root)
        server.remove()


@needs_runc
def test_a_pooled_sandboxs_execd_is_found_through_its_container(
    image_store: ImageStore, base_image: Image
) -> None:
    """A sandbox served from the warm pool runs in the pool container's cgroup, not one
    named after the sandbox: the profiling and measuring tools found no execd for it until
    they asked ``container_ids`` first."""
    server = SandlotServer(image_cache=image_store.root.parent, warm_pool_size=1,
                           extra_config=f'warm_pool_images = ["{base_image.name}"]')
    server.start()
    try:
        async def create_claimed() -> tuple[str, list[str], set[int], set[int]]:
            boxes = Sandboxes(server, "test-run")
            try:
                sandbox, _ = await boxes.create(base_image.name)  # waits for the warm start
                sid = str(sandbox.id)
                containers = server.container_ids([sid])
                return sid, containers, execd_pids([sid]), execd_pids(containers)
            finally:
                await boxes.delete_all()
                await boxes.aclose()

        sandbox_id, containers, by_sandbox, by_container = asyncio.run(create_claimed())
        assert containers != [sandbox_id]  # served from the pool: a container of its own
        assert containers[0].startswith("_pool-"), containers
        assert by_sandbox == set()
        assert len(by_container) == 1, by_container
        assert server.container_ids(["not-a-sandbox"]) == ["not-a-sandbox"]
    finally:
        server.stop()
        if server.root is not None:
            reap_leftovers(server.root)
        server.remove()
