"""Does a compiled config's run in another process reuse what its trial compiled?

In a job the trial compiles a config in the search's process, and the gate's child and the
profiles' child run the same config again. On one H200 (2026-12-01, 46a3e5a) a float8 config's
own gate run, without strict determinism, compiled as long in the gate's child as its trial had
(136 s against 132 s, 52 s against 50 s), and a repeat job's profile of the recommended config
compiled for 160 s in the profiles' child although the job had loaded the cold job's artefacts.
This runs the candidates one after another, each in a new process, all on one new Inductor and
Triton cache folder, and records each one's seconds and Inductor's and AOTAutograd's cache
counters (hits, misses, bypasses), so a record says which of them reuses the first's artefacts:

- `trial`: the config's run as a trial runs it (`trainers.run`), first, from an empty cache;
- `trial-again`: the same in a new process: the disk cache at its best;
- `gate-off`: the gate's own run of the config (`parity_losses`, dropout off) with the process's
  own kernels, in a process set up as the gate's child is (`tuner.search.gating.isolated`);
- `gate-strict`: the same under strict determinism (as the eager twin and a config owed its
  bits run);
- `gate-off-after-strict`: a strict eager run of the reference first, then `gate-off`, in one
  child (the loop twin's order).

    python benchmarks/compile_reuse.py --workload hf:causal-lm --preset llama-1b \\
        --precision float8 --config compile=default,optimizer=fused --commit <sha> \\
        --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.run_meta import model_parser, provenance, write_model_record
from trainers.gate import Determinism, parity_losses

CANDIDATES = ("trial", "trial-again", "gate-off", "gate-strict", "gate-off-after-strict")
_COUNTED = {
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
}


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {name: int(counters[group][name]) for group, names in _COUNTED.items() for name in names}


def _bypasses(said: Mapping[str, int] = MappingProxyType({})) -> dict[str, int]:
    """Why a cache was bypassed: Inductor's reason counters, and the reasons its caches logged
    (`said`, from `BypassReasons`: AOTAutograd keeps none in a counter; at 384c19e the float8
    step's bypass came back with no reason)."""
    from torch._dynamo.utils import counters

    found = {
        f"{group}:{reason}"[:200]: int(count)
        for group in ("inductor", "aot_autograd")
        for reason, count in counters[group].items()
        if "bypass" in reason and reason not in _COUNTED[group]
    }
    return found | dict(said)


CACHE_LOGGERS = ("torch._functorch._aot_autograd.autograd_cache", "torch._inductor.codecache")


class BypassReasons(logging.Handler):
    """Counts the bypasses that Inductor's and AOTAutograd's caches log (at INFO), by logger and
    the first line of the reason, while installed (`with`): AOTAutograd's "Bypassing autograd
    cache due to: REASON" by its reason, Inductor's "Bypassing FX Graph Cache because ..." whole."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: dict[str, int] = {}
        self._levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("Bypassing"):
            group = record.name.rsplit(".", 1)[-1]
            reason = f"{group}:{text.split(' due to: ', 1)[-1].splitlines()[0].strip()}"[:200]
            self.seen[reason] = self.seen.get(reason, 0) + 1

    def __enter__(self) -> BypassReasons:
        for name in CACHE_LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(logging.INFO)
            logger.addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        for name in CACHE_LOGGERS:
            logger = logging.getLogger(name)
            logger.removeHandler(self)
            logger.setLevel(self._levels[name])


def _candidate(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One candidate, in this (new) process: its seconds and the cache counters after it."""
    from tuner.search.gating.isolated import _in_child

    config = trainers.LoopConfig.from_dict(spec["config"])
    args = trainers.RunArgs(
        steps=spec["steps"], device=spec["device"], precision=spec["precision"], seed=0
    )
    factory = trainers.resolve_factory(spec["workload"], spec["model_args"])

    def trial() -> None:
        built = factory(spec["preset"], seed=0)
        trainers.run(built, config, args.replace(warmup=1, windows=1))

    def gate(mode: Determinism) -> None:
        parity_losses(factory, spec["preset"], config, args, determinism=mode)

    def part() -> None:
        if name == "gate-off-after-strict":
            reference_args = args.replace(precision=spec["reference_precision"])
            parity_losses(factory, spec["preset"], trainers.REFERENCE, reference_args)
        gate("strict" if name == "gate-strict" else "off")

    started = time.perf_counter()
    with BypassReasons() as reasons:
        if name.startswith("trial"):
            torch.set_float32_matmul_precision(spec["matmul_precision"])
            trial()
        else:
            _in_child(spec["matmul_precision"], part)
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "counters": _counters(),
        "bypasses": _bypasses(reasons.seen),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = trainers.LoopConfig.from_dict(
        dict(_value(item) for item in args.config.split(",") if item)
    )
    spec = {
        "workload": args.workload,
        "preset": args.preset,
        "model_args": dict(item.split("=", 1) for item in args.model_arg),
        "config": config.to_dict(),
        "steps": args.steps,
        "device": args.device,
        "precision": args.precision,
        "reference_precision": args.reference_precision,
        "matmul_precision": args.matmul_precision,
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="compile-reuse-") as folder:
        # One new cache for every candidate, as a job's study folder is for its processes.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(folder) / "inductor")
        os.environ.pop("TRITON_CACHE_DIR", None)  # Triton's kernels inside Inductor's folder
        context = multiprocessing.get_context("spawn")
        for name in args.candidates.split(","):
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as child:
                results[name] = child.submit(_candidate, name, spec).result()
            print(name, results[name], flush=True)
    return {"spec": spec, "candidates": results}


def _value(item: str) -> tuple[str, Any]:
    key, _, text = item.partition("=")
    for cast in (int, float):
        try:
            return key, cast(text)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(text.lower(), text)


def _changed(config: dict[str, Any]) -> dict[str, Any]:
    """The config's settings other than the defaults."""
    defaults = trainers.LoopConfig().to_dict()
    return {key: value for key, value in config.items() if value != defaults.get(key)}


def to_markdown(data: dict[str, Any]) -> str:
    meta, spec = data["meta"], data["spec"]
    lines = [
        "# Compile reuse: a config's run in new processes after its trial's",
        "",
        f"{meta['gpu']}. {provenance(meta)}",
        "",
        f"{spec['workload']} {spec['preset']} {spec['model_args']}, {spec['precision']}, "
        f"config {_changed(spec['config'])}, {spec['steps']} "
        "steps; each candidate in a new process on one cache folder, in this order.",
        "",
        "| candidate | s | FX graph hit / miss / bypass | AOTAutograd hit / miss / bypass |",
        "|---|---|---|---|",
    ]
    for name, got in data["candidates"].items():
        c = got["counters"]
        fx = f"{c['fxgraph_cache_hit']} / {c['fxgraph_cache_miss']} / {c['fxgraph_cache_bypass']}"
        aot = (
            f"{c['autograd_cache_hit']} / {c['autograd_cache_miss']} / {c['autograd_cache_bypass']}"
        )
        lines.append(f"| {name} | {got['seconds']:.1f} | {fx} | {aot} |")
        if got["bypasses"]:
            lines.append(f"| ↳ bypassed | | {got['bypasses']} | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--reference-precision", default="bf16-autocast")
    parser.add_argument("--matmul-precision", default="high")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    unknown = set(args.candidates.split(",")) - set(CANDIDATES)
    if unknown:
        parser.error(f"--candidates: {', '.join(sorted(unknown))}: allowed {', '.join(CANDIDATES)}")
    write_model_record(args, "compile_reuse.py", "compile-reuse", measure(args), to_markdown)


if __name__ == "__main__":
    main()
