"""`run`'s and `train`'s flags that are lists in a string: `--precisions a,b`, `--model-arg k=v`.
Import-free (the CLI parses them before PyTorch loads)."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import TunerError


def parse_precisions(text: str | None) -> tuple[str, ...] | None:
    """`--precisions a,b` as a tuple (`RunOptions` checks each value and the rest)."""
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(","))


def parse_model_args(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`--model-arg key=value` items as a mapping; the adapter checks keys and values."""
    parsed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TunerError(f"--model-arg: {item!r} is invalid: allowed key=value")
        if key.strip() in parsed:
            raise TunerError(f"--model-arg: {key.strip()!r} is given twice")
        value = value.strip()
        named = Path(value).expanduser()
        if key.strip() == "config" and named.is_file():
            # Absolute, as the study stores it: the exported script and the summary's commands
            # had named `llama.json` and ran only from the folder the study was tuned in (a
            # user's probe, 2026-12-06).
            value = str(named.resolve())
        parsed[key.strip()] = value
    return parsed


def program_workload(program: str | None, workload: str) -> str:
    """The workload `--program` and `--workload` name: `program:NAME` for a program, which
    with another --workload than the default is one line (the workload had been dropped)."""
    if program is None:
        return workload
    if workload != "transformer":  # --workload's default: not given
        raise TunerError(
            f"--program: {program!r} with --workload {workload!r}: allowed one of them "
            "(--program NAME is --workload program:NAME)"
        )
    return f"program:{program}"
