"""Time to an answer: the default job cold, then again as a repeat job on a fresh machine given
only the first job's storage and compile artefacts file.

    STREAMTUNE_COMMIT=$(git rev-parse --short HEAD) python benchmarks/time_to_answer.py \\
        --presets hf:causal-lm:llama-1b --precisions bf16-autocast,float8 --out docs/benchmarks

For each preset:
- `cold`: `python -m tuner run --workload W --preset P --json` in a fresh SQLite file, with the
  study's own compile cache (`<db>-artifacts/inductor-cache/`, Triton's kernels inside it) new
  and empty, as a user's first job on a fresh machine;
- `repeat`: the same command, a new study (`--study <cold's>-repeat`), in another fresh folder
  that holds only a copy of the cold job's SQLite file (its studies and the gate memo in it) and
  of its compile artefacts file (`tuner.search.measuring.artifacts.ARTIFACTS_FILE`): its Inductor
  and Triton caches are empty, as on another machine given those two files (the new study begins
  with the cold study's trials, `tuner.search.earlier`, and its verdicts and profiles);
- both recommendations measured on one device, interleaved (`--rounds`): the repeat's throughput
  over the cold job's with a 95 % bootstrap CI (`tuner.search.measuring.stats.ratio_ci`).

Writes `time-to-answer-<gpu>-<date>[-tag].json` (a list `presets`, one entry per model: `model`,
`cold` and `repeat`, each with `wall_s`, `phases` (seconds by phase, summed over the job's
processes) and `reused` (what it did not run again), and `ratio_repeat_vs_cold`) and its Markdown
twin, after each preset. Each job's progress lines go beside it. `--device cpu` runs the same
logic on this machine's CPU (the test of this script; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trainers  # noqa: E402
from benchmarks.node import interleaved  # noqa: E402
from benchmarks.run_meta import job_parser, provenance, run_meta  # noqa: E402
from tuner.evidence.profiles import ARTIFACTS_ENV, artifact_dir  # noqa: E402
from tuner.search.measuring.artifacts import ARTIFACTS_FILE, COMPILE_CACHE_ENV  # noqa: E402

AIMS_S = {"cold": 600.0, "repeat": 240.0}
"""The aims at 1B (a cold job within 10 minutes, a repeat job within 4)."""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = job_parser(__doc__, presets="hf:causal-lm:llama-1b", rounds=1)
    return parser.parse_args(argv)


def compile_cache(db: Path) -> Path:
    """The study's own compile cache beside its SQLite file, where the job saves its artefacts
    file: `inductor-cache/` in the study's artifact folder (`share_compile_cache`), with
    $TUNER_ARTIFACTS and $TUNER_COMPILE_CACHE unset (`job` unsets them)."""
    return artifact_dir(f"sqlite:///{db}", None) / "inductor-cache"


def job(
    args: argparse.Namespace, spec: str, db: Path, study: str | None, name: str
) -> dict[str, Any]:
    """One default job on `db` (a new study named `study`, None: the job's own name): its wall
    time (process start to exit, as a user waits) and its answer (`run --json`)."""
    workload, preset = spec.rsplit(":", 1)
    command = [
        sys.executable, "-m", "tuner", "run", "--workload", workload, "--preset", preset,
        "--device", args.device, "--storage", f"sqlite:///{db}", "--json", *args.job_arg,
    ]  # fmt: skip
    if args.precisions:
        command += ["--precisions", args.precisions]
    if study is not None:
        command += ["--study", study]
    # The study's own cache, nothing the machine had: Inductor's and Triton's (Triton's kernels
    # then go inside Inductor's folder).
    env = {k: v for k, v in os.environ.items() if k not in _CACHE_VARIABLES}
    # The tag in the name: two lanes of one machine writing to one folder each keep their own
    # logs (2026-12-01: the second lane's cold log replaced the first's).
    stem = f"time-to-answer-{preset}{f'-{args.tag}' if args.tag else ''}-{name}"
    log = args.out / f"{stem}.log"
    started = time.perf_counter()
    # The progress lines go to the log as they come: a job cut off (a lent machine taken back
    # mid-job, 2026-11-29) leaves what it had done.
    with log.open("w") as stderr:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=args.timeout,
        )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"{spec} ({name}) failed ({done.returncode}): {tail}")
    (args.out / f"{stem}-recommendation.json").write_text(done.stdout)
    return {"wall_s": wall, "recommendation": json.loads(done.stdout)}


# Each job's caches are its study's own folder beside its SQLite file, never one the machine or
# the user named (a shared one would warm the repeat job with more than the artefacts file).
_CACHE_VARIABLES = (
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", COMPILE_CACHE_ENV, ARTIFACTS_ENV,
)  # fmt: skip


def given_elsewhere(cold_db: Path, folder: Path, saved_entries: int) -> tuple[Path, bool]:
    """A fresh folder holding only what a user copies to another machine: the SQLite file and
    the compile artefacts file, the latter where that job's study will look for it. Returns the
    copy's SQLite file and whether an artefacts file was copied; raises where the cold job
    says it saved entries and no file is where it saves them (a repeat job measured without it
    would pass for a cold one)."""
    folder.mkdir(parents=True)
    db = folder / cold_db.name
    shutil.copyfile(cold_db, db)
    saved = compile_cache(cold_db) / ARTIFACTS_FILE
    if not saved.is_file():
        if saved_entries > 0:
            raise RuntimeError(
                f"the cold job saved {saved_entries} compile entries, not in {saved}"
            )
        return db, False
    compile_cache(db).mkdir(parents=True)
    shutil.copyfile(saved, compile_cache(db) / ARTIFACTS_FILE)
    return db, True


def summary(run: Mapping[str, Any]) -> dict[str, Any]:
    """A job's wall time, its phases and what it reused (the answer's `time` and `search`)."""
    rec = run["recommendation"]
    time_ = rec.get("time") or {}
    search = rec.get("search") or {}
    return {
        "wall_s": run["wall_s"],
        "phases": time_.get("phases"),
        "reused": {
            "compile_artifacts": search.get("compile_artifacts"),
            "verdicts_reused": search.get("verdicts_reused"),
            "reference_reused": search.get("reference_reused"),
            "profiles_copied": search.get("profiles_copied"),
            "trials_copied": search.get("trials_copied"),
        },
        "study": rec.get("study"),
        "config": rec.get("config"),
        "precision": rec.get("precision"),
        "trial_counts": rec.get("trial_counts"),
    }


def entry(
    args: argparse.Namespace, spec: str, scratch: Path, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """One preset's entry; `save` is given it once the jobs have ended, before the interleaved
    comparison (minutes: each pick compiles), with `ratio_repeat_vs_cold` None, so that a run
    cut off there keeps both jobs' times (2026-12-02: the lent machine went back during it)."""
    cold_db = scratch / "cold" / "study.db"
    cold_db.parent.mkdir(parents=True)
    cold = job(args, spec, cold_db, None, "cold")
    search = cold["recommendation"].get("search") or {}
    saved = int((search.get("compile_artifacts") or {}).get("saved") or 0)
    db, copied = given_elsewhere(cold_db, scratch / "repeat", saved)
    repeat = job(args, spec, db, f"{cold['recommendation']['study']}-repeat", "repeat")
    workload, preset = spec.rsplit(":", 1)
    picks = {"cold": cold["recommendation"], "repeat": repeat["recommendation"]}
    found = {
        "model": spec,
        # A held-out model is a preset changed by --model-arg (`--job-arg`): named by both.
        "model_args": dict(picks["cold"].get("model_args") or {}),
        "cold": summary(cold),
        "repeat": summary(repeat),
        "same_config": picks["cold"].get("config") == picks["repeat"].get("config")
        and picks["cold"].get("precision") == picks["repeat"].get("precision"),
        "artifacts_file_copied": copied,
        "samples_per_s": None,
        "ratio_repeat_vs_cold": None,
        "aims_s": AIMS_S,
    }
    save(found)
    samples, ratio = interleaved(args, workload, preset, picks, over="cold")
    return found | {"samples_per_s": samples, "ratio_repeat_vs_cold": ratio["repeat"]}


