"""``NetworkManager`` on its own: a failed set-up leaves nothing, teardown is idempotent, a
restart picks up live networks and removes dead ones and stale nft state (chains, map
entries, an earlier version's per-sandbox tables) whose veth is gone. Each case runs in a
fresh process inside a namespace the test creates (``nsenter``), so nothing can touch the
machine's own."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.net.testhosts import nsenter

SCRIPT = textwrap.dedent('''
    import asyncio, ipaddress, subprocess, sys
    from pathlib import Path
    from sandlot.net.addressing import SandboxAddress
    from sandlot.net.policy import EgressPolicy
    from sandlot.config import Config
    from sandlot.errors import RuntimeFailure
    from sandlot.net import firewall, links
    from sandlot.net.manager import NetworkManager

    async def veths():
        return await asyncio.to_thread(links.host_links, "slv")  # pyroute2's own loop

    async def nothing_left(data):
        assert await veths() == [], await veths()
        assert firewall.sandbox_chains() == [], firewall.sandbox_chains()
        assert firewall.legacy_tables() == [], firewall.legacy_tables()
        assert firewall.dns_peers() == [], firewall.dns_peers()
        assert list((data / "net" / "leases").iterdir()) == []

    def map_keys():
        out = subprocess.run(["nft", "list", "map", "inet", "sandlot", "egress"],
                             capture_output=True, text=True).stdout
        return out.count(": goto")

    async def main():
        data = Path(sys.argv[2])  # the test's own temporary directory
        cfg = Config.model_validate({"network": {"mode": "isolated",
                                                 "dns_servers": ["198.51.100.10"]}})
        mgr = await NetworkManager.open(cfg, data)
        # A set-up that fails half-way (no such namespace) leaves nothing.
        try:
            await mgr.setup("bad", Path("/run/netns/does-not-exist-" + sys.argv[1]))
        except (OSError, RuntimeFailure):
            pass
        else:
            raise AssertionError("set-up into a missing namespace succeeded")
        await nothing_left(data)
        await mgr.teardown("never-existed")  # idempotent
        # The shared table deleted under a running server (another server in the namespace
        # stopping with no sandbox left): the next set-up makes it again.
        firewall.run("delete table inet sandlot\\n")

        # A restart: the live network keeps its veth, table and DNS filter; a dead one goes.
        ns = ["sltnmgr" + sys.argv[1] + s for s in ("a", "b")]
        for name in ns:
            subprocess.run(["ip", "netns", "add", name], check=True)
        await mgr.setup("live", Path("/run/netns/" + ns[0]))
        await mgr.setup("dead", Path("/run/netns/" + ns[1]))
        await mgr.set_policy("live", {"defaultAction": "deny"})
        assert len(await veths()) == 2 and len(firewall.sandbox_chains()) == 2
        assert map_keys() == 2
        await mgr.close()
        assert firewall.table_exists()  # sandboxes outlive the server: so do their rules
        # Stale state of no lease of ours: a chain and map entries left by a crash between
        # a veth's removal and its rules', and an earlier version's per-sandbox table.
        ghost = SandboxAddress("ghost", 9, ipaddress.IPv4Network("100.88.0.36/30"))
        firewall.run(firewall.SandboxRules(ghost, ipaddress.IPv4Network("100.88.0.0/16"),
                                           [], True).install(EgressPolicy()))
        firewall.run("add table inet " + firewall.legacy_table_name("ghost-old") + "\\n")
        assert len(firewall.sandbox_chains()) == 3 and map_keys() == 3
        again = await NetworkManager.open(cfg, data)
        await again.restore({"live"})  # "dead": its container is gone
        assert [a.container_id for a in again.leases.all()] == ["live"]
        assert len(await veths()) == 1 and len(firewall.sandbox_chains()) == 1
        assert map_keys() == 1 and len(firewall.dns_peers()) == 1
        assert firewall.legacy_tables() == []
        assert again.policy("live").default_action == "deny"  # re-opened with its policy
        # A server started later in another mode removes what "isolated" left.
        await again.close()
        none = Config.model_validate({"network": {"mode": "none"}})
        await NetworkManager.remove_all(none, data)
        for name in ns:
            subprocess.run(["ip", "netns", "delete", name], check=True)
        await nothing_left(data)
        assert not firewall.table_exists()  # the last sandbox gone: the table too
        print("ok")

    asyncio.run(main())
''')


def test_failed_setup_and_restart_leave_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    tag = secrets.token_hex(3)
    ns = "sltn" + tag + "m"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(nsenter(ns, "ip", "link", "set", "lo", "up"), check=True)
        r = subprocess.run(nsenter(ns, sys.executable, "-c", SCRIPT, tag, str(tmp_path)),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)
        for leftover in (f"sltnmgr{tag}a", f"sltnmgr{tag}b"):
            subprocess.run(["ip", "netns", "delete", leftover], check=False,
                           capture_output=True)
