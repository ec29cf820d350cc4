"""How a Go cell is split into declarations that persist and statements that run once."""

from __future__ import annotations

from sandlot.execd.code.kernels.gocell import GoState, split, statements


def test_statements_follow_go_semicolon_rules():
    code = (
        'x := "a;b}" // c { \n'
        "for i := 0; i < 2; i++ {\n  y := `raw\n{`\n  _ = y\n}\n"
        "f(1,\n  2)\n"
        "/* block; { */ z := 'x'\n"
    )
    assert statements(code) == [
        'x := "a;b}" // c {',
        "for i := 0; i < 2; i++ {\n  y := `raw\n{`\n  _ = y\n}",
        "f(1,\n  2)",
        "/* block; { */ z := 'x'",
    ]


def test_split_sorts_declarations_from_statements():
    cell = split(
        'package main\nimport (\n  "fmt"\n  m "math"\n)\n'
        "type P struct{ X int }\n"
        "func (p *P) Inc() { p.X++ }\n"
        "func add(a, b int) int { return a + b }\n"
        "const k = 2\nvar (\n  a = 1\n  b, c = 2, 3\n)\n"
        "n, _ := add(1, 2), 0\n"
        "fmt.Println(n, m.Pi)\n"
    )
    assert cell.imports == [("", "fmt"), ("m", "math")]
    keys = [k for k, _ in cell.decls]
    assert keys == [("type:P",), ("method:P.Inc",), ("value:add",), ("value:k",),
                    ("value:a", "value:b", "value:c"), ("value:n",)]
    assert cell.decls[-1][1] == "var n, _ = add(1, 2), 0"
    assert cell.body == ["fmt.Println(n, m.Pi)"]


def test_later_declarations_replace_earlier_and_unused_imports_are_left_out():
    first = split('import "fmt"\nimport "os"\nx := 1\nfunc f() int { return 1 }')
    state = GoState().with_cell(first)
    state = state.with_cell(split("func f() int { return 2 }\nx := f()"))
    program = state.program("fmt.Println(x)")
    assert program.count("func f()") == 1 and "return 2" in program
    assert "var x = f()" in program and "var x = 1" not in program
    assert 'import "fmt"' in program and '"os"' not in program


def test_user_main_runs_once_and_is_not_kept():
    cell = split('import "fmt"\nfunc main() {\n  fmt.Println("hi")\n}')
    assert cell.main is not None and "Println" in cell.main
    assert cell.decls == []
