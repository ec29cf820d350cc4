"""A create's network is set up beside the overlay mount and ``runc run`` (the zygote forks
execd in afterwards), and awaited before execd is launched.

Pinned at the runtime (``OciRuntime``, no HTTP), in a process inside the server namespace of
fresh test namespaces (``testhosts``): the workload's first view of the network already has
``eth0`` up with its address and default route; a set-up that fails while the container
starts fails the create and leaves no container, namespace, veth, nft chain or lease.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from sandlot.images.model import Image
from sandlot.images.store import ImageStore
from tests.net import testhosts

SCRIPT = textwrap.dedent('''
    import asyncio, shutil, subprocess, sys, tempfile, time
    from pathlib import Path
    from sandlot.config import Config
    from sandlot.errors import RuntimeFailure
    from sandlot.images.store import ImageStore
    from sandlot.net import firewall, links
    from sandlot.net.addressing import host_ifname
    from sandlot.runtime import execd_client
    from sandlot.runtime.base import ImageRef, SandboxSpec
    from sandlot.runtime.oci import OciRuntime
    from sandlot.runtime.oci.layout import netns_name

    # The entrypoint (started by execd once launched) records what it first sees.
    PROBE = ("cat /sys/class/net/eth0/operstate > /first-look; "
             "grep -c . /proc/net/route >> /first-look; tail -f /dev/null")

    def spec(sid):
        return SandboxSpec(sandbox_id=sid, image=ImageRef("base"), entrypoint=["sh", "-c", PROBE],
                           execd_token="t-" + sid)

    async def main(images, host, tag):
        data = Path(tempfile.mkdtemp(prefix="slso", dir="/tmp"))
        cfg = Config.model_validate({"data_dir": str(data),
                                     "network": {"mode": "isolated", "dns_servers": [host]},
                                     "runtime": {"warm_pool_size": 0}})
        rt = await OciRuntime.open(cfg, images=ImageStore(Path(images)))
        ok, bad = "so-ok-" + tag, "so-bad-" + tag
        try:
            await rt.create(spec(ok))
            await execd_client.wait_ready(lambda: rt.connect(ok, rt.execd_port), "t-" + ok, 60)
            look = rt.paths(ok).upper / "first-look"
            deadline = time.monotonic() + 30
            first = []
            while len(first) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                first = look.read_text().split() if look.exists() else []
            # eth0 up, and /proc/net/route has its header, the /30 and the default route
            assert first[0] == "up" and int(first[1]) == 3, first
            await rt.delete(ok)

            # The host end's name taken: the veth fails while runc runs; the create fails.
            subprocess.run(["ip", "link", "add", host_ifname(bad), "type", "veth", "peer", "name",
                            "sltso" + tag], check=True)
            try:
                await rt.create(spec(bad))
            except RuntimeFailure as exc:
                assert "exists" in str(exc).lower(), exc
            else:
                raise AssertionError("a create whose veth failed succeeded")
            assert not rt.runc.has_state(bad)
            assert not Path("/run/netns/" + netns_name(bad)).exists()
            assert firewall.sandbox_chains() == [], firewall.sandbox_chains()
            assert list((data / "net" / "leases").iterdir()) == []
            assert not rt.paths(bad).root.exists()
            subprocess.run(["ip", "link", "del", host_ifname(bad)], check=False,
                           capture_output=True)
            left = await asyncio.to_thread(links.host_links, "slv")  # pyroute2's own loop
            assert left == [], left
        finally:
            for sid in (ok, bad):  # what a failed assertion above left
                if rt.paths(sid).root.exists():
                    await rt.delete(sid)
            await rt.close()
            shutil.rmtree(data, ignore_errors=True)
        print("ok")

    asyncio.run(main(*sys.argv[1:]))
''')


def test_network_set_up_beside_the_start_and_before_execd(image_store: ImageStore,
                                                          base_image: Image) -> None:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("needs root and runc")
    work = Path(tempfile.mkdtemp(prefix="sltso-", dir="/tmp"))
    try:
        with testhosts.test_network(work) as lab:
            r = subprocess.run(testhosts.nsenter(lab.server_ns, sys.executable, "-c", SCRIPT,
                                       str(image_store.root),
                                       testhosts.HOST, os.urandom(3).hex()),
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
