"""A `Trainer` checkpoint (`trainers.fit`): its format, the file the checkpoint of a step goes to
(`checkpoint_file`), the random-number states it carries (`rng_state`, `set_rng_state`), reading
one (`read_checkpoint`), and whether a Trainer may resume from it (`check_resumable`,
`check_fits`: checked whole before anything is restored, so a refused one leaves the Trainer as
it was).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import string
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainers.config import LoopConfig
from trainers.errors import ConfigError

CHECKPOINT_FORMAT = "streamtune-trainer/1"


def checkpoint_file(path: str | os.PathLike[str], step: int) -> Path:
    """Where the checkpoint of `step` goes: `path`, with `{step}` in it filled in by the step
    (a format spec too: `{step:06d}`), so that `run-{step}.pt` keeps every checkpoint
    (run-500.pt, run-1000.pt) where `run.pt` keeps the latest only. ConfigError naming
    `checkpoint_path` for any other placeholder (`{step:04d}` had been kept as written, every
    checkpoint overwriting one file), for a folder, where no file can be written, and for a
    path no file can be written at (`check_target`)."""
    target = filled_path(path, step)
    check_target(target, "checkpoint_path", str(path), "run-{step}.pt")
    return target


def filled_path(path: str | os.PathLike[str], step: int) -> Path:
    """`path` with its `{step}` filled in; ConfigError naming `checkpoint_path` for any other
    placeholder. Not checked as a target: `checkpoint_file` and `Trainer.save` check that."""
    text = str(path)
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
        filled = text.format(step=step) if fields == {"step"} else text
    except (ValueError, IndexError, KeyError) as exc:
        raise ConfigError(
            "checkpoint_path", text, f"a file path whose only placeholder is {{step}} ({exc})"
        ) from exc
    if fields - {"step"}:
        raise ConfigError(
            "checkpoint_path",
            text,
            "a file path whose only placeholder is {step} (run-{step}.pt, run-{step:06d}.pt)",
        )
    return Path(filled)


def check_target(target: Path, field: str, given: str, example: str) -> None:
    """ConfigError naming `field` unless a file can be written at `target`: not a folder (or no
    name at all), and in a folder this process can write (`_unwritable`)."""
    if not str(target).strip() or target.name in ("", ".", "..") or target.is_dir():
        raise ConfigError(field, given, f"a file path ({example}), not a folder")
    unwritable = _unwritable(target)
    if unwritable is not None:
        raise ConfigError(
            field, given, f"a file path in a folder this process can write ({unwritable})"
        )


def _unwritable(target: Path) -> str | None:
    """Why no checkpoint can be written at `target`, or None: its nearest existing folder is a
    file, or this process cannot create a file in it. Checked before a step: a file among the
    folders (`run.pt/run-{step}.pt`) or a read-only one had raised a raw OSError at the first
    checkpoint, the steps trained so far lost (a user's probe, 2026-12-07). The folders not
    there yet are made when the checkpoint is written."""
    existing = target.parent.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{str(existing)!r} is a file"
    try:
        with tempfile.TemporaryFile(dir=existing):
            return None
    except OSError as exc:
        return f"{str(existing)!r}: {exc.strerror or exc}"


def checkpoint_of(state: Any, path: str | os.PathLike[str] | None = None) -> Mapping[str, Any]:
    """`state` if it is a Trainer checkpoint, else a ConfigError naming `resume_from` (the file
    `path` where it is known) that says what it is: a list or a tensor saved with torch.save had
    raised AttributeError, and a model's bare state dict a TrainerError that code catching
    ConfigError, as every other refusal of a file is, missed (a user's probe, 2026-12-07)."""
    if not isinstance(state, Mapping):
        held = f"a {type(state).__name__}"
    elif state.get("format") != CHECKPOINT_FORMAT:
        held = f"format {state.get('format')!r}"
    else:
        return state
    allowed = f"a streamtune Trainer checkpoint, of format {CHECKPOINT_FORMAT!r}: this is not one"
    allowed += f" ({held})"
    raise ConfigError("resume_from", type(state).__name__ if path is None else str(path), allowed)


SCHEDULING_ONLY = frozenset(
    {
        "num_streams",
        "sync_interval",
        "sync_mode",
        "prefetch_depth",
        "pin_memory",
        "non_blocking",
        "num_workers",
    }
)
"""The settings that only order the host's and the device's work: no weight, optimizer state,
learning rate or captured graph depends on them, so a checkpoint resumes under others (a run
trained with the defaults, then tuned, had been refused its tuned config)."""


def check_resumable(
    state: Mapping[str, Any],
    *,
    accumulate: int,
    config: LoopConfig,
    scheduler: str | None,
    precision: str = "fp32",
    clip_grad_norm: float | None = None,
) -> None:
    """ConfigError unless `state` is a Trainer checkpoint (`checkpoint_of`), or naming what
    differs where a Trainer with these settings (`scheduler`: the kind of its scheduler, or
    None) cannot resume from it."""
    checkpoint_of(state)
    # Recorded from 2026-12-06 (older checkpoints hold neither): a bf16-autocast run resumed in
    # fp32 without a word, and a GradScaler's state was dropped (a user's probe).
    for field, own in (("precision", precision), ("clip_grad_norm", clip_grad_norm)):
        if field in state and state[field] != own:
            raise ConfigError(field, own, f"{state[field]!r}, as in the checkpointed run")
    if state["accumulate"] != accumulate:
        raise ConfigError(
            "accumulate",
            accumulate,
            f"{state['accumulate']}, as in the checkpoint (its data position counts micro-batches)",
        )
    saved = state.get("config")
    changed = sorted(
        k
        for k, v in config.to_dict().items()
        if (saved or {}).get(k) != v and k not in SCHEDULING_ONLY
    )
    if changed:
        raise ConfigError(
            "config",
            ", ".join(f"{k}={getattr(config, k)!r}" for k in changed),
            "the checkpointed run's config ("
            + ", ".join(f"{k}={(saved or {}).get(k)!r}" for k in changed)
            + "): the optimizer's state and learning rates are restored as that config "
            "built them",
        )
    if (state["scheduler"] is not None) != (scheduler is not None):
        raise ConfigError(
            "scheduler",
            scheduler,
            "the same as the checkpointed run (it had "
            + ("none" if state["scheduler"] is None else "one")
            + ")",
        )
    # Its kind, recorded from 2026-12-06: another kind of scheduler had been refused as another
    # optimizer (OneCycleLR adds its own keys to the optimizer's groups).
    saved_kind = state.get("scheduler_kind")
    if saved_kind is not None and scheduler is not None and saved_kind != scheduler:
        raise ConfigError("scheduler", scheduler, f"{saved_kind}, as the checkpointed run had")


def read_checkpoint(path: str | os.PathLike[str], device: torch.device) -> Any:
    """The checkpoint at `path`; a ConfigError naming `resume_from` where there is none or torch
    cannot read it (a truncated or foreign file had raised torch's own KeyError or
    RuntimeError, a traceback for a user's wrong path)."""
    if not str(path).strip():  # Path("") is the working folder
        raise ConfigError("resume_from", str(path), "a checkpoint file's path")
    try:
        return torch.load(Path(path), map_location=device, weights_only=True)
    except FileNotFoundError as exc:
        raise ConfigError("resume_from", str(path), "an existing checkpoint file") from exc
    except IsADirectoryError as exc:
        raise ConfigError("resume_from", str(path), "a checkpoint file, not a folder") from exc
    except Exception as exc:  # torch raises many kinds for a file it cannot read
        raise ConfigError(
            "resume_from",
            str(path),
            f"a checkpoint written by Trainer.save (torch could not read this one: "
            f"{_unreadable(exc)})",
        ) from exc


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_UNPICKLER = re.compile(r"WeightsUnpickler error: (.*?)(?: Check the documentation|$)")


def _unreadable(exc: Exception) -> str:
    """Why torch could not read a file, in a few words: its weights-only refusal is a page of
    advice to load the file with `weights_only=False` (with terminal colour codes), which is
    no fix for a file that is no Trainer checkpoint."""
    said = " ".join(_ANSI.sub("", str(exc)).split())
    if said.startswith("Weights only load failed"):
        found = _GLOBAL.search(said)
        if found is not None:
            return (
                f"it holds Python objects such as {found.group(1)}, where a Trainer checkpoint "
                "holds tensors and plain values"
            )
        detail = _UNPICKLER.search(said)
        return "its weights-only reader refused it" + (
            f": {detail.group(1).rstrip('. ')}" if detail else ""
        )
    return said[:160] or type(exc).__name__


def data_of(workload: Any) -> list[int | None]:
    """What a checkpoint's data position is counted in: the batch size and the dataset's
    length (None where it has none)."""
    try:
        length = len(workload.dataset)
    except TypeError:  # an IterableDataset, say
        length = None
    return [workload.batch_size, length]


def check_fits(
    state: Mapping[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: list[int | None] | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> None:
    """ConfigError naming `resume_from` unless `state`'s model has this model's tensors
    (`check_model`), its data this data and its optimizer this optimizer's kind of parameter
    groups: one of another optimizer (SGD into Adam) loaded and raised `KeyError: 'betas'` at
    the first step with the weights already replaced (a user's probe, 2026-12-05). `path`: the
    file it was read from, which the error names (None: a state given as it is)."""
    check_model(state, model, path=path)
    if data is not None and state.get("data") not in (None, data):
        # The position (`step` batches in) would be counted in other batches, or past the end
        # of other data (a user's probe: a resume with batch_size 8 after 16 was taken).
        (size, length), (was, were) = data, state["data"]
        raise _refused(
            path,
            f"a run of batch_size={was} on {were} samples",
            f"a checkpoint of this data (batch_size={size} on {length} samples)",
        )
    groups = [sorted(k for k in g if k != "params") for g in state["optimizer"]["param_groups"]]
    mine = [sorted(k for k in g if k != "params") for g in optimizer.param_groups]
    if groups != mine:
        raise _refused(
            path,
            f"an optimizer with settings {groups[0] if groups else []}",
            f"a checkpoint of this optimizer ({type(optimizer).__name__}, settings "
            f"{mine[0] if mine else []})",
        )
    _check_parameters(state["optimizer"], optimizer, path)


def _check_parameters(
    saved: Mapping[str, Any], optimizer: torch.optim.Optimizer, path: str | os.PathLike[str] | None
) -> None:
    """The saved optimizer steps as many parameters per group as this one, each of its state
    tensors shaped as the parameter it is paired with: a layer frozen or unfrozen since had
    loaded the weights, then failed in torch's `load_state_dict` (the weights already
    replaced), or at the first step, or paired one layer's Adam state with another's (a user's
    probe, 2026-12-06)."""
    counts = [len(group["params"]) for group in saved["param_groups"]]
    mine = [len(group["params"]) for group in optimizer.param_groups]
    if counts != mine:
        raise _refused(
            path,
            f"an optimizer of {sum(counts)} parameters (by group: {counts})",
            f"a checkpoint of this optimizer's {sum(mine)} parameters (by group: {mine}; a "
            "layer frozen or unfrozen since the checkpoint changes them)",
        )
    ids = [index for group in saved["param_groups"] for index in group["params"]]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    for position, (index, param) in enumerate(zip(ids, params, strict=True)):
        for name, value in saved["state"].get(index, {}).items():
            if isinstance(value, torch.Tensor) and not _fits(value, param):
                raise _refused(
                    path,
                    f"optimizer state {name!r} of parameter {position} shaped {list(value.shape)}",
                    f"a checkpoint of this optimizer's parameters (parameter {position} is "
                    f"shaped {list(param.shape)}; a layer frozen or unfrozen since the "
                    "checkpoint changes which are stepped)",
                )


def check_model(
    state: Mapping[str, Any],
    model: torch.nn.Module,
    *,
    path: str | os.PathLike[str] | None = None,
) -> None:
    """ConfigError naming `resume_from` unless `state`'s model has this model's tensors (names
    and shapes), saying which workload the checkpoint is of: a checkpoint of another model
    raised torch's "Error(s) in loading state_dict", then was refused for its config. A
    Trainer checks it before the config (`check_resumable`)."""
    saved = state["model"]
    own = model.state_dict()
    differ = sorted(
        name
        for name in own.keys() | saved.keys()
        if name not in own
        or name not in saved
        or tuple(own[name].shape) != tuple(saved[name].shape)
    )
    if differ:
        shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        allowed = f"a checkpoint of this model: its tensors' names and shapes differ{_of(state)}"
        allowed += _compiled(own, saved)
        if path is None:
            raise ConfigError("resume_from", f"{len(differ)} tensors ({shown})", allowed)
        # Counted over both: a name in one of them only, or a shape that differs.
        raise ConfigError(
            "resume_from",
            str(path),
            f"{allowed}; the file and this model differ in {len(differ)} tensors ({shown})",
        )


def _compiled(own: Mapping[str, Any], saved: Mapping[str, Any]) -> str:
    """Why the names differ where one side is the other under `torch.compile`'s wrapper: a
    model given to the Trainer compiled saves its tensors as `_orig_mod.NAME` (a probe,
    2026-12-07: "differ in 8 tensors" said nothing of it)."""
    prefix = "_orig_mod."

    def plain(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        return {name.removeprefix(prefix): tuple(t.shape) for name, t in state.items()}

    if set(own) != set(saved) and plain(own) == plain(saved):
        side = "the file's" if any(n.startswith(prefix) for n in saved) else "this model's"
        return (
            f" only by {side} '{prefix}' prefix, torch.compile's wrapper: give the Trainer the "
            "model that was saved (compiled or not) or the loop's compile setting instead"
        )
    return ""


def _fits(state: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether an optimizer's state tensor can be `param`'s: one of another rank is taken (a
    step count; quantized blocks), one of its rank where each size is the parameter's or 1
    (Adam's moments; Adafactor's factored row and column)."""
    if state.dim() != param.dim():
        return True
    return all(size in (1, own) for size, own in zip(state.shape, param.shape, strict=True))


def _refused(path: str | os.PathLike[str] | None, held: str, allowed: str) -> ConfigError:
    """The error naming `resume_from`: the file where it is known, with what it `held` (a
    resume of another model's file had said only "resume_from='3 tensors (...)'", not which
    file); what it held in the value's place where no file is (a state given as it is)."""
    if path is None:
        return ConfigError("resume_from", held, allowed)
    return ConfigError("resume_from", str(path), f"{allowed}; the file has {held}")


def _of(state: Mapping[str, Any]) -> str:
    workload = state.get("workload")
    if isinstance(workload, list | tuple) and len(workload) == 2:
        return f" (the checkpoint is of workload {workload[0]!r}, preset {workload[1]!r})"
    return ""


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


@contextlib.contextmanager
def refusal_naming(argument: str) -> Iterator[None]:
    """A checkpoint's refusal naming `argument`, what the method was given, not `fit`'s
    `resume_from` (`load(path)` had been told "resume_from=... is invalid", a user's probe,
    2026-12-07)."""
    try:
        yield
    except ConfigError as exc:
        if exc.field != "resume_from":
            raise
        raise ConfigError(argument, exc.value, exc.allowed) from exc
