"""Does a profile's compile read what a trial's compile wrote into Inductor's cache?

On `llama-1b` (4 H200s, 2026-11-28) the recommended config's profile took 98 s in a child
process, while the trial of the same config compiled for 82 s and its eager baselines' profiles
took 20-25 s: the profile seems to compile cold although every process of the job shares one
TORCHINDUCTOR_CACHE_DIR. This runs one config in fresh spawned processes over one empty cache
folder, in order: a plain run (fills the cache), a profiled run (`tuner.evidence.trace`'s, the
profiler active from the first step as the profiles run it), a plain run again (the control: a
fresh process reading the cache) and a profiled run after a warm-up run without the profiler,
and prints each one's wall and compile seconds and Inductor's FX-graph cache hits and
misses as JSON.

    python benchmarks/diagnose_profile_cache.py --workload transformer --preset medium
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import tempfile
import time
from typing import Any

MODES = ("run", "profile", "run", "profile-after-warmup", "tuner-child")
"""The rows by default: each of the first four in a fresh spawned process, then a profile through
the tuner's own child (see the module doc). `again` (not by default): two runs in one process, the
second timed."""
OPTIONAL_MODES = ("again",)


def _keys_to(path: str | None) -> list[str]:
    """Collect the FX-graph cache's hash details (its debug log) into a list, written to `path`."""
    import logging

    found: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "hash details" in message:
                found.append(message)
                if path:
                    with open(path, "a") as f:
                        f.write(message + "\n\n")

    logger = logging.getLogger("torch._inductor.codecache")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Keep(logging.DEBUG))
    return found


def _cache_counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters
    from torch._inductor import config

    inductor = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    aot = {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}
    return {
        "compile_threads": config.compile_threads,
        "inductor": inductor,
        "aot_autograd": aot,
        "compile_phases_s": _compile_phases(),
    }


def _compile_phases() -> dict[str, float]:
    """Seconds per compile phase Dynamo timed (its tracing, AOTAutograd, Inductor), the largest
    first: where a compile that hit the FX-graph cache still spends its time."""
    from torch._dynamo.utils import compilation_time_metrics

    totals = {name: sum(times) for name, times in compilation_time_metrics.items()}
    largest = sorted(totals.items(), key=lambda item: -item[1])[:8]
    return {name: round(seconds, 2) for name, seconds in largest}


def _in_child(
    workload: str,
    preset: str,
    precision: str | None,
    mode: str,
    device_name: str,
    model_args: dict[str, str],
    keys_path: str | None,
    loop: dict[str, Any],
) -> dict[str, Any]:
    import torch

    import trainers
    from tuner.evidence import trace

    keys = _keys_to(keys_path)
    built = trainers.load_workload(workload, preset, seed=0, model_args=model_args)
    config = trainers.LoopConfig.from_dict(loop)
    device = torch.device(device_name)
    started = time.perf_counter()
    if mode in ("run", "again"):
        args = trainers.RunArgs(steps=20, warmup=3, windows=2, device=device, precision=precision)
        if mode == "again":
            # The same model object and config twice in one process, as the final round runs a
            # trial's config: the second run keeps the first's compiled code (reuse_key).
            trainers.run(built, config, args)
            started = time.perf_counter()
        result = trainers.run(built, config, args)
    elif mode == "profile":
        result, _ = trace._profiled_run(built, config, 10, 3, device, precision)
    else:  # "profile-after-warmup": the warm-up (and its compile) before the profiler exists
        trainers.run(
            built,
            config,
            trainers.RunArgs(steps=1, warmup=3, windows=1, device=device, precision=precision),
        )
        result, _ = trace._profiled_run(built, config, 10, 3, device, precision)
    return {
        "mode": mode,
        "wall_s": time.perf_counter() - started,
        "compile_s": result.compile_s,
        "cache_hits": result.compile_cache_hits,
        "cache_misses": result.compile_cache_misses,
        "keys": len(keys),
        **_cache_counters(),
    }


def _through_tuner_child(
    workload: str,
    preset: str,
    precision: str | None,
    device: str,
    model_args: dict[str, str],
    loop: dict[str, Any],
) -> dict[str, Any]:
    """The recommended config's profile as a job takes it: in the tuner's spawned child."""
    import trainers
    from tuner.search.deciding.profile_child import ProfileProcess

    child = ProfileProcess(
        workload,
        preset,
        steps=10,
        warmup=5,
        seed=0,
        device=device,
        matmul_precision="highest",
        model_args=model_args,
        precision=precision,
    )
    started = time.perf_counter()
    try:
        profile = child.profile(trainers.LoopConfig.from_dict(loop))
    finally:
        child.close()
    return {
        "mode": "tuner-child",
        "wall_s": time.perf_counter() - started,
        "seconds": profile.seconds,
        "phases": profile.phases,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--precision", default="bf16-autocast")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="the rows, in order (a 1B float8 compile takes about 2 minutes a row)",
    )
    parser.add_argument(
        "--config",
        default='{"compile": "default", "optimizer": "fused"}',
        help="the loop config as JSON (a job's recommended config, to profile what it profiled)",
    )
    parser.add_argument("--out", default=None, help="a folder for the JSON (else stdout only)")
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    model_args = dict(item.split("=", 1) for item in args.model_arg)
    loop = json.loads(args.config)
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES) - set(OPTIONAL_MODES))
    if unknown:
        parser.error(
            f"--modes: {', '.join(unknown)} unknown; allowed "
            f"{', '.join(dict.fromkeys(MODES + OPTIONAL_MODES))}"
        )
    # The tuner's child logs each FX-graph cache hit and miss (its counters stay in it).
    os.environ.setdefault("TORCH_LOGS", "torch._inductor.codecache")
    rows = []
    with tempfile.TemporaryDirectory(prefix="streamtune-cache-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # every spawned child inherits it
        for index, mode in enumerate(m for m in modes if m != "tuner-child"):
            keys = os.path.join(args.out, f"keys-{index}-{mode}.txt") if args.out else None
            # A fresh process each: what one process compiled stays in its own memory too.
            with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")
            ) as pool:
                row = pool.submit(
                    _in_child,
                    args.workload,
                    args.preset,
                    args.precision,
                    mode,
                    args.device,
                    model_args,
                    keys,
                    loop,
                )
                rows.append(row.result())
            print(json.dumps(rows[-1]), flush=True)
        if "tuner-child" in modes:
            rows.append(
                _through_tuner_child(
                    args.workload, args.preset, args.precision, args.device, model_args, loop
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(os.path.join(args.out, "profile-cache.json"), "w") as f:
            json.dump(
                {
                    "workload": args.workload,
                    "preset": args.preset,
                    "model_args": model_args,
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
