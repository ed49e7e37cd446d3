"""Single-valued flags given more than once: click keeps the last with no word. The read-only
commands refuse it (`best --study A --study B` had shown B's); the others keep the last and say
so, as scripts override a base set of flags (`run $DEFAULTS --trials 5`), while `run --workload
mlp --workload convnet` had tuned convnet with no word."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

READ_ONLY = ("best", "export", "report", "studies")
"""The commands whose single-valued flags are refused when given twice (`repeated_flag`)."""

OVERRIDDEN: ContextVar[tuple[str, ...]] = ContextVar("overridden", default=())
"""This command line's notes from `overridden`, set by `tuner.__main__.main`."""


def _given(command: Any, argv: list[str]) -> list[tuple[str, str, str]]:
    """(parameter, flag as typed, value) for each single-valued flag on the command line, in
    order. Flags that take many (`multiple`) and on/off switches are left out."""
    sub = command.commands.get(argv[0]) if argv else None
    options = {o: p for p in getattr(sub, "params", ()) for o in getattr(p, "opts", ())}
    given = []
    tokens = iter(argv[1:])
    for token in tokens:
        name, eq, value = token.partition("=")
        param = options.get(name)
        if token == "--":
            break  # what follows is not flags
        if param is None or param.is_flag:
            continue
        if not eq:
            value = next(tokens, "")  # its value, whatever it looks like
        if not param.multiple:
            given.append((param.name, name, value))
    return given


def repeated_flag(command: Any, argv: list[str]) -> str | None:
    """The error for a single-valued flag of a read-only command given twice, else None: click
    kept the last silently (`best --study A --study B` showed B's)."""
    if not argv or argv[0] not in READ_ONLY:
        return None
    seen: set[str] = set()
    for param, name, _ in _given(command, argv):
        if param in seen:
            return f"{name}: given more than once; allowed once"
        seen.add(param)
    return None


def overridden(command: Any, argv: list[str]) -> list[str]:
    """One note for each single-valued flag of another command given twice with different
    values: the last is kept, as click does, but `run --workload mlp --workload convnet` had
    tuned convnet with no word."""
    if not argv or argv[0] in READ_ONLY:
        return []
    values: dict[str, list[tuple[str, str]]] = {}
    for param, name, value in _given(command, argv):
        values.setdefault(param, []).append((name, value))
    notes = []
    for given in values.values():
        if len({value for _, value in given}) > 1:
            (name, last), earlier = given[-1], [value for _, value in given[:-1]]
            dropped = ", ".join(repr(v) for v in dict.fromkeys(earlier) if v != last)
            notes.append(
                f"note: {name} given {len(given)} times; using the last, {last!r} "
                f"({dropped} ignored)"
            )
    return notes


def say_overridden(say: Callable[[str], None] | None = None) -> None:
    """Say this command line's notes, by `say` (`run`'s progress) or on stderr: called by a
    command once its flags are checked, so that a refused flag is still one line."""
    for note in OVERRIDDEN.get():
        if say is None:
            print(note, file=sys.stderr)
        else:
            say(note)
