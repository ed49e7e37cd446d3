"""Make the README's sample output from a real run: the first command, as a user runs it.

    python tools/readme_sample.py            # run the job, store it, rewrite the README's blocks
    python tools/readme_sample.py --render   # rewrite the blocks from the stored run only

It runs `python -m tuner run --workload transformer --preset tiny --trials 10` in an empty folder
(the embedded SQLite default there), and stores what a user saw in `docs/sample/`: the progress
lines (`progress.txt`), the recommendation as `best --json` prints it (`summary.json`) and the
wall time (`run.json`). The README's blocks between `<!-- sample:progress -->` and
`<!-- sample:summary -->` markers and their `<!-- /sample -->` ends are then written from those
files, the summary by the same renderer `best` uses. `tests/tuner/test_readme.py` renders the
stored run again and fails when the README's block differs (the renderer changed) or when a fresh
run's recommendation has fields the stored one lacks (the run changed): then run this again.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "docs" / "sample"
COMMAND = ["-m", "tuner", "run", "--workload", "transformer", "--preset", "tiny", "--trials", "10"]
STUDY = "transformer-tiny-cpu"
WIDTH = 100  # the summary's width in the README (a terminal's would vary)
HEAD, TAIL = 6, 9  # progress lines shown: the first and the last


def summary_text(recommendation: dict[str, object]) -> str:
    """The summary `python -m tuner best` prints for this recommendation, at WIDTH columns."""
    sys.path.insert(0, str(ROOT))
    from rich.console import Console

    from tuner.evidence import render
    from tuner.evidence.recommendation import Recommendation

    out = io.StringIO()
    console = Console(file=out, width=WIDTH, color_system=None, force_terminal=False)
    render.recommendation(console, Recommendation.from_dict(recommendation))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def progress_text(lines: list[str]) -> str:
    if len(lines) <= HEAD + TAIL:
        return "\n".join(lines)
    return "\n".join([*lines[:HEAD], "...", *lines[-TAIL:]])


def replace_block(readme: str, name: str, text: str) -> str:
    pattern = re.compile(rf"(<!-- sample:{name} -->\n```text\n)(.*?)(```\n<!-- /sample -->)", re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no <!-- sample:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + text.rstrip("\n") + "\n" + m.group(3), readme)


def run() -> None:
    """The first command in an empty folder; what it printed, stored in docs/sample/."""
    SAMPLE.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, *COMMAND], cwd=folder, env=env, capture_output=True, text=True
        )
        wall_s = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"the run failed:\n{done.stderr[-3000:]}")
        best = subprocess.run(
            [sys.executable, "-m", "tuner", "best", "--study", STUDY, "--json"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    (SAMPLE / "progress.txt").write_text(done.stderr)
    (SAMPLE / "summary.json").write_text(best.stdout)
    load = os.getloadavg()[0]
    facts = {"command": "python " + " ".join(COMMAND), "wall_s": round(wall_s, 1), "load": load}
    (SAMPLE / "run.json").write_text(json.dumps(facts, indent=2) + "\n")


def render_readme() -> None:
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    lines = (SAMPLE / "progress.txt").read_text().splitlines()
    readme = replace_block(readme, "progress", progress_text(lines))
    summary = json.loads((SAMPLE / "summary.json").read_text())
    readme = replace_block(readme, "summary", summary_text(summary))
    readme_path.write_text(readme, encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="from the stored run only")
    if not parser.parse_args().render:
        run()
    render_readme()
