"""Issue 16: kernel start + first cell through the Jupyter API (port 44771) vs the code API vs a
direct ``jupyter_client`` kernel on the host, and Java and Go first-cell latency (code API).

The Jupyter API figure is what a Jupyter client pays: ``POST /api/kernels`` (the direct endpoint,
the endpoint's token header), the channels WebSocket, one ``execute_request`` of ``1+1`` until
the kernel reports idle, then the kernel is deleted. The code API figure is the SDK's
``create_context`` + ``run``. Both take a pre-started kernel when the pool has one (a pause lets
it refill before each sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from datetime import timedelta

import httpx
import websockets
from code_interpreter import CodeInterpreter
from code_interpreter.models.code import SupportedLanguage

from bench.baselines.jupyter import JupyterBaseline
from bench.env import BenchEnv
from bench.results import Measured, Row, ms, skipped
from bench.server import image_present

BENCH = "jupyter"
KEYS = ("jupyter.kernel_first_cell", "jupyter.java_first_cell", "jupyter.go_first_cell")
IMAGE = "code-interpreter"
PORT = 44771


def _labels() -> dict[str, str]:
    return {
        "jupyter.kernel_first_cell": "Python kernel start + first cell via the Jupyter API",
        "jupyter.java_first_cell": "new Java context + first cell (code API)",
        "jupyter.go_first_cell": "new Go context + first cell (code API)",
    }


async def _jupyter_first_cell(url: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, headers=headers) as http:
        r = await http.post(f"{url}/api/kernels", json={"name": "python3"})
        r.raise_for_status()
        kid = r.json()["id"]
        ws_url = url.replace("http://", "ws://", 1) + f"/api/kernels/{kid}/channels"
        async with websockets.connect(ws_url, additional_headers=headers) as ws:
            msg_id = uuid.uuid4().hex
            await ws.send(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "b",
                           "username": "b", "date": "", "version": "5.3"},
                "parent_header": {}, "metadata": {}, "channel": "shell",
                "content": {"code": "1+1", "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": False}}))
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if (msg.get("msg_type") == "status"
                        and msg["parent_header"].get("msg_id") == msg_id
                        and msg["content"].get("execution_state") == "idle"):
                    break
        elapsed = time.perf_counter() - t0
        await http.delete(f"{url}/api/kernels/{kid}")
    return elapsed


async def run(env: BenchEnv) -> list[Row]:
    sc = env.scale
    labels = _labels()
    if not image_present(IMAGE, env.image_cache):
        note = f"image `{IMAGE}` not built (a full `python -m bench` builds it; --quick does not)"
        return [skipped(k, BENCH, labels[k], "ms", note, None) for k in KEYS]
    sandbox, _ = await env.sandboxes.create(IMAGE, ready_timeout=180.0)
    env.profile_execd(sandbox.id)
    api: list[float] = []
    code_api: list[float] = []
    java: list[float] = []
    go: list[float] = []
    try:
        ci = await CodeInterpreter.create(sandbox, ready_timeout=timedelta(seconds=120))
        ep = await sandbox.get_endpoint(PORT)
        url = ep.endpoint if "://" in ep.endpoint else f"http://{ep.endpoint}"
        headers = dict(ep.headers or {})
        async def via_code_api() -> float:
            t0 = time.perf_counter()
            ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
            await ci.codes.run("1+1", context=ctx)
            elapsed = time.perf_counter() - t0
            if ctx.id:
                await ci.codes.delete_context(ctx.id)
            return elapsed

        # Both take the pool's pre-started kernel: a pause long enough for it to be refilled
        # (a kernel start on a busy 2-core machine takes seconds), and alternating order.
        settle = 2.0 if env.quick else max(sc.settle_seconds, 6.0)
        for i in range(sc.context_runs):
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                await asyncio.sleep(settle)
                if which == 0:
                    api.append(await _jupyter_first_cell(url, headers))
                else:
                    code_api.append(await via_code_api())
        for language, bucket, code in (
            (SupportedLanguage.JAVA, java, "1 + 1"),
            (SupportedLanguage.GO, go, 'import "fmt"\nfmt.Println(1 + 1)'),
        ):
            for _ in range(1 if env.quick else min(sc.context_runs, 4)):
                t0 = time.perf_counter()
                ctx = await ci.codes.create_context(language)
                ex = await ci.codes.run(code, context=ctx)
                bucket.append(time.perf_counter() - t0)
                if ex.error is not None:
                    raise RuntimeError(f"{language} first cell failed: {ex.error}")
                if ctx.id:
                    await ci.codes.delete_context(ctx.id)
        with contextlib.suppress(Exception):
            await ci.aclose()
    finally:
        await env.sandboxes.delete(sandbox)

    host: list[float] = []
    for _ in range(1 if env.quick else min(sc.context_runs, 4)):
        jb = JupyterBaseline()
        try:
            t0 = time.perf_counter()
            jb.start()
            jb.execute("1+1")
            host.append(time.perf_counter() - t0)
        finally:
            jb.close()
    return [
        Row(key="jupyter.kernel_first_cell", bench=BENCH,
            label=labels["jupyter.kernel_first_cell"], unit="ms",
            sandlot=Measured("sandlot Jupyter API", ms(api)),
            baselines=[Measured("sandlot code API", ms(code_api)),
                       Measured("jupyter_client on host (cold)", ms(host))]),
        Row(key="jupyter.java_first_cell", bench=BENCH, label=labels["jupyter.java_first_cell"],
            unit="ms", sandlot=Measured("sandlot", ms(java)),
            baselines=[Measured("jupyter_client python on host (cold)", ms(host))]),
        Row(key="jupyter.go_first_cell", bench=BENCH, label=labels["jupyter.go_first_cell"],
            unit="ms", sandlot=Measured("sandlot", ms(go)),
            baselines=[Measured("jupyter_client python on host (cold)", ms(host))]),
    ]
