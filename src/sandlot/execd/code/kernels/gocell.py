"""Splitting a Go cell into declarations that persist and statements that run once.

Go has no REPL in Debian, so a Go context keeps the cell's top-level declarations (imports,
types, functions, methods, package-level ``var``/``const``) and compiles them with each new cell's
statements into one program. A top-level ``a, b := expr`` becomes ``var a, b = expr`` so the
names stay usable in later cells. The split follows Go's own rules: statements end at a
newline after a token that takes an automatic semicolon, or at ``;``, outside brackets; strings,
runes and comments are skipped. A later declaration of a name replaces the earlier one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ENDS_STATEMENT = re.compile(r"[\w\)\]\}'\"`]$|\+\+$|--$")
_KEYWORD_END = {"break", "continue", "fallthrough", "return"}
_SHORT_VAR = re.compile(r"^\s*((?:[A-Za-z_]\w*\s*,\s*)*[A-Za-z_]\w*)\s*:=(.*)$", re.S)
_IMPORT_SPEC = re.compile(r'(?:([A-Za-z_]\w*|\.)\s+)?"([^"]+)"')
_FUNC = re.compile(r"^func\s+([A-Za-z_]\w*)\s*[\[(]")
_METHOD = re.compile(
    r"^func\s*\(\s*(?:[A-Za-z_]\w*\s+)?\*?\s*([A-Za-z_]\w*)[^)]*\)\s*([A-Za-z_]\w*)"
)
_GROUP_NAME = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)", re.M)


def statements(code: str) -> list[str]:
    """The cell's top-level statements (each a piece of the source, comments kept)."""
    out: list[str] = []
    start = 0
    depth = 0
    last = ""  # the last significant token's text, for automatic semicolons
    i, n = 0, len(code)
    while i < n:
        ch = code[i]
        if ch == "/" and code.startswith("//", i):
            end = code.find("\n", i)
            i = n if end < 0 else end
            continue
        if ch == "/" and code.startswith("/*", i):
            end = code.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if ch in "\"'`":
            i = _skip_literal(code, i)
            last = ch
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        in_header = ch == ";" and code[start:i].split()[:1] in (["for"], ["if"], ["switch"])
        if depth == 0 and ((ch == ";" and not in_header)
                           or (ch == "\n" and _takes_semicolon(last))):
            piece = code[start:i].strip()
            if piece:
                out.append(piece)
            start = i + 1
            last = ""
            i += 1
            continue
        if not ch.isspace():
            word = re.match(r"\w+|\+\+|--|.", code[i:])
            assert word is not None
            last = word.group(0)
            i += len(last)
            continue
        i += 1
    tail = code[start:].strip()
    if tail:
        out.append(tail)
    return out


def _skip_literal(code: str, i: int) -> int:
    quote = code[i]
    j = i + 1
    while j < len(code):
        if code[j] == "\\" and quote != "`":
            j += 2
            continue
        if code[j] == quote or (code[j] == "\n" and quote != "`"):
            return j + 1
        j += 1
    return j


def _takes_semicolon(last: str) -> bool:
    return bool(last) and (last in _KEYWORD_END or bool(_ENDS_STATEMENT.search(last)))


@dataclass
class Cell:
    """One cell, split: ``imports`` as (alias, path), keyed declarations, and main's body."""

    imports: list[tuple[str, str]] = field(default_factory=list)
    decls: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    main: str | None = None  # the body of a ``func main`` the cell declares itself


def split(code: str) -> Cell:
    cell = Cell()
    for stmt in statements(code):
        head = stmt.split(None, 1)[0] if stmt.split() else ""
        if head == "package":
            continue
        if head == "import":
            specs = _IMPORT_SPEC.finditer(stmt[len("import"):])
            cell.imports.extend((m.group(1) or "", m.group(2)) for m in specs)
        elif head == "type":
            cell.decls.append((tuple("type:" + n for n in _names(stmt, "type")), stmt))
        elif head in ("var", "const"):
            cell.decls.append((tuple("value:" + n for n in _names(stmt, head)), stmt))
        elif (m := _FUNC.match(stmt)) is not None:
            if m.group(1) == "main":
                cell.main = stmt[stmt.index("{") + 1: stmt.rindex("}")] if "{" in stmt else ""
            else:
                cell.decls.append((("value:" + m.group(1),), stmt))
        elif (m := _METHOD.match(stmt)) is not None:
            cell.decls.append((("method:" + m.group(1) + "." + m.group(2),), stmt))
        elif (m := _SHORT_VAR.match(stmt)) is not None and not head.startswith(("if", "for")):
            names = [n.strip() for n in m.group(1).split(",")]
            real = tuple("value:" + n for n in names if n != "_")
            cell.decls.append((real, f"var {', '.join(names)} ={m.group(2)}"))
        else:
            cell.body.append(stmt)
    return cell


def _names(stmt: str, keyword: str) -> list[str]:
    rest = stmt[len(keyword):].strip()
    if rest.startswith("("):
        inner = rest[1: rest.rfind(")")]
        names: list[str] = []
        for piece in statements(inner):
            m = _GROUP_NAME.match(piece)
            if m:
                names.extend(n.strip() for n in m.group(1).split(","))
        return [n for n in names if n != "_"]
    m = _GROUP_NAME.match(rest)
    return [n.strip() for n in m.group(1).split(",") if n.strip() != "_"] if m else []


@dataclass
class GoState:
    """What a Go context remembers: imports and declarations, in the order they came."""

    imports: dict[tuple[str, str], None] = field(default_factory=dict)
    decls: list[tuple[tuple[str, ...], str]] = field(default_factory=list)

    def with_cell(self, cell: Cell) -> GoState:
        """The state after ``cell`` (a new object: committed only once the program compiles)."""
        imports = dict(self.imports)
        imports.update((spec, None) for spec in cell.imports)
        decls = list(self.decls)
        for keys, text in cell.decls:
            if keys:
                decls = [(k, t) for k, t in decls if not set(k) & set(keys)]
            decls.append((keys, text))
        return GoState(imports, decls)

    def program(self, body: str) -> str:
        """The whole program: declarations, the imports it uses, and ``body`` as main."""
        decl_text = "\n\n".join(text for _, text in self.decls)
        used = decl_text + "\n" + body
        lines = ["package main", ""]
        for alias, path in self.imports:
            name = alias or path.rstrip("/").rsplit("/", 1)[-1]
            if alias in (".", "_") or re.search(rf"\b{re.escape(name)}\s*\.", used):
                lines.append(f'import {alias + " " if alias else ""}"{path}"')
        lines += ["", decl_text, "", "func main() {", body, "}", ""]
        return "\n".join(lines)
