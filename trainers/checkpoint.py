"""A `Trainer` checkpoint (`trainers.fit`): its format, the file the checkpoint of a step goes to
(`checkpoint_file`), the random-number states it carries (`rng_state`, `set_rng_state`), and
whether a Trainer may resume from it (`check_resumable`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainers.config import LoopConfig
from trainers.errors import ConfigError, TrainerError

CHECKPOINT_FORMAT = "streamtune-trainer/1"


def checkpoint_file(path: str | os.PathLike[str], step: int) -> Path:
    """Where the checkpoint of `step` goes: `path`, with `{step}` in it replaced by the step, so
    that `run-{step}.pt` keeps every checkpoint (run-500.pt, run-1000.pt) where `run.pt` keeps
    the latest only."""
    return Path(str(path).replace("{step}", str(step)))


def check_resumable(
    state: Mapping[str, Any], *, accumulate: int, config: LoopConfig, scheduler: bool
) -> None:
    """TrainerError unless `state` is a Trainer checkpoint; ConfigError naming what differs where
    a Trainer with these settings (`scheduler`: whether it has one) cannot resume from it."""
    if state.get("format") != CHECKPOINT_FORMAT:
        raise TrainerError(
            f"not a streamtune Trainer checkpoint (format {state.get('format')!r}, "
            f"expected {CHECKPOINT_FORMAT!r})"
        )
    if state["accumulate"] != accumulate:
        raise ConfigError(
            "accumulate",
            accumulate,
            f"{state['accumulate']}, as in the checkpoint (its data position counts micro-batches)",
        )
    saved = state.get("config")
    if saved != config.to_dict():
        changed = sorted(k for k, v in config.to_dict().items() if (saved or {}).get(k) != v)
        raise ConfigError(
            "config",
            ", ".join(f"{k}={getattr(config, k)!r}" for k in changed),
            "the checkpointed run's config ("
            + ", ".join(f"{k}={(saved or {}).get(k)!r}" for k in changed)
            + "): the optimizer's state and learning rates are restored as that config "
            "built them",
        )
    if (state["scheduler"] is not None) != scheduler:
        raise ConfigError(
            "scheduler",
            "given" if scheduler else None,
            "the same as the checkpointed run (it had "
            + ("none" if state["scheduler"] is None else "one")
            + ")",
        )


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # As plain lists: a checkpoint loads with weights_only=True (no pickled objects).
        "numpy": _numpy_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _numpy_state() -> list[Any]:
    name, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return [str(name), [int(k) for k in keys], int(position), int(has_gauss), float(cached)]


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "numpy" in state:
        name, keys, position, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
