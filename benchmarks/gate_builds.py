"""What the gate's child saves by building a seed envelope's seeds ahead of its first check.

A config in another precision than the study's (float8 in a bf16 study) is judged against the
reference trained from four other seeds. The gate's child used to build each of those when the
envelope ran (18 s each at 1.2B on one thread of the CPU), and then the reference's seed again
for the config's twin. Now the tuner gives the seeds to `ParityProcess.prepare` while the trials
run, and the child keeps every build (`trainers.ReusedBuilds(keep=...)`).

This runs the seed envelope in two fresh gate children: one as before (started, and the
reference's seed built ahead), one whose seeds' builds were made ahead too, while the first
measured (their seconds reported apart, as they overlap the trials in a job), and records each
one's seconds and how far the two envelopes' losses differ.

    python benchmarks/gate_builds.py --workload hf:causal-lm --preset llama-1b \
        --precision bf16-autocast --config-precision float8 --commit <sha> --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.run_meta import provenance, run_meta, write_record
from trainers.gate import envelope_seeds
from tuner.search.gating.isolated import ParityProcess


def _envelope(gate: ParityProcess, precision: str) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    found = gate.envelope(precision=precision)
    return time.perf_counter() - started, found.envelope


def measure(args: argparse.Namespace) -> dict[str, Any]:
    model_args = dict(item.split("=", 1) for item in args.model_arg)
    run_args = trainers.RunArgs(
        steps=args.steps, seed=0, device=args.device, precision=args.precision
    )

    def child() -> ParityProcess:
        return ParityProcess(
            args.workload,
            args.preset,
            run_args,
            matmul_precision="high",
            model_args=model_args,
        )

    plain, ahead = child(), child()
    try:
        # Each child started and the reference's seed built, as a job's gate child was before
        # (`prepare`): what is timed is the envelope's own builds and runs. The seeds' builds
        # ahead on one core while the other child measures, as beside a job's trials.
        plain.prepare().result()
        built = ahead.prepare(envelope_seeds(0))
        plain_s, plain_envelope = _envelope(plain, args.config_precision)
        prepare_s = built.result()  # the child's own seconds for its builds
        ahead_s, ahead_envelope = _envelope(ahead, args.config_precision)
    finally:
        plain.close()
        ahead.close()
    runs = ("reference", "perturbed")
    same = all(plain_envelope[key] == ahead_envelope[key] for key in runs)
    return {
        "workload": args.workload,
        "preset": args.preset,
        "model_args": model_args,
        "steps": args.steps,
        "precision": args.precision,
        "config_precision": args.config_precision,
        "built_as_it_went_s": round(plain_s, 3),
        "built_ahead_s": round(prepare_s, 3),
        "with_builds_ahead_s": round(ahead_s, 3),
        "same_losses": same,
        # A seed envelope runs on the process's own kernels (flash attention's backward adds
        # with atomics): two processes differ by rounding, which these two say the size of.
        "largest_difference": _largest(plain_envelope, ahead_envelope),
        "seed_spread": _largest(plain_envelope, plain_envelope, against_reference=True),
    }


def _largest(
    one: dict[str, Any], other: dict[str, Any], *, against_reference: bool = False
) -> float:
    """The largest loss difference between the runs of two envelopes, step by step; with
    `against_reference`, between each perturbed run of `one` and its reference instead."""
    pairs = [(one["reference"], other["reference"])] if not against_reference else []
    for k, run in enumerate(one["perturbed"]):
        pairs.append((run, one["reference"] if against_reference else other["perturbed"][k]))
    return max(abs(a - b) for left, right in pairs for a, b in zip(left, right, strict=True))


def markdown(data: dict[str, Any]) -> str:
    row = data["row"]
    return (
        "# A seed envelope with its builds made ahead, against one that builds as it goes\n\n"
        f"{provenance(data['meta'])}\n\n"
        "| workload | steps | envelope, building as it goes (s) | builds ahead (s, beside the "
        "trials in a job) | envelope after them (s) | same losses | largest difference | "
        "seed spread |\n|---|---|---|---|---|---|---|---|\n"
        f"| {row['workload']} {row['preset']} {row['model_args']} | {row['steps']} | "
        f"{row['built_as_it_went_s']} | {row['built_ahead_s']} | {row['with_builds_ahead_s']} | "
        f"{row['same_losses']} | {row.get('largest_difference', '-')} | "
        f"{row.get('seed_spread', '-')} |\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="hf:causal-lm")
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--model-arg", action="append", default=[], help="NAME=VALUE")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--precision", default="bf16-autocast")
    parser.add_argument("--config-precision", default="float8")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args(argv)
    row = measure(args)
    meta, stamp = run_meta(torch.device(args.device), "gate_builds.py", argv or [], args.commit)
    write_record(args.out, f"gate-builds-{stamp}", {"meta": meta, "row": row}, markdown)


if __name__ == "__main__":
    main(sys.argv[1:])
