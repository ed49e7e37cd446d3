"""`python -m tuner run --help` as a new user reads it (issue 56): four groups (what to tune,
how long, where it is stored, advanced), every option's default shown, no text meant for the
tests, the README's preset as the default, and no `<bool>` label on a flag that takes no value."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import typer

from tuner.cli import app
from tuner.flags import RunFlags

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ["What to tune", "How long", "Where it is stored", "Advanced"]


def run_options() -> list[typer.core.TyperOption]:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    return [p for p in command.params if p.name != "help"]


def test_every_run_option_is_in_one_of_four_groups_and_shows_its_default() -> None:
    options = run_options()
    assert len(options) > 30
    assert {o.rich_help_panel for o in options} == set(GROUPS)
    for option in options:
        assert option.show_default not in (None, False, ""), option.name
    tune = {o.name for o in options if o.rich_help_panel == "What to tune"}
    assert {"workload", "preset", "precision", "fix", "max_memory"} <= tune
    assert {o.name for o in options if o.rich_help_panel == "Where it is stored"} == {
        "storage",
        "study",
        "artifacts",
    }


def test_the_help_as_printed_is_grouped_shows_defaults_and_has_no_test_only_text() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "run", "--help"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Options", *GROUPS], panels
    for flag in ("--precision ", "--max-memory", "--fix", "--quiet", "--json"):
        (line,) = [x for x in text.splitlines() if x.startswith(f"│ {flag}")]
        assert "[default: " in line, line
    assert "(tests)" not in text and "TUNER_CPU_STANDINS" not in text
    assert "<bool>" not in text.split("╭─ What to tune")[1]  # a flag takes no value


def test_the_preset_default_is_the_readmes() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert f"--preset {RunFlags().preset}" in first