def markdown(data: Mapping[str, Any]) -> str:
    lines = [
        "# Time to an answer: the default job cold, and again on a fresh machine given its files",
        "",
        provenance(data["meta"]),
        "",
        "| model | cold s | repeat s | repeat reused | same config | repeat's pick / cold's "
        "(95 % CI) |",
        "|---|---|---|---|---|---|",
    ]
    for e in data["presets"]:
        r = e["ratio_repeat_vs_cold"]
        compared = (
            "not measured"
            if r is None
            else (f"{r['ratio']:.3f} ({r['ci95'][0]:.3f}-{r['ci95'][1]:.3f})")
        )
        reused = e["repeat"]["reused"]
        loaded = (reused.get("compile_artifacts") or {}).get("loaded", 0)
        trials = (reused.get("trials_copied") or {}).get("trials", 0)
        shown = (
            f"{loaded} compile artefacts, {trials} trials, "
            f"{reused.get('verdicts_reused') or 0} verdicts, "
            f"{len(reused.get('profiles_copied') or [])} profiles"
        )
        changed = " ".join(f"{k}={v}" for k, v in (e.get("model_args") or {}).items())
        model = f"{e['model']} ({changed})" if changed else e["model"]
        lines.append(
            f"| {model} | {e['cold']['wall_s']:.0f} | {e['repeat']['wall_s']:.0f} | {shown} "
            f"| {'yes' if e['same_config'] else 'no'} | {compared} |"
        )
    lines += ["", "Seconds by phase (summed over each job's processes):", ""]
    for e in data["presets"]:
        for name in ("cold", "repeat"):
            phases = e[name]["phases"] or {}
            parts = ", ".join(f"{k} {v:.0f}" for k, v in phases.items() if v >= 0.5)
            lines.append(f"- {e['model']}, {name}: {parts or 'none recorded'}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    for name in _CACHE_VARIABLES:  # here too: `compile_cache` reads the same folders the jobs do
        os.environ.pop(name, None)
    meta, stem = run_meta(
        trainers.resolve_device(args.device), "time_to_answer.py", argv, args.commit
    )
    data: dict[str, Any] = {"meta": meta, "presets": []}
    name = f"time-to-answer-{stem}{f'-{args.tag}' if args.tag else ''}"
    meta["file"] = f"{name}.json"
    args.out.mkdir(parents=True, exist_ok=True)

    def write(entries: list[dict[str, Any]]) -> None:
        # Written after each preset's jobs and again after its comparison: a run cut short keeps
        # what it measured.
        shown = {**data, "presets": entries}
        (args.out / f"{name}.json").write_text(json.dumps(shown, indent=2) + "\n")
        (args.out / f"{name}.md").write_text(markdown(shown))

    with tempfile.TemporaryDirectory(prefix="streamtune-tta-") as tmp:
        done: list[dict[str, Any]] = data["presets"]
        for index, spec in enumerate(args.presets.split(",")):
            found = entry(args, spec.strip(), Path(tmp) / str(index), lambda e: write([*done, e]))
            done.append(found)
            write(done)
    print(f"wrote {args.out / name}.json")


if __name__ == "__main__":
    main()
