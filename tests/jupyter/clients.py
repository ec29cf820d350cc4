"""Real Jupyter clients against a Jupyter API endpoint (a sandbox's port 44771 or a host execd).

Jupyter Server runs as a separate process in gateway mode (``--GatewayClient.url`` pointing at the
endpoint, the token and any extra headers passed the way its gateway client sends them), and
``nbclient`` executes a notebook on it through jupyter_server's ``GatewayKernelManager``, the
kernel manager Jupyter Server itself uses for gateway kernels. So the path is
nbclient -> Jupyter Server (gateway mode) -> the endpoint, over REST and WebSocket both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import nbformat
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelManager
from nbclient import NotebookClient

from tests.conftest import free_port


@contextlib.contextmanager
def gateway_server(
    url: str, token: str, headers: dict[str, str] | None = None
) -> Iterator[str]:
    """A Jupyter Server whose kernels live at ``url``; yields its own base URL (no auth)."""
    port = free_port()
    root = tempfile.mkdtemp(prefix="sandlot-jupyter-gw-")
    argv = [
        sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
        f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
        "--IdentityProvider.token=", "--ServerApp.disable_check_xsrf=True",
        f"--GatewayClient.url={url}", f"--GatewayClient.auth_token={token}",
        "--GatewayClient.request_timeout=180",
    ]
    if headers:
        argv.append(f"--GatewayClient.headers={json.dumps(headers)}")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": root, "JUPYTER_RUNTIME_DIR": root}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(base + "/api", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jupyter server did not start")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def notebook(*cells: str, language: str = "python") -> Any:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": language, "display_name": language,
                                 "language": language}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    return nb


async def execute(
    server_url: str, nb: Any, kernel_name: str, interrupt_cell: int | None = None,
    interrupt_after: float = 2.0,
) -> Any:
    """Run ``nb`` with nbclient on a kernel started through ``server_url``'s gateway kernels.

    ``interrupt_cell``: the index of a cell to interrupt ``interrupt_after`` seconds after it
    starts, through the kernel manager (as a notebook UI's stop button does).
    """
    GatewayClient.clear_instance()
    GatewayClient.instance(url=server_url, request_timeout=180.0)
    # owns_kernel=False: jupyter_client's kernel client asks its manager's process-based
    # liveness check (which a gateway manager, having no process, fails with an assertion)
    # whenever a reply takes over a second; the gateway kernel's life is the server's business.
    km = GatewayKernelManager(kernel_name=kernel_name, owns_kernel=False)
    pending: list[asyncio.Task[None]] = []

    async def interrupt_later() -> None:
        await asyncio.sleep(interrupt_after)
        await km.interrupt_kernel()

    def on_cell_execute(cell: Any, cell_index: int) -> None:
        if cell_index == interrupt_cell:
            pending.append(asyncio.get_running_loop().create_task(interrupt_later()))

    client = NotebookClient(nb, km=km, kernel_name=kernel_name, timeout=120,
                            startup_timeout=180, allow_errors=True,
                            on_cell_execute=on_cell_execute)
    try:
        # GatewayKernelManager starts the kernel named in start_kernel's arguments (else
        # "python3"), not its own kernel_name.
        await client.async_execute(kernel_name=kernel_name)
        for task in pending:
            await task
    finally:
        with contextlib.suppress(Exception):
            if km.has_kernel:
                await km.shutdown_kernel(now=True)
        GatewayClient.clear_instance()
    return nb
