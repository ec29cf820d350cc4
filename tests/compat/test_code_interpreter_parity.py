"""Issue 16's acceptance in real sandboxes of the ``code-interpreter`` image: Java and Go contexts
and ``*_VERSION`` through the released code-interpreter SDK, and the Jupyter API on port 44771
driven by real Jupyter clients (Jupyter Server in gateway mode + nbclient) through the direct
endpoint and the server proxy, the token refused when missing, an OOM kill shown to the client.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
import websockets
from code_interpreter import CodeInterpreter
from code_interpreter.models.code import SupportedLanguage
from opensandbox import Sandbox
from opensandbox.models.execd import ExecutionHandlers
from websockets.exceptions import InvalidStatus

from sandlot.images.model import Image
from tests.compat.conftest import SandlotServer
from tests.compat.test_code_interpreter import closing, code_interpreter_image, figure  # noqa: F401
from tests.jupyter.clients import execute, gateway_server, notebook

pytestmark = pytest.mark.timeout(2400)

IMAGE = "code-interpreter"
JUPYTER_PORT = 44771
PY_CELLS = (
    "print('hello'); 6 * 7",
    "from IPython.display import HTML, display\ndisplay(HTML('<b>rich</b>'))",
    "1 / 0",
    "import time\ntime.sleep(300)",
    "print('after the interrupt')",
)


@pytest.fixture(scope="module")
def server(code_interpreter_image: Image, sandlot_server: SandlotServer) -> SandlotServer:  # noqa: F811
    return sandlot_server


async def sandbox_for(server: SandlotServer, *, proxy: bool = False,
                      env: dict[str, str] | None = None, memory: str = "2Gi") -> Sandbox:
    return await Sandbox.create(
        IMAGE, connection_config=server.sdk_config(proxy=proxy, timeout=180),
        env=env or {}, resource={"cpu": "1", "memory": memory},
        timeout=timedelta(minutes=20), ready_timeout=timedelta(seconds=180))


def _stdout(ex: Any) -> str:
    return "".join(m.text for m in ex.logs.stdout)


async def _interrupted(ci: CodeInterpreter, ctx: Any, code: str) -> Any:
    started = asyncio.Event()
    ids: list[str] = []

    async def on_init(init: Any) -> None:
        ids.append(init.id)
        started.set()

    run = asyncio.create_task(ci.codes.run(code, context=ctx,
                                           handlers=ExecutionHandlers(on_init=on_init)))
    await asyncio.wait_for(started.wait(), 120)
    await asyncio.sleep(2)
    await ci.codes.interrupt(ids[0])
    return await asyncio.wait_for(run, 60)


async def test_sdk_java_and_go_and_versions(server: SandlotServer, record_property: Any) -> None:
    sandbox = await sandbox_for(server, env={
        "JAVA_VERSION": "17", "PYTHON_VERSION": "3.11", "GO_VERSION": "1.19",
        "NODE_VERSION": "99"})
    ci = None
    try:
        ci = await CodeInterpreter.create(sandbox, ready_timeout=timedelta(seconds=180))
        t0 = time.monotonic()
        java = await ci.codes.create_context(SupportedLanguage.JAVA)
        ex = await ci.codes.run('int x = 41;\nSystem.out.println("java " + (x + 1));',
                                context=java)
        figure(record_property, "java_first_cell_s", time.monotonic() - t0)
        assert ex.error is None, ex.error
        assert _stdout(ex) == "java 42\n"
        ex = await ci.codes.run('x + " " + System.getProperty("java.version")', context=java)
        assert ex.result[0].text.strip('"').startswith("41 17.")
        ex = await ci.codes.run("Object o = null; o.toString();", context=java)
        assert ex.error is not None and ex.error.name == "java.lang.NullPointerException"
        ex = await _interrupted(ci, java, "while (true) { Thread.sleep(5); }")
        assert ex.error is not None and ex.error.name == "InterruptedException"
        assert (await ci.codes.run("x", context=java)).result[0].text == "41"

        t0 = time.monotonic()
        go = await ci.codes.create_context(SupportedLanguage.GO)
        ex = await ci.codes.run(
            'import ("fmt"; "runtime")\nfunc twice(n int) int { return 2 * n }\n'
            "n := 21\nfmt.Println(twice(n), runtime.Version())", context=go)
        figure(record_property, "go_first_cell_s", time.monotonic() - t0)
        assert ex.error is None, ex.error
        assert _stdout(ex).startswith("42 go1.19")
        ex = await ci.codes.run("fmt.Println(twice(n) + 1)", context=go)
        assert ex.error is None and _stdout(ex) == "43\n"
        ex = await ci.codes.run("var s []int\nfmt.Println(s[3])", context=go)
        assert ex.error is not None and ex.error.name == "panic"
        assert "index out of range" in ex.error.value
        ex = await _interrupted(ci, go, 'import "time"\nfor { time.Sleep(time.Millisecond) }')
        assert ex.error is not None and ex.error.name == "Interrupted"

        py = await ci.codes.create_context(SupportedLanguage.PYTHON)
        ex = await ci.codes.run("import sys; '%d.%d' % sys.version_info[:2]", context=py)
        assert ex.result[0].text == "'3.11'"
        # NODE_VERSION=99 is not installed: as in the reference, a warning and the default.
        js = await ci.codes.create_context(SupportedLanguage.JAVASCRIPT)
        ex = await ci.codes.run("process.version", context=js)
        assert ex.error is None and ex.result[0].text.startswith("'v")
    finally:
        await closing(sandbox, ci)


async def _jupyter_endpoint(sandbox: Sandbox, server: SandlotServer) -> tuple[str, str,
                                                                                 dict[str, str]]:
    ep = await sandbox.get_endpoint(JUPYTER_PORT)
    scheme, _, token = ep.headers["Authorization"].partition(" ")
    assert scheme == "token" and token
    url = ep.endpoint if "://" in ep.endpoint else f"http://{ep.endpoint}"
    extra = {"OPEN-SANDBOX-API-KEY": server.api_key} if "/proxy/" in url else {}
    return url, token, extra


async def _wait_for_api(url: str, token: str, extra: dict[str, str]) -> dict[str, Any]:
    """The kernelspecs, once the port is open (it opens when the warm kernel is up)."""
    deadline = time.monotonic() + 180
    async with httpx.AsyncClient(timeout=60, headers=extra) as http:
        while True:
            try:
                r = await http.get(f"{url}/api/kernelspecs",
                                   headers={"Authorization": f"token {token}"})
                if r.status_code == 200:
                    return dict(r.json())
            except httpx.TransportError:  # the direct endpoint: closed until it listens
                pass
            assert time.monotonic() < deadline, "the Jupyter API did not come up"
            await asyncio.sleep(0.5)


def check_python_notebook(nb: Any) -> None:
    out = [c.outputs for c in nb.cells]
    assert out[0][0]["text"] == "hello\n" and out[0][1]["data"]["text/plain"] == "42"
    assert out[1][0]["data"]["text/html"] == "<b>rich</b>"
    assert out[2][0]["ename"] == "ZeroDivisionError"
    assert out[3][0]["ename"] == "KeyboardInterrupt"
    assert out[4][0]["text"] == "after the interrupt\n"


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
async def test_jupyter_clients_on_port_44771(server: SandlotServer, proxy: bool,
                                             record_property: Any) -> None:
    sandbox = await sandbox_for(server, proxy=proxy)
    try:
        url, token, extra = await _jupyter_endpoint(sandbox, server)
        specs = await _wait_for_api(url, token, extra)
        assert {"python3", "java", "go", "bash"} <= set(specs["kernelspecs"])
        async with httpx.AsyncClient(timeout=60, headers=extra) as http:
            assert (await http.get(f"{url}/api/kernels")).status_code == 403
        with gateway_server(url, token, extra) as local:
            t0 = time.monotonic()
            nb = await execute(local, notebook(*PY_CELLS), "python3", interrupt_cell=3)
            figure(record_property, f"nbclient_python_{'proxy' if proxy else 'direct'}_s",
                   time.monotonic() - t0)
            check_python_notebook(nb)
            # One message of 1.5 MB (past websockets' default 1 MiB frame limit) arrives whole.
            big = await execute(local, notebook(
                "from IPython.display import HTML, display\ndisplay(HTML('x' * 1_500_000))"),
                "python3")
            assert len(big.cells[0].outputs[0]["data"]["text/html"]) == 1_500_000
            go = await execute(local, notebook(
                'import "fmt"\nx := 40', "fmt.Println(x + 2)", language="go"), "go")
            assert go.cells[1].outputs[0]["text"] == "42\n"
        # A WebSocket without the token is refused, directly and through the proxy.
        async with httpx.AsyncClient(timeout=60, headers=extra) as http:
            kid = (await http.post(f"{url}/api/kernels", json={"name": "bash"},
                                   headers={"Authorization": f"token {token}"})).json()["id"]
        ws_url = url.replace("http://", "ws://", 1) + f"/api/kernels/{kid}/channels"
        with pytest.raises(InvalidStatus):
            async with websockets.connect(ws_url, additional_headers=extra):
                pass
        async with websockets.connect(ws_url, additional_headers={
                **extra, "Authorization": f"token {token}"}) as ws:
            await ws.ping()
    finally:
        await sandbox.kill()
        await sandbox.close()


async def test_out_of_memory_on_the_jupyter_channel(server: SandlotServer) -> None:
    sandbox = await sandbox_for(server, memory="512Mi")
    try:
        url, token, extra = await _jupyter_endpoint(sandbox, server)
        await _wait_for_api(url, token, extra)
        with gateway_server(url, token, extra) as local:
            nb = await execute(local, notebook(
                "before = 1", "hog = b'\\x01' * (2 << 30)", "print('alive')", "before"),
                "python3")
        out = [c.outputs for c in nb.cells]
        assert out[1][0]["ename"] == "OutOfMemoryError"
        assert "out of memory" in out[1][0]["evalue"]
        assert out[2][0]["text"] == "alive\n"
        assert out[3][0]["ename"] == "NameError"
        # execd (PID 1) survived: the sandbox still runs commands.
        ex = await sandbox.commands.run("echo still-here")
        assert "".join(m.text for m in ex.logs.stdout).strip() == "still-here"
    finally:
        await sandbox.kill()
        await sandbox.close()
