"""``NetworkManager``: the isolated network of every sandbox of one server.

Per sandbox (container): a /30 lease, a veth pair, a chain (and set and map entries) in
the shared nft table, a DNS filter listening on its gateway and the applied policy, saved
under ``data_dir/net/policies`` so that a restarted server re-opens the DNS filters with the
same policies (the kernel state, veth and chain, survives the restart and keeps enforcing
meanwhile). ``teardown`` removes all of it and is safe to call for a container that has
none of it (idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
from pathlib import Path

from sandlot.config import Config
from sandlot.errors import RuntimeFailure
from sandlot.net import firewall, links
from sandlot.net.addressing import (
    IFNAME_PREFIX,
    Leases,
    SandboxAddress,
    host_ifname,
    overlapping_routes,
    parse_subnet,
)
from sandlot.net.dns import DnsFilter, host_resolvers, start_filter
from sandlot.net.policy import ALLOW, EgressPolicy, coerce, parse_policy

log = logging.getLogger(__name__)


def _enable_forwarding() -> None:
    with open("/proc/sys/net/ipv4/ip_forward") as fh:
        if fh.read().strip() == "1":
            return
    log.warning("network: enabling IPv4 forwarding (net.ipv4.ip_forward=1) in this namespace "
                "for sandboxes' outbound traffic")
    with open("/proc/sys/net/ipv4/ip_forward", "w") as fh:
        fh.write("1")


def _allow_cidrs(raw: list[str]) -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for item in raw:
        try:
            net = ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise RuntimeFailure(f"[network] allow_cidrs: {item!r} is not a CIDR") from None
        if not isinstance(net, ipaddress.IPv4Network):
            raise RuntimeFailure(f"[network] allow_cidrs: {item!r}: IPv6 is disabled in "
                                 "sandboxes")
        nets.append(net)
    return nets


def _address_part(policy: EgressPolicy) -> tuple[object, ...]:
    """What of a policy the nft table holds (the DNS filter holds the names)."""
    return (policy.default_action, tuple(policy.networks("allow")),
            tuple(policy.networks("deny")))


class NetworkManager:
    """The networks of one data dir's sandboxes (used by ``OciRuntime`` in mode isolated)."""

    def __init__(self, cfg: Config, data_dir: Path) -> None:
        self.subnet = parse_subnet(cfg.network.subnet)
        self.allow_cidrs = _allow_cidrs(cfg.network.allow_cidrs)
        self.enforcement_mode = cfg.egress.mode
        self.enforce_ips = cfg.egress.mode == "dns+nft"
        self.upstreams = list(cfg.network.dns_servers) or host_resolvers()
        self.root = data_dir / "net"
        self.leases = Leases(self.root / "leases", self.subnet)
        self.policy_dir = self.root / "policies"
        self.policy_dir.mkdir(parents=True, exist_ok=True)
        self._filters: dict[str, DnsFilter] = {}
        self._learned: dict[str, firewall.LearnedAddresses] = {}
        self._sets = firewall.NetlinkSets()
        self._applied: dict[str, EgressPolicy] = {}  # the policy each nft table holds
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def open(cls, cfg: Config, data_dir: Path) -> NetworkManager:
        """Check the host, then pick up the networks a previous server left running."""
        mgr = cls(cfg, data_dir)
        own = {a.network for a in mgr.leases.all()}
        clash = await asyncio.to_thread(overlapping_routes, mgr.subnet, own)
        if clash:
            raise RuntimeFailure(
                f"[network] subnet {mgr.subnet} overlaps this host's routes or addresses "
                f"({', '.join(clash)}); choose another subnet"
            )
        await asyncio.to_thread(_enable_forwarding)
        await asyncio.to_thread(firewall.ensure_table)
        if not mgr.upstreams:
            log.warning("network: no upstream DNS servers (none in /etc/resolv.conf and no "
                        "[network] dns_servers): sandboxes' names will not resolve")
        return mgr

    @classmethod
    async def remove_all(cls, cfg: Config, data_dir: Path) -> None:
        """Remove every network a previous server in mode "isolated" left in ``data_dir``
        (this one runs in another mode, so nothing would ever remove them)."""
        if not any((data_dir / "net" / "leases").glob("[0-9]*")):
            return
        mgr = cls(cfg, data_dir)
        log.warning("network: removing the isolated networks of %d sandbox(es): [network] "
                    "mode is now %r", len(mgr.leases.all()), cfg.network.mode)
        for addr in mgr.leases.all():
            await mgr.teardown(addr.container_id)
        await asyncio.to_thread(firewall.remove_table_if_unused)

    async def restore(self, live: set[str], keep: frozenset[str] | set[str] = frozenset()
                      ) -> None:
        """Re-install the rules and re-open the DNS filters of ``live`` containers; remove
        what is left of others, and any sandbox chain or map entry whose veth is gone.

        ``keep``: containers whose teardown comes later (a crashed server's warm ones): their
        leases stay taken and nothing of theirs is re-installed."""
        present = set(await asyncio.to_thread(links.host_links, IFNAME_PREFIX))
        for addr in self.leases.all():
            cid = addr.container_id
            if cid in keep:
                continue
            if cid in live and addr.host_ifname in present:
                pol = self._load_policy(cid)
                # An earlier version's per-sandbox table goes; the chain is (re)made in
                # place (a no-op change when it is there already).
                await asyncio.to_thread(firewall.try_run, "delete table inet "
                                        + firewall.legacy_table_name(cid))
                await asyncio.to_thread(self._install, addr, pol)
                self._applied[cid] = pol
                try:
                    await self._start_filter(addr, pol)
                except OSError:
                    log.exception("network: cannot re-open the DNS filter of %s", cid)
            else:
                await self.teardown(cid)
        stale = await asyncio.to_thread(firewall.sweep)
        if stale:
            log.warning("network: removed the nft chains and map entries of %d sandbox(es) "
                        "whose veth no longer exists", len(stale))

    # -- per sandbox ------------------------------------------------------------------

    def _lock(self, cid: str) -> asyncio.Lock:
        return self._locks.setdefault(cid, asyncio.Lock())

    def _rules(self, addr: SandboxAddress) -> firewall.SandboxRules:
        return firewall.SandboxRules(addr, self.subnet, self.allow_cidrs, self.enforce_ips)

    def _install(self, addr: SandboxAddress, pol: EgressPolicy) -> None:
        """Install a sandbox's chain (blocking). The shared table is made again if it is
        gone: another server in this namespace deletes it when its own last sandbox goes
        and it finds no chain left."""
        script = self._rules(addr).install(pol)
        if not firewall.try_run(script):
            firewall.ensure_table()
            firewall.run(script)

    def address(self, cid: str) -> SandboxAddress | None:
        return self.leases.get(cid)

    def resolv_conf(self, cid: str) -> str:
        addr = self.leases.get(cid)
        assert addr is not None
        return f"nameserver {addr.gateway}\noptions ndots:0 attempts:2 timeout:2\n"

    def reserve(self, cid: str) -> SandboxAddress:
        """Lease ``cid``'s address now (``setup`` uses the same; ``teardown`` releases it),
        so that its ``resolv_conf`` can be written before the network is set up."""
        return self.leases.acquire(cid)

    async def setup(self, cid: str, ns: Path, policy: object = None) -> SandboxAddress:
        """Give container ``cid`` (namespace ``ns``) its outbound path under ``policy``.

        The veth and the nft chain are made at once (one worker thread each): the chain
        matches the veth by name, and until both exist a sandlot veth without a chain is
        rejected by the shared table (``firewall``), so neither order lets a packet out."""
        pol = coerce(policy)
        async with self._lock(cid):
            addr = self.leases.acquire(cid)
            try:
                made = await asyncio.gather(asyncio.to_thread(links.create_veth, addr, ns),
                                            asyncio.to_thread(self._install, addr, pol),
                                            return_exceptions=True)
                # both finished (a failed one must not race the clean-up of the other)
                for outcome in made:
                    if isinstance(outcome, BaseException):
                        raise outcome
                self._applied[cid] = pol
                self._save_policy(cid, pol)
                await self._start_filter(addr, pol)
            except BaseException:
                await self._remove(cid)
                raise
        return addr

    async def _start_filter(self, addr: SandboxAddress, pol: EgressPolicy) -> None:
        cid = addr.container_id
        learned = firewall.LearnedAddresses(cid, self._sets)
        self._learned[cid] = learned
        flt = DnsFilter(cid, pol, self.upstreams, learned.add if self.enforce_ips else None)
        self._filters[cid] = await start_filter(str(addr.gateway), flt)

    def policy(self, cid: str) -> EgressPolicy:
        flt = self._filters.get(cid)
        return flt.policy if flt is not None else self._load_policy(cid)

    async def set_policy(self, cid: str, policy: object) -> None:
        """Swap the policy at once: nft chain and sets in one batch, then the DNS filter.

        The nft batch is skipped when the address part (default action, IP/CIDR rules) is
        unchanged, as for the usual PATCH adding or removing names: the DNS filter's swap
        and the learned-address removal (netlink) are all such a change needs.
        """
        pol = coerce(policy)
        async with self._lock(cid):
            addr = self.leases.get(cid)
            if addr is None:
                raise RuntimeFailure(f"container {cid} has no isolated network")
            applied = self._applied.get(cid)  # what this process put into nft, if anything
            learned = self._learned.get(cid)
            forget = learned.forget_unless(
                lambda name: pol.evaluate(name)[0] == ALLOW) if learned else []
            if applied is None or _address_part(applied) != _address_part(pol):
                await asyncio.to_thread(firewall.run, self._rules(addr).update(pol))
            self._applied[cid] = pol
            if forget:
                await self._sets.delete(firewall.TABLE, firewall.dns_set_name(cid), forget)
            self._save_policy(cid, pol)
            flt = self._filters.get(cid)
            if flt is not None:
                flt.policy = pol

    async def teardown(self, cid: str) -> None:
        async with self._lock(cid):
            await self._remove(cid)
        self._locks.pop(cid, None)

    async def _remove(self, cid: str) -> None:
        flt = self._filters.pop(cid, None)
        if flt is not None:
            flt.close()
        self._learned.pop(cid, None)
        self._applied.pop(cid, None)
        addr = self.leases.get(cid)
        ifname = addr.host_ifname if addr else host_ifname(cid)
        await asyncio.to_thread(links.delete_veth, ifname)  # first: see firewall.sweep
        await asyncio.to_thread(firewall.remove_sandbox, cid, addr)
        (self.policy_dir / f"{cid}.json").unlink(missing_ok=True)
        self.leases.release(cid)

    def _save_policy(self, cid: str, pol: EgressPolicy) -> None:
        # Overwritten in place and cut to length: a rename over it, or a truncation to zero,
        # makes ext4 flush the data first (auto_da_alloc), ~5 ms on every PATCH. A crash
        # mid-write leaves an unreadable file, which loads as deny-all (below) until the
        # server re-applies the stored policy at start.
        data = json.dumps(pol.to_json()).encode()
        fd = os.open(self.policy_dir / f"{cid}.json", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def _load_policy(self, cid: str) -> EgressPolicy:
        path = self.policy_dir / f"{cid}.json"
        if not path.exists():
            return EgressPolicy()  # a warm container (allow-all until claimed)
        with contextlib.suppress(OSError, ValueError):
            return parse_policy(json.loads(path.read_text()))
        log.warning("network: the saved policy of %s is unreadable; denying all until the "
                    "server re-applies it", cid)
        return EgressPolicy("deny")

    async def close(self) -> None:
        """Stop the DNS filters; kernel state stays (sandboxes outlive the server), the
        shared table only while some sandbox still has a chain in it."""
        for flt in self._filters.values():
            flt.close()
        self._filters.clear()
        self._sets.close()
        await asyncio.to_thread(firewall.remove_table_if_unused)
