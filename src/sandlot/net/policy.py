"""The egress policy model, with the reference egress component's semantics.

A policy is ``defaultAction`` (allow | deny) plus ordered ``egress`` rules whose targets are
FQDNs, ``*.wildcards``, IP addresses or CIDRs. Domain rules decide DNS answers: the first
matching rule wins (``*.example.com`` matches subdomains, not ``example.com`` itself), no
match falls back to ``defaultAction``. IP and CIDR rules are enforced by nftables (deny
before allow). PATCH merges (incoming rules first, the first of each target wins), DELETE
removes rules by target. No policy at all means allow-all (the lifecycle spec's default).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from sandlot.errors import InvalidRequest

Action = Literal["allow", "deny"]
ALLOW: Action = "allow"
DENY: Action = "deny"
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class PolicyError(InvalidRequest):
    """An invalid policy or rule (HTTP 400, naming the rule)."""


class TooManyRules(PolicyError):
    """More than ``MAX_RULES`` rules (the egress API answers 413 for it, as the reference)."""

    def __init__(self, count: int) -> None:
        super().__init__(f"egress rule total count {count} exceeds limit {MAX_RULES}")


@dataclass(frozen=True)
class EgressRule:
    action: Action
    target: str  # normalised: lower-case domain, or the IP/CIDR as written canonically

    @property
    def network(self) -> IpNetwork | None:
        """The IP/CIDR this rule names, or None for a domain rule."""
        try:
            return ipaddress.ip_network(self.target, strict=False)
        except ValueError:
            return None

    def matches_domain(self, name: str) -> bool:
        if self.target.startswith("*."):
            return name.endswith(self.target[1:]) and name != self.target[2:]
        return name == self.target

    def to_json(self) -> dict[str, str]:
        return {"action": self.action, "target": self.target}


@dataclass(frozen=True)
class EgressPolicy:
    default_action: Action = ALLOW
    egress: tuple[EgressRule, ...] = field(default_factory=tuple)

    def evaluate(self, name: str) -> tuple[Action, EgressRule | None]:
        """The action for DNS name ``name`` and the rule that decided it (None: default)."""
        name = name.lower().rstrip(".")
        for rule in self.egress:
            if rule.network is None and rule.matches_domain(name):
                return rule.action, rule
        return self.default_action, None

    def networks(self, action: Action) -> list[IpNetwork]:
        return [n for r in self.egress if r.action == action and (n := r.network) is not None]

    @property
    def mode(self) -> str:
        """The reference's derived mode: allow_all, deny_all or enforcing."""
        if not self.egress:
            return "allow_all" if self.default_action == ALLOW else "deny_all"
        return "enforcing"

    @property
    def allows_everything(self) -> bool:
        return self.default_action == ALLOW and not self.egress

    def to_json(self) -> dict[str, Any]:
        return {"defaultAction": self.default_action,
                "egress": [r.to_json() for r in self.egress]}

    def patched(self, rules: list[EgressRule]) -> EgressPolicy:
        """Incoming rules first (the first of each target wins), then the kept old ones.
        Raises ``PolicyError`` when the result would exceed ``MAX_RULES``."""
        seen: set[str] = set()
        merged: list[EgressRule] = []
        for rule in [*rules, *self.egress]:
            if rule.target not in seen:
                seen.add(rule.target)
                merged.append(rule)
        if len(merged) > MAX_RULES:
            raise TooManyRules(len(merged))
        return EgressPolicy(self.default_action, tuple(merged))

    def without(self, targets: list[str]) -> EgressPolicy:
        drop = {t.strip().lower() for t in targets if t.strip()}
        return EgressPolicy(self.default_action,
                            tuple(r for r in self.egress if r.target.lower() not in drop))


ALLOW_ALL = EgressPolicy()


def _action(value: Any, where: str) -> Action:
    if value is None or (isinstance(value, str) and not value.strip()):
        return DENY  # the reference's default for a missing action
    if isinstance(value, str) and value.strip().lower() in (ALLOW, DENY):
        return ALLOW if value.strip().lower() == ALLOW else DENY
    raise PolicyError(f"{where}: action must be 'allow' or 'deny', got {value!r}")


def _target(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{where}: target must be a non-empty string")
    raw = value.strip()
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        pass
    if "/" in raw:
        try:
            return str(ipaddress.ip_network(raw, strict=False))
        except ValueError:
            raise PolicyError(f"{where}: {raw!r} is not a valid CIDR") from None
    name = raw.lower().rstrip(".")
    labels = name[2:].split(".") if name.startswith("*.") else name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise PolicyError(
            f"{where}: {raw!r} is not a domain name, '*.' wildcard domain, IP address or CIDR"
        )
    return name


def parse_rule(raw: Any, where: str) -> EgressRule:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: a rule is an object {{action, target}}, got {raw!r}")
    unknown = set(raw) - {"action", "target"}
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {sorted(unknown)}")
    target = _target(raw.get("target"), where)
    return EgressRule(_action(raw.get("action"), f"{where} ({target})"), target)


MAX_RULES = 4096  # per policy (the reference's default limit, OPENSANDBOX_EGRESS_MAX_RULES)


def parse_rules(raw: Any, what: str = "egress") -> list[EgressRule]:
    if not isinstance(raw, list):
        raise PolicyError(f"{what} must be a list of rules")
    if len(raw) > MAX_RULES:
        raise TooManyRules(len(raw))
    return [parse_rule(item, f"{what}[{i}]") for i, item in enumerate(raw)]


def parse_policy(raw: Any) -> EgressPolicy:
    """A create request's ``networkPolicy`` (or a PUT body); None or ``{}`` is allow-all."""
    if raw is None or raw == {}:
        return ALLOW_ALL
    if not isinstance(raw, dict):
        raise PolicyError("networkPolicy must be an object {defaultAction, egress}")
    unknown = set(raw) - {"defaultAction", "egress"}
    if unknown:
        raise PolicyError(f"networkPolicy: unknown field(s) {sorted(unknown)}")
    default = _action(raw.get("defaultAction"), "networkPolicy.defaultAction")
    return EgressPolicy(default, tuple(parse_rules(raw.get("egress") or [], "egress")))


def parse_targets(raw: Any) -> list[str]:
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) for t in raw):
        raise PolicyError("the body must be a non-empty list of target strings")
    return raw


def coerce(value: object) -> EgressPolicy:
    """A policy from what a runtime spec carries: ours, the lifecycle JSON, or any object
    with ``default_action`` and ``egress`` items having ``action`` and ``target``."""
    if value is None:
        return ALLOW_ALL
    if isinstance(value, EgressPolicy):
        return value
    if isinstance(value, dict):
        return parse_policy(value)
    rules = [{"action": getattr(r, "action", None), "target": getattr(r, "target", None)}
             for r in getattr(value, "egress", ())]
    return parse_policy({"defaultAction": getattr(value, "default_action", None),
                         "egress": rules})
