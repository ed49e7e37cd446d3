"""The size rules of `trainers/`: no module over 500 lines and no function over 60, so that a
module holds one responsibility and a function reads in one screen.

Read from the source as the rules count: a module's lines (`str.splitlines`, what `wc -l` counts
for a file that ends in a newline), a function's from its `def` line to its last
(`end_lineno - lineno + 1`, its decorators not counted), for every function at any depth: methods,
nested functions and closures included.
"""

from __future__ import annotations

import ast
from pathlib import Path

TRAINERS = Path(__file__).resolve().parents[2] / "trainers"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function in `source`, at any depth."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def oversized(root: Path) -> list[str]:
    """Every module over MAX_MODULE_LINES and every function over MAX_FUNCTION_LINES under
    `root`, one line each (path relative to `root`'s parent)."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        lines = module_lines(path)
        if lines > MAX_MODULE_LINES:
            problems.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES})")
        for name, first, length in function_lengths(path.read_text(encoding="utf-8")):
            if length > MAX_FUNCTION_LINES:
                problems.append(
                    f"{where}:{first} {name}: {length} lines (at most {MAX_FUNCTION_LINES})"
                )
    return problems


def test_the_rules_read_the_trainers_package() -> None:
    # A wrong root would find nothing and pass whatever the code's size.
    assert len(list(TRAINERS.rglob("*.py"))) > 40
    fit = function_lengths((TRAINERS / "fit.py").read_text(encoding="utf-8"))
    assert "Trainer.fit" in {name for name, _, _ in fit}


def test_no_trainers_module_or_function_is_over_its_size() -> None:
    problems = oversized(TRAINERS)
    assert not problems, "split by responsibility:\n" + "\n".join(problems)


def test_the_rules_see_a_planted_module_and_function_just_over_their_size(tmp_path: Path) -> None:
    package = tmp_path / "planted"
    package.mkdir()

    def function(name: str, lines: int, indent: str = "") -> str:
        # A def line and a body of `lines - 1` statements: `lines` lines in all.
        body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
        return f"{indent}def {name}():\n{body}{indent}    return 0\n"

    fitting = function("fits", MAX_FUNCTION_LINES)
    (package / "fits.py").write_text(
        fitting + "\n" * (MAX_MODULE_LINES - len(fitting.splitlines()))
    )
    assert module_lines(package / "fits.py") == MAX_MODULE_LINES
    assert oversized(package) == []

    method = "class Loop:\n" + function("step", MAX_FUNCTION_LINES + 1, indent="    ")
    (package / "long.py").write_text(
        method + "\n" * (MAX_MODULE_LINES + 1 - len(method.splitlines()))
    )
    assert oversized(package) == [
        f"planted/long.py: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
        f"planted/long.py:2 Loop.step: {MAX_FUNCTION_LINES + 1} lines (at most "
        f"{MAX_FUNCTION_LINES})",
    ]
