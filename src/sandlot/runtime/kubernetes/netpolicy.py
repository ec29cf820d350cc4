"""Egress on Kubernetes, the pure part: which guarantees hold on the configured cluster, which
policies it can enforce, and the NetworkPolicy of one sandbox.

Names are filtered by sandlot's DNS filter (every sandbox Pod's only resolver, see
``dnsfilter``): that holds on any cluster. Addresses are restricted by a NetworkPolicy per
sandbox, which only a network plugin that enforces NetworkPolicy makes true; Kubernetes
cannot tell sandlot whether it does, so the operator says so (``[kubernetes]
network_policy_enforced``). In ``[egress] mode = "dns"`` addresses are not restricted at all,
as on the ``oci`` runtime in that mode, and no NetworkPolicy is written.

A NetworkPolicy only allows, so a sandbox's is: egress to the DNS filter (port 53), to the
policy's allowed IP/CIDR blocks and the addresses its DNS filter answered (with the denied
blocks carved out as ``except``), or, when the default is allow, to everything but the denied
blocks. IPv6 is not allowed (sandboxes have no IPv6 on the other runtimes either).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from sandlot.config import Config
from sandlot.net.policy import ALLOW, DENY, EgressPolicy

ANNOTATION_POLICY = "sandlot.io/network-policy"  # on the Pod: the policy in force (JSON)
ANNOTATION_LEARNED = "sandlot.io/learned-addresses"  # on the NetworkPolicy: {ip: expiry}
NAME_SUFFIX = "-egress"
DNS_PORT = 53
ANY_V4 = ipaddress.IPv4Network("0.0.0.0/0")


def policy_name(pod_name: str) -> str:
    return pod_name + NAME_SUFFIX


def filter_configured(cfg: Config) -> bool:
    return bool(cfg.kubernetes.dns_filter_address)


def filter_listen_text(cfg: Config) -> str:
    """``host:port`` the server's DNS filter listens on, as configured: ``dns_filter_listen``,
    or ``dns_filter_address`` port 53."""
    return cfg.kubernetes.dns_filter_listen or \
        f"{cfg.kubernetes.dns_filter_address}:{DNS_PORT}"


def filter_listen(cfg: Config) -> tuple[str, int]:
    """``filter_listen_text`` as (host, port), brackets of an IPv6 host removed."""
    host, _, port = filter_listen_text(cfg).rpartition(":")
    return host.strip("[]"), int(port)


def writes_network_policies(cfg: Config) -> bool:
    """NetworkPolicies are written in mode dns+nft (mode dns restricts names only)."""
    return filter_configured(cfg) and cfg.egress.mode == "dns+nft"


def needs_ip_enforcement(policy: EgressPolicy) -> bool:
    """Whether the policy denies anything by address (a default deny, or a denied block):
    only a NetworkPolicy the cluster enforces can make that true."""
    return policy.default_action == DENY or bool(_v4(policy.networks(DENY)))


def refusal(cfg: Config, policy: EgressPolicy) -> str | None:
    """Why this cluster cannot enforce ``policy`` (None: it can)."""
    if not filter_configured(cfg):
        return ("networkPolicy needs sandlot's DNS filter on the kubernetes runtime: set "
                "[kubernetes] dns_filter_address to an address sandbox Pods reach the server "
                "at (docs/runtime-kubernetes.md)")
    if (cfg.egress.mode == "dns+nft" and not cfg.kubernetes.network_policy_enforced
            and needs_ip_enforcement(policy)):
        return ("this networkPolicy denies by address (defaultAction deny or a denied "
                "IP/CIDR), which on Kubernetes only holds where the cluster's network plugin "
                "enforces NetworkPolicy, and this server is not told that it does. If it does, "
                "set [kubernetes] network_policy_enforced = true; to accept filtering by DNS "
                'name only (addresses unrestricted), set [egress] mode = "dns"')
    return None


def guarantees(cfg: Config) -> str:
    """One sentence on what egress policies mean on the configured cluster."""
    k = cfg.kubernetes
    if not filter_configured(cfg):
        return ("egress: networkPolicy is refused (no [kubernetes] dns_filter_address); "
                "sandbox Pods use the cluster's DNS and reach what the cluster lets them")
    names = (f"names are filtered per sandbox by sandlot's DNS filter at "
             f"{k.dns_filter_address}")
    if cfg.egress.mode == "dns":
        return (f"egress: {names}; addresses are NOT restricted ([egress] mode = \"dns\"): "
                "a workload that connects by IP address, or asks another resolver, is not "
                "stopped")
    if k.network_policy_enforced:
        return (f"egress: {names}; addresses are restricted by a NetworkPolicy per sandbox "
                "(default deny, allowed blocks and the filter's answers), which holds "
                "because [kubernetes] network_policy_enforced = true says the cluster's "
                "network plugin enforces NetworkPolicy")
    return (f"egress: {names}; policies that deny by address are refused: the cluster is not "
            "declared to enforce NetworkPolicy ([kubernetes] network_policy_enforced = false)")


def _v4(nets: list[Any]) -> list[ipaddress.IPv4Network]:
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def _block(net: ipaddress.IPv4Network, deny: list[ipaddress.IPv4Network]
           ) -> dict[str, Any] | None:
    """An ipBlock of ``net`` without the denied blocks (None: all of it is denied)."""
    if any(net.subnet_of(d) for d in deny):
        return None
    carved = sorted({str(d) for d in deny if d.subnet_of(net) and d != net})
    block: dict[str, Any] = {"cidr": str(net)}
    if carved:
        block["except"] = carved
    return {"ipBlock": block}


def dns_peer(cfg: Config) -> dict[str, Any]:
    k = cfg.kubernetes
    if k.dns_filter_peer:
        return dict(k.dns_filter_peer)
    return {"ipBlock": {"cidr": f"{k.dns_filter_address}/32"}}


def dns_ports(cfg: Config) -> list[dict[str, Any]]:
    """Port 53, and the filter's listening port where a Service maps 53 to it (policies
    see the Pod's port after the Service's translation)."""
    ports = {DNS_PORT}
    listen = cfg.kubernetes.dns_filter_listen
    if listen:
        ports.add(int(listen.rsplit(":", 1)[1]))
    return [{"protocol": proto, "port": port} for port in sorted(ports)
            for proto in ("UDP", "TCP")]


def egress_rules(cfg: Config, policy: EgressPolicy,
                 learned: list[ipaddress.IPv4Address]) -> list[dict[str, Any]]:
    """The ``spec.egress`` of a sandbox's NetworkPolicy (see module docstring)."""
    deny = _v4(policy.networks(DENY))
    rules: list[dict[str, Any]] = [{"to": [dns_peer(cfg)], "ports": dns_ports(cfg)}]
    if policy.default_action == ALLOW:
        allowed = [ANY_V4]
    else:
        allowed = _v4(policy.networks(ALLOW))
        allowed += [ipaddress.IPv4Network(ip) for ip in sorted(set(learned))
                    if not any(ip in n for n in allowed)]
    peers = [b for net in allowed if (b := _block(net, deny)) is not None]
    if peers:
        rules.append({"to": peers})
    return rules


