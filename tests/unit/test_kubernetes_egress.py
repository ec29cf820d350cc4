"""Egress on the kubernetes runtime, the pure part: what the configured cluster guarantees,
which policies it refuses, a sandbox's NetworkPolicy and the addresses learned from answers."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Any

from sandlot.config import Config
from sandlot.net.policy import parse_policy
from sandlot.runtime.kubernetes import netpolicy
from sandlot.runtime.kubernetes.learned import Learned

IP = ipaddress.IPv4Address


def cfg(**kubernetes: Any) -> Config:
    mode = kubernetes.pop("mode", "dns+nft")
    return Config.model_validate({"runtime": {"type": "kubernetes"},
                                  "kubernetes": {"dns_filter_address": "10.96.0.53",
                                                 **kubernetes},
                                  "egress": {"mode": mode}})


DENY = parse_policy({"defaultAction": "deny", "egress": [
    {"action": "allow", "target": "pypi.org"},
    {"action": "allow", "target": "9.9.0.0/16"},
    {"action": "deny", "target": "9.9.9.0/24"},
    {"action": "deny", "target": "fd00::/8"}]})


def test_refusals_follow_what_the_cluster_can_enforce() -> None:
    names_only = parse_policy({"defaultAction": "allow",
                               "egress": [{"action": "deny", "target": "evil.test"}]})
    block = parse_policy({"defaultAction": "allow",
                          "egress": [{"action": "deny", "target": "1.2.3.0/24"}]})
    unenforced = cfg()
    assert netpolicy.refusal(unenforced, names_only) is None
    for policy in (DENY, block):
        why = netpolicy.refusal(unenforced, policy)
        assert why is not None and "network_policy_enforced = true" in why
        assert '[egress] mode = "dns"' in why
        assert netpolicy.refusal(cfg(network_policy_enforced=True), policy) is None
        assert netpolicy.refusal(cfg(mode="dns"), policy) is None
    no_filter = Config.model_validate({"runtime": {"type": "kubernetes"}})
    why = netpolicy.refusal(no_filter, names_only)
    assert why is not None and "dns_filter_address" in why


def test_guarantees_say_what_holds() -> None:
    assert "NOT restricted" in netpolicy.guarantees(cfg(mode="dns"))
    assert "restricted by a NetworkPolicy" in netpolicy.guarantees(
        cfg(network_policy_enforced=True))
    assert "refused" in netpolicy.guarantees(cfg())
    assert "refused" in netpolicy.guarantees(Config.model_validate({}))
    assert not netpolicy.writes_network_policies(cfg(mode="dns"))
    assert netpolicy.writes_network_policies(cfg())


def test_default_deny_manifest() -> None:
    learned = {IP("5.6.7.8"): time.time() + 300, IP("9.9.1.1"): time.time() + 300,
               IP("9.9.9.9"): time.time() + 300}
    np = netpolicy.manifest(cfg(network_policy_enforced=True), "sandlot-x-egress",
                            {"a": "b"}, {"sandlot.io/sandbox-id": "x"}, DENY, learned)
    assert np["kind"] == "NetworkPolicy" and np["apiVersion"] == "networking.k8s.io/v1"
    assert np["spec"]["podSelector"] == {"matchLabels": {"sandlot.io/sandbox-id": "x"}}
    assert np["spec"]["policyTypes"] == ["Egress"]
    dns, allowed = np["spec"]["egress"]
    assert dns == {"to": [{"ipBlock": {"cidr": "10.96.0.53/32"}}],
                   "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    # the allowed block minus the denied one; an answer inside an allowed block adds
    # nothing; one inside a denied block is not allowed; IPv6 is never allowed
    assert allowed == {"to": [
        {"ipBlock": {"cidr": "9.9.0.0/16", "except": ["9.9.9.0/24"]}},
        {"ipBlock": {"cidr": "5.6.7.8/32"}}]}
    assert netpolicy.parse_learned(
        np["metadata"]["annotations"][netpolicy.ANNOTATION_LEARNED]).keys() == learned.keys()


def test_default_allow_manifest_and_a_peer_behind_a_service() -> None:
    policy = parse_policy({"defaultAction": "allow", "egress": [
        {"action": "deny", "target": "8.8.0.0/16"}, {"action": "deny", "target": "x.test"}]})
    peer = {"podSelector": {"matchLabels": {"app": "sandlot"}}}
    c = cfg(network_policy_enforced=True, dns_filter_listen="0.0.0.0:5353",
            dns_filter_peer=peer)
    dns, allowed = netpolicy.egress_rules(c, policy, [IP("5.6.7.8")])
    assert dns["to"] == [peer]
    assert {p["port"] for p in dns["ports"]} == {53, 5353}
    assert allowed == {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["8.8.0.0/16"]}}]}
    everything = parse_policy({"defaultAction": "allow", "egress": [
        {"action": "deny", "target": "0.0.0.0/0"}]})
    assert netpolicy.egress_rules(c, everything, []) == [dns]  # DNS only
    assert netpolicy.parse_learned("not json") == {}


def test_pod_dns_points_at_the_filter() -> None:
    fields = netpolicy.pod_dns(cfg())
    assert fields["dnsPolicy"] == "None"
    assert fields["dnsConfig"]["nameservers"] == ["10.96.0.53"]


def test_learned_addresses() -> None:
    learned = Learned({})
    assert learned.add("a.test", [(IP("5.6.7.8"), 30)])
    assert learned.expiry[IP("5.6.7.8")] - time.time() > 250  # at least LEARNED_MIN
    assert not learned.add("a.test", [(IP("5.6.7.8"), 30)])  # nothing new to write
    assert not learned.add("b.test", [(IP("10.0.0.1"), 30), (IP("169.254.169.254"), 30)])
    assert set(learned.expiry) == {IP("5.6.7.8")}  # private answers open nothing
    assert learned.forget_unless(parse_policy({"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "b.test"}]}))
    assert learned.expiry == {}
    old = Learned({IP("5.6.7.9"): time.time() - 1, IP("5.6.7.10"): time.time() + 100})
    assert old.prune(time.time()) and set(old.expiry) == {IP("5.6.7.10")}
    # a predecessor's addresses (no names known) stay until they expire
    assert not old.forget_unless(parse_policy({"defaultAction": "deny"}))


def test_config_keys_are_honoured(tmp_path: Path) -> None:
    path = tmp_path / "sandlot.toml"
    path.write_text('[runtime]\ntype = "kubernetes"\n[kubernetes]\n'
                    'dns_filter_address = "10.96.0.53"\ndns_filter_listen = "0.0.0.0:5353"\n'
                    "network_policy_enforced = true\n"
                    'dns_filter_peer = { podSelector = { matchLabels = { app = "x" } } }\n'
                    'bogus_key = 1\n')
    c = Config.load(path)
    assert c.refusals() == []
    assert c.kubernetes.network_policy_enforced
    assert [w for w in c.warnings() if "[kubernetes]" in w] == [
        w for w in c.warnings() if "bogus_key" in w] != []
