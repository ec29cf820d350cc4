"""Bash and JavaScript/TypeScript contexts, language errors, and context management."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from code_interpreter.models.code import SupportedLanguage
from opensandbox.exceptions import SandboxException
from opensandbox.models.execd import ExecutionHandlers


def _stdout(ex) -> str:
    return "".join(m.text for m in ex.logs.stdout)


async def test_bash_context_keeps_variables_and_cwd(codes):
    ctx = await codes.create_context(SupportedLanguage.BASH)
    assert ctx.language == "bash"
    ex = await codes.run("GREETING=hello; cd /tmp; echo $GREETING from bash", context=ctx)
    assert ex.error is None
    assert _stdout(ex).strip() == "hello from bash"
    ex = await codes.run("echo $GREETING; pwd", context=ctx)
    assert _stdout(ex).split() == ["hello", "/tmp"]
    await codes.delete_context(ctx.id)


async def test_bash_failure_and_interrupt(codes):
    ctx = await codes.create_context(SupportedLanguage.BASH)
    ids: list[str] = []
    started = asyncio.Event()

    async def on_init(init):
        ids.append(init.id)
        started.set()

    run = asyncio.create_task(codes.run("sleep 60", context=ctx,
                                        handlers=ExecutionHandlers(on_init=on_init)))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await codes.interrupt(ids[0])
    await asyncio.wait_for(run, 10)
    assert time.monotonic() - t0 < 2.0
    ex = await codes.run("echo still-here", context=ctx)
    assert _stdout(ex).strip() == "still-here"
    await codes.delete_context(ctx.id)


async def test_javascript_context(codes):
    ctx = await codes.create_context(SupportedLanguage.JAVASCRIPT)
    ex = await codes.run("console.log('Hello from JS'); const n = 20; n + 1", context=ctx)
    assert ex.error is None
    assert _stdout(ex) == "Hello from JS\n"
    assert ex.result[0].text == "21"
    ex = await codes.run("n * 2", context=ctx)
    assert ex.result[0].text == "40"
    ex = await codes.run("undefinedThing()", context=ctx)
    assert ex.error is not None and ex.error.name == "ReferenceError"
    await codes.delete_context(ctx.id)


async def test_javascript_interrupt(codes):
    ctx = await codes.create_context(SupportedLanguage.JAVASCRIPT)
    await codes.run("let kept = 5", context=ctx)
    ids: list[str] = []
    started = asyncio.Event()

    async def on_init(init):
        ids.append(init.id)
        started.set()

    run = asyncio.create_task(codes.run("while (true) {}", context=ctx,
                                        handlers=ExecutionHandlers(on_init=on_init)))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await codes.interrupt(ids[0])
    ex = await asyncio.wait_for(run, 10)
    assert time.monotonic() - t0 < 2.0
    assert ex.error is not None
    ex = await codes.run("kept + 1", context=ctx)
    assert ex.result[0].text == "6"
    await codes.delete_context(ctx.id)


async def test_typescript_context(codes, execd):
    with httpx.Client(base_url=execd.url, headers={"X-EXECD-ACCESS-TOKEN": "code-test-token"}) as c:
        r = c.post("/code/context", json={"language": "typescript"})
    if r.status_code == 400:
        pytest.skip(f"no TypeScript compiler for node on this host: {r.json()['message']}")
    ctx = await codes.create_context(SupportedLanguage.TYPESCRIPT)
    ex = await codes.run(
        "interface P { x: number }\nconst p: P = { x: 3 };\nconsole.log('sum =', p.x + 3);",
        context=ctx)
    assert ex.error is None, ex.error
    assert _stdout(ex) == "sum = 6\n"
    await codes.delete_context(ctx.id)


async def test_unsupported_language_lists_available(execd, codes):
    with execd.client() as c:
        r = c.post("/code/context", json={"language": "cobol"})
        assert r.status_code == 400
        body = r.json()
        assert body["code"] == "UNSUPPORTED_LANGUAGE"
        assert "python" in body["message"] and "bash" in body["message"]
        r = c.post("/code", json={"code": "x", "context": {"language": "cobol"}})
        assert r.status_code == 400
    with pytest.raises(SandboxException):
        await codes.create_context("cobol")


async def test_context_crud(codes, execd):
    a = await codes.create_context(SupportedLanguage.PYTHON)
    b = await codes.create_context(SupportedLanguage.BASH)
    got = await codes.get_context(a.id)
    assert got.id == a.id and got.language == "python"
    py_ids = {c.id for c in await codes.list_contexts(SupportedLanguage.PYTHON)}
    assert a.id in py_ids and b.id not in py_ids
    await codes.delete_contexts(SupportedLanguage.PYTHON)
    assert await codes.list_contexts(SupportedLanguage.PYTHON) == []
    assert [c.id for c in await codes.list_contexts(SupportedLanguage.BASH)] == [b.id]
    with execd.client() as c:
        assert c.get(f"/code/contexts/{a.id}").status_code == 404
        r = c.delete(f"/code/contexts/{a.id}")
        assert r.status_code == 404 and r.json()["code"] == "CONTEXT_NOT_FOUND"
        r = c.post("/code", json={"code": "1", "context": {"id": a.id, "language": "python"}})
        assert r.status_code == 500 and r.json()["code"] == "RUNTIME_ERROR"  # as the reference
        r = c.delete("/code", params={"id": "no-such-context"})
        assert r.status_code == 500 and r.json()["code"] == "RUNTIME_ERROR"
        assert c.delete("/code/contexts").status_code == 400
        assert c.delete("/code").status_code == 400
        assert c.post("/code", content=b"{not json").status_code == 400
        assert c.post("/code", json={"context": {"language": "python"}}).status_code == 400
    await codes.delete_context(b.id)


async def test_context_cwd(execd):
    with execd.client() as c:
        r = c.post("/code/context", json={"language": "python", "cwd": "/tmp"})
        assert r.status_code == 200
        ctx = r.json()
        text = c.post("/code", json={"code": "import os; os.getcwd()", "context": ctx}).text
        assert "'/tmp'" in text
        assert c.post("/code/context",
                      json={"language": "python", "cwd": "/no/such/dir"}).status_code == 400
        assert c.delete(f"/code/contexts/{ctx['id']}").status_code == 200
