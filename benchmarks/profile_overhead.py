"""Does a torch.profiler pass with CUDA activity (CUPTI) slow the measurements that follow it in
the same process? Matters for `--profile all`, which profiles every trial between measurements.

    python benchmarks/profile_overhead.py --preset small --matmul-precision high --out OUT.json

For each config (seed-baseline eager, whole-step graph): `--repeats` measurements before any
profile, interleaved; then one `profile_config` of each (in this process, or with `--isolated` in
a child process as the tuner does on a GPU); then `--repeats` measurements again. Prints and writes
the medians before and after, and the profiled step time itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers import LoopConfig, fingerprint, load_workload, resolve_device, run
from tuner.evidence.trace import profile_config
from tuner.search.isolated import ProfileProcess
from tuner.search.measure import PRECISIONS, set_matmul_precision

PINNED = {"pin_memory": True, "non_blocking": True}
CONFIGS = {
    "seed-baseline": LoopConfig(num_streams=2, **PINNED),
    "graph": LoopConfig(cuda_graph=True, sync_mode="event", sync_interval=10, **PINNED),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul-precision", choices=PRECISIONS, default="highest")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="profile in a child process (tuner.isolated.ProfileProcess)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    set_matmul_precision(args.matmul_precision)
    device = resolve_device(args.device)
    configs = {name: c for name, c in CONFIGS.items() if device.type == "cuda" or not c.cuda_graph}
    workload = load_workload("transformer", args.preset, seed=0)
    initial = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}

    def measure_all(phase: str, into: dict[str, dict[str, list[float]]]) -> None:
        for _ in range(args.repeats):
            for name, config in configs.items():
                workload.model.load_state_dict(initial)
                result = run(workload, config, steps=100, warmup=10, windows=5, device=device)
                into[name].setdefault(phase, []).append(result.step_time_ms["median"])
                print(f"{phase:<7} {name:<14} {result.step_time_ms['median']:.3f} ms", flush=True)

    step_ms: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    measure_all("before", step_ms)
    profiled: dict[str, dict[str, float | None]] = {}
    child = (
        ProfileProcess(
            "transformer",
            args.preset,
            steps=10,
            warmup=5,
            seed=0,
            device=str(device),
            matmul_precision=args.matmul_precision,
        )
        if args.isolated
        else None
    )
    for name, config in configs.items():
        workload.model.load_state_dict(initial)
        prof = (
            child.profile(config)
            if child is not None
            else profile_config(workload, config, device=device)
        )
        profiled[name] = {
            "profiled_step_ms": prof.step_ms,
            "unprofiled_window_ms": prof.unprofiled_step_ms,
            "gpu_busy_fraction": prof.gpu_busy_fraction,
            "seconds": prof.seconds,
        }
        print(
            f"profile {name:<14} {prof.step_ms:.3f} ms (unprofiled window "
            f"{prof.unprofiled_step_ms} ms), {prof.seconds:.1f} s",
            flush=True,
        )
    if child is not None:
        child.close()
    measure_all("after", step_ms)
    summary = {
        name: {
            "before_ms": phases["before"],
            "after_ms": phases["after"],
            "after_over_before": statistics.median(phases["after"])
            / statistics.median(phases["before"]),
            **profiled[name],
        }
        for name, phases in step_ms.items()
    }
    data = {
        "fingerprint": fingerprint(device),
        "preset": args.preset,
        "matmul_precision": args.matmul_precision,
        "repeats": args.repeats,
        "profiled_in": "a child process" if args.isolated else "the measuring process",
        "configs": summary,
    }
    args.out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    for name, entry in summary.items():
        print(f"{name}: after/before {entry['after_over_before']:.3f}")


if __name__ == "__main__":
    main()
