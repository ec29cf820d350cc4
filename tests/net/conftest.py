"""A ``sandlot serve`` with isolated networking, inside namespaces the tests create.

The module's thread (pytest's main thread) is moved into the server's namespace for the
module: the server process, the SDK clients and ``osb`` all live there, and the only way out
of it leads to the test hosts (``testhosts.py``). Nothing is added to the machine's own
namespace.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, compat_image_root  # noqa: F401
from tests.net.testhosts import HOST, MIRROR, TestNet, test_network, thread_in_netns


class NetServer(SandlotServer):
    net: TestNet


@pytest.fixture(scope="module")
def net_server(compat_image_root: Path) -> Iterator[NetServer]:  # noqa: F811
    if shutil.which("nsenter") is None:
        pytest.skip("nsenter (util-linux) is required")
    work = Path(tempfile.mkdtemp(prefix="sltn-", dir="/tmp"))
    try:
        with test_network(work) as net, thread_in_netns(net.server_ns):
            server = NetServer(compat_image_root)
            server.net = net
            with open(server.config, "a") as fh:
                fh.write(
                    "[runtime]\nwarm_pool_size = 1\n"
                    f'warm_pool_images = ["{COMPAT_IMAGE}"]\n'
                    '[network]\nmode = "isolated"\n'
                    f'dns_servers = ["{HOST}"]\n'
                    f'allow_cidrs = ["{MIRROR}/32"]\n'
                    '[egress]\nmode = "dns+nft"\n'
                )
            server.start()
            try:
                yield server
            finally:
                server.destroy()
    finally:
        shutil.rmtree(work, ignore_errors=True)
