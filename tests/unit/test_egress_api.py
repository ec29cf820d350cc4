"""The egress API's answers beside the reference's (``components/egress/policy_server.go``):
status codes, the text of its 400s, the 405's ``Allow`` header, the empty-body reset, the
rule limit's 413 (docs/compatibility.md EG1-EG4)."""

from __future__ import annotations

import json

from sandlot.net.egress_api import EGRESS_AUTH_HEADER, PolicyAccess, handle
from sandlot.net.policy import MAX_RULES, EgressPolicy, parse_policy

TOKEN = "t0ken"


def access() -> tuple[PolicyAccess, list[EgressPolicy]]:
    state = [parse_policy({"defaultAction": "deny",
                           "egress": [{"action": "allow", "target": "a.test"}]})]

    async def change(new: EgressPolicy) -> None:
        state.append(new)

    return PolicyAccess(TOKEN, lambda: state[-1], change, "dns+nft"), state


async def call(acc: PolicyAccess, method: str, body: object = None, path: str = "/policy",
               auth: bool = True):  # type: ignore[no-untyped-def]
    raw = b"" if body is None else json.dumps(body).encode()
    headers = {EGRESS_AUTH_HEADER.lower(): TOKEN} if auth else {}
    return await handle(acc, method, path, headers, raw)


async def test_health_needs_no_header_and_policy_does() -> None:
    acc, _ = access()
    r = await call(acc, "GET", path="/healthz", auth=False)
    assert (r.status, r.body) == (200, b"ok\n")
    r = await call(acc, "GET", auth=False)
    assert r.status == 401 and r.body == b"unauthorized\n"
    r = await call(acc, "GET")
    got = json.loads(r.body)
    assert r.status == 200 and got["mode"] == "enforcing" and got["enforcementMode"] == "dns+nft"
    assert got["policy"]["egress"] == [{"action": "allow", "target": "a.test"}]


async def test_other_methods_get_405_with_allow() -> None:
    acc, _ = access()
    r = await call(acc, "HEAD")
    assert r.status == 405 and ("Allow", "GET, POST, PUT, PATCH, DELETE") in r.headers


async def test_empty_post_resets_to_deny_all() -> None:
    acc, state = access()
    r = await call(acc, "POST")
    assert r.status == 200 and json.loads(r.body) == {
        "status": "ok", "mode": "deny_all", "reason": "policy reset to default deny-all"}
    assert state[-1] == EgressPolicy("deny")


async def test_bad_bodies_are_400_in_the_reference_wording() -> None:
    acc, state = access()
    r = await call(acc, "PATCH")
    assert (r.status, r.body) == (400, b"empty body\n")
    r = await call(acc, "PATCH", [])
    assert (r.status, r.body) == (400, b"invalid patch rules: empty array\n")
    r = await call(acc, "PATCH", [{"action": "allow", "target": "no spaces!"}])
    assert r.status == 400 and r.body.startswith(b"invalid patch rules: rules[0]")
    r = await call(acc, "DELETE", "a.test")
    assert r.status == 400 and r.body.startswith(b"invalid delete targets: ")
    r = await call(acc, "POST", {"defaultAction": "block"})
    assert r.status == 400 and r.body.startswith(b"invalid policy: ")
    assert len(state) == 1  # nothing changed


async def test_rule_limit_is_413() -> None:
    acc, state = access()
    rules = [{"action": "allow", "target": f"h{i}.test"} for i in range(MAX_RULES)]
    r = await call(acc, "PATCH", rules)  # with the one already there: one too many
    assert r.status == 413
    assert r.body == f"egress rule total count {MAX_RULES + 1} exceeds limit {MAX_RULES}\n".encode()
    r = await call(acc, "DELETE", ["nothing.test"])
    assert r.status == 200 and json.loads(r.body)["reason"] == "no matching targets found"
    assert len(state) == 1
