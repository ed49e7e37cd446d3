"""The whole model compiled with each repeated block a nested compile region, against the whole
model compiled as the search compiles it: the compile's seconds, and the step's speed.

A whole-model trial is most of a cold job's compile at 0.5B: on one H200 at 2c9259f the
Qwen1.5-0.5B shape's bf16 trial compiled 69 s, its float8 trial with the head 177.5 s and the
head alone 63.7 s, 310 of the job's 822 s (docs/benchmarks/README.md, 2026-12-02). Dynamo traces
and Inductor compiles each of the 24 identical decoder layers again. `torch.compiler.
nested_compile_region` (torch 2.8 on) marks a function whose graph is traced and compiled once
and called for every block with inputs of the same kind; the whole model stays one compiled
graph around it. On this project's CPU (torch 2.13, a stack of 24 residual MLP blocks of 256
features), each in a new process from an empty Inductor cache, the whole-model compile and first
step took 14.7-15.1 s marked against 21.7-23.4 s, with the same loss and gradients. Whether it
holds on a GPU, for Hugging Face decoder layers and for float8's tensor subclasses inside the
region, and what the step loses where fusion stops at the block's edge, is what this measures:

- `model`, `regions`: each in a new process, from an empty Inductor and Triton cache, one
  `trainers.run` (the trial's run), its compile seconds, step, MFU, peak memory and first losses,
  or the exception that stopped it;
- `--rounds`: then both again in one process, taking turns on the code each compiled
  (`trainers.keeping_compiled`), for the step's speed side by side.

    python benchmarks/compile_regions.py --workload hf:causal-lm --preset llama-1b \\
        --model-arg arch=qwen2 ... --precision float8 --config compile=default,optimizer=fused \\
        --rounds 2 --commit <sha> --out DIR

`regions` is the config with the `compile_regions` lever at `blocks` (`trainers/levers/regions.py`:
each repeated block, `trainers.blocks.find_blocks`, a nested compile region for the run); nothing
else changes.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.compile_reuse import _changed, _value
from benchmarks.run_meta import model_parser, provenance, write_model_record
from trainers.blocks import find_blocks
from trainers.dynamo_state import counters
from trainers.workloads import ReusedBuilds

VARIANTS = ("model", "regions")


def variant_config(base: trainers.LoopConfig, name: str) -> trainers.LoopConfig:
    """`base` with the `compile_regions` lever as `name` has it (`model`: at its default)."""
    return base.replace(compile_regions="blocks" if name == "regions" else "none")


def summary(result: trainers.RunResult) -> dict[str, Any]:
    """A run's figures as the record keeps them."""
    steps = [window.step_ms for window in result.windows]
    return {
        "compile_s": round(result.compile_s, 2),
        "kept_s": round(result.compile_kept_s, 2),
        "step_ms": round(statistics.median(steps), 3),
        "samples_per_s": round(result.samples_per_s, 3),
        "mfu": result.utilisation.mfu,
        "peak_memory_bytes": result.peak_memory_bytes,
        "graph_breaks": result.graph_breaks,
        # Calls Dynamo put in the graph: each marked block's are traced once, not once a block.
        "traced_calls": counters()["stats"]["calls_captured"],
        "recompiles": result.recompiles,
        "notes": list(result.compile_notes)[:4],
        "losses": [round(loss, 5) for loss in result.losses[:5]],
    }


def _args(spec: dict[str, Any]) -> trainers.RunArgs:
    return trainers.RunArgs(
        steps=spec["steps"], warmup=spec["warmup"], windows=spec["windows"],
        device=spec["device"], precision=spec["precision"], seed=0,
    )  # fmt: skip


