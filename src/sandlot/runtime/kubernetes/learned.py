"""Addresses a sandbox's DNS filter answered, which its NetworkPolicy allows until they
expire (``egress``): one entry per address, with the names that led to it so that a policy
change can take back what it no longer allows."""

from __future__ import annotations

import ipaddress
import time

from sandlot.net.policy import ALLOW, EgressPolicy

# An answered address stays allowed this long at least (an API write per new address is
# dearer than an nft set element, so answers are kept longer than their TTL) and at most.
LEARNED_MIN = 300.0
LEARNED_MAX = 3600.0
LEARNED_PER_SANDBOX = 1024  # the oldest go first beyond this (the object must stay small)


class Learned:
    """Addresses a sandbox's DNS filter answered: expiry (epoch seconds) and names."""

    def __init__(self, expiry: dict[ipaddress.IPv4Address, float]) -> None:
        self.expiry = dict(expiry)
        self.names: dict[ipaddress.IPv4Address, set[str]] = {}

    def add(self, name: str, answers: list[tuple[ipaddress.IPv4Address, int]]) -> bool:
        """Remember the answers; True when the NetworkPolicy must be written again."""
        now = time.time()
        changed = self.prune(now)
        for ip, ttl in answers:
            if not ip.is_global:  # a DNS answer never opens a private/link-local address
                continue
            self.names.setdefault(ip, set()).add(name)
            lifetime = min(max(float(ttl), LEARNED_MIN), LEARNED_MAX)
            old = self.expiry.get(ip)
            if old is not None and old - now > lifetime / 2:
                continue  # present with long enough to live
            self.expiry[ip] = now + lifetime
            changed = True
        while len(self.expiry) > LEARNED_PER_SANDBOX:
            oldest = min(self.expiry, key=lambda a: self.expiry[a])
            self.expiry.pop(oldest)
            self.names.pop(oldest, None)
        return changed

    def prune(self, now: float) -> bool:
        gone = [ip for ip, until in self.expiry.items() if until <= now]
        for ip in gone:
            self.expiry.pop(ip)
            self.names.pop(ip, None)
        return bool(gone)

    def forget_unless(self, policy: EgressPolicy) -> bool:
        """Drop addresses whose names the policy no longer allows; True if any went.
        Addresses of a restarted server's predecessor have no names: kept to their expiry."""
        gone = [ip for ip, names in self.names.items()
                if names and not any(policy.evaluate(n)[0] == ALLOW for n in names)]
        for ip in gone:
            self.expiry.pop(ip, None)
            self.names.pop(ip, None)
        return bool(gone)
