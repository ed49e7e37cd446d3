"""The import structure: `trainers` < `tuner` (store < evidence < search < service < cli) < `api`.

Read from the source (every `import`, at any depth, type-checking ones included), so a lazy import
inside a function cannot hide an upward dependency; and once at run time in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Layers of `tuner`, lowest first; a module may import its own layer and those before it.
TUNER_LAYERS = ("errors", "store", "evidence", "search", "service", "cli")
# What each top-level package must never import.
FORBIDDEN = {
    "trainers": ("tuner", "api", "optuna", "fastapi", "sqlalchemy"),
    "tuner": ("api", "fastapi", "starlette", "uvicorn"),
}


def imports_of(path: Path) -> set[str]:
    """Absolute module names imported anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def layer_of(module: str) -> int | None:
    """The layer index of a `tuner.<x>...` module name; None for `tuner` itself."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "tuner":
        return None
    name = parts[1]
    if name in TUNER_LAYERS:
        return TUNER_LAYERS.index(name)
    return len(TUNER_LAYERS)  # __main__ and anything new: the top


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_never_imports_what_sits_above_it(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules(package)
        for name in imports_of(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert not offenders, "\n".join(offenders)


def test_tuner_sub_packages_import_only_downwards() -> None:
    offenders = []
    for path in modules("tuner"):
        relative = path.relative_to(ROOT).with_suffix("")
        own = layer_of(".".join(relative.parts))
        if own is None:
            continue  # tuner/__init__.py: the package's face re-exports every layer
        for name in imports_of(path):
            target = layer_of(name)
            if target is not None and target > own:
                offenders.append(f"{relative} (layer {TUNER_LAYERS[own]}) imports {name}")
    assert not offenders, "\n".join(offenders)


def test_the_layer_rule_sees_an_upward_import(tmp_path: Path) -> None:
    planted = tmp_path / "bad.py"
    planted.write_text("def f():\n    from tuner.service.worker import Worker\n    return Worker\n")
    assert "tuner.service.worker" in imports_of(planted)
    assert layer_of("tuner.service.worker") > layer_of("tuner.store.keys")  # type: ignore[operator]


def test_importing_the_tuner_cli_loads_no_http_layer() -> None:
    code = (
        "import sys, tuner, tuner.cli, tuner.service.worker; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('api', 'fastapi')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
