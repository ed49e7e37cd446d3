"""The default tuning job as a new user runs it, timed cold then warm, with where the time went.

    python benchmarks/default_job.py --workload hf:causal-lm --precision bf16-autocast \
        --commit $(git rev-parse --short HEAD) --out docs/benchmarks --tag gpt2

Each run is `python -m tuner run --workload W [--preset P] [--precision X] --json` in a process
of its own, everything else at its default (flags after `--` are passed on), timed from the
command's start to its exit. The runs share one SQLite file, so one Inductor cache
(`<db>-artifacts/inductor-cache/`, `tuner.search.measuring.artifacts.share_compile_cache`): the
first run (`cold`) starts with that cache and a Triton cache both new and empty, as on a fresh
machine; each later run (`warm`) is a new study on what the runs before it compiled, as a user's
second job. Issue 29's aims: cold in at most 480 s, warm in at most 240 s.

`--reference peers.json`: the recommendation's ms/step beside the one a peers record
(`benchmarks/peers.py`) measured for the workload, preset, model options and precision the job
ran (defaults resolved: `--workload hf:causal-lm` alone runs preset `small`, not GPT-2's
`default`); "as fast" when
this run's interval reaches that one's or is faster (its fastest bound at or below the
reference's slowest).

Writes `default-job-<gpu>-<date>[-<tag>].json` and its Markdown twin after every run, so a run
cut short keeps the ones before it; each run's stderr (its progress lines) goes to
`<stem>-<run>.log` as it is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

import trainers
from benchmarks.run_meta import provenance, run_meta
from tuner.store import keys
from tuner.store.phases import study_time

REPO = Path(__file__).resolve().parents[1]
AIMS_S = {"cold": 480.0, "warm": 240.0}
"""Issue 29: the default job on a 125M model from a cold cache in at most 8 minutes, warm 4.
Other aims come with `--aim-cold`/`--aim-warm` (issue 32's at 0.3-8B parameters: cold in 900 s)
and are kept in the record's `meta["aims_s"]`."""


def aim_of(name: str, aims: Mapping[str, float] | None = None) -> float | None:
    """A run's aim by its name: `cold`, or `warm` and its retries (`warm2`: a warm run again on
    the same caches after one was cut short); `aims` the record's (default AIMS_S)."""
    return (AIMS_S if aims is None else aims).get(name.rstrip("0123456789"))


def job_command(args: argparse.Namespace, storage: str, study: str) -> list[str]:
    """`python -m tuner run` as the user types it, with this run's storage and study."""
    command = [sys.executable, "-m", "tuner", "run", "--workload", args.workload]
    if args.preset:
        command += ["--preset", args.preset]
    if args.precision:
        command += ["--precision", args.precision]
    for pair in args.model_arg:
        command += ["--model-arg", pair]
    return [*command, *args.passed, "--storage", storage, "--study", study, "--json"]


def trials_of(storage: str, study: str) -> list[dict[str, Any]]:
    """Every trial in number order: state, config, throughput, seconds, phase times, and why it
    failed or stopped."""
    loaded = optuna.load_study(study_name=study, storage=storage)
    out = []
    for t in sorted(loaded.get_trials(deepcopy=False), key=lambda t: t.number):
        attrs = t.user_attrs
        out.append(
            {
                "number": t.number,
                "state": t.state.name.lower(),
                "config": attrs.get(keys.CONFIG),
                "precision": attrs.get(keys.PRECISION),
                "samples_per_s": t.values[0] if t.values else None,
                "seconds": (
                    (t.datetime_complete - t.datetime_start).total_seconds()
                    if t.datetime_complete and t.datetime_start
                    else None
                ),
                "phases_s": attrs.get(keys.TIME),
                "failure_reason": attrs.get(keys.FAILURE_REASON),
            }
        )
    return out


def step_ms_interval(rec: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """The recommendation's ms/step and its 95 % interval, from its throughput's (the same
    measurement: ms/step = samples per step x 1000 / samples/s)."""
    throughput, step_ms = rec.get("throughput"), rec.get("step_ms")
    if not throughput or not step_ms:
        return None
    median = throughput["median"]
    low, high = throughput["ci95"]
    # A higher throughput is a shorter step: the interval's bounds swap.
    return step_ms, step_ms * median / high, step_ms * median / low


def reference_of(path: Path, rec: Mapping[str, Any]) -> Any:
    """The recommendation a peers record measured for the workload, preset, model options and
    precision this job ran (as its recommendation names them, defaults resolved)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    ran = (
        rec.get("workload"),
        rec.get("preset"),
        rec.get("model_args") or {},
        rec.get("precision"),
    )
    for item in data["presets"]:
        there = (item["workload"], item["preset"], item.get("model_args") or {})
        if (*there, item.get("precision")) == ran:
            rec = item.get("harness", {}).get("recommended", {})
            if "median_ms" in rec:
                return {
                    "file": path.name,
                    "commit": data["meta"].get("commit"),
                    "median_ms": rec["median_ms"],
                    "ci95": rec["ci95"],
                    "config": rec.get("config"),
                }
    return None


def compare(run: Mapping[str, Any], reference: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """This run's recommendation against the reference's: the ratio of medians and whether it
    is as fast (its interval reaches the reference's or lies below it)."""
    interval = run.get("step_ms")
    if reference is None or interval is None:
        return None
    median, low, _ = interval
    return {
        "reference_over_run": reference["median_ms"] / median,
        "as_fast": low <= reference["ci95"][1],
    }


def one_run(
    name: str, args: argparse.Namespace, storage: str, env: Mapping[str, str], log: Path
) -> dict[str, Any]:
    command = job_command(args, storage, name)
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as sink:
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=sink, text=True, env=dict(env), cwd=REPO
        )
    wall = time.perf_counter() - started
    run: dict[str, Any] = {
        "run": name,
        "command": " ".join(command[1:]),
        "wall_s": wall,
        "returncode": done.returncode,
        "log": log.name,
    }
    try:
        rec = json.loads(done.stdout) if done.returncode == 0 else None
    except json.JSONDecodeError as exc:
        run["error"] = f"its --json output did not parse ({exc}): {done.stdout[-500:]!r}"
        return run
    if rec is None:
        run["error"] = log.read_text(encoding="utf-8")[-2000:]
        return run
    run["recommendation"] = {
        k: rec.get(k)
        for k in (
            "workload",
            "preset",
            "model_args",
            "config",
            "precision",
            "throughput",
            "step_ms",
            "utilisation",
            "peak_memory_bytes",
            "device_memory_bytes",
            "headroom_bytes",
            "speedup",
            # A baseline that failed (at 1.1B, 16 x 2048: the eager step out of memory) has no
            # speed-up; its reason is here, not only in the study the machine takes back.
            "failures",
            "gpu_seconds",
            "reason",
            "search",  # its trials' fates, for a peers row of this record (--recommendation)
        )
    }
    # The record's key stays `n_trials` (the recommendation's `trial_counts`, its name since
    # 2026-11-27), so the records before and after read alike.
    run["recommendation"]["n_trials"] = rec.get("trial_counts")
    run["step_ms"] = step_ms_interval(rec)
    loaded = optuna.load_study(study_name=name, storage=storage)
    run["time"] = study_time(loaded.user_attrs)
    run["trials"] = trials_of(storage, name)
    aim = aim_of(name, getattr(args, "aims_s", None))
    if aim is not None:
        run["within_aim"] = wall <= aim
    return run


def continued(
    earlier: dict[str, Any], meta: Mapping[str, Any], names: Sequence[str]
) -> dict[str, Any]:
    """An earlier call's record on the same scratch, to append this call's runs to: same
    commit and GPU (else the runs do not belong together), no run name twice."""
    before = earlier["meta"]
    for key in ("commit", "gpu"):
        if before.get(key) != meta.get(key):
            raise SystemExit(
                f"--scratch: its record was made with {key} {before.get(key)!r}, this call has "
                f"{meta.get(key)!r}; use a new --scratch"
            )
    again = sorted({r["run"] for r in earlier["runs"]} & set(names))
    if again:
        raise SystemExit(f"--runs: {', '.join(again)} already ran on this --scratch")
    earlier["meta"]["continued_by"] = meta.get("command")
    return earlier


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# The default job, timed, on {meta['gpu']}",
        "",
        provenance(meta),
        "",
        "| run | wall s (aim) | trials complete/failed/pruned | recommended ms/step (95 % CI) "
        "| MFU | peak GB | vs reference | where the time went (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in data["runs"]:
        aim = aim_of(run["run"], meta.get("aims_s"))
        wall = f"{run['wall_s']:.0f}" + ("" if aim is None else f" ({aim:.0f})")
        if "error" in run:
            lines.append(f"| {run['run']} | {wall} | failed: exit {run['returncode']} |")
            continue
        rec = run["recommendation"]
        counts = rec.get("n_trials") or {}
        interval = run.get("step_ms")
        ms = "-" if interval is None else f"{interval[0]:.2f} ({interval[1]:.2f}-{interval[2]:.2f})"
        use = (rec.get("utilisation") or {}).get("mfu")
        mfu = "-" if use is None else f"{100 * use:.1f} %"
        peak = rec.get("peak_memory_bytes")
        versus = run.get("vs_reference")
        verdict = "as fast" if versus and versus["as_fast"] else "slower"
        vs = "-" if versus is None else f"{versus['reference_over_run']:.3f}x, {verdict}"
        phases = (run.get("time") or {}).get("phases") or {}
        spent = ", ".join(f"{k} {v:.0f}" for k, v in phases.items() if v >= 0.5)
        lines.append(
            f"| {run['run']} | {wall} | {counts.get('complete', 0)}/{counts.get('failed', 0)}/"
            f"{counts.get('pruned', 0)} | {ms} | {mfu} | "
            f"{'-' if peak is None else f'{peak / 1e9:.1f}'} | {vs} | {spent} |"
        )
    reference = data.get("reference")
    if reference:
        low, high = reference["ci95"]
        lines += [
            "",
            f"Reference: `{reference['file']}` (commit {reference['commit']}), the recommendation "
            f"at {reference['median_ms']:.2f} ms/step ({low:.2f}-{high:.2f}).",
        ]
    for run in data["runs"]:
        for name, why in ((run.get("recommendation") or {}).get("failures") or {}).items():
            lines += ["", f"{run['run']}: baseline {name} failed: {why}"]
    lines += [f"\n{note}" for note in data.get("notes", [])]
    lines += ["", "Each trial (seconds from its start to its end; its phases):", ""]
    for run in data["runs"]:
        lines += [_trial_line(run["run"], trial) for trial in run.get("trials", [])]
    return "\n".join(lines) + "\n"


def _trial_line(run: str, trial: Mapping[str, Any]) -> str:
    """One trial of a run: its state, throughput (or why it failed), seconds and phases."""
    phases = trial.get("phases_s") or {}
    spent = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
    figure = (
        f"{trial['samples_per_s']:,.1f} samples/s"
        if trial["samples_per_s"]
        else (trial.get("failure_reason") or "")[:160]
    )
    seconds = "-" if trial["seconds"] is None else f"{trial['seconds']:.1f}"
    return f"- {run} trial {trial['number']} {trial['state']}: {figure}; {seconds} s ({spent})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default=None)
    parser.add_argument("--precision", default=None)
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--runs", default="cold,warm", help="names; the first runs cold")
    parser.add_argument("--reference", type=Path, default=None, help="a peers JSON record")
    parser.add_argument("--device", default="auto", help="for the record's metadata only")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    parser.add_argument(
        "--aim-cold",
        type=float,
        default=AIMS_S["cold"],
        help="seconds the cold run should take at most (default: issue 29's 480 for a 125M "
        "model; issue 32's for a 1B model: 900)",
    )
    parser.add_argument("--aim-warm", type=float, default=AIMS_S["warm"])
    parser.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="where the database and caches live (default: a new temporary folder); one that "
        "holds an earlier call's record continues it, every run warm on its caches (a device "
        "call's 10 minutes may end between the cold and the warm run)",
    )
    return parser


def _parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str], list[str]]:
    """The arguments (those after `--` go to every job), the raw command line, the run names."""
    parser = _parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    passed = raw[raw.index("--") + 1 :] if "--" in raw else []
    args = parser.parse_args(raw[: raw.index("--")] if "--" in raw else raw)
    args.passed = passed
    for flag, value in (("--aim-cold", args.aim_cold), ("--aim-warm", args.aim_warm)):
        if not value > 0:
            raise SystemExit(f"{flag}: expected seconds > 0, got {value}")
    args.aims_s = {"cold": args.aim_cold, "warm": args.aim_warm}
    names = [n for n in args.runs.split(",") if n]
    if not names or len(set(names)) != len(names):
        raise SystemExit(f"--runs: expected distinct names, got {args.runs!r}")
    return args, raw, names


