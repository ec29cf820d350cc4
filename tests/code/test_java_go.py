"""Java and Go contexts through the released code-interpreter SDK (``SupportedLanguage.JAVA``,
``GO``), on a real execd with the host's JDK and Go, plus ``*_VERSION`` selection."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator

import pytest
from code_interpreter.models.code import SupportedLanguage
from opensandbox.models.execd import ExecutionHandlers

from tests.code.conftest import Execd, make_codes, start_execd, stop_execd

pytestmark = pytest.mark.timeout(300)


async def _interrupt_run(codes, ctx, code: str):
    started = asyncio.Event()
    ids: list[str] = []

    async def on_init(init):
        ids.append(init.id)
        started.set()

    run = asyncio.create_task(
        codes.run(code, context=ctx, handlers=ExecutionHandlers(on_init=on_init)))
    await asyncio.wait_for(started.wait(), 60)
    await asyncio.sleep(1.0)
    await codes.interrupt(ids[0])
    return await asyncio.wait_for(run, 30)


def _stdout(ex) -> str:
    return "".join(m.text for m in ex.logs.stdout)


async def test_java_state_errors_and_interrupt(codes):
    ctx = await codes.create_context(SupportedLanguage.JAVA)
    assert ctx.language == "java"
    ex = await codes.run(
        'int x = 41;\nString greet(String n) { return "hello " + n; }\n'
        'System.out.println(greet("java"));', context=ctx)
    assert ex.error is None, ex.error
    assert _stdout(ex) == "hello java\n"
    ex = await codes.run("x + 1", context=ctx)
    assert ex.error is None and ex.result[0].text == "42"
    ex = await codes.run('List<String> l = new ArrayList<>(List.of("a", "b")); l.size()',
                         context=ctx)
    assert ex.result[0].text == "2"  # java.util.* is imported, as in the jshell tool

    ex = await codes.run("int y = x / 0;", context=ctx)
    assert ex.error is not None and ex.error.name == "java.lang.ArithmeticException"
    assert ex.error.value == "/ by zero"
    ex = await codes.run("int z = undefinedName + 1;", context=ctx)
    assert ex.error is not None and ex.error.name == "CompilationError"
    assert "undefinedName" in ex.error.value

    ex = await _interrupt_run(codes, ctx, "while (true) { Thread.sleep(5); }")
    assert ex.error is not None and ex.error.name == "InterruptedException"
    ex = await codes.run("x * 2", context=ctx)  # the context survives the interrupt
    assert ex.error is None and ex.result[0].text == "82"
    await codes.delete_context(ctx.id)


async def test_go_declarations_persist_errors_and_interrupt(codes):
    ctx = await codes.create_context(SupportedLanguage.GO)
    assert ctx.language == "go"
    ex = await codes.run(
        'import "fmt"\n'
        "type point struct{ X, Y int }\n"
        "func (p point) sum() int { return p.X + p.Y }\n"
        "base := 40\n"
        'fmt.Println("sum", point{1, 1}.sum()+base)', context=ctx)
    assert ex.error is None, ex.error
    assert _stdout(ex) == "sum 42\n"
    ex = await codes.run('fmt.Println(point{X: base}.sum() + 2)', context=ctx)
    assert ex.error is None and _stdout(ex) == "42\n"

    ex = await codes.run("var zero = 0\nfmt.Println(base / zero)", context=ctx)
    assert ex.error is not None and ex.error.name == "panic"
    assert "divide by zero" in ex.error.value
    ex = await codes.run("fmt.Println(notDeclared)", context=ctx)
    assert ex.error is not None and ex.error.name == "CompileError"
    assert "notDeclared" in ex.error.value
    ex = await codes.run('bad := "never kept"\nfmt.Println(undefinedToo)', context=ctx)
    assert ex.error is not None  # a cell that does not compile leaves the context unchanged
    ex = await codes.run("fmt.Println(bad)", context=ctx)
    assert ex.error is not None and "bad" in ex.error.value

    ex = await _interrupt_run(codes, ctx, 'import "time"\nfor { time.Sleep(time.Millisecond) }')
    assert ex.error is not None and ex.error.name == "Interrupted"
    ex = await codes.run("fmt.Println(base + 2)", context=ctx)
    assert ex.error is None and _stdout(ex) == "42\n"
    await codes.delete_context(ctx.id)


@pytest.fixture(scope="module")
def versioned() -> Iterator[Execd]:
    server = start_execd({"JAVA_VERSION": "17", "PYTHON_VERSION": "3", "GO_VERSION": "0.1",
                          "SANDLOT_CODE_PRESTART": ""})
    yield server
    stop_execd(server)


async def test_version_variables_select_or_keep_the_default(versioned):
    codes = make_codes(versioned.endpoint)
    try:
        java = await codes.create_context(SupportedLanguage.JAVA)
        ex = await codes.run('System.getProperty("java.version")', context=java)
        assert ex.error is None and ex.result[0].text.strip('"').startswith("17")
        ex = await codes.run('System.getenv("JAVA_HOME")', context=java)
        assert "java-17-openjdk" in ex.result[0].text
        py = await codes.create_context(SupportedLanguage.PYTHON)
        ex = await codes.run("import sys; sys.version_info[0]", context=py)
        assert ex.result[0].text == "3"
        # An unknown version keeps the default, as the reference's switch script does.
        go = await codes.create_context(SupportedLanguage.GO)
        ex = await codes.run('import "runtime"\nimport "fmt"\nfmt.Println(runtime.Version())',
                             context=go)
        default_go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True,
                                    check=True).stdout.strip()
        assert ex.error is None and _stdout(ex).strip() == default_go
    finally:
        await codes.aclose()
