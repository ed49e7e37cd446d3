"""The program side of the protocol (`trainers.program.protocol`), for a Python training program.

    reporter = Reporter.from_env()               # settings and run shape from STREAMTUNE_*
    config = reporter.config                     # a LoopConfig; use the fields you implement
    reporter.perturb(model)                      # no-op unless the gate asks for it
    reporter.start(samples_per_batch=batch_size)
    for index, size in enumerate(reporter.window_sizes()):   # after reporter.warmup steps
        with reporter.window(index, size, device):           # synced at both ends
            ...train `size` steps...
    reporter.losses(0, all_losses)               # any time, in step order
    reporter.end(n_syncs=syncs)

Run outside the tuner (no STREAMTUNE_REPORT), `Reporter.from_env()` raises: a program that
should also run on its own checks `Reporter.active()` first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from trainers.config import LoopConfig
from trainers.errors import ConfigError
from trainers.gate.trajectories import Perturbation
from trainers.measure import fingerprint, window_sizes
from trainers.program.protocol import PROTOCOL
from trainers.tuned import ENV_PREFIX, config_from_env


@dataclasses.dataclass
class Reporter:
    report: Path
    config: LoopConfig
    warmup: int
    steps: int
    windows: int
    device: str
    precision: str | None
    seed: int
    preset: str
    perturb_seed: int | None
    perturb_eps: float | None
    _handle: TextIO | None = None

    @staticmethod
    def active(environ: Mapping[str, str] | None = None) -> bool:
        """Whether this process was started by the tuner (STREAMTUNE_REPORT is set)."""
        return bool((os.environ if environ is None else environ).get(f"{ENV_PREFIX}REPORT"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Reporter:
        variables = os.environ if environ is None else environ

        def get(name: str) -> str:
            value = variables.get(f"{ENV_PREFIX}{name}")
            if value is None:
                raise ConfigError(f"{ENV_PREFIX}{name}", None, "set by the tuner (a program run)")
            return value

        def number(name: str) -> int:
            raw = get(name)
            try:
                return int(raw)
            except ValueError as exc:
                raise ConfigError(f"{ENV_PREFIX}{name}", raw, "an integer") from exc

        perturb_seed = variables.get(f"{ENV_PREFIX}PERTURB_SEED") or None
        perturb_eps = variables.get(f"{ENV_PREFIX}PERTURB_EPS") or None
        return cls(
            report=Path(get("REPORT")),
            config=config_from_env(variables),
            warmup=number("WARMUP"),
            steps=number("STEPS"),
            windows=number("WINDOWS"),
            device=get("DEVICE"),
            precision=get("PRECISION") or None,
            seed=number("SEED"),
            preset=get("PRESET"),
            perturb_seed=None if perturb_seed is None else int(perturb_seed),
            perturb_eps=None if perturb_eps in (None, "None") else float(perturb_eps),
        )

    def window_sizes(self) -> list[int]:
        return window_sizes(self.steps, self.windows)

    def perturb(self, model: nn.Module) -> None:
        """Move the weights by one rounding unit when the gate measures its envelope."""
        if self.perturb_seed is not None:
            Perturbation(seed=self.perturb_seed, eps=self.perturb_eps).apply(model)

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._handle is None:
            self._handle = self.report.open("a", encoding="utf-8")
        # One line per write, flushed: the tuner reads windows as they come (pruning).
        self._handle.write(json.dumps(line) + "\n")
        self._handle.flush()

    def start(self, *, samples_per_batch: int, tokens_per_sample: int | None = None) -> None:
        device = torch.device(self.device)
        line: dict[str, Any] = {
            "event": "start",
            "protocol": PROTOCOL,
            "samples_per_batch": samples_per_batch,
            "device": str(device),
            "fingerprint": fingerprint(device),
        }
        if tokens_per_sample is not None:
            line["tokens_per_sample"] = tokens_per_sample
        self._write(line)

    def losses(self, first_step: int, values: Sequence[float]) -> None:
        self._write({"event": "loss", "step": first_step, "losses": [float(v) for v in values]})

    def window_seconds(self, index: int, steps: int, seconds: float) -> None:
        self._write({"event": "window", "index": index, "steps": steps, "seconds": seconds})

    @contextlib.contextmanager
    def window(self, index: int, steps: int, device: torch.device) -> Iterator[None]:
        """Time the block as window `index` of `steps` steps, the device synced at both ends."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # nothing from before the window is counted
        started = time.perf_counter()
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # everything queued in the window is counted
        self.window_seconds(index, steps, time.perf_counter() - started)

    def end(self, **counters: Any) -> None:
        """The end line: the counters (`n_syncs`, ...) and whatever else the run adds (a
        data-parallel run: its world size and every rank's losses)."""
        self._write({"event": "end", **counters})
        if self._handle is not None:
            self._handle.close()
            self._handle = None
