"""Issue 4's acceptance through real sandboxes: the released ``opensandbox-code-interpreter`` SDK
against ``sandlot serve`` and a sandbox of the ``code-interpreter`` image.

The image is built into the shared test image store when missing (``code_interpreter_image``;
a cold build installs Debian packages and npm's typescript, several minutes). Measured figures
(first-cell and interrupt latency) are printed as ``FIGURE name=value`` lines (``pytest -s``) and
recorded as test properties; assertions on them are deliberately loose (a shared, noisy machine).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from code_interpreter import CodeInterpreter
from code_interpreter.models.code import CodeContext, SupportedLanguage
from opensandbox import Sandbox
from opensandbox.constants import DEFAULT_EXECD_PORT
from opensandbox.models.execd import ExecutionHandlers
from opensandbox.models.sandboxes import SandboxEndpoint

from sandlot.images.model import Image
from sandlot.images.store import ImageStore
from sandlot.runtime.oci.spec import EXECD_OOM_SCORE_ADJ, can_lower_oom_score_adj
from tests.compat.conftest import SandlotServer
from tests.runtime.helpers import EXECD_PID

# A cold image build can take far longer than the suite's default per-test timeout.
pytestmark = [pytest.mark.timeout(2400), pytest.mark.backends("oci", "docker"),
              pytest.mark.heavy_backends("runsc")]

IMAGE = "code-interpreter"
REFERENCE_IMAGE = "opensandbox/code-interpreter:latest"
REFERENCE_ENTRYPOINT = ["/opt/code-interpreter/code-interpreter.sh"]
HELLO = "import sys; print('Hello from Python!'); {'py': sys.version.split()[0], 'sum': 2+2}"
PLOT = (
    "import matplotlib.pyplot as plt\n"
    "plt.plot([1, 2, 3], [1, 4, 9])\n"
    "plt.title('squares')\n"
    "plt.show()\n"
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def code_interpreter_image(image_store: ImageStore, base_image: Image) -> Image:
    """The ``code-interpreter`` recipe's image in the shared test store (built when missing)."""
    return asyncio.run(image_store.build("code-interpreter", if_missing=True))


@pytest.fixture(scope="module")
def code_server(code_interpreter_image: Image, sandlot_server: SandlotServer) -> SandlotServer:
    """The module's ``sandlot serve``, once the images it needs are in its backend."""
    for name in (IMAGE, REFERENCE_IMAGE):
        sandlot_server.provide_image(code_interpreter_image, name)
    return sandlot_server


def figure(record: Any, name: str, value: float) -> None:
    print(f"\nFIGURE {name}={value:.3f}")
    record(name, round(value, 4))


async def new_sandbox(
    server: SandlotServer,
    image: str = IMAGE,
    *,
    proxy: bool = False,
    entrypoint: list[str] | None = None,
    resource: dict[str, str] | None = None,
) -> Sandbox:
    return await Sandbox.create(
        image,
        connection_config=server.sdk_config(proxy=proxy, timeout=120),
        entrypoint=entrypoint,
        resource=resource or {"cpu": "1", "memory": "2Gi"},
        timeout=timedelta(minutes=20),
        ready_timeout=timedelta(seconds=120),
    )


async def interpreter_for(sandbox: Sandbox) -> CodeInterpreter:
    """``CodeInterpreter.create`` with its strict readiness check (the in-sandbox port probe)."""
    return await CodeInterpreter.create(sandbox, ready_timeout=timedelta(seconds=120))


async def closing(sandbox: Sandbox, interpreter: CodeInterpreter | None) -> None:
    if interpreter is not None:
        await interpreter.aclose()
    try:
        await sandbox.kill()
    finally:
        await sandbox.close()


async def sse_events(
    sandbox: Sandbox, server: SandlotServer, body: dict[str, Any]
) -> list[dict[str, Any]]:
    """``POST /code`` on the wire (the SDK keeps only a result's text, not its MIME bundle)."""
    ep: SandboxEndpoint = await sandbox.get_endpoint(DEFAULT_EXECD_PORT)
    headers = {"OPEN-SANDBOX-API-KEY": server.api_key, **ep.headers}
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream(
            "POST", f"http://{ep.endpoint}/code", headers=headers, json=body
        ) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("{"):  # the reference's framing: JSON lines
                    events.append(json.loads(line))
    return events


