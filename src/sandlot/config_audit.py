"""No silent ignoring of configuration: every key sandlot does not honour is named at start.

A key is *honoured* when sandlot's config model (``sandlot.config.Config``) has a field for
it: a backend that implements an upstream section (``[secure_runtime]``, ``[docker]``, ...)
registers what it honours simply by adding that section's model and fields to ``Config``.
Every other key of the file is audited here:

- refused (``sandlot serve`` does not start) when ignoring it would leave sandboxes less
  protected than the file asks: the security sections ``[secure_runtime]``, ``[egress]``,
  ``[storage]`` and ``[ingress]``, unless the value asks for nothing (``UPSTREAM`` lists the
  values that are inert, e.g. ``[ingress] mode = "direct"``);
- warned about otherwise (upstream keys sandlot has no use for, typos, unknown sections).

So an OpenSandbox server config file loads with warnings for what does not apply, and a
file asking for, say, gVisor never runs sandboxes under runc without saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

SECURITY_SECTIONS = frozenset({"secure_runtime", "egress", "storage", "ingress"})


@dataclass(frozen=True)
class Rule:
    """How an upstream key sandlot does not implement is treated."""

    security: bool  # ignoring a meaningful value weakens what the operator asked for
    inert: tuple[Any, ...] = ()  # values that ask for nothing: accepted without a word
    why: str = ""


_NO_SIDECAR = "sandlot runs no egress sidecar"
# The reference server's keys (server/opensandbox_server/config.py) that sandlot knows of but
# does not implement (yet). Keys of the security sections not listed are refused when set.
UPSTREAM: dict[str, dict[str, Rule]] = {
    "server": {
        k: Rule(False, why="uvicorn tuning of the reference server")
        for k in ("thread_pool_size", "loop", "http", "eip")
    },
    "runtime": {"execd_image": Rule(False, why="sandlot bind-mounts its own execd")},
    "store": {"type": Rule(False, inert=("sqlite",)),
              "path": Rule(False, why="sandlot keeps its database in data_dir "
                                      "(or [store] url)")},
    "renew_intent": {k: Rule(False, inert=(False,) if k == "enabled" else (),
                             why="renew-on-access is the sandbox's extensions key here")
                     for k in ("enabled", "min_interval_seconds", "redis")},
    "kubernetes": {
        k: Rule(False, why="sandlot's kubernetes runtime watches Pods itself (no informer "
                           "cache or client-side rate limits)")
        for k in ("informer_enabled", "informer_resync_seconds",
                  "informer_watch_timeout_seconds", "read_qps", "read_burst", "write_qps",
                  "write_burst", "sandbox_create_poll_interval_seconds")
    } | {
        "workload_provider": Rule(False, inert=(None, "", "pod"),
                                  why="sandlot runs one plain Pod per sandbox"),
        "batchsandbox_template_file": Rule(False, inert=(None, ""),
                                           why="no BatchSandbox workloads"),
        "snapshot_create_timeout_seconds": Rule(False,
                                                why="the kubernetes runtime has no snapshots"),
    },
    "agent_sandbox": {},  # a runtime sandlot does not have: warned
    "secure_runtime": {
        "type": Rule(True, inert=("",), why='only type = "gvisor" is implemented'),
        "docker_runtime": Rule(True, inert=(None, "")),
    },
    "egress": {  # [egress] mode is honoured (dns | dns+nft)
        "image": Rule(False, why=_NO_SIDECAR),
        "disable_ipv6": Rule(True, inert=(True,),
                             why="IPv6 is always off inside sandboxes; false cannot be honoured"),
    },
    "storage": {
        # A size is enforced when a create asks for one (``storage``, oci runtime); claims made
        # without it have no limit, so a default size would be a promise not kept.
        "volume_default_size": Rule(False, why="pvc volumes made without storage have no "
                                               "size limit"),
        "ossfs_mount_root": Rule(False, why="no OSSFS volumes"),
    },
    "ingress": {
        "mode": Rule(True, inert=("direct",), why="only direct ingress is implemented"),
        "gateway": Rule(True, inert=(None, {})),
        "secure_access": Rule(True, inert=(None, {})),
    },
}


@dataclass
class Audit:
    warnings: list[str]
    refusals: list[str]


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return dict(model.model_fields)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():  # Optional[Model]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def audit(raw: dict[str, Any], model: type[BaseModel]) -> Audit:
    """Compare the file's keys with ``model`` (sandlot's ``Config``)."""
    result = Audit([], [])
    fields = _fields(model)
    for section, body in raw.items():
        field = fields.get(section)
        sub = _submodel(field.annotation) if field is not None else None
        if field is not None and (sub is None or not isinstance(body, dict)):
            continue  # a top-level key sandlot honours (data_dir), or a type error pydantic reports
        if not isinstance(body, dict):
            result.warnings.append(f"unknown top-level key {section!r} is ignored")
            continue
        honoured = _fields(sub) if sub is not None else {}
        for key, value in body.items():
            if key in honoured and value not in _unsupported(sub, key):
                continue
            _judge(section, key, value, sub is not None, result)
    return result


def _unsupported(model: type[BaseModel] | None, key: str) -> tuple[Any, ...]:
    """Values of an honoured field its section does not implement (``UNSUPPORTED_VALUES``)."""
    table = getattr(model, "UNSUPPORTED_VALUES", None) or {}
    return tuple(table.get(key, ()))


def _judge(section: str, key: str, value: Any, section_known: bool, result: Audit) -> None:
    name = f"[{section}] {key}"
    rules = UPSTREAM.get(section)
    rule = rules.get(key) if rules is not None else None
    security = section in SECURITY_SECTIONS if rule is None else rule.security
    if rule is not None and value in rule.inert:
        return
    if rule is None and rules is None and not section_known:
        origin = "unknown section"
    elif rule is None:
        origin = "unknown key"
    else:
        origin = "not implemented by sandlot"
    why = f" ({rule.why})" if rule is not None and rule.why else ""
    if security:
        result.refusals.append(
            f"{name} = {value!r}: {origin}{why}; ignoring it would run sandboxes with less "
            "protection than the file asks for. Remove it, or use a sandlot that implements it"
        )
    else:
        result.warnings.append(f"{name} = {value!r} is ignored: {origin}{why}")
