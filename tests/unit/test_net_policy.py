"""The egress policy model: parsing, first-match evaluation, merge and delete semantics."""

from __future__ import annotations

import pytest

from sandlot.net.addressing import Leases, SandboxAddress
from sandlot.net.firewall import SandboxRules, base_table, clamp_ttl, policy_rules
from sandlot.net.policy import (
    ALLOW_ALL,
    EgressPolicy,
    EgressRule,
    PolicyError,
    coerce,
    parse_policy,
    parse_rules,
)
from sandlot.server.api.proxy import rebase_location


def test_empty_policy_allows_everything_and_missing_default_denies() -> None:
    assert parse_policy(None) is ALLOW_ALL and parse_policy({}) is ALLOW_ALL
    assert ALLOW_ALL.mode == "allow_all"
    p = parse_policy({"egress": [{"action": "allow", "target": "pypi.org"}]})
    assert p.default_action == "deny" and p.mode == "enforcing"
    assert parse_policy({"defaultAction": "deny"}).mode == "deny_all"


def test_first_match_wins_and_wildcards_exclude_the_apex() -> None:
    p = parse_policy({"defaultAction": "deny", "egress": [
        {"action": "deny", "target": "bad.example.com"},
        {"action": "allow", "target": "*.example.com"},
        {"action": "allow", "target": "Example.COM."},
    ]})
    assert p.evaluate("a.example.com")[0] == "allow"
    assert p.evaluate("x.y.example.com.")[0] == "allow"
    assert p.evaluate("bad.example.com") == ("deny", EgressRule("deny", "bad.example.com"))
    assert p.evaluate("example.com")[0] == "allow"  # the explicit rule, not the wildcard
    assert p.evaluate("notexample.com") == ("deny", None)
    assert p.evaluate("EXAMPLE.com")[0] == "allow"


def test_ip_and_cidr_rules_are_networks_not_names() -> None:
    p = parse_policy({"defaultAction": "allow", "egress": [
        {"action": "deny", "target": "203.0.113.7"},
        {"action": "allow", "target": "198.51.100.0/24"},
    ]})
    assert [str(n) for n in p.networks("deny")] == ["203.0.113.7/32"]
    assert [str(n) for n in p.networks("allow")] == ["198.51.100.0/24"]
    assert p.evaluate("203.0.113.7") == ("allow", None)  # IP rules never decide names


@pytest.mark.parametrize(("raw", "named"), [
    ({"defaultAction": "block"}, "defaultAction"),
    ({"egress": [{"action": "allow", "target": "ok.test"}, {"action": "allow"}]}, "egress[1]"),
    ({"egress": [{"action": "allow", "target": "bad name!"}]}, "bad name!"),
    ({"egress": [{"action": "maybe", "target": "x.test"}]}, "x.test"),
    ({"egress": [{"action": "allow", "target": "10.0.0.0/33"}]}, "10.0.0.0/33"),
    ({"egress": [{"action": "allow", "target": "x.test", "port": 80}]}, "port"),
    ({"egress": [{"action": "allow", "target": "*.*.test"}]}, "*.*.test"),
    ({"rules": []}, "rules"),
])
def test_invalid_policies_name_the_rule(raw: dict, named: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(raw)
    assert named in err.value.message and err.value.status == 400


def test_patch_merges_first_wins_and_delete_by_target() -> None:
    p = parse_policy({"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "a.test"}, {"action": "allow", "target": "b.test"}]})
    patched = p.patched(parse_rules([{"action": "deny", "target": "b.test"},
                                     {"action": "allow", "target": "b.test"},
                                     {"action": "allow", "target": "c.test"}]))
    assert [(r.action, r.target) for r in patched.egress] == [
        ("deny", "b.test"), ("allow", "c.test"), ("allow", "a.test")]
    assert patched.default_action == "deny"
    removed = patched.without(["B.test", "missing.test"])
    assert [r.target for r in removed.egress] == ["c.test", "a.test"]
    assert removed.without(["nothing"]) == removed


def test_coerce_accepts_typed_policies_of_other_modules() -> None:
    class Rule:
        action, target = "allow", "x.test"

    class Policy:
        default_action = "deny"
        egress = (Rule(),)

    assert coerce(Policy()) == EgressPolicy("deny", (EgressRule("allow", "x.test"),))
    assert coerce(None) is ALLOW_ALL
    assert coerce({"defaultAction": "allow"}) == EgressPolicy("allow")


def test_nft_rules_follow_mode_and_default() -> None:
    deny = parse_policy({"defaultAction": "deny"})
    assert policy_rules(deny, False, "dns_x") == ["accept"]
    rules = policy_rules(deny, True, "dns_x")
    assert rules[-2] == "ip daddr @dns_x accept" and rules[-1].startswith("reject")
    assert policy_rules(ALLOW_ALL, True, "dns_x")[-1] == "accept"
    mixed = parse_policy({"defaultAction": "allow", "egress": [
        {"action": "deny", "target": "10.1.0.0/16"}, {"action": "allow", "target": "1.2.3.4"}]})
    rules = policy_rules(mixed, True, "dns_x")
    assert rules[0].startswith("ip daddr { 10.1.0.0/16 } reject")
    assert rules[1] == "ip daddr { 1.2.3.4/32 } accept" and rules[2] == "accept"
    assert (clamp_ttl(0), clamp_ttl(30), clamp_ttl(10_000)) == (60, 90, 360)


def test_table_blocks_private_ranges_and_spoofing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import ipaddress

    leases = Leases(tmp_path, ipaddress.IPv4Network("100.88.0.0/16"))
    addr: SandboxAddress = leases.acquire("sb")
    assert (str(addr.gateway), str(addr.address)) == ("100.88.0.5", "100.88.0.6")
    for net in ("10.0.0.0/8", "169.254.0.0/16", "100.64.0.0/10", "192.168.0.0/16"):
        assert net in base_table()
    script = SandboxRules(addr, leases.subnet, [], True).install(ALLOW_ALL)
    assert "ip daddr @blocked4 reject" in script and "ip daddr 100.88.0.0/16 reject" in script
    assert "ip saddr != 100.88.0.6 drop" in script
    assert "meta nfproto ipv6 drop" in script
    assert f'"{addr.host_ifname}" : goto sbx_' in script
    assert Leases(tmp_path, leases.subnet).get("sb") == addr  # survives a restart
    second = leases.acquire("other")
    assert second.index != addr.index
    leases.release("sb")
    assert leases.get("sb") is None and not (tmp_path / str(addr.index)).exists()


def test_proxy_rebases_root_relative_redirects() -> None:
    path = "/v1/sandboxes/abc/proxy/8000/sub"
    assert rebase_location("/sub/", path, 8000) == "/v1/sandboxes/abc/proxy/8000/sub/"
    assert rebase_location("http://x/y", path, 8000) == "http://x/y"
    assert rebase_location("//cdn/y", path, 8000) == "//cdn/y"
    assert rebase_location("rel/y", path, 8000) == "rel/y"


def test_policies_are_bounded() -> None:
    from sandlot.net.policy import MAX_RULES

    rules = [{"action": "allow", "target": f"h{i}.test"} for i in range(MAX_RULES + 1)]
    with pytest.raises(PolicyError, match="exceeds limit"):
        parse_policy({"egress": rules})
    full = parse_policy({"egress": rules[:MAX_RULES]})
    with pytest.raises(PolicyError, match="exceeds limit"):
        full.patched(parse_rules([{"action": "deny", "target": "one-more.test"}]))
