"""Does a profile still slow the process that ran it when Kineto tears CUPTI down?

The tuner profiles in a child process (`tuner.search.deciding.profile_child`) because a
`torch.profiler` pass with CUDA activity left CUPTI attached and slowed every later launch of
the process (pytorch/pytorch#144455; on an H100 in 2026-11 the seed baseline of transformer
`small` ran 14.3-15.3 ms a step before a profile and 15.4-22.5 ms after it). Kineto calls
`cuptiFinalize` after a profile where `TEARDOWN_CUPTI=1` (and, in newer Kineto, by default
from CUDA 12.6). If that holds here, the recommended config's profile could run in the process
that already holds its compiled code instead of compiling it again in the child (131 s of a
542 s cold job at the Qwen2-style shape, 2026-12-04).

Each row is a fresh spawned process with `TEARDOWN_CUPTI` unset or set to 1 before torch is
imported: a config's median step time over `--steps` steps, then two profiles of it
(`tuner.evidence.trace.profile_config`: a second profile re-initialises CUPTI after a teardown,
which crashed with CUDA graphs on CUDA 12), with the median measured again after each.

    python benchmarks/cupti_teardown.py --out DIR
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    # The seed baseline's loop: eager, launch-bound at this size, so CUPTI's per-launch cost shows.
    "eager": {"num_streams": 2, "pin_memory": True, "non_blocking": True},
    # The compiled step captured in one CUDA graph: the case Kineto kept CUPTI up for.
    "compiled-graph": {"compile": "default", "cuda_graph": True, "optimizer": "fused"},
}
TEARDOWN = ("unset", "1")


def _row(
    teardown: str, name: str, workload: str, preset: str, steps: int, precision: str, where: str
) -> dict[str, Any]:
    """One process: the config's median before any profile and after each of two profiles."""
    if teardown != "unset":
        os.environ["TEARDOWN_CUPTI"] = teardown
    import torch

    import trainers
    from tuner.evidence import trace

    built = trainers.load_workload(workload, preset, seed=0)
    config = trainers.LoopConfig.from_dict(CONFIGS[name])
    device = torch.device(where)
    args = trainers.RunArgs(steps=steps, warmup=5, windows=1, device=device, precision=precision)

    def median() -> float:
        return round(trainers.run(built, config, args).step_time_ms["median"], 3)

    row: dict[str, Any] = {"teardown": teardown, "config": name, "before_ms": median()}
    for index in (1, 2):
        started = time.perf_counter()
        trace.profile_config(built, config, steps=10, warmup=5, device=device, precision=precision)
        row[f"profile_{index}_s"] = round(time.perf_counter() - started, 2)
        row[f"after_{index}_ms"] = median()
    row["after_ratio"] = round(max(row["after_1_ms"], row["after_2_ms"]) / row["before_ms"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--precision", default="bf16-autocast")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = args.configs.split(",")
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        parser.error(f"--configs: {', '.join(unknown)} unknown; allowed {', '.join(CONFIGS)}")
    rows = []
    for name in names:
        for teardown in TEARDOWN:
            # A fresh process each: CUPTI's state is per process, and the variable is read once.
            with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")
            ) as pool:
                future = pool.submit(
                    _row,
                    teardown,
                    name,
                    args.workload,
                    args.preset,
                    args.steps,
                    args.precision,
                    args.device,
                )
                try:
                    rows.append(future.result())
                except (BrokenProcessPool, RuntimeError) as error:  # a crash is a result too
                    rows.append({"teardown": teardown, "config": name, "error": repr(error)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"workload": args.workload, "preset": args.preset, "rows": rows}
        (args.out / "cupti-teardown.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
