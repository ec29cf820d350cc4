"""A ``sandlot serve`` with isolated networking, inside namespaces the tests create.

The module's thread (pytest's main thread) is moved into the server's namespace for the
module: the server process, the SDK clients and ``osb`` all live there, and the only way out
of it leads to the test hosts (``testhosts.py``). Nothing is added to the machine's own
namespace.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, compat_image_root  # noqa: F401
from tests.net.testhosts import HOST, MIRROR, TestNet, test_network, thread_in_netns


class NetServer(SandlotServer):
    net: TestNet


@contextlib.contextmanager
def serve_in_test_network(image_root: Path, backend: str = "oci", network_toml: str | None = None,
                          warm_pool: bool = True) -> Iterator[NetServer]:
    """A started ``sandlot serve`` in fresh test namespaces; all removed after.

    ``network_toml`` replaces the default ``[network]``/``[egress]`` sections (mode isolated,
    the test hosts' DNS, the mirror in ``allow_cidrs``)."""
    if shutil.which("nsenter") is None:
        pytest.skip("nsenter (util-linux) is required")
    work = Path(tempfile.mkdtemp(prefix="sltn-", dir="/tmp"))
    try:
        with test_network(work) as net, thread_in_netns(net.server_ns):
            server = NetServer(image_root, backend=backend)
            server.net = net
            pool = (f'warm_pool_size = 1\nwarm_pool_images = ["{COMPAT_IMAGE}"]\n'
                    if warm_pool else "warm_pool_size = 0\n")
            with open(server.config, "a") as fh:
                fh.write(f"[runtime]\n{pool}" + (network_toml if network_toml is not None else (
                    '[network]\nmode = "isolated"\n'
                    f'dns_servers = ["{HOST}"]\n'
                    f'allow_cidrs = ["{MIRROR}/32"]\n'
                    '[egress]\nmode = "dns+nft"\n')))
            server.start()
            try:
                yield server
            finally:
                server.destroy()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def net_server(compat_image_root: Path) -> Iterator[NetServer]:  # noqa: F811
    with serve_in_test_network(compat_image_root) as server:
        yield server
