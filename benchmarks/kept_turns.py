"""Do a final round's turns run on kept code? Configs taking turns in one process, as the search's
final round runs them, with the gate's own run of each after its first turn.

On one H200 (2026-12-02, the Qwen1.5-0.5B shape in float8, `docs/benchmarks/README.md`) every
final-round turn of the two finalists compiled again (31-66 s against about 10 s on kept code),
and so did the gate's run of one of them made where its trial compiled. The same sequence on
the CPU keeps every turn's code. This runs the sequence alone and records, for each run, its
seconds, its compile seconds, what the code it kept had cost (`kept_s`), Inductor's cache
counters, its compile notes (`trainers.dynamo_state.why_dropped`: which rule dropped kept code)
and the warnings of a run that ran kept code and compiled anyway (the guard that failed):

- `turn`: `trainers.run` on a copy of one build (`trainers.workloads.ReusedBuilds`), as the
  search's measurements run, within `trainers.keeping_compiled` (room for every config and the
  trials' three, as the final round gives);
- `gate`: the config's own gate run as the search makes it where its trial compiled: a fresh
  build, dropout off, every step's loss in one window, the process's own kernels
  (`trainers.gate.trajectory` with determinism "off").

    python benchmarks/kept_turns.py --workload hf:causal-lm --preset llama-1b \\
        --model-arg arch=qwen2 ... --precision float8 \\
        --config compile=default,optimizer=fused,float8_head=float8 \\
        --turns "float8_linears=all;float8_linears=none" --rounds 2 --commit <sha> --out DIR
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.compile_reuse import _changed, _value
from benchmarks.run_meta import provenance, run_meta, write_record
from trainers.gate.trajectories import min_warmup, trajectory_length
from trainers.workloads import ReusedBuilds, disable_dropout

SEARCH_KEPT = 3
"""The trials' kept keys beside the finalists' (`tuner.search.options.SEARCH_KEPT`; `trainers`
never imports the tuner, and neither does this script's measurement)."""


class Warnings(logging.Handler):
    """The warnings `trainers.compilation` logs during one run."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage()[:400])


def _configs(args: argparse.Namespace) -> list[trainers.LoopConfig]:
    base = dict(_value(item) for item in args.config.split(",") if item)
    return [
        trainers.LoopConfig.from_dict(
            {**base, **dict(_value(item) for item in turn.split(",") if item)}
        )
        for turn in args.turns.split(";")
    ]


def _one(kind: str, name: str, call: Any, warnings: Warnings) -> dict[str, Any]:
    warnings.said.clear()
    started = time.perf_counter()
    result = call()
    row = {
        "kind": kind,
        "config": name,
        "seconds": round(time.perf_counter() - started, 2),
        "compile_s": round(result.compile_s, 2),
        "kept_s": round(result.compile_kept_s, 2),
        "cache_hits": result.compile_cache_hits,
        "cache_misses": result.compile_cache_misses,
        "notes": list(result.compile_notes)[:4],
        "warnings": list(warnings.said),
    }
    print(row, flush=True)
    return row


def measure(args: argparse.Namespace) -> dict[str, Any]:
    configs = _configs(args)
    model_args = dict(item.split("=", 1) for item in args.model_arg)
    factory = trainers.resolve_factory(args.workload, model_args)
    reused = ReusedBuilds(factory)
    device = trainers.resolve_device(args.device)
    run_args = trainers.RunArgs(
        steps=args.steps, warmup=args.warmup, windows=args.windows, device=str(device),
        precision=args.precision,
    )  # fmt: skip
    warnings = Warnings()
    logging.getLogger("trainers.compilation").addHandler(warnings)

    def turn(config: trainers.LoopConfig) -> trainers.RunResult:
        return trainers.run(reused(args.preset, seed=0), config, run_args)

    def gate(config: trainers.LoopConfig) -> trainers.RunResult:
        built = factory(args.preset, seed=0)
        disable_dropout(built.model)
        warm = min_warmup(config)
        timed = trajectory_length(config, args.gate_steps) - warm
        return trainers.run(built, config, run_args.replace(steps=timed, warmup=warm, windows=1))

    rows: list[dict[str, Any]] = []
    with trainers.keeping_compiled(len(configs) + SEARCH_KEPT):
        for round_index in range(args.rounds):
            for index, config in enumerate(configs):
                name = f"config-{index}"
                rows.append(_one("turn", name, lambda c=config: turn(c), warnings))
                if round_index == 0:
                    rows.append(_one("gate", name, lambda c=config: gate(c), warnings))
    return {
        "spec": {
            "workload": args.workload,
            "preset": args.preset,
            "model_args": model_args,
            "precision": args.precision,
            "configs": {f"config-{i}": _changed(c.to_dict()) for i, c in enumerate(configs)},
            "steps": args.steps,
            "gate_steps": args.gate_steps,
            "rounds": args.rounds,
        },
        "runs": rows,
    }


def to_markdown(data: dict[str, Any]) -> str:
    meta, spec = data["meta"], data["spec"]
    lines = [
        "# Kept code: a final round's turns and the gate's run, in one process",
        "",
        f"{meta['gpu']}. {provenance(meta)}",
        "",
        f"{spec['workload']} {spec['preset']} {spec['model_args']}, {spec['precision']}; "
        + "; ".join(f"{name}: {changes}" for name, changes in spec["configs"].items()),
        "",
        "| run | config | s | compile s | kept s | hits / misses | notes, warnings |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data["runs"]:
        said = "; ".join(row["notes"] + row["warnings"]).replace("|", "/")[:300]
        lines.append(
            f"| {row['kind']} | {row['config']} | {row['seconds']:.1f} | {row['compile_s']:.1f} "
            f"| {row['kept_s']:.1f} | {row['cache_hits']} / {row['cache_misses']} | {said} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="hf:causal-lm")
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--precision", default="float8")
    parser.add_argument("--config", default="compile=default,optimizer=fused")
    parser.add_argument("--turns", default=";", help="each config's changes, ';' between configs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--gate-steps", type=int, default=60)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds}: allowed 1 or more")
    meta, stem = run_meta(
        trainers.resolve_device(args.device), "kept_turns.py", sys.argv[1:], args.commit
    )
    data = {"meta": meta, **measure(args)}
    name = f"kept-turns-{stem}{f'-{args.tag}' if args.tag else ''}"
    write_record(args.out, name, data, to_markdown)


if __name__ == "__main__":
    main()
