"""`python -m tuner`: parse, delegate, and turn every input error into one line naming the flag."""

from __future__ import annotations

import os
import sys
from typing import Any

import typer
from typer import Abort, Exit

from tuner.cli import app, flag_error
from tuner.errors import Interrupted, NoRecommendation
from tuner.repeats import OVERRIDDEN, overridden, repeated_flag

try:  # recent typer carries its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import ClickException  # type: ignore[assignment]


def from_environment(message: str, argv: list[str]) -> str:
    """`message`, saying where a --storage it names came from when the command line gave none:
    TUNER_STORAGE's value had been blamed on a --storage the user never passed."""
    given = any(token == "--storage" or token.startswith("--storage=") for token in argv)
    if message.startswith("--storage: ") and not given and os.environ.get("TUNER_STORAGE"):
        return "--storage (not given; from TUNER_STORAGE): " + message.removeprefix("--storage: ")
    return message


def main(argv: list[str] | None = None) -> int:
    command = typer.main.get_command(app)
    words = sys.argv[1:] if argv is None else argv
    repeated = repeated_flag(command, words)
    if repeated is not None:
        print(f"error: {repeated}", file=sys.stderr)
        return 2
    # Said by the command once its flags are checked (`tuner.repeats.say_overridden`), so that a
    # refused flag is still one line.
    said = OVERRIDDEN.set(tuple(overridden(command, words)))
    try:
        return _main(command, argv, words)
    finally:
        OVERRIDDEN.reset(said)  # not said again by a later command in this process


def _main(command: Any, argv: list[str] | None, words: list[str]) -> int:
    try:
        # Not standalone, click returns a `typer.Exit`'s code (`run` without a recommendation).
        code = command.main(args=argv, prog_name="python -m tuner", standalone_mode=False)
    except ClickException as exc:
        # Click's own parse errors ("Invalid value for '--streams': ...") already name the flag.
        message = exc.format_message() or ""
        if message:  # empty for a bare `python -m tuner`, which has printed its help
            print(f"error: {message}", file=sys.stderr)
        return 2
    except (Abort, Interrupted) as exc:
        print(str(exc) or "aborted", file=sys.stderr)
        return 130
    except Exit as exc:
        return int(exc.exit_code or 0)
    except NoRecommendation as exc:
        # Nothing to export: the study's outcome, as `best` and `run` exit, not a usage error.
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        known = flag_error(exc)
        if known is None:
            raise
        print(f"error: {from_environment(known, words)}", file=sys.stderr)
        return 2
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
