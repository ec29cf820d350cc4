"""The issue's quickstart program, run unmodified (but for the port) as its own process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.compat.conftest import SandlotServer

pytestmark = [pytest.mark.backends("oci", "docker"), pytest.mark.heavy_backends("runsc")]

QUICKSTART = """
import asyncio
from datetime import timedelta

from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.models.filesystem import WriteEntry


async def main() -> None:
    sandbox = await Sandbox.create(
        "python:3.12",
        connection_config=ConnectionConfig(
            domain="{domain}", api_key="{key}", use_server_proxy={proxy}
        ),
    )
    execution = await sandbox.commands.run("python -c 'print(1 + 1)'")
    print("result:", execution.logs.stdout[0].text)
    await sandbox.files.write_files([WriteEntry(path="/tmp/hello.txt", data="Hello World")])
    content = await sandbox.files.read_file("/tmp/hello.txt")
    print(content)
    await sandbox.destroy()


asyncio.run(main())
"""


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
def test_quickstart_prints_hello_world(sandlot_server: SandlotServer, proxy: bool) -> None:
    code = QUICKSTART.format(domain=sandlot_server.domain, key=sandlot_server.api_key, proxy=proxy)
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=sandlot_server.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert "result: 2" in lines
    assert "Hello World" in lines
    with sandlot_server.client() as c:
        assert c.get("/v1/sandboxes").json()["items"] == []  # destroy() removed it
