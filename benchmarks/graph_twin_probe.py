"""Why does a whole-step graph not replay its eager twin bit for bit? A diagnostic for the gate's
exactness test on one workload (run on a GPU; on a CPU it only lists the random ops).

For each variant it runs the gate's own trajectories (`trainers.trajectories.trajectory`, dropout
off, deterministic kernels): the eager twin twice and the graph once, and prints where the losses
first differ. It also lists the ops of one training step that draw random numbers
(`torch.Tag.nondeterministic_seeded`) after the gate switched dropout off: a random op left on is
drawn differently by a replayed graph than by eager steps, so such a step cannot be owed its eager
losses bit for bit.

    python benchmarks/graph_twin_probe.py --workload hf:masked-lm --preset default \
        --variants default,math-sdpa,eager-attention --out probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers import LoopConfig
from trainers.parity import twin_of
from trainers.trajectories import trajectory
from trainers.workloads import disable_dropout, resolve_factory

GRAPH = LoopConfig(cuda_graph=True, optimizer="fused")


class RandomOps(TorchDispatchMode):
    """Counts the ops that draw from a random generator."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if torch.Tag.nondeterministic_seeded in func.tags:
            # SDPA is tagged whatever its dropout_p: keep the float arguments to tell.
            floats = [a for a in args if isinstance(a, float)]
            self.seen[f"{func}{floats if floats else ''}"] += 1
        return func(*args, **(kwargs or {}))


def random_ops(
    workload: str, preset: str, model_args: dict[str, str], device: str
) -> dict[str, int]:
    built = resolve_factory(workload, model_args)(preset, seed=0)
    disable_dropout(built.model)
    model = built.model.to(device).train()
    batch = tuple(t.to(device) for t in built.dataset[0])
    with RandomOps() as mode:
        built.loss_fn(model, batch).backward()
    return dict(mode.seen)


def first_difference(a: list[float], b: list[float]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def probe(workload: str, preset: str, model_args: dict[str, str], steps: int) -> dict[str, Any]:
    factory = resolve_factory(workload, model_args)
    twin_config, capturable = twin_of(GRAPH)
    runs = {}
    for name, config, cap in (
        ("twin", twin_config, capturable),
        ("twin again", twin_config, capturable),
        ("graph", GRAPH, None),
    ):
        start = time.perf_counter()
        result = trajectory(factory, preset, config, steps=steps, capturable=cap)
        runs[name] = {
            "losses": result.losses,
            "strict": result.strict,
            "seconds": round(time.perf_counter() - start, 1),
        }
    twin = runs["twin"]["losses"]
    return {
        "runs": runs,
        "twin_reproducible_first_difference": first_difference(runs["twin again"]["losses"], twin),
        "graph_first_difference": first_difference(runs["graph"]["losses"], twin),
        "graph_max_abs_diff": max(
            abs(a - b) for a, b in zip(runs["graph"]["losses"], twin, strict=True)
        ),
    }


VARIANTS = ("default", "math-sdpa", "eager-attention")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="hf:masked-lm")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--model-arg", action="append", default=[], help="name=value")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model_args = dict(a.split("=", 1) for a in args.model_arg)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    import importlib.metadata as md

    versions = {}
    for package in ("torch", "transformers", "timm", "torchvision"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = None
    report: dict[str, Any] = {
        "workload": args.workload,
        "preset": args.preset,
        "model_args": model_args,
        "versions": versions,
        "variants": {},
    }
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            parser.error(f"--variants: {variant!r} is invalid: allowed {', '.join(VARIANTS)}")
        extra = dict(model_args)
        if variant == "eager-attention":
            extra["attention"] = "eager"
        entry: dict[str, Any] = {
            "random_ops": random_ops(args.workload, args.preset, extra, device)
        }
        if device == "cuda":
            sdpa = (
                torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH])
                if variant == "math-sdpa"
                else contextlib.nullcontext()
            )
            with sdpa:
                entry |= probe(args.workload, args.preset, extra, args.steps)
        report["variants"][variant] = entry
        print(variant, {k: v for k, v in entry.items() if k != "runs"}, flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