async def drop(ci: CodeInterpreter, ctx: CodeContext) -> None:
    assert ctx.id is not None
    await ci.codes.delete_context(ctx.id)


async def check_hello(ci: CodeInterpreter, record: Any) -> None:
    t0 = time.monotonic()
    ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
    ex = await ci.codes.run(HELLO, context=ctx)
    figure(record, "first_cell_s", time.monotonic() - t0)
    assert ex.error is None, ex.error
    assert "".join(m.text for m in ex.logs.stdout) == "Hello from Python!\n"
    assert len(ex.result) == 1
    text = ex.result[0].text or ""
    assert "'sum': 4" in text and "'py': '3." in text
    assert ex.execution_count == 1 and ex.complete is not None and ex.id
    t0 = time.monotonic()
    warm = await ci.codes.run("1+1", context=ctx)
    figure(record, "warm_1plus1_s", time.monotonic() - t0)
    assert warm.result[0].text == "2"
    await drop(ci, ctx)


async def check_state(ci: CodeInterpreter) -> None:
    a = await ci.codes.create_context(SupportedLanguage.PYTHON)
    b = await ci.codes.create_context(SupportedLanguage.PYTHON)
    assert a.id != b.id
    await ci.codes.run("x = 41\nimport os; os.chdir('/tmp')", context=a)
    ex = await ci.codes.run("x + 1, os.getcwd()", context=a)
    assert ex.error is None and ex.result[0].text == "(42, '/tmp')"
    ex = await ci.codes.run("x", context=b)
    assert ex.error is not None and ex.error.name == "NameError"
    for c in (a, b):
        await drop(ci, c)


async def check_interrupt(ci: CodeInterpreter, record: Any) -> None:
    ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
    await ci.codes.run("y = 7", context=ctx)
    started = asyncio.Event()
    ids: list[str] = []

    async def on_init(init: Any) -> None:
        ids.append(init.id)
        started.set()

    run = asyncio.create_task(
        ci.codes.run("while True: pass", context=ctx, handlers=ExecutionHandlers(on_init=on_init))
    )
    await asyncio.wait_for(started.wait(), 60)
    await asyncio.sleep(0.5)
    assert not run.done()
    t0 = time.monotonic()
    await ci.codes.interrupt(ids[0])
    ex = await asyncio.wait_for(run, 30)
    latency = time.monotonic() - t0
    figure(record, "interrupt_latency_s", latency)
    assert latency < 10  # the target is 2 s; loose on a shared machine (see the figure)
    assert ex.error is not None and ex.error.name == "KeyboardInterrupt"
    after = await ci.codes.run("y * 6", context=ctx)
    assert after.error is None and after.result[0].text == "42"
    await drop(ci, ctx)


async def check_history(ci: CodeInterpreter) -> None:
    """The image's Python kernel keeps its input history in memory (its recipe,
    docs/compatibility.md): ``%history`` lists the context's cells, and no history database
    is written in the sandbox."""
    ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
    await ci.codes.run("a = 6", context=ctx)
    await ci.codes.run("b = a * 7", context=ctx)
    ex = await ci.codes.run("%history", context=ctx)
    assert ex.error is None, ex.error
    listed = "".join(m.text for m in ex.logs.stdout)
    assert "a = 6" in listed and "b = a * 7" in listed, listed
    ex = await ci.codes.run(
        "import os; (get_ipython().history_manager.hist_file, os.path.exists("
        "os.path.join(get_ipython().profile_dir.location, 'history.sqlite')))", context=ctx)
    assert ex.error is None and ex.result[0].text == "(':memory:', False)", ex
    await drop(ci, ctx)


async def check_syntax_error(ci: CodeInterpreter) -> None:
    ex = await ci.codes.run("def broken(:\n  pass", language=SupportedLanguage.PYTHON)
    assert ex.error is not None and ex.error.name == "SyntaxError"
    assert ex.result == []


async def check_plot(sandbox: Sandbox, server: SandlotServer) -> None:
    events = await sse_events(sandbox, server, {"code": PLOT, "context": {"language": "python"}})
    kinds = [e["type"] for e in events]
    assert kinds[0] == "init" and kinds[-1] == "execution_complete", kinds
    results = [e for e in events if e["type"] == "result"]
    assert results, events
    png = base64.b64decode(results[0]["results"]["image/png"])
    assert png.startswith(PNG_MAGIC)
    assert "text" in results[0]["results"] and "text/plain" not in results[0]["results"]


