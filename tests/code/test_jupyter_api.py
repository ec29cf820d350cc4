"""The Jupyter API execd serves on the code port: REST, token auth, the channels WebSocket driven
by real clients (Jupyter Server in gateway mode + nbclient), the stripped kernelspec, culling and
an out-of-memory kill reported on the channel. A host execd here; tests/compat covers sandboxes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from sandlot.jupyter_token import jupyter_token
from tests.code.conftest import TOKEN, Execd, start_execd, stop_execd
from tests.code.test_oom import limited_cgroup  # noqa: F401 - fixture
from tests.conftest import free_port
from tests.jupyter.clients import execute, gateway_server, notebook

pytestmark = pytest.mark.timeout(600)

JTOKEN = jupyter_token(TOKEN)
AUTH = {"Authorization": f"token {JTOKEN}"}


class Api:
    def __init__(self, execd: Execd, port: int):
        self.execd = execd
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"

    def wait_up(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/api", headers=AUTH, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the Jupyter API did not come up")


def _start(env: dict[str, str], preexec: list[str] | None = None) -> Api:
    port = free_port()
    execd = start_execd({"SANDLOT_CODE_READY_PORT": str(port), **env}, preexec=preexec)
    api = Api(execd, port)
    try:
        api.wait_up()
    except Exception:
        stop_execd(execd)
        raise
    return api


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    server = _start({
        "SANDLOT_CODE_PRESTART": "python",
        "SANDLOT_JUPYTER_STRIPPED_KERNEL": "docsgpt-python",
        "SANDLOT_JUPYTER_STRIPPED_ENV": "*SECRET*,*_TOKEN",
        "MY_APP_SECRET_KEY": "hunter2",
        "GITHUB_TOKEN": "ghp_canary",
        "PLAIN_SETTING": "visible",
        "JUPYTER_TOKEN": "reference-style-token",
    })
    yield server
    stop_execd(server.execd)


def test_rest_needs_the_token_in_any_jupyter_form(api):
    assert httpx.get(api.url + "/api/kernels").status_code == 403
    assert httpx.get(api.url + "/api/kernels", headers={"Authorization": "token nope"}
                     ).status_code == 403
    body = httpx.get(api.url + "/api/kernelspecs").json()
    assert body["code"] == "FORBIDDEN" and "token" in body["message"]
    assert httpx.get(api.url + "/api/kernels", headers=AUTH).status_code == 200
    assert httpx.get(api.url + f"/api/kernels?token={JTOKEN}").status_code == 200
    assert httpx.get(api.url + "/api/kernels",
                     headers={"Authorization": f"Bearer {JTOKEN}"}).status_code == 200
    # JUPYTER_TOKEN (the reference image's variable) is accepted besides the derived token.
    assert httpx.get(api.url + "/api/kernels?token=reference-style-token").status_code == 200


def test_kernelspecs_list_every_language_and_the_stripped_one(api):
    specs = httpx.get(api.url + "/api/kernelspecs", headers=AUTH).json()
    assert specs["default"] == "python3"
    names = set(specs["kernelspecs"])
    assert {"python3", "bash", "java", "go", "javascript", "docsgpt-python"} <= names
    assert specs["kernelspecs"]["java"]["spec"]["language"] == "java"
    one = httpx.get(api.url + "/api/kernelspecs/go", headers=AUTH).json()
    assert one["name"] == "go" and one["spec"]["display_name"] == "Go"
    missing = httpx.get(api.url + "/api/kernelspecs/cobol", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["code"] == "KERNELSPEC_NOT_FOUND"
    bad = httpx.post(api.url + "/api/kernels", headers=AUTH, json={"name": "cobol"})
    assert bad.status_code == 404 and "available" in bad.json()["message"]


def test_kernel_lifecycle_over_rest(api):
    started = httpx.post(api.url + "/api/kernels", headers=AUTH, json={"name": "python3"},
                         timeout=120)
    assert started.status_code == 201
    kernel = started.json()
    assert kernel["name"] == "python3" and kernel["execution_state"] in ("idle", "starting")
    kid = kernel["id"]
    assert any(k["id"] == kid for k in httpx.get(api.url + "/api/kernels", headers=AUTH).json())
    assert httpx.post(f"{api.url}/api/kernels/{kid}/interrupt", headers=AUTH).status_code == 204
    restarted = httpx.post(f"{api.url}/api/kernels/{kid}/restart", headers=AUTH, timeout=120)
    assert restarted.status_code == 200 and restarted.json()["id"] == kid
    assert httpx.delete(f"{api.url}/api/kernels/{kid}", headers=AUTH).status_code == 204
    gone = httpx.get(f"{api.url}/api/kernels/{kid}", headers=AUTH)
    assert gone.status_code == 404 and gone.json()["code"] == "KERNEL_NOT_FOUND"


async def test_websocket_without_the_token_is_refused(api):
    kid = httpx.post(api.url + "/api/kernels", headers=AUTH, json={"name": "bash"},
                     timeout=120).json()["id"]
    try:
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(f"{api.ws_url}/api/kernels/{kid}/channels"):
                pass
        assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus):
            async with websockets.connect(f"{api.ws_url}/api/kernels/{kid}/channels?token=x"):
                pass
        # The same socket with the token works (query form, as browsers must send it).
        async with websockets.connect(
                f"{api.ws_url}/api/kernels/{kid}/channels?token={JTOKEN}") as ws:
            reply = await _request(ws, "kernel_info_request", {})
            assert reply["content"]["language_info"]["name"] == "bash"
    finally:
        httpx.delete(f"{api.url}/api/kernels/{kid}", headers=AUTH)


async def _request(ws, msg_type: str, content: dict, channel: str = "shell") -> dict:
    msg_id = uuid.uuid4().hex
    await ws.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": msg_type, "session": "t", "username": "t",
                   "date": "2026-01-01T00:00:00Z", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": content, "channel": channel}))
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if msg["parent_header"].get("msg_id") == msg_id and msg["channel"] == channel:
            return msg


PY_CELLS = (
    "print('hello'); 6 * 7",
    "from IPython.display import HTML, display\ndisplay(HTML('<b>rich</b>'))",
    "1 / 0",
    "import time\ntime.sleep(120)",
    "print('after the interrupt')",
)


def check_python_notebook(nb) -> None:
    out = [c.outputs for c in nb.cells]
    assert out[0][0]["text"] == "hello\n"
    assert out[0][1]["data"]["text/plain"] == "42"
    assert out[1][0]["output_type"] == "display_data"
    assert out[1][0]["data"]["text/html"] == "<b>rich</b>"
    assert out[2][0]["output_type"] == "error" and out[2][0]["ename"] == "ZeroDivisionError"
    assert out[3][0]["output_type"] == "error" and out[3][0]["ename"] == "KeyboardInterrupt"
    assert out[4][0]["text"] == "after the interrupt\n"


async def test_nbclient_through_jupyter_server_gateway(api):
    with gateway_server(api.url, JTOKEN) as local:
        nb = await execute(local, notebook(*PY_CELLS), "python3", interrupt_cell=3)
        check_python_notebook(nb)
        java = await execute(local, notebook(
            'int x = 40;', 'x + 2', 'System.out.println("hi " + x);', 'int y = 1 / 0;',
            language="java"), "java")
        out = [c.outputs for c in java.cells]
        assert out[1][0]["data"]["text/plain"] == "42"
        assert out[2][0]["text"] == "hi 40\n"
        assert out[3][0]["ename"] == "java.lang.ArithmeticException"
    # nbclient shut its kernels down through the gateway.
    assert httpx.get(api.url + "/api/kernels", headers=AUTH).json() == []


async def test_stripped_kernel_has_no_secrets(api):
    with gateway_server(api.url, JTOKEN) as local:
        nb = await execute(local, notebook(
            "import os; sorted(k for k in ('MY_APP_SECRET_KEY', 'GITHUB_TOKEN', 'PLAIN_SETTING')"
            " if k in os.environ)"), "docsgpt-python")
        assert nb.cells[0].outputs[0]["data"]["text/plain"] == "['PLAIN_SETTING']"
        nb = await execute(local, notebook(
            "import os; os.environ.get('GITHUB_TOKEN')"), "python3")
        assert nb.cells[0].outputs[0]["data"]["text/plain"] == "'ghp_canary'"


@pytest.fixture
def culling() -> Iterator[Api]:
    server = _start({"SANDLOT_CODE_PRESTART": "", "SANDLOT_JUPYTER_CULL_IDLE": "2",
                     "SANDLOT_JUPYTER_CULL_INTERVAL": "0.5"})
    yield server
    stop_execd(server.execd)


def test_idle_kernels_are_culled(culling):
    kid = httpx.post(culling.url + "/api/kernels", headers=AUTH, json={"name": "go"},
                     timeout=120).json()["id"]
    assert httpx.get(f"{culling.url}/api/kernels/{kid}", headers=AUTH).status_code == 200
    deadline = time.monotonic() + 60
    while httpx.get(f"{culling.url}/api/kernels/{kid}", headers=AUTH).status_code == 200:
        assert time.monotonic() < deadline, "the idle kernel was not culled"
        time.sleep(0.5)
    assert httpx.get(culling.url + "/api/kernels", headers=AUTH).json() == []


@pytest.fixture
def confined_api(limited_cgroup: Path) -> Iterator[Api]:  # noqa: F811 - the fixture
    enter = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(limited_cgroup)]
    server = _start({"SANDLOT_CODE_PRESTART": ""}, preexec=enter)
    yield server
    stop_execd(server.execd)


async def test_out_of_memory_is_an_error_on_the_channel_then_a_fresh_kernel(confined_api):
    with gateway_server(confined_api.url, JTOKEN) as local:
        nb = await execute(local, notebook(
            "before = 1", "hog = b'\\x01' * (2 << 30)", "print('alive')", "before"), "python3")
    out = [c.outputs for c in nb.cells]
    assert out[1][0]["output_type"] == "error"
    assert out[1][0]["ename"] == "OutOfMemoryError"
    assert "out of memory" in out[1][0]["evalue"] and "smaller pieces" in out[1][0]["evalue"]
    assert out[2][0]["text"] == "alive\n"  # the restarted kernel runs the next cell
    assert out[3][0]["ename"] == "NameError"  # ... with fresh state
