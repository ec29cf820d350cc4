"""The released OpenSandbox MCP server (``opensandbox-mcp``) against ``sandlot serve``.

``opensandbox-mcp`` speaks MCP over stdio by default and configures its SDK connection from
``OPEN_SANDBOX_DOMAIN``/``OPEN_SANDBOX_API_KEY`` (or ``--domain``/``--api-key``); we start
it the way an MCP host does, with the env vars, and drive it with the ``mcp`` client
library. Every exchange is bounded by ``anyio.fail_after``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer

# make test: oci; make test-heavy: docker and runsc too
pytestmark = pytest.mark.heavy_backends("docker", "runsc")

TOOLS = {
    "sandbox_create",
    "sandbox_connect",
    "sandbox_kill",
    "sandbox_get_info",
    "sandbox_list",
    "sandbox_renew",
    "sandbox_get_metrics",
    "sandbox_healthcheck",
    "sandbox_get_endpoint",
    "command_run",
    "command_interrupt",
    "file_read",
    "file_write",
    "file_delete",
    "file_search",
    "file_create_directories",
    "file_delete_directories",
    "file_move",
    "file_replace_contents",
}


@asynccontextmanager
async def mcp_session(server: SandlotServer, name: str) -> AsyncIterator[ClientSession]:
    exe = shutil.which("opensandbox-mcp", path=str(Path(sys.executable).parent))
    assert exe, "opensandbox-mcp is not installed in the venv"
    params = StdioServerParameters(
        command=exe,
        args=["--request-timeout-seconds", "120"],
        env={
            "OPEN_SANDBOX_DOMAIN": server.domain,
            "OPEN_SANDBOX_API_KEY": server.api_key,
            "HOME": str(server.data_dir / "home"),
        },
    )
    with open(server.data_dir / f"mcp-{name}.log", "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, read_timeout_seconds=180) as session,
        ):
            with anyio.fail_after(60):
                await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> Any:
    """Call a tool, assert it succeeded, and return its structured result."""
    with anyio.fail_after(180):
        res = await session.call_tool(tool, args)
    text = " ".join(getattr(c, "text", "") for c in res.content)
    assert not res.is_error, f"{tool}({args}) failed: {text}"
    assert res.structured_content is not None, f"{tool} returned no structured content: {text}"
    return res.structured_content


async def call_error(session: ClientSession, tool: str, args: dict[str, Any]) -> str:
    """Call a tool that must fail; return its error text."""
    with anyio.fail_after(180):
        res = await session.call_tool(tool, args)
    text = " ".join(getattr(c, "text", "") for c in res.content)
    assert res.is_error, f"{tool}({args}) unexpectedly succeeded: {text}"
    return text


def stdout_of(execution: dict[str, Any]) -> str:
    return "".join(m["text"] for m in execution["logs"]["stdout"])


def stderr_of(execution: dict[str, Any]) -> str:
    return "".join(m["text"] for m in execution["logs"]["stderr"])


async def test_mcp_sandbox_workflow(sandlot_server: SandlotServer) -> None:
    sid = ""
    try:
        with anyio.fail_after(500):
            async with mcp_session(sandlot_server, "workflow") as s:
                listed = await s.list_tools()
                assert {t.name for t in listed.tools} == TOOLS

                created = await call(
                    s,
                    "sandbox_create",
                    {
                        "image": COMPAT_IMAGE,
                        "timeout_seconds": 900,
                        "ready_timeout_seconds": 180,
                        "metadata": {"who": "mcp"},
                        "env": {"GREETING": "from-mcp"},
                    },
                )
                sid = created["sandbox_id"]
                assert created["info"]["id"] == sid
                assert created["info"]["status"]["state"] == "Running"
                assert created["info"]["metadata"] == {"who": "mcp"}

                info = await call(s, "sandbox_get_info", {"sandbox_id": sid})
                assert info["id"] == sid and info["image"]["image"] == COMPAT_IMAGE
                health = await call(s, "sandbox_healthcheck", {"sandbox_id": sid})
                assert health == {"sandbox_id": sid, "healthy": True}
                page = await call(s, "sandbox_list", {"filter": {"metadata": {"who": "mcp"}}})
                assert [i["id"] for i in page["sandbox_infos"]] == [sid]

                # command_run: stdout, env from create, exit code of a failing command.
                ran = await call(
                    s, "command_run", {"sandbox_id": sid, "command": "echo hi $GREETING"}
                )
                assert stdout_of(ran) == "hi from-mcp"  # one message per line, no newline
                assert ran["exit_code"] == 0 and ran["error"] is None
                assert ran["complete"] is not None
                ran = await call(
                    s,
                    "command_run",
                    {
                        "sandbox_id": sid,
                        "command": "pwd; echo oops >&2; exit 3",
                        "working_directory": "/tmp",
                    },
                )
                assert stdout_of(ran) == "/tmp" and stderr_of(ran) == "oops"
                assert ran["exit_code"] == 3
                assert ran["error"]["name"] == "CommandExecError" and ran["error"]["value"] == "3"

                # A background command, then command_interrupt.
                bg = await call(
                    s,
                    "command_run",
                    {"sandbox_id": sid, "command": "sleep 777", "background": True},
                )
                assert bg["id"]
                ps = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo"
                ran = await call(s, "command_run", {"sandbox_id": sid, "command": ps})
                assert "sleep 777" in stdout_of(ran)
                interrupted = await call(
                    s, "command_interrupt", {"sandbox_id": sid, "execution_id": bg["id"]}
                )
                assert interrupted == {"status": "interrupted"}
                for _ in range(100):  # the interrupt is asynchronous: wait (bounded) for it
                    ran = await call(s, "command_run", {"sandbox_id": sid, "command": ps})
                    if "sleep 777" not in stdout_of(ran):
                        break
                    await anyio.sleep(0.3)
                assert "sleep 777" not in stdout_of(ran)

                # Files: write/read (and a byte range), directories, search, replace, move, delete.
                body = "line one\nline two\n"
                assert await call(
                    s,
                    "file_write",
                    {
                        "sandbox_id": sid,
                        "path": "/work/mcp/notes.txt",
                        "content": body,
                        "mode": 644,
                    },
                ) == {"status": "written"}
                read = await call(
                    s, "file_read", {"sandbox_id": sid, "path": "/work/mcp/notes.txt"}
                )
                assert read == {"path": "/work/mcp/notes.txt", "content": body}
                part = await call(
                    s,
                    "file_read",
                    {"sandbox_id": sid, "path": "/work/mcp/notes.txt", "range_header": "bytes=5-7"},
                )
                assert part["content"] == "one"
                ran = await call(
                    s,
                    "command_run",
                    {"sandbox_id": sid, "command": "find /work/mcp/notes.txt -printf %m"},
                )
                assert stdout_of(ran) == "644"

                assert await call(
                    s,
                    "file_create_directories",
                    {"sandbox_id": sid, "entries": [{"path": "/work/mcp/sub", "mode": 700}]},
                ) == {"status": "created"}
                found = await call(
                    s, "file_search", {"sandbox_id": sid, "path": "/work", "pattern": "*.txt"}
                )
                assert [e["path"] for e in found["result"]] == ["/work/mcp/notes.txt"]

                replaced = await call(
                    s,
                    "file_replace_contents",
                    {
                        "sandbox_id": sid,
                        "entries": [
                            {
                                "path": "/work/mcp/notes.txt",
                                "old_content": "two",
                                "new_content": "2",
                            }
                        ],
                    },
                )
                assert len(replaced["result"]) == 1
                assert replaced["result"][0]["path"] == "/work/mcp/notes.txt"
                assert await call(
                    s,
                    "file_move",
                    {
                        "sandbox_id": sid,
                        "entries": [
                            {"source": "/work/mcp/notes.txt", "destination": "/work/mcp/sub/n.txt"}
                        ],
                    },
                ) == {"status": "moved"}
                read = await call(
                    s, "file_read", {"sandbox_id": sid, "path": "/work/mcp/sub/n.txt"}
                )
                assert read["content"] == "line one\nline 2\n"
                # (The MCP server hides non-ToolError details: only the failure is visible.)
                await call_error(s, "file_read", {"sandbox_id": sid, "path": "/work/mcp/notes.txt"})

                assert await call(
                    s, "file_delete", {"sandbox_id": sid, "paths": ["/work/mcp/sub/n.txt"]}
                ) == {"status": "deleted"}
                assert await call(
                    s, "file_delete_directories", {"sandbox_id": sid, "paths": ["/work/mcp"]}
                ) == {"status": "deleted"}
                found = await call(
                    s, "file_search", {"sandbox_id": sid, "path": "/work", "pattern": "*"}
                )
                assert found["result"] == []

                # Lifecycle odds and ends.
                renewed = await call(
                    s, "sandbox_renew", {"sandbox_id": sid, "timeout_seconds": 1200}
                )
                assert renewed["expires_at"]
                metrics = await call(s, "sandbox_get_metrics", {"sandbox_id": sid})
                assert metrics["cpu_count"] > 0 and metrics["memory_total_in_mib"] > 0
                endpoint = await call(s, "sandbox_get_endpoint", {"sandbox_id": sid, "port": 8080})
                assert endpoint["endpoint"]

                assert await call(s, "sandbox_kill", {"sandbox_id": sid}) == {"status": "killed"}
                # Not sandbox_get_info here: on any API error opensandbox 1.1.1 raises the
                # exception "from" itself (a __cause__ cycle) and the MCP server's rich
                # logging then loops forever rendering the traceback.
                with sandlot_server.client() as c:
                    assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
    finally:
        if sid:
            with sandlot_server.client() as c:
                c.delete(f"/v1/sandboxes/{sid}")
    assert sid and sid not in sandlot_server.runtime_ids()


async def test_mcp_connects_to_existing_sandbox(sandlot_server: SandlotServer) -> None:
    """A second MCP server process reaches a sandbox it did not create (connect/kill paths)."""
    sid = ""
    try:
        with anyio.fail_after(500):
            async with mcp_session(sandlot_server, "creator") as s:
                created = await call(
                    s,
                    "sandbox_create",
                    {"image": COMPAT_IMAGE, "timeout_seconds": 600, "ready_timeout_seconds": 180},
                )
                sid = created["sandbox_id"]
                await call(
                    s,
                    "file_write",
                    {"sandbox_id": sid, "path": "/tmp/handoff.txt", "content": "baton"},
                )

            async with mcp_session(sandlot_server, "other") as s:
                # Not in this server's registry yet: tools refuse unless asked to connect.
                err = await call_error(
                    s, "file_read", {"sandbox_id": sid, "path": "/tmp/handoff.txt"}
                )
                assert "sandbox_connect" in err
                read = await call(
                    s,
                    "file_read",
                    {"sandbox_id": sid, "path": "/tmp/handoff.txt", "connect_if_missing": True},
                )
                assert read["content"] == "baton"
                connected = await call(s, "sandbox_connect", {"sandbox_id": sid})
                assert connected["sandbox_id"] == sid
                assert connected["info"]["status"]["state"] == "Running"

            async with mcp_session(sandlot_server, "killer") as s:
                # sandbox_kill of an unregistered id goes through the SandboxManager.
                assert await call(s, "sandbox_kill", {"sandbox_id": sid}) == {"status": "killed"}
        with sandlot_server.client() as c:
            assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
    finally:
        if sid:
            with sandlot_server.client() as c:
                c.delete(f"/v1/sandboxes/{sid}")