def manifest(cfg: Config, name: str, labels: dict[str, str], selector: dict[str, str],
             policy: EgressPolicy, learned: dict[ipaddress.IPv4Address, float]
             ) -> dict[str, Any]:
    """The NetworkPolicy of one sandbox; ``learned`` maps answered addresses to their
    expiry (seconds since the epoch), kept in an annotation for a restarted server."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": dict(labels),
                     "annotations": {ANNOTATION_LEARNED: learned_annotation(learned)}},
        "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Egress"],
                 "egress": egress_rules(cfg, policy, list(learned))},
    }


def learned_annotation(learned: dict[ipaddress.IPv4Address, float]) -> str:
    return json.dumps({str(ip): int(until) for ip, until in sorted(learned.items())})


def parse_learned(raw: str | None) -> dict[ipaddress.IPv4Address, float]:
    """The annotation back (garbage: nothing learned, the workload just resolves again)."""
    out: dict[ipaddress.IPv4Address, float] = {}
    try:
        for ip, until in json.loads(raw or "{}").items():
            out[ipaddress.IPv4Address(ip)] = float(until)
    except (ValueError, TypeError, AttributeError):
        return {}
    return out


def pod_dns(cfg: Config) -> dict[str, Any]:
    """The Pod spec fields that make the DNS filter a sandbox's only resolver."""
    return {"dnsPolicy": "None", "dnsConfig": {
        "nameservers": [str(cfg.kubernetes.dns_filter_address)],
        "options": [{"name": "ndots", "value": "1"}, {"name": "timeout", "value": "2"},
                    {"name": "attempts", "value": "2"}]}}
