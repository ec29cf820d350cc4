"""nftables state of sandboxes, through libnftables in-process (no ``nft`` fork per change).

Each sandbox has its own table ``inet sl_<hash>`` in the server's namespace, matched on its
host-side veth, so deleting the table removes every rule and set of that sandbox at once,
and a change of one sandbox never touches another's. Base chains of all tables see every
packet; each only drops what comes from (or goes to) its own veth. The workload holds no
CAP_NET_ADMIN and these tables are not in its namespace: it cannot see or change them.

Outbound from a sandbox, in order: IPv6 dropped; a source other than its own address
dropped (no spoofing); replies of established flows accepted; the operator's
``allow_cidrs`` accepted; private, link-local, loopback, multicast, reserved ranges and
the sandbox subnet (other sandboxes) dropped; then the egress policy chain. Anything to
the host itself (every local address) is dropped in ``input`` except DNS to the gateway.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import ipaddress
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import nftables
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.nftables.main import NFTables, NFTSet, NFTSetElem

from sandlot.errors import RuntimeFailure
from sandlot.net.addressing import SandboxAddress
from sandlot.net.policy import ALLOW, DENY, EgressPolicy

TABLE_PREFIX = "sl_"
NFPROTO_INET = 1  # the tables' family (inet), for netlink messages
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

_nft = nftables.Nftables()
_nft.set_json_output(False)
_nft_lock = threading.Lock()


def table_name(container_id: str) -> str:
    return TABLE_PREFIX + hashlib.sha256(container_id.encode()).hexdigest()[:12]


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


def clamp_ttl(ttl: int) -> int:
    return max(TTL_MIN, min(TTL_MAX, ttl + TTL_SLACK))


def _elements(items: Iterable[object]) -> str:
    listed = ", ".join(str(i) for i in items)
    return f"elements = {{ {listed} }}" if listed else ""


def _collapse(nets: Iterable[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
    return list(ipaddress.collapse_addresses(nets))


def policy_rules(policy: EgressPolicy, enforce_ips: bool) -> list[str]:
    """The statements of the ``userpolicy`` chain (first match; deny before allow)."""
    if not enforce_ips:
        return ["accept"]  # mode dns: names are filtered, addresses are not
    rules = [f"ip daddr @deny4 {REJECT}", "ip daddr @allow4 accept"]
    if policy.default_action == DENY:
        rules += ["ip daddr @dns4 accept", REJECT]
    else:
        rules.append("accept")
    return rules


def _v4(nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> list[ipaddress.IPv4Network]:
    return _collapse(n for n in nets if isinstance(n, ipaddress.IPv4Network))


def sandbox_table(
    addr: SandboxAddress,
    subnet: ipaddress.IPv4Network,
    allow_cidrs: list[ipaddress.IPv4Network],
    policy: EgressPolicy,
    enforce_ips: bool,
) -> str:
    """The script that (re)creates the sandbox's table from scratch."""
    t, ifn = table_name(addr.container_id), addr.host_ifname
    blocked = _collapse([*(ipaddress.IPv4Network(b) for b in BLOCKED_V4), subnet])
    lines = [
        f"table inet {t}",
        f"delete table inet {t}",
        f"table inet {t} {{",
        f"  set blocked4 {{ type ipv4_addr; flags interval; {_elements(blocked)} }}",
        f"  set operator4 {{ type ipv4_addr; flags interval; {_elements(allow_cidrs)} }}",
        f"  set allow4 {{ type ipv4_addr; flags interval; "
        f"{_elements(_v4(policy.networks(ALLOW)))} }}",
        f"  set deny4 {{ type ipv4_addr; flags interval; "
        f"{_elements(_v4(policy.networks(DENY)))} }}",
        "  set dns4 { type ipv4_addr; flags timeout; }",
        "  chain input { type filter hook input priority -10; policy accept;",
        f'    iifname "{ifn}" ip saddr {addr.address} ip daddr {addr.gateway} '
        "meta l4proto { tcp, udp } th dport 53 accept",
        f'    iifname "{ifn}" ct state established,related accept',
        f'    iifname "{ifn}" {REJECT}',
        "  }",
        "  chain forward { type filter hook forward priority -10; policy accept;",
        f'    iifname "{ifn}" jump egress',
        f'    oifname "{ifn}" ct state established,related accept',
        f'    oifname "{ifn}" drop',
        "  }",
        "  chain egress {",
        "    meta nfproto ipv6 drop",
        f"    ip saddr != {addr.address} drop",
        "    ct state established,related accept",
        "    ip daddr @operator4 accept",
        "    ip daddr @blocked4 reject with icmpx admin-prohibited",
        "    jump userpolicy",
        f"    {REJECT}",
        "  }",
        "  chain userpolicy {",
        *(f"    {r}" for r in policy_rules(policy, enforce_ips)),
        "  }",
        "  chain postrouting { type nat hook postrouting priority 100; policy accept;",
        f'    ip saddr {addr.address} oifname != "{ifn}" masquerade',
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def policy_update(container_id: str, policy: EgressPolicy, enforce_ips: bool) -> str:
    """The script that swaps the policy chain and static sets in one atomic batch."""
    t = table_name(container_id)
    lines = [f"flush chain inet {t} userpolicy", f"flush set inet {t} allow4",
             f"flush set inet {t} deny4"]
    for name, action in (("allow4", ALLOW), ("deny4", DENY)):
        nets = _v4(policy.networks(action))
        if nets:
            lines.append(f"add element inet {t} {name} {{ {', '.join(map(str, nets))} }}")
    for r in policy_rules(policy, enforce_ips):
        lines.append(f"add rule inet {t} userpolicy {r}")
    return "\n".join(lines) + "\n"


def delete_table(container_id: str) -> None:
    t = table_name(container_id)
    try_run(f"table inet {t}\ndelete table inet {t}\n")


def tables(prefix: str = TABLE_PREFIX) -> list[str]:
    with _nft_lock:
        rc, out, _err = _nft.cmd("list tables inet")
    if rc != 0:
        return []
    return [parts[2] for line in out.splitlines()
            if len(parts := line.split()) >= 3 and parts[2].startswith(prefix)]


class LearnedAddresses:
    """Addresses the DNS filter put into a sandbox's ``dns4`` set, with the names behind them.

    Written over raw nf_tables netlink (pyroute2) on the event loop: libnftables fetches
    the whole ruleset before every command, which grows with the number of sandboxes (10-40
    ms with 60 of them), while one element message stays ~0.5 ms, and this sits between a
    DNS answer and its delivery. Kept here so that re-adding an address can refresh its
    timeout (adding an existing element leaves its timeout alone) and so that a policy
    change can drop addresses whose names are no longer allowed.
    """

    def __init__(self, container_id: str, socket: NetlinkSets) -> None:
        self.table = table_name(container_id)
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
            await self._sets.delete(self.table, "dns4", refresh)
        if fresh:
            await self._sets.add(self.table, "dns4", fresh)

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
