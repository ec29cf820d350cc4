"""A direct endpoint's connection handed to execd whole (runc sandboxes; execd/handoff.py):
the real ``sandlot serve`` hands it over instead of relaying it, and no command execd starts
inherits it: the client's connection must never be reachable from the workload."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.compat.conftest import (  # noqa: F401
    SandlotServer,
    compat_backend,
    compat_image_root,
    fresh_server,
)
from tests.security.running import running_sandbox

# Every descriptor of the shell execd starts, as "fd -> target" lines.
LIST_FDS = 'for f in /proc/$$/fd/*; do echo "${f##*/} -> $(readlink "$f")"; done'


def _handoffs(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sandlot_endpoint_handoffs_total":
                return float(sample.value)
    raise AssertionError("no sandlot_endpoint_handoffs_total in /metrics")


async def test_execd_connections_are_handed_over_and_not_inherited_by_commands(
    fresh_server: SandlotServer,  # noqa: F811
    compat_backend: str,  # noqa: F811
) -> None:
    srv = fresh_server
    async with httpx.AsyncClient(base_url=srv.url, timeout=120,
                                 headers={"OPEN-SANDBOX-API-KEY": srv.api_key}) as api:
        before = _handoffs((await api.get("/metrics")).text)
        _, endpoint, headers = await running_sandbox(api, {
            "image": {"uri": "base"}, "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 600, "resourceLimits": {"cpu": "500m", "memory": "256Mi"}})
        async with httpx.AsyncClient(base_url=f"http://{endpoint}", headers=headers,
                                     timeout=60) as execd:
            assert (await execd.get("/ping")).status_code == 200
            r = await execd.post("/command", json={"command": LIST_FDS})  # same connection
            assert r.status_code == 200, r.text
        after = _handoffs((await api.get("/metrics")).text)
    lines = [line for line in r.text.splitlines() if '"stdout"' in line]
    assert any("0 -> " in line for line in lines), r.text  # the listing ran
    leaked = [line for line in lines if "socket:" in line]
    assert not leaked, f"a command inherited execd's sockets: {leaked}"
    if compat_backend == "oci":
        assert after == before + 1, "execd's endpoint connection was relayed, not handed over"
    else:  # gVisor and Docker relay execd's endpoint
        assert after == before
