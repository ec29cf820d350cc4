"""``PodEgress``: the egress policies of one kubernetes runtime's sandboxes, enforced by
sandlot's DNS filter (names) and a NetworkPolicy per sandbox (addresses, mode dns+nft).

State lives in the cluster, so a restarted server carries on without a gap: each Pod's
policy in its annotation ``sandlot.io/network-policy`` (the server's store stays the source
of truth and re-applies it at start), the addresses its DNS filter answered in the
NetworkPolicy's annotation with their expiry. The NetworkPolicy is written before the Pod
starts and owned by the Pod once it exists, so the cluster deletes it with the Pod even
without sandlot. ``netpolicy`` has the rules and what they guarantee.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sandlot.config import Config
from sandlot.errors import Conflict, RuntimeFailure
from sandlot.net.dns import DnsFilter, host_resolvers
from sandlot.net.policy import ALLOW_ALL, DENY, EgressPolicy, parse_policy
from sandlot.runtime.kubernetes import netpolicy
from sandlot.runtime.kubernetes.apierror import explain
from sandlot.runtime.kubernetes.dnsfilter import PodDnsServer
from sandlot.runtime.kubernetes.learned import Learned
from sandlot.runtime.kubernetes.pod import LABEL_OWNER, LABEL_SANDBOX, pod_name

log = logging.getLogger(__name__)
PRUNE_EVERY = 60.0
MISS_CACHE = 2.0  # seconds a Pod IP that is none of ours is not looked up again
ABSENT_LOG_EVERY = 60.0  # seconds between errors about a listen address still absent
# The sandbox id at a Pod IP, asked of the API server when the watch has not seen it yet.
LookupIp = Callable[[str], Awaitable[str | None]]


def policy_of_pod(pod: Any) -> EgressPolicy:
    """The policy a Pod's annotation records (none: allow-all; unreadable: deny-all until
    the server re-applies the stored one)."""
    raw = (pod.metadata.annotations or {}).get(netpolicy.ANNOTATION_POLICY)
    if raw is None:
        return ALLOW_ALL
    with contextlib.suppress(ValueError, TypeError):
        return parse_policy(json.loads(raw))
    log.warning("the network policy annotation of Pod %s is unreadable; denying all",
                pod.metadata.name)
    return EgressPolicy(DENY)


class PodEgress:
    """See module docstring; one per ``KubernetesRuntime`` whose DNS filter is configured."""

    def __init__(self, cfg: Config, api: client.ApiClient, owner: str,
                 labels: Callable[[str], dict[str, str]], lookup: LookupIp) -> None:
        self.cfg = cfg
        self.namespace = cfg.kubernetes.namespace
        self.core = client.CoreV1Api(api)
        self.net = client.NetworkingV1Api(api)
        self.owner = owner
        self.labels = labels  # a sandbox's labels (those of its Pod and Secrets)
        self.lookup = lookup
        self.enforce_ips = netpolicy.writes_network_policies(cfg)
        self.upstreams = list(cfg.network.dns_servers) or host_resolvers()
        self.server = PodDnsServer(self._filter_of)
        self._by_ip: dict[str, str] = {}
        self._ip_of: dict[str, str] = {}
        self._misses: dict[str, float] = {}
        self._policies: dict[str, EgressPolicy] = {}
        self._filters: dict[str, DnsFilter] = {}
        self._learned: dict[str, Learned] = {}
        self._written: set[str] = set()  # sandboxes whose NetworkPolicy exists
        self._pods: dict[str, str] = {}  # sandbox id -> Pod name (a claimed warm Pod's)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._prune: asyncio.Task[None] | None = None
        self._listen = netpolicy.filter_listen_text(cfg)  # as configured, for messages
        # The listen address is on no interface of this host (see _check_absent).
        self._absent = False
        self._absent_logged = -ABSENT_LOG_EVERY

    async def start(self) -> None:
        try:
            host, port = netpolicy.filter_listen(self.cfg)
            present = await self.server.start(host, port)
        except (OSError, ValueError) as exc:
            raise RuntimeFailure(f"[kubernetes] the DNS filter cannot listen on "
                                 f"{self._listen}: {exc}") from exc
        if not present:
            self._absent = True
            log.warning("dns filter: %s is on no interface of this host yet; listening on it "
                        "anyway (a node's Pod bridge gets its address with its first Pod): "
                        "sandbox Pods' names resolve once it is there", self._listen)
        if not self.upstreams:
            log.warning("dns filter: no upstream resolvers (none in /etc/resolv.conf and no "
                        "[network] dns_servers): sandboxes' names will not resolve")
        if self.enforce_ips:
            try:
                found = await self.net.list_namespaced_network_policy(
                    self.namespace, label_selector=f"{LABEL_OWNER}={self.owner}")
            except ApiException as exc:
                self.server.close()
                raise RuntimeFailure(f"cannot list NetworkPolicies in namespace "
                                     f"{self.namespace}: {explain(exc)}") from exc
            for item in found.items:
                sid = (item.metadata.labels or {}).get(LABEL_SANDBOX)
                if sid:
                    self._written.add(sid)
                    self._learned[sid] = Learned(netpolicy.parse_learned(
                        (item.metadata.annotations or {}).get(netpolicy.ANNOTATION_LEARNED)))
            self._prune = asyncio.get_running_loop().create_task(self._prune_loop())
        log.info("%s", netpolicy.guarantees(self.cfg))

    async def close(self) -> None:
        self.server.close()
        if self._prune is not None:
            self._prune.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prune

    # -- Pods ---------------------------------------------------------------------------

    def pod_fields(self, policy: EgressPolicy | None) -> tuple[dict[str, Any], dict[str, str]]:
        """Pod spec fields and annotations of a new sandbox Pod."""
        annotations = {} if policy is None else {
            netpolicy.ANNOTATION_POLICY: json.dumps(policy.to_json(), sort_keys=True)}
        return netpolicy.pod_dns(self.cfg), annotations

    def note(self, kind: str, sandbox_id: str | None, pod: Any) -> None:
        """A Pod change seen by the watch: which sandbox is at which address."""
        if sandbox_id is None:
            return  # a warm Pod: no sandbox's yet
        ip = pod.status.pod_ip if pod.status is not None else None
        if kind == "DELETED" or pod.metadata.deletion_timestamp is not None:
            old = self._ip_of.pop(sandbox_id, None)
            if old is not None and self._by_ip.get(old) == sandbox_id:
                del self._by_ip[old]
            return
        self._pods[sandbox_id] = pod.metadata.name
        if sandbox_id not in self._policies:
            self._policies[sandbox_id] = policy_of_pod(pod)
        if ip:
            self.bind_ip(sandbox_id, ip)
            self._check_absent()

    @property
    def listen_address_absent(self) -> bool:
        """Whether the filter listens on an address this host does not have (yet)."""
        return self._absent

    def _check_absent(self) -> None:
        """A sandbox Pod has an address, so a node's Pod bridge has its own by now: say
        whether the listen address appeared, or (once a minute) that queries cannot reach
        the filter while it is absent (a wrong ``dns_filter_address``)."""
        if not self._absent:
            return
        try:
            present = self.server.address_present()
        except OSError:
            present = False
        now = time.monotonic()
        if present:
            self._absent = False
            log.info("dns filter: %s is on an interface now", self._listen)
        elif now - self._absent_logged >= ABSENT_LOG_EVERY:
            self._absent_logged = now
            log.error("dns filter: %s is still on no interface of this host while sandbox "
                      "Pods run: their DNS queries cannot reach it; set [kubernetes] "
                      "dns_filter_address (or dns_filter_listen) to an address of this host "
                      "that Pods reach (docs/runtime-kubernetes.md)", self._listen)

    def bind_ip(self, sandbox_id: str, ip: str) -> None:
        old = self._ip_of.get(sandbox_id)
        if old is not None and old != ip:
            self._by_ip.pop(old, None)
        self._ip_of[sandbox_id] = ip
        self._by_ip[ip] = sandbox_id
        self._misses.pop(ip, None)

    async def _filter_of(self, ip: str) -> DnsFilter | None:
        sandbox_id = self._by_ip.get(ip)
        if sandbox_id is None:
            if time.monotonic() - self._misses.get(ip, -MISS_CACHE) < MISS_CACHE:
                return None
            sandbox_id = await self.lookup(ip)
            if sandbox_id is None:
                if len(self._misses) > 4096:
                    self._misses.clear()
                self._misses[ip] = time.monotonic()
                return None
            self.bind_ip(sandbox_id, ip)
        flt = self._filters.get(sandbox_id)
        if flt is None:
            policy = self._policies.get(sandbox_id, ALLOW_ALL)

            async def learn(name: str, answers: list[tuple[ipaddress.IPv4Address, int]],
                            sid: str = sandbox_id) -> None:
                await self._learn(sid, name, answers)

            flt = DnsFilter(sandbox_id, policy, self.upstreams,
                            learn if self.enforce_ips else None)
            self._filters[sandbox_id] = flt
        return flt

    # -- policies -----------------------------------------------------------------------

    def _needs_object(self, policy: EgressPolicy) -> bool:
        return self.enforce_ips and netpolicy.needs_ip_enforcement(policy)

    async def prepare(self, sandbox_id: str, policy: EgressPolicy | None) -> None:
        """Before a sandbox's Pod is created: its policy, and its NetworkPolicy if one is
        needed (so the network plugin knows it when the Pod's network comes up)."""
        pol = policy or ALLOW_ALL
        self._policies[sandbox_id] = pol
        self._learned[sandbox_id] = Learned({})
        if self._needs_object(pol):
            await self._write(sandbox_id, pol, owner=None)

    async def own(self, sandbox_id: str, pod: Any) -> None:
        """Make the Pod the NetworkPolicy's owner: the cluster deletes it with the Pod."""
        if sandbox_id not in self._written:
            return
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
               "uid": pod.metadata.uid}
        await self.net.patch_namespaced_network_policy(
            netpolicy.policy_name(pod.metadata.name), self.namespace,
            {"metadata": {"ownerReferences": [ref]}})

    async def set_policy(self, sandbox_id: str, pod: Any, policy: EgressPolicy) -> None:
        """Enforce ``policy`` at once: the NetworkPolicy, the Pod's record, the DNS filter."""
        if not policy.allows_everything and not self._resolves_through_filter(pod):
            raise Conflict(
                f"sandbox {sandbox_id}'s Pod was created before [kubernetes] "
                "dns_filter_address was set: its resolver is not sandlot's DNS filter, so a "
                "network policy cannot be enforced for it (create the sandbox again)",
                code="SANDBOX_STATE_CONFLICT")
        async with self._locks[sandbox_id]:
            learned = await self._learned_of(sandbox_id, pod.metadata.name)
            learned.forget_unless(policy)
            if self._needs_object(policy):
                await self._write(sandbox_id, policy, owner=pod)
            else:
                await self._delete_object(sandbox_id, pod.metadata.name)
            try:
                await self.core.patch_namespaced_pod(
                    pod.metadata.name, self.namespace, {"metadata": {"annotations": {
                        netpolicy.ANNOTATION_POLICY: json.dumps(policy.to_json(),
                                                                sort_keys=True)}}})
            except ApiException as exc:
                raise RuntimeFailure(f"cannot record the network policy on Pod "
                                     f"{pod.metadata.name}: {explain(exc)}") from exc
            self._policies[sandbox_id] = policy
            flt = self._filters.get(sandbox_id)
            if flt is not None:
                flt.policy = policy

    def _resolves_through_filter(self, pod: Any) -> bool:
        dns = pod.spec.dns_config if pod.spec is not None else None
        return (pod.spec is not None and pod.spec.dns_policy == "None" and dns is not None
                and str(self.cfg.kubernetes.dns_filter_address) in (dns.nameservers or []))

    async def _learn(self, sandbox_id: str, name: str,
                     answers: list[tuple[ipaddress.IPv4Address, int]]) -> None:
        """Allow the addresses of an answer before it is sent (default deny only)."""
        policy = self._policies.get(sandbox_id, ALLOW_ALL)
        if not self._needs_object(policy) or policy.default_action != DENY:
            return
        async with self._locks[sandbox_id]:
            learned = self._learned.setdefault(sandbox_id, Learned({}))
            if learned.add(name, answers) and sandbox_id in self._written:
                await self._write(sandbox_id, self._policies.get(sandbox_id, policy),
                                  owner=None)

    async def _learned_of(self, sandbox_id: str, name: str) -> Learned:
        learned = self._learned.get(sandbox_id)
        if learned is None:
            learned = Learned({})
            with contextlib.suppress(ApiException):
                obj = await self.net.read_namespaced_network_policy(
                    netpolicy.policy_name(name), self.namespace)
                self._written.add(sandbox_id)
                learned = Learned(netpolicy.parse_learned(
                    (obj.metadata.annotations or {}).get(netpolicy.ANNOTATION_LEARNED)))
            self._learned[sandbox_id] = learned
        return learned

    def _pod_name(self, sandbox_id: str) -> str:
        return self._pods.get(sandbox_id) or pod_name(sandbox_id)

    async def _write(self, sandbox_id: str, policy: EgressPolicy, owner: Any | None) -> None:
        """Create or update the sandbox's NetworkPolicy (``owner``: its Pod, if known)."""
        name = owner.metadata.name if owner is not None else self._pod_name(sandbox_id)
        learned = self._learned.setdefault(sandbox_id, Learned({}))
        learned.prune(time.time())
        body: Any = netpolicy.manifest(
            self.cfg, netpolicy.policy_name(name), self.labels(sandbox_id),
            {LABEL_OWNER: self.owner, LABEL_SANDBOX: sandbox_id}, policy,
            learned.expiry)
        if owner is not None:
            body["metadata"]["ownerReferences"] = [{
                "apiVersion": "v1", "kind": "Pod", "name": owner.metadata.name,
                "uid": owner.metadata.uid}]
        name = body["metadata"]["name"]
        self._pods[sandbox_id] = owner.metadata.name if owner is not None else \
            self._pod_name(sandbox_id)
        try:
            if sandbox_id in self._written:
                try:
                    await self.net.patch_namespaced_network_policy(
                        name, self.namespace,
                        {"metadata": body["metadata"], "spec": body["spec"]})
                    return
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            await self.net.create_namespaced_network_policy(self.namespace, body)
            self._written.add(sandbox_id)
        except ApiException as exc:
            raise RuntimeFailure(f"cannot write NetworkPolicy {name}: {explain(exc)}") \
                from exc

    async def _delete_object(self, sandbox_id: str, name: str) -> None:
        try:
            await self.net.delete_namespaced_network_policy(
                netpolicy.policy_name(name), self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise RuntimeFailure(f"cannot delete the NetworkPolicy of {sandbox_id}: "
                                     f"{explain(exc)}") from exc
        self._written.discard(sandbox_id)

    async def remove(self, sandbox_id: str, name: str) -> None:
        """The sandbox (Pod ``name``) is gone: its NetworkPolicy and all kept for it."""
        async with self._locks[sandbox_id]:
            if self.enforce_ips:
                await self._delete_object(sandbox_id, name)
            self.forget(sandbox_id)
        self._locks.pop(sandbox_id, None)

    def forget(self, sandbox_id: str) -> None:
        self._policies.pop(sandbox_id, None)
        self._filters.pop(sandbox_id, None)
        self._learned.pop(sandbox_id, None)
        self._pods.pop(sandbox_id, None)
        ip = self._ip_of.pop(sandbox_id, None)
        if ip is not None and self._by_ip.get(ip) == sandbox_id:
            self._by_ip.pop(ip, None)

    async def _prune_loop(self) -> None:
        """Expired answers leave the NetworkPolicies even when nothing is resolved."""
        while True:
            await asyncio.sleep(PRUNE_EVERY)
            now = time.time()
            for sandbox_id, learned in list(self._learned.items()):
                if sandbox_id not in self._written or not any(
                        until <= now for until in learned.expiry.values()):
                    continue
                try:
                    async with self._locks[sandbox_id]:
                        policy = self._policies.get(sandbox_id)
                        if policy is not None and sandbox_id in self._written:
                            await self._write(sandbox_id, policy, owner=None)
                except Exception:  # noqa: BLE001 - retried at the next round
                    log.warning("pruning the answered addresses of %s failed", sandbox_id,
                                exc_info=True)

