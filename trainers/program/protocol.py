"""The protocol (version 1) between the tuner and a program run as a workload: settings in through
environment variables (`program_env`), measurements out as JSON lines in a file (`ReportReader`
checks them line by line and makes the `RunResult`).

In, for every run (`program_env`):
- `STREAMTUNE_<FIELD>` for every `LoopConfig` field (the `env` export's names and values:
  `STREAMTUNE_NUM_STREAMS=2`, `STREAMTUNE_CUDA_GRAPH=true`, ...);
- `STREAMTUNE_WARMUP`, `STREAMTUNE_STEPS`, `STREAMTUNE_WINDOWS`: untimed steps, then timed steps
  split into that many windows (`trainers.measure.window_sizes`);
- `STREAMTUNE_DEVICE` (cpu, cuda or cuda:N), `STREAMTUNE_PRECISION` (empty: fp32), `STREAMTUNE_SEED`
  (initial weights and data), `STREAMTUNE_PRESET`;
- `STREAMTUNE_PERTURB_SEED` and `STREAMTUNE_PERTURB_EPS` (empty unless the correctness gate
  measures its noise envelope): multiply every weight by 1 + s * eps, s a random sign per element
  drawn from that seed, before the first step (`trainers.gate.trajectories.Perturbation`);
- `STREAMTUNE_REPORT`: the file to append the JSON lines to.
The program's command comes from the registry (`trainers.program.registry`); `{python}` (this
Python), `{preset}`, `{device}`, `{steps}`, `{warmup}`, `{windows}` and `{seed}` in it are
replaced.

Out, one JSON object per line, in this order:
- `{"event": "start", "protocol": 1, "samples_per_batch": N, "device": "cuda:0",
  "fingerprint": {...}}` (`tokens_per_sample` optional);
- `{"event": "loss", "step": i, "loss": x}` for every step, warm-up included, in step order,
  whenever the program has them (`"losses": [...]` with `"step"` the first one also works);
- `{"event": "window", "index": j, "steps": n, "seconds": s}` after each timed window, its wall
  time measured with a device sync at both ends, as the built-in loop does;
- `{"event": "end", "n_syncs": K}` (optional counters: `n_syncs`, `sync_wait_ms`,
  `peak_memory_bytes`, `flops_per_step`: one process's model FLOPs per step, for its MFU).
A window is read as soon as its line is written: a pruned run's program is stopped there
(`trainers.program.runner`). A program that writes a malformed line or skips a step or a window
is a failed run.

`trainers.program.Reporter` is the Python side of the protocol; `examples/program/` holds a
plain PyTorch program that uses it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainers.config import LoopConfig
from trainers.errors import TrainerError
from trainers.harvest import LossLedger
from trainers.measure import RunResult, Window
from trainers.program.registry import PREFIX, Program
from trainers.runargs import RunArgs
from trainers.tuned import ENV_PREFIX

PROTOCOL = 1
# The shortest step a window may report, in seconds: below any GPU kernel launch.
MIN_STEP_S = 1e-6


def program_env(
    program: Program,
    preset: str,
    config: LoopConfig,
    args: RunArgs,
    *,
    device: torch.device,
    report: Path,
    perturb: tuple[int, float | None] | None = None,
) -> dict[str, str]:
    """The variables a run of `program` with `args` gets, on top of this process's environment
    (`device`: `args.device` resolved)."""
    values = {
        f"{ENV_PREFIX}{field.upper()}": str(value).lower()
        if isinstance(value, bool)
        else str(value)
        for field, value in config.to_dict().items()
    }
    perturb_seed, perturb_eps = perturb if perturb is not None else (None, None)
    values |= {
        f"{ENV_PREFIX}WARMUP": str(args.warmup),
        f"{ENV_PREFIX}STEPS": str(args.steps),
        f"{ENV_PREFIX}WINDOWS": str(args.windows),
        f"{ENV_PREFIX}DEVICE": str(device),
        f"{ENV_PREFIX}PRECISION": args.precision or "",
        f"{ENV_PREFIX}SEED": str(args.seed),
        f"{ENV_PREFIX}PRESET": preset,
        f"{ENV_PREFIX}PERTURB_SEED": "" if perturb_seed is None else str(perturb_seed),
        f"{ENV_PREFIX}PERTURB_EPS": "" if perturb_eps is None else repr(perturb_eps),
        f"{ENV_PREFIX}REPORT": str(report),
    }
    return {**os.environ, **program.env, **values}


class ReportReader:
    """The program's lines, checked one at a time against the protocol."""

    def __init__(
        self,
        name: str,
        total_steps: int,
        sizes: Sequence[int],
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self.name = name
        self.on_start = on_start
        self.total_steps = total_steps
        self.sizes = list(sizes)
        self.ledger = LossLedger()
        self.windows: list[Window] = []
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.error: str | None = None

    def feed(self, raw: bytes) -> tuple[int, Window] | None:
        if self.error is not None or not raw.strip():
            return None
        try:
            line = json.loads(raw)
            return self._event(line)
        except (ValueError, TypeError, KeyError, TrainerError) as exc:
            self.error = f"malformed report line {raw[:200]!r}: {exc}"
            return None

    def _event(self, line: Any) -> tuple[int, Window] | None:
        if not isinstance(line, dict):
            raise ValueError("not a JSON object")
        event = line["event"]
        if self.start is None and event != "start":
            raise ValueError("the first line must be the start event")
        if event == "start":
            if self.start is not None:
                raise ValueError("a second start event")
            if line.get("protocol") != PROTOCOL:
                raise ValueError(f"protocol {line.get('protocol')!r}, expected {PROTOCOL}")
            samples = line["samples_per_batch"]
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
                raise ValueError("samples_per_batch must be an integer >= 1")
            self.start = line
            if self.on_start is not None:
                self.on_start(samples)
        elif event == "loss":
            values = line["losses"] if "losses" in line else [line["loss"]]
            floats = [float(v) for v in values]
            self.ledger.take(int(line["step"]), floats)
            if len(self.ledger.losses) > self.total_steps:
                raise ValueError(f"more than {self.total_steps} losses")
        elif event == "window":
            index = int(line["index"])
            if index != len(self.windows) or index >= len(self.sizes):
                raise ValueError(f"window {index} out of order")
            steps, seconds = line["steps"], line["seconds"]
            if not _is_count(steps) or not _is_number(seconds):
                # int() and float() had taken 2.5, true and "0.01".
                raise ValueError(f"window {index} needs an integer steps and a number seconds")
            if steps != self.sizes[index]:
                raise ValueError(f"window {index} has {steps} steps, expected {self.sizes[index]}")
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"window {index} took {seconds!r} s")
            if seconds < steps * MIN_STEP_S:
                # No training step runs in under a microsecond (one kernel launch takes several):
                # a window of 1e-300 s had been taken as 1e300 samples/s and won the search.
                raise ValueError(
                    f"window {index} took {seconds!r} s for {steps} steps, under 1 us a step: "
                    "time the steps themselves (Reporter.window)"
                )
            window = Window(steps=steps, wall_ms=seconds * 1e3, gpu_ms=None)
            self.windows.append(window)
            return index, window
        elif event == "end":
            # Checked here, where a bad line is the program's named fault: read later, a string
            # peak ended the tuner with a TypeError in its final round (a probe, 2026-12-06).
            for key in ("n_syncs", "n_polls", "peak_memory_bytes"):
                if line.get(key) is not None and not _is_count(line[key]):
                    raise ValueError(f"{key} must be an integer >= 0, not {line[key]!r}")
            wait = line.get("sync_wait_ms", 0.0)
            if not _is_number(wait) or not math.isfinite(wait) or wait < 0:
                raise ValueError(f"sync_wait_ms must be a number >= 0, not {wait!r}")
            self.end = line
        else:
            raise ValueError(f"unknown event {event!r}")
        return None

    def missing(self) -> str | None:
        if self.start is None:
            return "no start event"
        if len(self.windows) != len(self.sizes):
            return f"{len(self.windows)} of {len(self.sizes)} windows reported"
        if len(self.ledger.losses) != self.total_steps:
            return f"{len(self.ledger.losses)} of {self.total_steps} losses reported"
        if self.end is None:
            return "no end event"
        return None

    def result(
        self,
        program: Program,
        preset: str,
        config: LoopConfig,
        *,
        warmup: int,
        stopped: bool,
        dev: torch.device,
    ) -> RunResult:
        assert self.start is not None
        end = self.end or {}
        steps = sum(w.steps for w in self.windows)
        return RunResult(
            config=config.to_dict(),
            workload=f"{PREFIX}{program.name}",
            preset=preset,
            device=str(self.start.get("device", dev)),
            effective={"program": program.name, "settings": list(program.settings)},
            warmup_steps=warmup,
            steps=steps,
            stopped_early=stopped,
            losses=list(self.ledger.losses),
            loss_check=self.ledger.proof(warmup + steps),
            n_syncs=int(end.get("n_syncs") or 0),
            n_polls=int(end.get("n_polls") or 0),
            sync_wait_ms=float(end.get("sync_wait_ms", 0.0)),
            windows=list(self.windows),
            samples_per_batch=int(self.start["samples_per_batch"]),
            tokens_per_sample=self.start.get("tokens_per_sample"),
            peak_memory_bytes=end.get("peak_memory_bytes"),
            flops_per_step=_flops(end.get("flops_per_step")),
            fingerprint=dict(self.start.get("fingerprint") or {}),
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _flops(value: Any) -> int | None:
    """The end line's `flops_per_step` where it is a positive count; None (MFU unknown) else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)
