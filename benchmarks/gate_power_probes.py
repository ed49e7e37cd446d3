"""The eager reproducibility probes of `benchmarks/gate_power.py`: per model, precision and
determinism mode, whether the eager step reproduces itself (`probe_entry`) and what each mode
costs (`time_modes`, interleaved).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.gate_power_models import ModelSpec
from trainers import REFERENCE, Precision, RunArgs, TrainerError, run
from trainers.gate import Determinism, Reproducibility
from trainers.gate.reproducibility import measure as measure_reproducibility
from trainers.gate.trajectories import deterministic
from trainers.loop import min_warmup
from trainers.workloads import WorkloadFactory, disable_dropout


@contextlib.contextmanager
def determinism_mode(mode: Determinism) -> Iterator[None]:
    """The kernels' settings of a gate run under `mode` (`trainers.gate.trajectories`), for
    timing: warn-only where strict mode would refuse an op without a deterministic version."""
    if mode == "off":
        yield
        return
    with deterministic(strict=False):
        yield


def eager_step_ms(
    factory: WorkloadFactory,
    spec: ModelSpec,
    precision: Precision | None,
    device: torch.device,
    mode: Determinism,
    steps: int,
) -> float:
    """The reference loop's median ms/step under `mode` (dropout off, as in the gate), after 5
    warm-up steps, over 3 windows."""
    workload = factory(spec.preset, seed=0)
    disable_dropout(workload.model)
    with determinism_mode(mode):
        result = run(
            workload,
            REFERENCE,
            RunArgs(
                steps=max(3, steps),
                warmup=max(5, min_warmup(REFERENCE)),
                windows=3,
                device=device,
                precision=precision,
            ),
        )
    return float(result.step_time_ms["median"])


def probe_entry(
    factory: WorkloadFactory,
    spec: ModelSpec,
    precision: Precision | None,
    device: torch.device,
    mode: Determinism,
    steps: int,
    *,
    capture: bool,
) -> tuple[dict[str, Any], Reproducibility | None]:
    """One row of `probes`: the reproducibility probe under `mode` (its time comes later);
    `capture`: the one-stream graph against its eager twin too (on a GPU)."""
    try:
        probe = measure_reproducibility(
            factory,
            spec.preset,
            RunArgs(steps=steps, device=device, precision=precision),
            determinism=mode,
            capture=capture,
        )
    except (RuntimeError, TrainerError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}, None
    return {**probe.to_dict(), "step_ms": None, "step_ms_rounds": []}, probe


def time_modes(
    factory: WorkloadFactory,
    spec: ModelSpec,
    precision: Precision | None,
    device: torch.device,
    row: dict[str, dict[str, Any]],
    *,
    rounds: int = 2,
) -> None:
    """The eager step's ms/step in each probed mode, interleaved (A B A B) so that clock and load
    drift hit every mode alike; the median of the rounds, and strict's extra ms over off."""
    modes = [mode for mode, entry in row.items() if "error" not in entry]
    for _ in range(rounds):
        for mode in modes:
            try:
                ms = eager_step_ms(factory, spec, precision, device, mode, steps=20)  # type: ignore[arg-type]
            except (RuntimeError, TrainerError) as exc:
                row[mode]["step_ms_error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            row[mode]["step_ms_rounds"].append(ms)
    for mode in modes:
        times = row[mode]["step_ms_rounds"]
        row[mode]["step_ms"] = statistics.median(times) if times else None
    if row.get("strict", {}).get("step_ms") and row.get("off", {}).get("step_ms"):
        row["strict"]["extra_ms_vs_off"] = row["strict"]["step_ms"] - row["off"]["step_ms"]