async def check_bash_and_js(ci: CodeInterpreter) -> None:
    sh = await ci.codes.create_context(SupportedLanguage.BASH)
    await ci.codes.run("GREETING=hi; cd /tmp", context=sh)
    ex = await ci.codes.run('echo "$GREETING from $(pwd)"; echo $((6*7))', context=sh)
    assert ex.error is None, ex.error
    assert "".join(m.text for m in ex.logs.stdout) == "hi from /tmp\n42\n"
    await drop(ci, sh)

    js = await ci.codes.create_context(SupportedLanguage.JAVASCRIPT)
    await ci.codes.run("const base = 40; function add(a, b) { return a + b; }", context=js)
    ex = await ci.codes.run("console.log('from node'); add(base, 2)", context=js)
    assert ex.error is None, ex.error
    assert "".join(m.text for m in ex.logs.stdout) == "from node\n"
    assert ex.result and ex.result[0].text == "42"
    ex = await ci.codes.run("undefinedThing.x", context=js)
    assert ex.error is not None and ex.error.name == "ReferenceError"
    await drop(ci, js)

    ts = await ci.codes.create_context(SupportedLanguage.TYPESCRIPT)
    ex = await ci.codes.run("const n: number = 6; n * 7", context=ts)
    assert ex.error is None, ex.error
    assert ex.result and ex.result[0].text == "42"
    await drop(ci, ts)


async def test_code_interpreter_image(code_server: SandlotServer, record_property: Any) -> None:
    """The ``code-interpreter`` image, direct endpoints: the whole acceptance list."""
    sandbox = await new_sandbox(code_server)
    ci: CodeInterpreter | None = None
    try:
        t0 = time.monotonic()
        ci = await interpreter_for(sandbox)
        figure(record_property, "interpreter_ready_s", time.monotonic() - t0)
        await check_hello(ci, record_property)
        await check_state(ci)
        await check_interrupt(ci, record_property)
        await check_syntax_error(ci)
        await check_history(ci)
        await check_plot(sandbox, code_server)
        await check_bash_and_js(ci)
    finally:
        await closing(sandbox, ci)


async def test_reference_image_through_server_proxy(
    code_server: SandlotServer, record_property: Any
) -> None:
    """``opensandbox/code-interpreter:latest`` with the reference entrypoint, as the SDK docs
    create it, and every request (readiness probe, SSE, interrupt) through the server proxy."""
    sandbox = await new_sandbox(
        code_server, REFERENCE_IMAGE, proxy=True, entrypoint=REFERENCE_ENTRYPOINT
    )
    ci: CodeInterpreter | None = None
    try:
        ep = await sandbox.get_endpoint(DEFAULT_EXECD_PORT)
        assert "/proxy/" in ep.endpoint, ep
        ci = await interpreter_for(sandbox)
        assert await ci.is_healthy()
        await check_hello(ci, record_property)
        await check_state(ci)
        await check_interrupt(ci, record_property)
        await check_syntax_error(ci)
        await check_plot(sandbox, code_server)
        ex = await ci.codes.run("echo proxied", language=SupportedLanguage.BASH)
        assert "".join(m.text for m in ex.logs.stdout) == "proxied\n"
    finally:
        await closing(sandbox, ci)


async def _execd_identity(sandbox: Sandbox) -> tuple[str, str]:
    """execd's start time (field 22 of /proc/<pid>/stat) and its oom_score_adj."""
    ex = await sandbox.commands.run(f"E={EXECD_PID}; cut -d' ' -f22 /proc/$E/stat; "
                                    "cat /proc/$E/oom_score_adj")
    lines = [m.text.strip() for m in ex.logs.stdout if m.text.strip()]
    out = "\n".join(lines).split()
    assert len(out) == 2, ex
    return out[0], out[1]


