"""``osb sandbox create/list/get/renew/pause/resume/kill`` against ``sandlot serve``.

osb is configured the way users do it: ``OPEN_SANDBOX_DOMAIN``/``OPEN_SANDBOX_API_KEY``
in the environment, with ``--config`` pointing at a file that does not exist (so no
~/.opensandbox/config.toml of the machine leaks in).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer

# make test: oci; make test-heavy: docker and runsc too
pytestmark = pytest.mark.heavy_backends("docker", "runsc")


def osb(server: SandlotServer, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("osb", path=str(Path(sys.executable).parent)) or "osb"
    return subprocess.run(
        [exe, "--config", str(server.data_dir / "osb-none.toml"), *args],
        env=server.env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def ok_json(server: SandlotServer, *args: str) -> object:
    p = osb(server, *args, "-o", "json")
    assert p.returncode == 0, f"osb {args} failed:\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout)


def test_osb_sandbox_commands(sandlot_server: SandlotServer) -> None:
    created = ok_json(
        sandlot_server, "sandbox", "create", "-i", COMPAT_IMAGE, "-m", "who=osb", "-t", "10m"
    )
    assert isinstance(created, dict)
    sid = created["id"]
    try:
        listed = ok_json(sandlot_server, "sandbox", "list", "-m", "who=osb")
        assert isinstance(listed, dict)
        assert [i["id"] for i in listed["items"]] == [sid]

        got = ok_json(sandlot_server, "sandbox", "get", sid)
        assert isinstance(got, dict)
        assert got["status"]["state"] == "Running"  # create waited for readiness
        assert got["metadata"] == {"who": "osb"}

        renewed = ok_json(sandlot_server, "sandbox", "renew", sid, "-t", "30m")
        assert isinstance(renewed, dict)
        expires = datetime.fromisoformat(str(renewed["expires_at"]))
        assert expires > datetime.now(UTC) + timedelta(minutes=29)

        ok_json(sandlot_server, "sandbox", "pause", sid)
        got = ok_json(sandlot_server, "sandbox", "get", sid)
        assert isinstance(got, dict) and got["status"]["state"] == "Paused"

        ok_json(sandlot_server, "sandbox", "resume", sid)
        got = ok_json(sandlot_server, "sandbox", "get", sid)
        assert isinstance(got, dict) and got["status"]["state"] == "Running"

        killed = ok_json(sandlot_server, "sandbox", "kill", sid)
        assert isinstance(killed, list) and killed[0]["status"] == "terminated"
        gone = osb(sandlot_server, "sandbox", "get", sid, "-o", "json")
        assert gone.returncode != 0 and "not found" in (gone.stdout + gone.stderr)
    finally:
        with sandlot_server.client() as c:
            c.delete(f"/v1/sandboxes/{sid}")
    assert sid not in sandlot_server.runtime_ids()
