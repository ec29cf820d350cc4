"""``[network] mode = "host"``: refused without the explicit opt-in; with it, a warning at
start and in ``sandlot doctor``, sandboxes in the server's own namespace (here a test
namespace whose only uplink leads to the test hosts), each execd on its own loopback port,
and a restricting ``networkPolicy`` refused rather than ignored."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.config import Config
from sandlot.net import hostmode
from sandlot.server.main import StartupRefused, check_config
from tests.compat.conftest import COMPAT_IMAGE, compat_image_root  # noqa: F401
from tests.net.conftest import NetServer, serve_in_test_network
from tests.net.test_network import DENY_POLICY, create, fetch, sh
from tests.net.testhosts import HOST

pytestmark = pytest.mark.timeout(600)
HOST_MODE = '[network]\nmode = "host"\nallow_host_mode = true\n'


def test_host_mode_needs_the_opt_in_and_runc() -> None:
    base = {"server": {"api_key": "k"}, "network": {"mode": "host"}}
    with pytest.raises(StartupRefused, match="allow_host_mode = true"):
        check_config(Config.model_validate(base))
    opted = {**base, "network": {"mode": "host", "allow_host_mode": True}}
    check_config(Config.model_validate(opted))  # accepted (with the warning at start)
    gvisor = Config.model_validate({**opted, "secure_runtime": {"type": "gvisor"}})
    assert "gVisor" in (hostmode.refusal(gvisor) or "")


@pytest.fixture(scope="module")
def host_server(compat_image_root: Path) -> Iterator[NetServer]:  # noqa: F811
    with serve_in_test_network(compat_image_root, network_toml=HOST_MODE,
                               warm_pool=False) as server:
        yield server


async def test_host_mode_shares_the_namespace_loudly(host_server: NetServer) -> None:
    assert hostmode.WARNING in host_server.log.read_text()
    service = subprocess.Popen(  # on the loopback of the server's (test) namespace
        [sys.executable, "-m", "http.server", "18997", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
    a = await create(host_server)
    b = await create(host_server)
    try:
        code, out = await fetch(a, f"http://{HOST}/hello.txt")
        assert code == 0 and "hello from the test host" in out, out
        code, out = await sh(a, "curl -sS --max-time 5 --retry 5 --retry-connrefused "
                                "http://127.0.0.1:18997/")
        assert code == 0 and "Directory listing" in out, out  # unfenced: the host's loopback
        code, out = await sh(b, "cat /proc/net/dev")
        assert code == 0 and "up0" in out, out  # the server namespace's uplink, seen inside
        ports = {int((host_server.data_dir / "sandboxes" / s.id / hostmode.PORT_FILE)
                     .read_text()) for s in (a, b)}
        assert len(ports) == 2  # one execd port each

        with host_server.client() as c:
            r = c.post("/v1/sandboxes", json={
                "image": {"uri": COMPAT_IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"],
                "timeout": 600, "resourceLimits": {},
                "networkPolicy": DENY_POLICY.model_dump(by_alias=True, exclude_none=True)})
            assert r.status_code == 400 and "networkPolicy" in r.json()["message"], r.text
            r = c.patch(f"/v1/sandboxes/{a.id}/networkpolicy",
                        json=[{"action": "deny", "target": "x.test"}])
            assert r.status_code == 501 and "mode = \"host\"" in r.json()["message"], r.text

        doctor = subprocess.run(
            [sys.executable, "-m", "sandlot", "doctor", "--config", str(host_server.config)],
            capture_output=True, text=True, timeout=300, env=host_server.env())
        assert "network mode host" in doctor.stdout and "WARNING" in doctor.stdout, (
            doctor.stdout + doctor.stderr)
    finally:
        service.terminate()
        service.wait(10)
        for s in (a, b):
            await s.kill()
            await s.close()
    assert not (host_server.data_dir / "sandboxes" / a.id).exists()
