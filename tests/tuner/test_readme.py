"""The README as a new user reads it: short, in the order of a first hour, free of internal
references, its sample output made from a real run and not stale, and every shell block run.

Each ```bash block is tagged by the comment before it: `ci` (the two commands, which `.ci/run`
runs in fresh virtual environments), `cpu` (run here, as written, in an empty folder),
`service` (tests/api/test_readme_service.py runs it) or `gpu` (test_readme_gpu_blocks_run, on a
GPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tuner.conftest import Finished
from tools.readme_commands import readme_commands
from tools.readme_sample import SAMPLE, progress_text, summary_text

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
ORDER = [
    "## The two commands",
    "## What you will see",
    "## Tune your own model",
    "## Train with the result",
    "## The service",
    "## On a GPU",
    "## More",
]
TAGS = {"ci", "cpu", "service", "gpu", "python"}
# Commit hashes (7-40 hexadecimal digits with at least one letter and one digit), issue numbers,
# and the paths of the machine this project is developed on.
INTERNAL = re.compile(
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b|\bissues? #?\d+|#\d{2,}\b|shared/"
    r"|GPU-FACTS",
    re.I,
)


def blocks(text: str) -> list[tuple[str, str]]:
    """(tag, body) of each tagged fenced block, in order."""
    return re.findall(r"<!-- test: (\w+) -->\n```\w+\n(.*?)```", text, re.S)


def test_the_readme_is_short_and_in_a_new_users_order() -> None:
    assert len(README.splitlines()) <= 250
    headings = [line for line in README.splitlines() if line.startswith("## ")]
    assert headings == ORDER


def test_every_shell_block_is_tagged_with_the_test_that_runs_it() -> None:
    fences = re.findall(r"(?:<!-- test: (\w+) -->\n)?```bash\n", README)
    assert fences and all(tag in TAGS for tag in fences), fences
    assert [tag for tag, _ in blocks(README)].count("ci") == 1
    # .ci/run reads the first ```bash block: the tagged `ci` one, with its two commands.
    (ci,) = [body for tag, body in blocks(README) if tag == "ci"]
    assert readme_commands(README) == [
        line for line in ci.splitlines() if line.strip() and not line.startswith("#")
    ]
    assert len(readme_commands(README)) == 2


@pytest.mark.parametrize(
    "path", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
)
def test_no_internal_references_outside_docs_benchmarks(path: str) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")
    # Links into docs/benchmarks/ may name a run by its commit: that is the evidence's place.
    text = re.sub(r"\]\((?:docs/)?benchmarks/[^)]*\)", "]()", text)
    found = [m.group(0) for m in INTERNAL.finditer(text)]
    assert not found, found


def test_the_readme_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_sample_blocks_are_what_the_stored_run_renders_to() -> None:
    """Fails when the summary's renderer changed since the sample was made (a new row, a new
    wording): run `python tools/readme_sample.py` again."""
    summary = json.loads((SAMPLE / "summary.json").read_text())
    shown = re.search(r"<!-- sample:summary -->\n```text\n(.*?)```", README, re.S)
    assert shown and shown.group(1).rstrip("\n") == summary_text(summary)
    progress = (SAMPLE / "progress.txt").read_text().splitlines()
    shown = re.search(r"<!-- sample:progress -->\n```text\n(.*?)```", README, re.S)
    assert shown and shown.group(1).rstrip("\n") == progress_text(progress)
    facts = json.loads((SAMPLE / "run.json").read_text())
    assert f"in {facts['wall_s']:.0f} s" in README  # the timing the README states is the run's


def _keys(value: object, prefix: str = "") -> set[str]:
    if not isinstance(value, dict):
        return set()
    found = set()
    for key, inner in value.items():
        if key in ("ties", "verdicts", "profile_errors", "failures", "speedup", "windows"):
            found.add(prefix + key)  # keyed by config name: the names vary from run to run
            continue
        if prefix == "parity." and key == "time":
            # The gate parts this check ran: the reference and envelope only where the
            # recommended config was the first checked (CI, 2026-11-28: a run where it was).
            found.add(prefix + key)
            continue
        found |= {prefix + key} | _keys(inner, f"{prefix}{key}.")
    return found


def test_the_stored_run_has_every_field_a_fresh_run_has(finished: Finished) -> None:
    """Fails when a run now records what the stored sample lacks (the FLOPs row of a newer run,
    say): the sample is stale; run `python tools/readme_sample.py` again."""
    stored = json.loads((SAMPLE / "summary.json").read_text())
    missing = {k for k in _keys(finished.rec) - _keys(stored) if not k.startswith("time.")}
    # A GPU-only or run-dependent field may be null in one and a dict in the other.
    missing = {k for k in missing if k.split(".")[0] in stored and stored[k.split(".")[0]]}
    assert not missing, sorted(missing)
    assert set(finished.rec) <= set(stored), sorted(set(finished.rec) - set(stored))


def _bash(script: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    # The checkout stands for the installed package, ahead of what the caller's path holds: a
    # lent GPU's wheels (optuna among them) sit on PYTHONPATH, and the GPU block's run had
    # failed there with "No module named 'optuna'" (2026-12-07, b280010).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _losses(out: str) -> dict[int, str]:
    found = [line.split(": loss ") for line in out.splitlines() if line.startswith("step ")]
    return {int(step.removeprefix("step ")): loss for step, loss in found}


@pytest.mark.slow
def test_the_cpu_blocks_run_as_written(tmp_path: Path) -> None:
    """The `cpu` blocks, in order, in one empty folder (a user's). The train block needs the
    study of the first command: a short run of the same command (fewer trials and windows) makes
    it, under the same name."""
    quick = (
        "python -m tuner run --workload transformer --preset tiny --trials 2 --timeout 10 "
        "--warmup 1 --windows 3 --window-steps 2 --final-rounds 1 --quiet"
    )
    made = _bash(quick, tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    cpu = [body for tag, body in blocks(README) if tag in ("cpu", "python")]
    assert len(cpu) == 3
    outputs = []
    for tag, body in [(t, b) for t, b in blocks(README) if t in ("cpu", "python")]:
        if tag == "python":
            (tmp_path / "snippet.py").write_text(body)
            body = "python snippet.py"
        done = _bash(body, tmp_path)
        assert done.returncode == 0, (body, done.stdout[-2000:], done.stderr[-3000:])
        outputs.append(done)
    own, train, _ = outputs
    assert "my_model" in own.stdout
    # The train block: the first run to 1000, the resumed one from 500, then 500 more.
    first, resumed, more = train.stdout.split("trained ")[:3]
    whole = _losses(first)
    again = _losses(resumed.split("\n", 1)[1])
    assert sorted(again) == list(range(600, 1001, 100))
    assert again == {step: loss for step, loss in whole.items() if step > 500}
    assert sorted(_losses(more.split("\n", 1)[1])) == list(range(1100, 1501, 100))
    assert (tmp_path / "run-500.pt").is_file() and (tmp_path / "run-1000.pt").is_file()


@pytest.mark.gpu
def test_the_gpu_block_runs_as_written(tmp_path: Path) -> None:
    (gpu,) = [body for tag, body in blocks(README) if tag == "gpu"]
    done = _bash(gpu, tmp_path, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "transformer-small-" in done.stdout


DOCS = sorted((ROOT / "docs").glob("*.md"))
DOC_TAGS = {"cpu", "gpu", "multi-node"}  # multi-node: several machines, which no test has


def test_every_docs_shell_block_is_tagged() -> None:
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        fences = re.findall(r"(?:<!-- test: ([\w-]+) -->\n)?```bash\n", text)
        assert all(tag in DOC_TAGS for tag in fences), (path.name, fences)


@pytest.mark.slow
def test_the_docs_cpu_blocks_run_as_written(tmp_path: Path) -> None:
    ran = 0
    for path in DOCS:
        for tag, body in re.findall(
            r"<!-- test: ([\w-]+) -->\n```bash\n(.*?)```", path.read_text(encoding="utf-8"), re.S
        ):
            if tag != "cpu":
                continue
            # Paths in the blocks are the checkout's (examples/...): run them from its root, on
            # a storage of the test's own.
            script = f"export TUNER_STORAGE=sqlite:///{tmp_path}/docs.db\ncd {ROOT}\n{body}"
            done = _bash(script, tmp_path)
            assert done.returncode == 0, (path.name, body, done.stderr[-3000:])
            ran += 1
    assert ran >= 1