def main(argv: Sequence[str] | None = None) -> None:
    args, raw, names = _parse(argv)
    meta, where = run_meta(trainers.resolve_device(args.device), "default_job.py", raw, args.commit)
    stem = f"default-job-{where}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    meta["file"] = path.name
    meta["aims_s"] = args.aims_s
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="streamtune-default-job-"))
    scratch.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{scratch.resolve() / 'tuner.db'}"
    kept = scratch / "record.json"
    # A fresh machine's caches: the study's own Inductor cache beside the database (empty until
    # the first run fills it) and a new Triton cache; a cache the caller set would not be cold.
    unset = ("TORCHINDUCTOR_CACHE_DIR", "TUNER_COMPILE_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["TRITON_CACHE_DIR"] = str(scratch / "triton-cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # The database stays where it is (its studies, traces and cache are the runs' evidence).
    data: dict[str, Any] = {"meta": meta, "storage": storage, "reference": None, "runs": []}
    if kept.exists():
        data = continued(json.loads(kept.read_text(encoding="utf-8")), meta, names)
    for name in names:
        print(f"== {name}: {' '.join(job_command(args, storage, name)[1:])}", flush=True)
        run = one_run(name, args, storage, env, args.out / f"{stem}-{name}.log")
        if args.reference is not None and "recommendation" in run:
            data["reference"] = reference_of(args.reference, run["recommendation"])
        run["vs_reference"] = compare(run, data["reference"])
        data["runs"].append(run)
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        kept.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        print(f"== {name}: {run['wall_s']:.0f} s, exit {run['returncode']}; wrote {path}")


if __name__ == "__main__":
    main()
