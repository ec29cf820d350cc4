"""The issue's acceptance for Python, through the released opensandbox-code-interpreter SDK."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from code_interpreter.models.code import SupportedLanguage
from opensandbox.models.execd import ExecutionHandlers

HELLO = "import sys; print('Hello from Python!'); {'py': sys.version.split()[0], 'sum': 2+2}"


async def test_hello_and_result_dict(codes):
    ctx = await codes.create_context(SupportedLanguage.PYTHON)
    ex = await codes.run(HELLO, context=ctx)
    assert ex.error is None
    assert "".join(m.text for m in ex.logs.stdout) == "Hello from Python!\n"
    assert len(ex.result) == 1
    assert "'sum': 4" in ex.result[0].text and "'py': '3." in ex.result[0].text
    assert ex.execution_count == 1
    assert ex.complete is not None and ex.id == ctx.id  # init carries the context id
    await codes.delete_context(ctx.id)


async def test_state_persists_in_context_not_across(codes):
    a = await codes.create_context(SupportedLanguage.PYTHON)
    b = await codes.create_context(SupportedLanguage.PYTHON)
    assert a.id != b.id
    await codes.run("x = 41\nimport os; os.chdir('/tmp')", context=a)
    ex = await codes.run("x + 1, os.getcwd()", context=a)
    assert ex.result[0].text == "(42, '/tmp')"
    ex = await codes.run("x", context=b)
    assert ex.error is not None and ex.error.name == "NameError"
    assert any("NameError" in line for line in ex.error.traceback)
    for c in (a, b):
        await codes.delete_context(c.id)


async def test_interrupt_stops_busy_loop_and_context_survives(codes):
    ctx = await codes.create_context(SupportedLanguage.PYTHON)
    await codes.run("y = 7", context=ctx)
    started = asyncio.Event()
    ids: list[str] = []

    async def on_init(init):
        ids.append(init.id)
        started.set()

    run = asyncio.create_task(codes.run(
        "while True: pass", context=ctx, handlers=ExecutionHandlers(on_init=on_init)))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    assert ids[0] == ctx.id
    await codes.interrupt(ids[0])
    ex = await asyncio.wait_for(run, 10)
    assert time.monotonic() - t0 < 2.0
    assert ex.error is not None and ex.error.name == "KeyboardInterrupt"
    assert ex.complete is not None  # the kernel went idle: complete follows, as the reference
    after = await codes.run("y * 6", context=ctx)
    assert after.error is None and after.result[0].text == "42"
    await codes.delete_context(ctx.id)


async def test_an_interrupt_before_the_kernel_takes_up_the_run_is_not_lost(codes):
    """ipykernel ignores SIGINT between requests: an interrupt that reaches a kernel too slow
    to have read the run yet (here: stopped) is sent once the kernel has taken the run up."""
    ctx = await codes.create_context(SupportedLanguage.PYTHON)
    ex = await codes.run("import os; os.getpid()", context=ctx)
    kernel = int(ex.result[0].text)
    started = asyncio.Event()
    ids: list[str] = []

    async def on_init(init):
        ids.append(init.id)
        started.set()

    os.kill(kernel, signal.SIGSTOP)
    try:
        run = asyncio.create_task(codes.run(
            "while True: pass", context=ctx, handlers=ExecutionHandlers(on_init=on_init)))
        await asyncio.wait_for(started.wait(), 30)
        await codes.interrupt(ids[0])  # answered at once, the kernel still stopped
        await asyncio.sleep(0.3)
    finally:
        os.kill(kernel, signal.SIGCONT)
    ex = await asyncio.wait_for(run, 10)
    assert ex.error is not None and ex.error.name == "KeyboardInterrupt"
    assert ex.complete is not None
    after = await codes.run("6 * 7", context=ctx)
    assert after.error is None and after.result[0].text == "42"
    await codes.delete_context(ctx.id)


async def test_a_run_in_a_busy_context_is_refused_not_queued(codes):
    ctx = await codes.create_context(SupportedLanguage.PYTHON)
    started = asyncio.Event()

    async def on_init(_init):
        started.set()

    slow = asyncio.create_task(codes.run(
        "import time; time.sleep(3); 'slow done'", context=ctx,
        handlers=ExecutionHandlers(on_init=on_init)))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    refused = await codes.run("1 + 1", context=ctx)
    assert time.monotonic() - t0 < 2.5  # did not wait for the slow run
    assert refused.error is not None and refused.result == [] and refused.complete is None
    assert refused.id == ctx.id
    done = await asyncio.wait_for(slow, 30)
    assert done.error is None and done.result[0].text == "'slow done'"
    await codes.delete_context(ctx.id)


async def test_syntax_error_is_an_error_event(codes):
    ex = await codes.run("def broken(:\n  pass", language=SupportedLanguage.PYTHON)
    assert ex.error is not None
    assert ex.error.name == "SyntaxError"
    assert ex.result == []
    assert ex.complete is not None  # a kernel error is followed by complete (reference)


async def test_matplotlib_figure_arrives_as_png(execd):
    import base64

    import httpx

    from .conftest import TOKEN

    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.title('squares')\n"
        "plt.show()\n"
    )
    events = []
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream("POST", execd.url + "/code",
                                 headers={"X-EXECD-ACCESS-TOKEN": TOKEN},
                                 json={"code": code, "context": {"language": "python"}}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            import json

            async for line in r.aiter_lines():
                if line.startswith("{"):  # the reference's framing: JSON lines
                    events.append(json.loads(line))
    results = [e for e in events if e["type"] == "result"]
    assert results, events
    png = base64.b64decode(results[0]["results"]["image/png"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert "text" in results[0]["results"] and "text/plain" not in results[0]["results"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "init" and kinds[-1] == "execution_complete"
    assert all("timestamp" in e for e in events)
    assert isinstance(events[-1]["execution_time"], int)


async def test_default_context_keeps_state(codes):
    await codes.run("default_var = 'kept'", language=SupportedLanguage.PYTHON)
    ex = await codes.run("default_var", language=SupportedLanguage.PYTHON)
    assert ex.result[0].text == "'kept'"
