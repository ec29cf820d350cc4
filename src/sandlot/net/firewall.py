"""nftables state of sandboxes: one shared table, one chain per sandbox behind a verdict map.

The table ``inet sandlot`` (one per network namespace, shared by every sandlot server in it)
has three base chains whatever the number of sandboxes: ``forward`` dispatches a packet from
a sandbox's host-side veth through the verdict map ``egress`` (interface name -> ``goto``
the sandbox's chain ``sbx_<hash>``), ``input`` lets each sandbox reach only its DNS filter
(the ``dnspeers`` set of interface . source . gateway), and ``postrouting`` masquerades.
Earlier each sandbox had a table with base chains of its own: every packet went through
every sandbox's hooks and registering hooks made a create cost grow with the number of
sandboxes (docs/network.md has the figures).

A sandbox's objects are its chain and its ``dns_<hash>`` set (addresses its DNS filter
answered); its IP/CIDR rules are anonymous sets inside the chain, so a policy change is one
atomic batch that flushes and refills the chain. The workload holds no CAP_NET_ADMIN and
the table is not in its namespace: it cannot see or change it.

A sandbox's chain, in order: IPv6 dropped; a source other than its own address dropped (no
spoofing); replies of established flows accepted; the operator's ``allow_cidrs`` accepted;
private, link-local, loopback, multicast, reserved ranges and the sandbox subnet (other
sandboxes) rejected; then the egress policy. Packets from a sandlot veth the map does not
know, and anything to the host itself except DNS to the gateway, are rejected.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import ipaddress
import json
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import nftables
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.nftables.main import NFTables, NFTSet, NFTSetElem

from sandlot.errors import RuntimeFailure
from sandlot.net import links
from sandlot.net.addressing import IFNAME_PREFIX, SandboxAddress
from sandlot.net.policy import ALLOW, DENY, EgressPolicy

TABLE = "sandlot"
CHAIN_PREFIX = "sbx_"
DNS_SET_PREFIX = "dns_"
LEGACY_PREFIX = "sl_"  # per-sandbox tables of earlier versions (removed when met)
NFPROTO_INET = 1  # the table's family (inet), for netlink messages
# Always denied destinations (besides the host's own addresses, which ``input`` drops).
BLOCKED_V4 = [
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
    "240.0.0.0/4",
]
# The reference's TTL handling for addresses learned from DNS answers.
TTL_SLACK = 60
# Refused, not silently dropped: a denied connection fails at once instead of timing out.
REJECT = "reject with icmpx admin-prohibited"
TTL_MIN = 60
TTL_MAX = 360
PRUNE_ABOVE = 4096  # learned addresses kept in memory before expired ones are dropped
VETHS = f'"{IFNAME_PREFIX}*"'

_nft = nftables.Nftables()
_nft.set_json_output(False)
_nft_json = nftables.Nftables()
_nft_json.set_json_output(True)
_nft_lock = threading.Lock()


def _suffix(container_id: str) -> str:
    """The hash that names a sandbox's veth (``slv``), chain and set alike."""
    return hashlib.sha256(container_id.encode()).hexdigest()[:12]


def chain_name(container_id: str) -> str:
    return CHAIN_PREFIX + _suffix(container_id)


def dns_set_name(container_id: str) -> str:
    return DNS_SET_PREFIX + _suffix(container_id)


def legacy_table_name(container_id: str) -> str:
    return LEGACY_PREFIX + _suffix(container_id)


def run(script: str) -> None:
    """Apply an nft script atomically (one netlink batch); raise with nft's message."""
    with _nft_lock:
        rc, _out, err = _nft.cmd(script)
    if rc != 0:
        raise RuntimeFailure(f"nftables refused the change: {err.strip()}")


def try_run(script: str) -> bool:
    with _nft_lock:
        rc, _out, _err = _nft.cmd(script)
    return rc == 0


