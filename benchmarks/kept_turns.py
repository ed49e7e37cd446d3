"""Do a final round's turns run on kept code? Configs taking turns in one process, as the search's
final round runs them, with the gate's own run of each after its first turn.

On one H200 (2026-12-02, the Qwen1.5-0.5B shape in float8, `docs/benchmarks/README.md`) every
final-round turn of the two finalists compiled again (31-66 s against about 10 s on kept code),
and so did the gate's run of one of them made where its trial compiled. The same sequence on
the CPU keeps every turn's code. This runs the sequence alone and records, for each run, its
seconds, its compile seconds, what the code it kept had cost (`kept_s`), Inductor's cache
counters, its compile notes (`trainers.dynamo_state.why_dropped`: which rule dropped kept code)
and the warnings of a run that ran kept code and compiled anyway (the guard that failed):

- `trial`: each config once, in the order given, as the search's trials run them
  (`trainers.run` on a copy of one build, `trainers.workloads.ReusedBuilds`, within
  `trainers.keeping_compiled` with the trials' room), then the `gate` of the last (the leader,
  gated after the trials); `--no-trials` leaves them out;
- rounds of `turn`s, as the final round takes them: the two baselines first, eager, in the
  study's precision (`--no-baselines` leaves them out), then each config, within
  `keeping_compiled` with room for every config and the trials' keys; after the first round the
  `gate` of each config not gated yet;
- `gate`: the config's own gate run as the search makes it where its trial compiled
  (`tuner.search.gating.isolated.ParityProcess._run_here`): a fresh build, dropout off, every
  step's loss in one window, the process's own kernels (`trainers.gate.trajectory` with
  determinism "off"), made only where this process holds the config's code and turning dropout
  off changes nothing, as there; else recorded as run in the gate's child.

    python benchmarks/kept_turns.py --workload hf:causal-lm --preset llama-1b \\
        --model-arg arch=qwen2 ... --precision float8 \\
        --config compile=default,optimizer=fused,float8_head=float8 \\
        --turns "float8_linears=all;float8_linears=none" --rounds 2 --commit <sha> --out DIR

At 0920146 the job ran its trials in that order (trial 11, then trial 12 its leader), gated trial
12, then took its final round's turns trial 12 before trial 11; here the turns keep the order
given.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.compile_reuse import _changed, _value
from benchmarks.run_meta import model_parser, provenance, write_model_record
from trainers.compilation import holds_compiled
from trainers.gate.trajectories import min_warmup, trajectory_length
from trainers.workloads import ReusedBuilds, disable_dropout
from tuner.search.options import BASELINES, SEARCH_KEPT


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
    if result is None:
        row = {"kind": kind, "config": name, "where": "the gate's child: not run here"}
        print(row, flush=True)
        return row
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


class Runs:
    """The two kinds of run of one workload, as the search makes them: `turn` (a trial or a final
    round's turn) and `gate` (the config's own gate run made here, or None where the search makes
    it in the gate's child)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model_args = dict(item.split("=", 1) for item in args.model_arg)
        self.factory = trainers.resolve_factory(args.workload, self.model_args)
        self.reused = ReusedBuilds(self.factory)
        self.device = trainers.resolve_device(args.device)
        self.run_args = trainers.RunArgs(
            steps=args.steps, warmup=args.warmup, windows=args.windows, device=str(self.device),
            precision=args.precision,
        )  # fmt: skip

    def turn(self, config: trainers.LoopConfig, precision: str) -> Any:
        built = self.reused(self.args.preset, seed=0)
        return trainers.run(built, config, self.run_args.replace(precision=precision))

    def gate(self, config: trainers.LoopConfig) -> Any:
        built = self.factory(self.args.preset, seed=0)
        if disable_dropout(built.model) or not holds_compiled(
            built.model, config, self.args.precision, self.device
        ):
            return None  # the search runs it in the gate's child (`ParityProcess._run_here`)
        warm = min_warmup(config)
        timed = trajectory_length(config, self.args.gate_steps) - warm
        args = self.run_args.replace(steps=timed, warmup=warm, windows=1)
        return trainers.run(built, config, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    configs = {f"config-{index}": config for index, config in enumerate(_configs(args))}
    names = list(configs)
    runs = Runs(args)
    warnings = Warnings()
    logging.getLogger("trainers.compilation").addHandler(warnings)

    def one(kind: str, name: str, precision: str = args.precision) -> dict[str, Any]:
        if kind == "gate":
            return _one(kind, name, lambda: runs.gate(configs[name]), warnings)
        config = configs.get(name) or BASELINES[name]
        return _one(kind, name, lambda: runs.turn(config, precision), warnings)

    rows: list[dict[str, Any]] = []
    if args.trials:
        with trainers.keeping_compiled(SEARCH_KEPT):  # as the search runs its trials
            rows += [one("trial", name) for name in names]
        rows.append(one("gate", names[-1]))  # the leader, gated after the trials
    with trainers.keeping_compiled(len(configs) + SEARCH_KEPT):
        for round_index in range(args.rounds):
            if args.baselines:
                rows += [one("turn", name, args.baseline_precision) for name in BASELINES]
            rows += [one("turn", name) for name in names]
            if round_index == 0:
                rows += [one("gate", name) for name in (names[:-1] if args.trials else names)]
    return {
        "spec": {
            "workload": args.workload,
            "preset": args.preset,
            "model_args": runs.model_args,
            "precision": args.precision,
            "configs": {name: _changed(c.to_dict()) for name, c in configs.items()},
            "steps": args.steps,
            "gate_steps": args.gate_steps,
            "rounds": args.rounds,
            "trials": args.trials,
            "baselines": args.baseline_precision if args.baselines else None,
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
        if "where" in row:
            lines.append(f"| {row['kind']} | {row['config']} | | | | | {row['where']} |")
            continue
        said = "; ".join(row["notes"] + row["warnings"]).replace("|", "/")[:300]
        lines.append(
            f"| {row['kind']} | {row['config']} | {row['seconds']:.1f} | {row['compile_s']:.1f} "
            f"| {row['kept_s']:.1f} | {row['cache_hits']} / {row['cache_misses']} | {said} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--turns", default=";", help="each config's changes, ';' between configs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--gate-steps", type=int, default=20)
    parser.add_argument("--no-trials", dest="trials", action="store_false")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false")
    parser.add_argument("--baseline-precision", default="bf16-autocast")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds}: allowed 1 or more")
    write_model_record(args, "kept_turns.py", "kept-turns", measure(args), to_markdown)


if __name__ == "__main__":
    main()
