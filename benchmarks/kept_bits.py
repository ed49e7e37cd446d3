"""Does a compiled whole-step graph replay its eager twin bit for bit, and does the twin replay
itself? The question under the search's kept check (`tuner.search.gating.kept`), whose runs use
the process's own kernels ("off"): on an H100 (e9eed6f) transformer small in fp32 gave other bits
than its twin from step 4 on, and a Qwen2-style 0.5B decoder in float8 on an H200 did too ("its
kept runs differed"), so both fell back to the strict child, whose twin compiles the model cold.

Each run in one process, in this order, from the same seed, dropout off:
  twin, twin': the graph config's eager twin (`trainers.Twin.measure`, runs=2: same compiled code,
               no capture), under `--determinism`;
  graph:       the config itself (`trainers.gate.parity_losses`), which captures after its
               warm-up and reuses the twin's compiled code.
twin vs twin' says whether the step's kernels reproduce at all under that determinism (an atomic
reduction's order, an attention backward's split); twin vs graph whether the capture changes
them. `--sdpa math` runs everything with SDPA's math backend, to tell an attention kernel's
doing from the rest. Run it once per variant, each in its own process: Dynamo's guards do not
cover the SDPA backend choice, so a second variant in one process would reuse the first's code.

    python benchmarks/kept_bits.py transformer --preset small --precision fp32 --out DIR
    python benchmarks/kept_bits.py hf:causal-lm --preset llama-1b --precision bf16-autocast \\
        --model-arg layers=2 --sdpa math --out DIR

`--out DIR` (default: $OUT when set) appends one JSON line per run to kept_bits.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainers import PRECISIONS, LoopConfig, RunArgs, Twin, fingerprint, resolve_factory
from trainers.gate import parity_losses
from trainers.gate.verdict import first_difference

GRAPH = {
    "cuda_graph": True,
    "sync_interval": 10,
    "sync_mode": "event",
    "pin_memory": True,
    "non_blocking": True,
    "compile": "default",
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--precision", choices=PRECISIONS, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--determinism", choices=("off", "strict"), default="off")
    parser.add_argument("--sdpa", choices=("default", "math"), default="default")
    parser.add_argument("--config", default=json.dumps(GRAPH), help="LoopConfig JSON dict")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args(argv)
    if args.sdpa == "math":
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            return run(args)
    return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_args = dict(item.split("=", 1) for item in args.model_arg)
    factory = resolve_factory(args.workload, model_args or None)
    config = LoopConfig.from_dict(json.loads(args.config))
    run_args = RunArgs(steps=args.steps, device="cuda", precision=args.precision)
    started = time.perf_counter()
    twin = Twin.measure(
        factory, config, run_args, preset=args.preset, runs=2, determinism=args.determinism
    )
    twin_s = time.perf_counter() - started
    graph = parity_losses(factory, args.preset, config, run_args, determinism=args.determinism)
    record = {
        "workload": args.workload,
        "preset": args.preset,
        "model_args": model_args,
        "precision": args.precision,
        "determinism": args.determinism,
        "sdpa": args.sdpa,
        "steps": args.steps,
        "gpu": fingerprint(torch.device("cuda")).get("gpu"),
        "torch": torch.__version__,
        "twin_reproducible": twin.reproducible,
        "twin_first_difference": twin.first_difference,
        "twin_max_abs_difference": twin.max_abs_difference,
        "twin_strict": twin.strict,
        "graph_first_difference": first_difference(graph[: len(twin.losses)], twin.losses),
        "twin_losses": list(twin.losses),
        "graph_losses": graph,
        "twin_s": round(twin_s, 1),
        "s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps({k: v for k, v in record.items() if not k.endswith("losses")}), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "kept_bits.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
    return record


if __name__ == "__main__":
    main()
