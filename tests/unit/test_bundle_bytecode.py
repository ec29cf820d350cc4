"""The bundle's bytecode leaves docstrings out and nothing else: the import system takes the
written .pyc (no docstrings where the source has them), asserts still raise, line numbers
are the source's, a body that was only a docstring still runs, and a file that does not
compile is skipped (imported from source, as compileall leaves it)."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

from sandlot.runtime import bundle_bytecode

SOURCE = '''"""The module's docstring."""
import sys


class Documented:
    """A class's docstring."""

    def method(self):
        """A method's docstring."""
        return "method ran"


def only_a_docstring():
    """Nothing else in the body."""


async def coroutine():
    """A coroutine's docstring."""
    return 1


def checks(value):
    assert value, "asserts are kept"
    return "not a docstring: an expression statement's string stays code"


def fails():
    raise RuntimeError("line 28")
'''


def _load(path: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_the_written_bytecode_has_no_docstrings_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "documented.py"
    path.write_text(SOURCE)
    (tmp_path / "broken.py").write_text("def (:\n")
    assert bundle_bytecode.compile_tree(tmp_path) == 1
    assert not Path(importlib.util.cache_from_source(str(tmp_path / "broken.py"))).exists()
    m = _load(path, "sandlot_test_documented")
    assert m.__cached__ == importlib.util.cache_from_source(str(path))  # type: ignore[attr-defined]
    assert m.__doc__ is None
    assert m.Documented.__doc__ is None and m.Documented.method.__doc__ is None  # type: ignore[attr-defined]
    assert m.only_a_docstring.__doc__ is None and m.only_a_docstring() is None  # type: ignore[attr-defined]
    assert m.coroutine.__doc__ is None  # type: ignore[attr-defined]
    assert m.Documented().method() == "method ran"  # type: ignore[attr-defined]
    try:
        m.checks(0)  # type: ignore[attr-defined]
    except AssertionError as exc:
        assert str(exc) == "asserts are kept"
    else:
        raise AssertionError("the assert was compiled out")
    try:
        m.fails()  # type: ignore[attr-defined]
    except RuntimeError as exc:
        assert traceback.extract_tb(exc.__traceback__)[-1].lineno == 28
    # the same source compiled as usual has them: the loader used the written file
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "documented.py").write_text(SOURCE)
    assert _load(plain / "documented.py", "sandlot_test_plain").__doc__ == "The module's docstring."
