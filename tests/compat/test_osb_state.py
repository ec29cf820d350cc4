"""``osb snapshot *`` and ``osb template *`` (opensandbox-cli 1.1.1) against ``sandlot serve``."""

from __future__ import annotations

import time

import pytest

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer
from tests.compat.test_osb_cli import ok_json, osb

pytestmark = pytest.mark.backends("oci", "docker", "runsc")


def _poll(server: SandlotServer, args: tuple[str, ...], key: str, done: set[str]) -> dict:
    for _ in range(1200):
        body = ok_json(server, *args)
        assert isinstance(body, dict)
        state = body["status"][key]
        if state in done:
            return body
        time.sleep(0.1)
    raise AssertionError(f"{args} never reached {done}")


def test_osb_snapshot_and_template_commands(sandlot_server: SandlotServer) -> None:
    server = sandlot_server
    sb = ok_json(server, "sandbox", "create", "-i", COMPAT_IMAGE, "-t", "10m")
    assert isinstance(sb, dict)
    snap = ok_json(server, "snapshot", "create", sb["id"], "--name", "osb-snap")
    assert isinstance(snap, dict) and snap["name"] == "osb-snap"
    ready = _poll(server, ("snapshot", "get", snap["id"]), "state", {"Ready", "Failed"})
    assert ready["status"]["state"] == "Ready"
    listed = ok_json(server, "snapshot", "list", "--sandbox-id", sb["id"], "--state", "Ready")
    assert isinstance(listed, dict | list)
    assert snap["id"] in str(listed)

    tpl = ok_json(server, "template", "create", "--image", f"snapshot:{snap['id']}",
                  "--publish", "local", "--entrypoint", "sh", "--entrypoint", "-c",
                  "--entrypoint", "echo from-osb > /workspace/osb.txt")
    assert isinstance(tpl, dict)
    tpl_id = tpl.get("template_id") or tpl["templateId"]
    built = _poll(server, ("template", "get", tpl_id), "phase",
                  {"Succeeded", "Failed"})
    assert built["status"]["phase"] == "Succeeded", built
    assert tpl_id in str(ok_json(server, "template", "list"))
    first = osb(server, "snapshot", "delete", snap["id"])
    if server.backend == "docker":
        # The engine keeps the layers the template's image stands on; only the snapshot's
        # tag goes (docs/snapshots.md), and the template stays usable.
        assert first.returncode == 0, first.stderr
        got = ok_json(server, "template", "get", tpl_id)
        assert isinstance(got, dict) and got["status"]["phase"] == "Succeeded"
        assert osb(server, "template", "delete", tpl_id).returncode == 0
    else:
        # The template stands on the snapshot's layer: deleting the snapshot first is refused.
        assert first.returncode != 0 and "delete those first" in first.stdout + first.stderr
        assert osb(server, "template", "delete", tpl_id).returncode == 0
        assert osb(server, "snapshot", "delete", snap["id"]).returncode == 0
    assert osb(server, "snapshot", "get", snap["id"]).returncode != 0
    assert osb(server, "sandbox", "kill", sb["id"]).returncode == 0
