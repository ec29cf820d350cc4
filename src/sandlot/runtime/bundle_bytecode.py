"""Byte-compiling the execd bundle's modules without their docstrings.

A forked execd counts every page of its zygote's heap in its RSS, and ~1.0 MB of the plain
zygote's heap was docstrings (each module's, class's and function's first constant), which
nothing in execd reads. ``python -OO`` would drop them, and every ``assert`` with them; this
compiles each module's syntax tree with only the docstrings taken out. ``__doc__`` is then
None, as under ``-OO``, which the standard library and the bundled distributions allow for.
Line numbers are the source's, so tracebacks point where they did.
"""

from __future__ import annotations

import ast
import importlib.util
import marshal
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def without_docstrings(tree: ast.Module) -> ast.Module:
    """``tree`` with the docstring of the module and of every class and function removed
    (a body left empty gets a ``pass`` where the docstring was)."""
    for node in ast.walk(tree):
        if not isinstance(node, _DOCUMENTED) or not node.body:
            continue
        first = node.body[0]
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            node.body = node.body[1:] or [ast.copy_location(ast.Pass(), first)]
    return tree


def compile_module(source_path: Path) -> bool:
    """Write ``source_path``'s cached bytecode (where the import system looks for it),
    docstrings left out; False for a file that does not compile (as ``compileall`` skips
    it), which is then imported from source, as before."""
    source = source_path.read_bytes()
    try:
        tree = ast.parse(source, filename=str(source_path))
        code = compile(without_docstrings(tree), str(source_path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    st = source_path.stat()
    # A timestamp-checked .pyc (PEP 552 header: magic, flags 0, source mtime, source size),
    # written here because py_compile and compileall take source text, not a code object.
    header = (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
              + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
              + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little"))
    cached = Path(importlib.util.cache_from_source(str(source_path)))
    cached.parent.mkdir(exist_ok=True)
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    tmp.write_bytes(header + marshal.dumps(code))
    os.replace(tmp, cached)
    return True


def compile_tree(root: Path) -> int:
    """Compile every module under ``root`` (as ``compile_module``), on every CPU; how many
    compiled."""
    sources = sorted(root.rglob("*.py"))
    if len(sources) < 64:
        return sum(compile_module(p) for p in sources)
    with ProcessPoolExecutor() as pool:
        return sum(pool.map(compile_module, sources, chunksize=32))
