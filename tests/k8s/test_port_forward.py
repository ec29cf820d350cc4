"""The compat core on the kubernetes backend with ``connect_mode = "port-forward"``: every
connection to execd and sandbox ports goes through the API server's port-forward (no Pod IP
is dialled), for the released SDK's lifecycle, commands and files (direct endpoints and the
server proxy) and the quickstart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.conftest import SandlotServer
from tests.compat.test_quickstart import test_quickstart_prints_hello_world as quickstart
from tests.compat.test_sdk_lifecycle import test_sdk_commands_and_files as commands_and_files
from tests.k8s_cluster import Cluster

pytestmark = [pytest.mark.backends("kubernetes"), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def forwarded_server(request: pytest.FixtureRequest,
                     compat_image_root: Path) -> Iterator[SandlotServer]:
    cluster: Cluster = request.getfixturevalue("k8s_images")
    server = SandlotServer(compat_image_root, backend="kubernetes", k8s=cluster)
    server.config.write_text(server.config.read_text() + 'connect_mode = "port-forward"\n')
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def test_the_server_says_it_forwards(forwarded_server: SandlotServer) -> None:
    assert "connect via port-forward" in forwarded_server.log_tail(200000)


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
async def test_commands_and_files(forwarded_server: SandlotServer, proxy: bool) -> None:
    await commands_and_files(forwarded_server, proxy)


def test_quickstart(forwarded_server: SandlotServer) -> None:
    quickstart(forwarded_server, False)