def _variant(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One variant, in this (new) process with its own empty caches."""
    config = variant_config(trainers.LoopConfig.from_dict(spec["config"]), name)
    built = trainers.resolve_factory(spec["workload"], spec["model_args"])(spec["preset"], seed=0)
    blocks = len(find_blocks(built.model))
    started = time.perf_counter()
    try:
        found = summary(trainers.run(built, config, _args(spec)))
    except Exception as exc:  # noqa: BLE001 - the record says what stopped it
        lines = traceback.format_exception_only(exc)
        found = {"error": " ".join(line.strip() for line in lines)[:600]}
    return {"blocks": blocks, "seconds": round(time.perf_counter() - started, 2), **found}


def _turns(spec: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    """Both variants taking turns in this process, each on what it compiled at its first turn."""
    config = trainers.LoopConfig.from_dict(spec["config"])
    reused = ReusedBuilds(trainers.resolve_factory(spec["workload"], spec["model_args"]))
    turns = []
    with trainers.keeping_compiled(len(VARIANTS)):
        for index in range(rounds):
            for name in VARIANTS:
                built = reused(spec["preset"], seed=0)
                found = summary(trainers.run(built, variant_config(config, name), _args(spec)))
                turns.append({"round": index + 1, "variant": name, **found})
                print(turns[-1], flush=True)
    return turns


def measure(args: Any) -> dict[str, Any]:
    config = trainers.LoopConfig.from_dict(
        dict(_value(item) for item in args.config.split(",") if item)
    )
    spec = {
        "workload": args.workload,
        "preset": args.preset,
        "model_args": dict(item.split("=", 1) for item in args.model_arg),
        "config": config.to_dict(),
        "steps": args.steps,
        "warmup": args.warmup,
        "windows": args.windows,
        "device": args.device,
        "precision": args.precision,
    }
    variants: dict[str, Any] = {}
    context = multiprocessing.get_context("spawn")
    for name in VARIANTS:
        with tempfile.TemporaryDirectory(prefix="compile-regions-") as folder:
            # Each variant's own empty cache: a cold compile, as a job's first trial of it.
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(folder) / "inductor")
            os.environ.pop("TRITON_CACHE_DIR", None)  # Triton's kernels inside Inductor's folder
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as child:
                variants[name] = child.submit(_variant, name, spec).result()
        print(name, variants[name], flush=True)
    turns: list[dict[str, Any]] = []
    if args.rounds and not any("error" in found for found in variants.values()):
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as child:
            turns = child.submit(_turns, spec, args.rounds).result()
    return {"spec": spec, "variants": variants, "turns": turns}


def to_markdown(data: dict[str, Any]) -> str:
    meta, spec = data["meta"], data["spec"]
    lines = [
        "# The whole model compiled, with each repeated block a nested compile region or not",
        "",
        f"{meta['gpu']}. {provenance(meta)}",
        "",
        f"{spec['workload']} {spec['preset']} {spec['model_args']}, {spec['precision']}, "
        f"{_changed(spec['config'])}; {spec['steps']} steps after {spec['warmup']}.",
        "",
        "| variant | blocks | s | compile s | ms/step | samples/s | MFU | peak GB | first losses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in data["variants"].items():
        if "error" in v:
            lines.append(f"| {name} | {v['blocks']} | {v['seconds']} | failed: {v['error']} |")
            continue
        mfu = "" if v["mfu"] is None else f"{v['mfu']:.1%}"
        peak = "" if v["peak_memory_bytes"] is None else f"{v['peak_memory_bytes'] / 1e9:.1f}"
        lines.append(
            f"| {name} | {v['blocks']} | {v['seconds']} | {v['compile_s']} | {v['step_ms']} "
            f"| {v['samples_per_s']} | {mfu} | {peak} | {v['losses']} |"
        )
    if data["turns"]:
        lines += ["", "Taking turns in one process:", "", "| round | variant | compile s | "
                  "ms/step | samples/s |", "|---|---|---|---|---|"]  # fmt: skip
        lines += [
            f"| {t['round']} | {t['variant']} | {t['compile_s']} | {t['step_ms']} "
            f"| {t['samples_per_s']} |"
            for t in data["turns"]
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = model_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="turns side by side (0: none)")
    args = parser.parse_args()
    write_model_record(args, "compile_regions.py", "compile-regions", measure(args), to_markdown)


if __name__ == "__main__":
    main()
