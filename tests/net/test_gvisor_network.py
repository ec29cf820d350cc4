"""gVisor (runsc) sandboxes with isolated networking: netstack takes the namespace's ``eth0``
and default route, and the rules on the host side of the veth still decide what leaves.

One server with ``[secure_runtime] type = "gvisor"`` in the test namespaces (``conftest.py``):
outbound to the test host by name and address under the default policy, the metadata
stand-in and private addresses refused, and a deny policy enforced by name and address.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.conftest import compat_image_root  # noqa: F401
from tests.net.conftest import NetServer, serve_in_test_network
from tests.net.test_network import DENY_POLICY, assert_deny_policy_holds, create, fetch, sh
from tests.net.testhosts import HOST, METADATA, PRIVATE

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def gvisor_net_server(compat_image_root: Path) -> Iterator[NetServer]:  # noqa: F811
    if shutil.which("runsc") is None:
        pytest.skip("runsc (gVisor) is not installed")
    with serve_in_test_network(compat_image_root, backend="runsc", warm_pool=False) as server:
        yield server


async def test_gvisor_sandbox_outbound_per_policy(gvisor_net_server: NetServer) -> None:
    server = gvisor_net_server
    open_sb = await create(server)
    try:
        code, out = await sh(open_sb, "uname -r; dmesg | head -1")
        assert code == 0 and out.splitlines()[0] == "4.4.0" and "gVisor" in out, out
        code, out = await fetch(open_sb, "http://allowed.test/hello.txt")
        assert code == 0 and "hello from the test host" in out, out
        code, out = await fetch(open_sb, f"http://{HOST}/hello.txt")
        assert code == 0 and "hello from the test host" in out, out
        code, out = await fetch(open_sb, f"http://{METADATA}/latest/meta-data")
        assert code != 0 and "metadata stand-in" not in out, out
        code, out = await fetch(open_sb, f"http://{PRIVATE}/hello.txt")
        assert code != 0 and "hello" not in out, out
    finally:
        await open_sb.kill()
        await open_sb.close()

    fenced = await create(server, DENY_POLICY)
    try:
        await assert_deny_policy_holds(fenced)
    finally:
        await fenced.kill()
        await fenced.close()
