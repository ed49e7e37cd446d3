"""The size rules of `trainers/`, `tuner/`, `api/` and `benchmarks/` (the project's structure
issue): no module over 500 lines, no function or method over 60 (`end_lineno - lineno + 1` of its
`def`, nested ones included).

Each check first runs on sources made to break its rule, so a check that finds nothing cannot
pass for one that looks: a module or function that grows past its limit fails the test, named.
"""

from __future__ import annotations

import ast
from pathlib import Path

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainers", "tuner", "api", "benchmarks")


def module_lines(source: str) -> int:
    return len(source.splitlines())


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """Every function, method and nested function longer than `limit` lines: (name, lines)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def modules() -> list[Path]:
    found = []
    for package in PACKAGES:
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, f"no Python modules under {package}/"
        found += files
    return found


def _body(statements: int, indent: str) -> str:
    return "\n".join(f"{indent}x{i} = {i}" for i in range(statements))


def test_the_checks_find_what_breaks_the_rules() -> None:
    at_limit = f"def fits():\n{_body(MAX_FUNCTION_LINES - 1, '    ')}\n"
    assert long_functions(at_limit) == []
    over = (
        f"def plain():\n{_body(MAX_FUNCTION_LINES, '    ')}\n\n"
        f"class Holder:\n    async def method(self):\n{_body(MAX_FUNCTION_LINES, '        ')}\n\n"
        f"def outer():\n    def inner():\n{_body(MAX_FUNCTION_LINES, '        ')}\n"
        "    return inner\n"
    )
    assert long_functions(over) == [
        ("plain", MAX_FUNCTION_LINES + 1),
        ("outer", MAX_FUNCTION_LINES + 3),
        ("method", MAX_FUNCTION_LINES + 1),
        ("inner", MAX_FUNCTION_LINES + 1),
    ]
    assert module_lines("x = 1\n" * (MAX_MODULE_LINES + 1)) > MAX_MODULE_LINES


def test_no_module_is_over_500_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): module_lines(p.read_text()) for p in modules()}
    over = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by responsibility): {over}"


def test_no_function_is_over_60_lines() -> None:
    over = {
        f"{p.relative_to(ROOT)}:{name}": lines
        for p in modules()
        for name, lines in long_functions(p.read_text())
    }
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