def _objects(command: str, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` objects ("chain", "set", "map", "table") a listing command returns."""
    with _nft_lock:
        rc, out, _err = _nft_json.cmd(command)
    if rc != 0 or not out:
        return []
    items = json.loads(out).get("nftables", [])
    return [item[kind] for item in items
            if isinstance(item, dict) and isinstance(item.get(kind), dict)]


def clamp_ttl(ttl: int) -> int:
    return max(TTL_MIN, min(TTL_MAX, ttl + TTL_SLACK))


def _elements(items: Iterable[object]) -> str:
    listed = ", ".join(str(i) for i in items)
    return f"elements = {{ {listed} }}" if listed else ""


def _collapse(nets: Iterable[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
    return list(ipaddress.collapse_addresses(nets))


def _v4(nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> list[ipaddress.IPv4Network]:
    return _collapse(n for n in nets if isinstance(n, ipaddress.IPv4Network))


def _anonymous(nets: list[ipaddress.IPv4Network]) -> str:
    return "{ " + ", ".join(map(str, nets)) + " }"


# -- the shared table -------------------------------------------------------------------

def base_table() -> str:
    """The script that creates the shared table; it fails (changing nothing) if it exists."""
    return "\n".join([
        f"create table inet {TABLE}",
        f"table inet {TABLE} {{",
        f"  set blocked4 {{ type ipv4_addr; flags interval; "
        f"{_elements(_collapse(ipaddress.IPv4Network(b) for b in BLOCKED_V4))} }}",
        "  map egress { type ifname : verdict; }",
        "  set dnspeers { type ifname . ipv4_addr . ipv4_addr; }",
        "  chain input { type filter hook input priority -10; policy accept;",
        "    iifname . ip saddr . ip daddr @dnspeers meta l4proto { tcp, udp } th dport 53 accept",
        f"    iifname {VETHS} ct state established,related accept",
        f"    iifname {VETHS} {REJECT}",
        "  }",
        "  chain forward { type filter hook forward priority -10; policy accept;",
        "    iifname vmap @egress",
        f"    iifname {VETHS} {REJECT}",  # a sandlot veth without a chain: nothing leaves
        f"    oifname {VETHS} ct state established,related accept",
        f"    oifname {VETHS} drop",
        "  }",
        "  chain postrouting { type nat hook postrouting priority 100; policy accept;",
        f"    iifname {VETHS} oifname != {VETHS} masquerade",
        "  }",
        "}",
    ]) + "\n"


def ensure_table() -> None:
    """Create the shared table unless it is there (another server's, or a previous run's)."""
    with _nft_lock:
        rc, _out, err = _nft.cmd(base_table())
        if rc == 0:
            return
        present, _o, _e = _nft.cmd(f"list chain inet {TABLE} forward")
    if present != 0:
        raise RuntimeFailure(f"nftables refused the sandbox table: {err.strip()}")


def table_exists() -> bool:
    return try_run(f"list chain inet {TABLE} forward")  # not the whole table: it is large


def remove_table_if_unused() -> bool:
    """Delete the shared table when no sandbox chain is left in it (True when gone)."""
    if not table_exists():
        return True
    if sandbox_chains():
        return False
    return try_run(f"delete table inet {TABLE}")


# -- one sandbox ------------------------------------------------------------------------

@dataclass(frozen=True)
class SandboxRules:
    """What a sandbox's chain is made of, besides its egress policy."""

    addr: SandboxAddress
    subnet: ipaddress.IPv4Network
    allow_cidrs: list[ipaddress.IPv4Network]
    enforce_ips: bool

    @property
    def chain(self) -> str:
        return chain_name(self.addr.container_id)

    @property
    def dns_set(self) -> str:
        return dns_set_name(self.addr.container_id)

    def statements(self, policy: EgressPolicy) -> list[str]:
        """The chain's rules, in order."""
        rules = ["meta nfproto ipv6 drop", f"ip saddr != {self.addr.address} drop",
                 "ct state established,related accept"]
        operator = _collapse(self.allow_cidrs)
        if operator:
            rules.append(f"ip daddr {_anonymous(operator)} accept")
        rules += [f"ip daddr @blocked4 {REJECT}", f"ip daddr {self.subnet} {REJECT}"]
        return rules + policy_rules(policy, self.enforce_ips, self.dns_set)

    def _fill(self, policy: EgressPolicy) -> list[str]:
        t = f"inet {TABLE} {self.chain}"
        return [f"flush chain {t}", *(f"add rule {t} {r}" for r in self.statements(policy))]

    def _peer(self) -> str:
        a = self.addr
        return f'"{a.host_ifname}" . {a.address} . {a.gateway}'

    def install(self, policy: EgressPolicy) -> str:
        """The script that (re)creates the sandbox's chain, set and map entries."""
        return "\n".join([
            f"add set inet {TABLE} {self.dns_set} {{ type ipv4_addr; flags timeout; }}",
            f"add chain inet {TABLE} {self.chain}",
            *self._fill(policy),
            f'add element inet {TABLE} egress {{ "{self.addr.host_ifname}" : goto {self.chain} }}',
            f"add element inet {TABLE} dnspeers {{ {self._peer()} }}",
        ]) + "\n"

    def update(self, policy: EgressPolicy) -> str:
        """The script that swaps the policy in one atomic batch (the chain refilled)."""
        return "\n".join(self._fill(policy)) + "\n"

    def remove(self) -> str:
        """The script that removes all of it (fails, changing nothing, if a part is missing)."""
        return "\n".join([
            f'delete element inet {TABLE} egress {{ "{self.addr.host_ifname}" }}',
            f"delete element inet {TABLE} dnspeers {{ {self._peer()} }}",
            f"delete chain inet {TABLE} {self.chain}",
            f"delete set inet {TABLE} {self.dns_set}",
        ]) + "\n"


def policy_rules(policy: EgressPolicy, enforce_ips: bool, dns_set: str) -> list[str]:
    """The policy's statements at the end of a sandbox's chain (first match; deny first)."""
    if not enforce_ips:
        return ["accept"]  # mode dns: names are filtered, addresses are not
    rules = []
    deny, allow = _v4(policy.networks(DENY)), _v4(policy.networks(ALLOW))
    if deny:
        rules.append(f"ip daddr {_anonymous(deny)} {REJECT}")
    if allow:
        rules.append(f"ip daddr {_anonymous(allow)} accept")
    if policy.default_action == DENY:
        rules += [f"ip daddr @{dns_set} accept", REJECT]
    else:
        rules.append("accept")
    return rules


def remove_sandbox(container_id: str, addr: SandboxAddress | None) -> None:
    """Remove a sandbox's chain, set and map entries; whatever of them is missing is fine.

    With its address known this is one batch; otherwise (or when a part was missing) each
    part goes alone, the ``dnspeers`` entry found by its interface name.
    """
    if addr is not None and try_run(
            SandboxRules(addr, addr.network, [], True).remove()):
        return
    _remove_by_suffix(_suffix(container_id))


def dns_peers(ifname: str | None = None) -> list[str]:
    """``dnspeers`` keys (of ``ifname``, or all) as nft element literals."""
    keys = []
    for found in _objects(f"list set inet {TABLE} dnspeers", "set"):
        for elem in found.get("elem") or []:
            parts = elem.get("concat") if isinstance(elem, dict) else None
            if not isinstance(parts, list) or len(parts) != 3:
                continue
            if ifname is None or parts[0] == ifname:
                keys.append(f'"{parts[0]}" . {parts[1]} . {parts[2]}')
    return keys


def _named(command: str, kind: str, prefix: str, table: str | None = TABLE) -> list[str]:
    """Names after ``prefix`` of the ``kind`` objects (of ``table``) a listing returns."""
    return [str(o["name"])[len(prefix):] for o in _objects(command, kind)
            if (table is None or o.get("table") == table)
            and str(o.get("name", "")).startswith(prefix)]


def sandbox_chains() -> list[str]:
    """The suffixes (hashes) of the sandbox chains in the shared table."""
    return _named("list chains inet", "chain", CHAIN_PREFIX)


def legacy_tables() -> list[str]:
    """Per-sandbox tables of earlier versions (``sl_<hash>``) still in this namespace."""
    return [LEGACY_PREFIX + s for s in _named("list tables inet", "table", LEGACY_PREFIX, None)]


def sweep() -> list[str]:
    """Remove sandbox chains, sets, map entries and legacy tables whose veth is gone.

    Safe beside other servers sharing the table: a sandbox's veth is made before its nft
    objects and removed before them, and the links are read after the objects, so an
    object whose veth is missing then belongs to nobody. Returns the suffixes removed.
    """
    suffixes = set(sandbox_chains())
    suffixes |= set(_named("list sets inet", "set", DNS_SET_PREFIX))
    suffixes |= set(_named("list tables inet", "table", LEGACY_PREFIX, None))
    for key in dns_peers():
        suffixes.add(key.split('"')[1][len(IFNAME_PREFIX):])
    for found in _objects(f"list map inet {TABLE} egress", "map"):
        for elem in found.get("elem") or []:
            if isinstance(elem, list) and elem and isinstance(elem[0], str):
                suffixes.add(elem[0][len(IFNAME_PREFIX):])
    present = set(links.host_links(IFNAME_PREFIX))  # after the objects: see above
    gone = sorted(s for s in suffixes if IFNAME_PREFIX + s not in present)
    for s in gone:
        _remove_by_suffix(s)
    return gone


def _remove_by_suffix(suffix: str) -> None:
    ifname = IFNAME_PREFIX + suffix
    try_run(f'delete element inet {TABLE} egress {{ "{ifname}" }}')
    for key in dns_peers(ifname):
        try_run(f"delete element inet {TABLE} dnspeers {{ {key} }}")
    try_run(f"delete chain inet {TABLE} {CHAIN_PREFIX}{suffix}")
    try_run(f"delete set inet {TABLE} {DNS_SET_PREFIX}{suffix}")
    try_run(f"delete table inet {LEGACY_PREFIX}{suffix}")


class LearnedAddresses:
    """Addresses the DNS filter put into a sandbox's ``dns_<hash>`` set, with the names behind them.

    Written over raw nf_tables netlink (pyroute2): libnftables reads the table's chains and
    sets before every command, while one element message stays ~0.5 ms whatever the number
    of sandboxes, and this sits between a DNS answer and its delivery. Kept here so that
    re-adding an address can refresh its timeout (adding an existing element leaves its
    timeout alone) and so that a policy change can drop addresses whose names are no
    longer allowed.
    """

    def __init__(self, container_id: str, socket: NetlinkSets) -> None:
        self.set_name = dns_set_name(container_id)
        self._sets = socket
        self._expiry: dict[ipaddress.IPv4Address, float] = {}
        self._names: dict[ipaddress.IPv4Address, set[str]] = {}

    async def add(self, name: str, answers: list[tuple[ipaddress.IPv4Address, int]]) -> None:
        now = time.monotonic()
        if len(self._expiry) > PRUNE_ABOVE:  # forget what the kernel has expired already
            for ip in [ip for ip, until in self._expiry.items() if until <= now]:
                self._expiry.pop(ip, None)
                self._names.pop(ip, None)
        fresh: list[tuple[ipaddress.IPv4Address, int]] = []
        refresh: list[ipaddress.IPv4Address] = []
        for ip, ttl in answers:
            seconds = clamp_ttl(ttl)
            self._names.setdefault(ip, set()).add(name)
            old = self._expiry.get(ip)
            if old is not None and old - now > seconds - TTL_SLACK / 2:
                continue  # present, with about as long to live
            if old is not None and old > now:
                refresh.append(ip)
            self._expiry[ip] = now + seconds
            fresh.append((ip, seconds))
        if refresh:
            await self._sets.delete(TABLE, self.set_name, refresh)
        if fresh:
            await self._sets.add(TABLE, self.set_name, fresh)

    def forget_unless(self, still_allowed: object) -> list[ipaddress.IPv4Address]:
        """Drop (and return) addresses none of whose names ``still_allowed(name)`` is true for."""
        assert callable(still_allowed)
        now = time.monotonic()
        gone = [ip for ip, names in self._names.items()
                if not any(still_allowed(n) for n in names)]
        live = [ip for ip in gone if self._expiry.get(ip, 0) > now]
        for ip in gone:
            self._names.pop(ip, None)
            self._expiry.pop(ip, None)
        return live


class NetlinkSets:
    """Element changes of timeout sets over one nf_tables netlink socket (see above).

    The socket lives on one worker thread with pyroute2's own event loop: the server's loop
    (uvloop) cannot carry netlink datagram sockets. One thread hop costs ~0.1 ms.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandlot-nftsets")
        self._nft: NFTables | None = None

    def _socket(self) -> NFTables:
        if self._nft is None:
            self._nft = NFTables(nfgen_family=NFPROTO_INET)
        return self._nft

    def _add(self, table: str, name: str,
             items: list[tuple[ipaddress.IPv4Address, int]]) -> None:
        target = NFTSet(table=table, name=name, key_type="ipv4_addr")
        self._socket().set_elems("add", set=target, elements=[
            NFTSetElem(value=str(ip), timeout=seconds * 1000) for ip, seconds in items])

    def _delete(self, table: str, name: str, items: list[ipaddress.IPv4Address]) -> None:
        target = NFTSet(table=table, name=name, key_type="ipv4_addr")
        for ip in items:  # one by one: one already expired is not an error
            try:
                self._socket().set_elems("del", set=target, elements=[str(ip)])
            except NetlinkError as exc:
                if exc.code != errno.ENOENT:
                    raise

    async def add(self, table: str, name: str,
                  items: list[tuple[ipaddress.IPv4Address, int]]) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self._pool, self._add, table, name, items)

    async def delete(self, table: str, name: str, items: list[ipaddress.IPv4Address]) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self._pool, self._delete, table, name, items)

    def close(self) -> None:
        def shut() -> None:
            if self._nft is not None:
                self._nft.close()
                self._nft = None

        self._pool.submit(shut).result()
        self._pool.shutdown(wait=False)