# Many small processes started from a kernel, together over the limit, each smaller than execd
# (fresh interpreters, not forks sharing the kernel's pages): with every process at the same
# oom_score_adj the OOM killer takes the biggest, execd (PID 1), and the whole sandbox goes (seen
# before kernels were made the preferred victims).
SWARM = """
import subprocess, sys
hog = (
    "import time; block = bytearray(22 << 20)\\n"
    "for i in range(0, len(block), 4096): block[i] = 1\\n"
    "time.sleep(4)"
)
procs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(30)]
print(sorted(p.wait() for p in procs))
"""


# Not on runsc: the host's OOM killer sees gVisor's sentry (the whole sandbox) as the one
# process over the limit, so an OOM inside ends the sandbox (docs/compatibility.md).
@pytest.mark.heavy_backends()
async def test_oom_then_fresh_context_and_execd_survives(code_server: SandlotServer) -> None:
    sandbox = await new_sandbox(code_server, resource={"cpu": "1", "memory": "512Mi"})
    ci: CodeInterpreter | None = None
    try:
        ci = await interpreter_for(sandbox)
        started, adj = await _execd_identity(sandbox)
        # -999 where the host lets runc lower it (CAP_SYS_RESOURCE); else 0, and kernels go up.
        assert int(adj) == (EXECD_OOM_SCORE_ADJ if can_lower_oom_score_adj() else 0)
        ctx = await ci.codes.create_context(SupportedLanguage.PYTHON)
        ex = await ci.codes.run("before = 'set before the OOM'", context=ctx)
        assert ex.error is None
        ex = await ci.codes.run("int(open('/proc/self/oom_score_adj').read())", context=ctx)
        kernel_adj = int(ex.result[0].text or "")
        print(f"\nFIGURE execd_oom_score_adj={adj} kernel_oom_score_adj={kernel_adj}")
        assert kernel_adj == min(1000, int(adj) + 999)  # the OOM killer prefers kernels

        ex = await ci.codes.run("hog = b'\\x01' * (2 << 30)", context=ctx)
        assert ex.error is not None, ex
        assert ex.error.name == "OutOfMemoryError", ex.error
        assert "out of memory" in ex.error.value and "smaller pieces" in ex.error.value
        ex = await ci.codes.run("print('alive'); 6 * 7", context=ctx)
        assert ex.error is None, ex.error
        assert ex.result[0].text == "42"
        ex = await ci.codes.run("before", context=ctx)
        assert ex.error is not None and ex.error.name == "NameError"

        # Death by a thousand cuts: the kernel and its workers go, never execd.
        ex = await ci.codes.run(SWARM, context=ctx)
        outcome = ex.error.name if ex.error else "".join(m.text for m in ex.logs.stdout)
        print(f"\nFIGURE swarm_outcome={outcome.strip()!r}")
        ex = await ci.codes.run("6 * 7", context=ctx)
        assert ex.error is None and ex.result[0].text == "42", ex

        # execd (PID 1) was never the victim: same process, still serving.
        assert await ci.ping()
        assert (await _execd_identity(sandbox))[0] == started
        assert (await sandbox.get_info()).status.state == "Running"
        await drop(ci, ctx)
    finally:
        await closing(sandbox, ci)


async def test_a_kernels_own_output_is_in_the_sandbox_logs(code_server: SandlotServer) -> None:
    """What a cell writes to its kernel's own stdout descriptor (not the run's output: the
    descriptors the kernel started with) goes to the sandbox's capped kernels log, never to
    the host's container log, and the logs diagnostics show it in a section of its own."""
    sandbox = await new_sandbox(code_server)
    ci: CodeInterpreter | None = None
    try:
        ci = await interpreter_for(sandbox)
        ex = await ci.codes.run(
            "import os, sys; os.write(sys.stdout.fileno(), b'kernel-own-output-7\\n')")
        assert ex.error is None, ex.error
        content = ""
        with code_server.client() as c:
            for _ in range(50):  # the copy into the log is asynchronous
                r = c.get(f"/v1/sandboxes/{sandbox.id}/diagnostics/logs",
                          params={"scope": "container"})
                assert r.status_code == 200, r.text
                content = r.json()["content"]
                if "kernel-own-output-7" in content:
                    break
                await asyncio.sleep(0.2)
        kernels = content.partition("=== code kernels' own output\n")[2]
        assert "kernel-own-output-7" in kernels, content
        init = content.partition("=== container init (execd) output\n")[2]
        assert "kernel-own-output-7" not in init, content
    finally:
        await closing(sandbox, ci)
