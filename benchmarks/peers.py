"""The recommendation against what a user would write instead, measured interleaved in one process.

    python benchmarks/peers.py --presets transformer:small,transformer:medium \
        --precisions tf32,bf16-autocast --trials 12 --search-timeout 180 --out docs/benchmarks

Per preset and precision, on one GPU:
1. a tuning job over the default space (`--space auto`: on a GPU the compiler levers without
   max-autotune; the runs of 2026-11-23 used `compile`, with it), `--trials`, `--search-timeout`:
   its wall time, GPU-seconds and recommended config;
2. the peers, each a plain training loop written the way a user writes it (`user_loop`): the
   workload's model, loss, optimizer and dataset, a pinned 2-worker DataLoader, `loss.item()`
   every 10 steps, autocast where the precision asks for it:
   - `pytorch-idiom`: that loop as it is;
   - `fused-optimizer`: the optimizer rebuilt with `fused=True`;
   - `compile-default`: plus `torch.compile(model)`;
   - `compile-reduce-overhead`: plus `torch.compile(model, mode="reduce-overhead")` with
     `torch.compiler.cudagraph_mark_step_begin()` before each step, as the PyTorch docs say;
3. the recommendation and the seed design's baseline, run by the harness (`trainers.run`) with
   the tuner's protocol;
4. all of them `--rounds` times, interleaved, every run from the same initial weights. Each peer
   reports its setup (`setup_s`: its warm-up's wall time beyond that many steady steps, compile
   included), each run's windows (ms/step, device-synchronised at both ends) and their median
   and bootstrap CI; `ratio_vs_best_peer` is the recommendation's throughput over the fastest
   peer's, with a bootstrap CI; `floor` is the fastest setting measured.

A compiled peer starts from `torch._dynamo.reset()`, as a new training process would: Inductor's
on-disk caches stay warm (the tuning job filled them), the in-memory ones do not.

Writes `peers-<gpu>-<date>[-<tag>].json` after each preset and a Markdown twin.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
import torch
from optuna.trial import TrialState

import trainers
from benchmarks.run_meta import run_meta
from trainers import LoopConfig, Workload, matmul_precision_for, prepare_optimizer
from tuner.evidence.render import phase_times, search_text
from tuner.search.measure import Failure, Measurer, Protocol
from tuner.search.options import BASELINES, RunOptions
from tuner.search.search import run_study
from tuner.search.stats import bootstrap_ci, ratio_ci
from tuner.store import keys

PEERS: dict[str, dict[str, Any]] = {
    "pytorch-idiom": {"fused": False, "compile": None},
    "fused-optimizer": {"fused": True, "compile": None},
    "compile-default": {"fused": False, "compile": "default"},
    "compile-reduce-overhead": {"fused": False, "compile": "reduce-overhead"},
    # At scale (0.3-8B parameters), as their users write them:
    # `torch.compile(model)` with fused AdamW, the plain strong loop;
    "compile-fused": {"fused": True, "compile": "default"},
    # the Hugging Face way: gradient checkpointing on every layer, `torch.compile`, fused AdamW;
    "hf-checkpointing": {"fused": True, "compile": "default", "checkpointing": "hf"},
    # the torchtitan way: each decoder layer compiled on its own, selective activation
    # checkpointing (matmul and attention outputs kept), fused AdamW;
    "torchtitan": {"fused": True, "compile": "per-layer", "checkpointing": "selective"},
    # gradient accumulation in halves until the step fits, as `auto_find_batch_size` users end up.
    "accumulate-halves": {"fused": True, "compile": "default", "accumulate": "halves"},
    # each decoder layer compiled on its own, nothing recomputed: the fastest bf16 loop of the
    # float8 issue's table (434.7 ms on the 1.1B decoder, 16 x 2048);
    "compile-per-layer": {"fused": True, "compile": "per-layer"},
    # Float8 matmuls (bf16 autocast around them), where the job allows float8:
    # torchao's README: `convert_to_float8_training` (tensorwise, the last linear and any whose
    # features are not multiples of 16 left alone), then `torch.compile(model)`;
    "float8-compile": {"fused": True, "compile": "default", "float8": True},
    # torchtitan's float8: the same conversion, then each decoder layer compiled on its own.
    "float8-per-layer": {"fused": True, "compile": "per-layer", "float8": True},
}
PEER_LABELS = {
    "pytorch-idiom": "PyTorch idiom",
    "fused-optimizer": "fused optimizer",
    "compile-default": "compile",
    "compile-reduce-overhead": "compile reduce-overhead",
    "compile-fused": "compile + fused",
    "hf-checkpointing": "HF checkpointing + compile",
    "torchtitan": "torchtitan (per-layer compile + SAC)",
    "accumulate-halves": "accumulate in halves + compile",
    "compile-per-layer": "per-layer compile",
    "float8-compile": "torchao float8 + compile",
    "float8-per-layer": "float8 + per-layer compile (torchtitan)",
}
SCALE_PEERS = ("compile-fused", "hf-checkpointing", "torchtitan", "accumulate-halves")
FLOAT8_PEERS = ("compile-per-layer", "float8-compile", "float8-per-layer")
"""Added to a preset's peers when its tuning job may choose float8 (`--allow-precisions`): the
strongest bf16 loop of that regime and the two float8 loops users write."""
SMALL_PEERS = ("pytorch-idiom", "fused-optimizer", "compile-default", "compile-reduce-overhead")
HARNESS = ("recommended", "seed-baseline")
READ_EVERY = 10
AIMS_TF32 = {"transformer:small": 6.0, "transformer:medium": 2.5, "transformer:large": 1.2}
RATIO_AIM = 0.98
FLOAT8_OVER_BF16_AIM = 1.12
"""The float8 issue's aim: a job allowing float8, at least 1.12x the fastest bf16 peer (ratio CI
low), and no slower than the float8 peers (CI low >= RATIO_AIM)."""


@dataclasses.dataclass
class Run:
    windows_ms: list[float]
    setup_s: float
    losses: list[float]
    peak_memory_bytes: int | None = None
    micro_batches: int = 1


# --------------------------------------------------------------------------------------------
# the peers: a user's own loop
# --------------------------------------------------------------------------------------------


def _batches(loader: torch.utils.data.DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers, found as a user finds them: `model.model.layers` (Llama, Qwen2,
    Mistral), `model.gpt_neox.layers` (GPT-NeoX), `model.transformer.h` (GPT-2),
    `model.bert.encoder.layer` (BERT)."""
    paths = (
        "model.layers",
        "gpt_neox.layers",
        "transformer.h",
        "bert.encoder.layer",
        "layers",
        "blocks",
    )
    for path in paths:
        found: Any = model
        for name in path.split("."):
            found = getattr(found, name, None)
        if isinstance(found, torch.nn.ModuleList):
            return list(found)
    raise ValueError(f"no decoder layers found in {type(model).__name__}")


def _titan_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    saved = (
        aten.mm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    )
    return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE


def _compile_each_layer(model: torch.nn.Module, *, selective: bool) -> Callable[[], None]:
    """Each decoder layer compiled on its own, in place; with `selective`, torchtitan's recipe
    written out: each layer first wrapped in a selective activation checkpoint
    (`ptd_checkpoint_wrapper` with an op policy). Returns what puts the layers back."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    layers = _layers(model)
    parent_of = {
        id(m): (parent, name) for parent in model.modules() for name, m in parent.named_children()
    }
    context = functools.partial(create_selective_checkpoint_contexts, _titan_policy)
    placed: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []

    def undo() -> None:
        for parent, name, layer in placed:
            setattr(parent, name, layer)

    try:
        for layer in layers:
            wrapped = (
                checkpoint_wrapper(layer, context_fn=context, preserve_rng_state=False)
                if selective
                else layer
            )
            compiled = torch.compile(wrapped)
            parent, name = parent_of[id(layer)]
            setattr(parent, name, compiled)
            placed.append((parent, name, layer))
    except BaseException:
        undo()  # no layer left compiled behind a failure
        raise
    return undo


def float8_peer_error(device: torch.device, precision: str | None) -> str | None:
    """Why a float8 peer cannot run here (None: it can): float8 tensor cores and torchao, under
    bf16 autocast as torchao's and torchtitan's recipes train."""
    from trainers.float8 import unavailable

    if precision != "bf16-autocast":
        return f"float8 peers train under bf16-autocast (torchao's recipe); this run is {precision}"
    return unavailable(device)


def _to_float8_as_torchao_writes_it(model: torch.nn.Module) -> Callable[[], None]:
    """torchao's README, written out: `convert_to_float8_training` with its default (tensorwise)
    config and its README's filter: not the last linear (the output head), not a linear whose
    features are not multiples of 16. In place; returns what puts the `nn.Linear` modules back
    (torchao's modules share their Parameters, so what was trained stays trained)."""
    from torchao.float8 import convert_to_float8_training

    linears = {
        name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name
    }
    last = list(linears)[-1] if linears else None

    def module_filter_fn(module: torch.nn.Module, fqn: str) -> bool:
        if fqn == last:
            return False
        if isinstance(module, torch.nn.Linear):
            return module.in_features % 16 == 0 and module.out_features % 16 == 0
        return True

    convert_to_float8_training(model, module_filter_fn=module_filter_fn)

    def undo() -> None:
        for name, module in linears.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module)

    # Only a converted plain nn.Linear runs float8: a subclass such as nn.MultiheadAttention's
    # out_proj is converted too, but its owner reads the weight directly. GPT-2's layers are
    # transformers' Conv1D: nothing qualifies there, and such a loop would be bf16 under a
    # float8 name.
    swapped = [
        name
        for name, module in linears.items()
        if type(module) is torch.nn.Linear and model.get_submodule(name) is not module
    ]
    if not swapped:
        undo()
        raise ValueError(
            "float8: no plain nn.Linear of this model qualifies (only its output head, "
            "subclasses whose owners read the weight, or none at all)"
        )
    return undo


def _prepare_model(
    model: torch.nn.Module, spec: Mapping[str, Any]
) -> tuple[torch.nn.Module, Callable[[], None]]:
    """The model a peer trains, converted, checkpointed and compiled as its users do it (float8
    conversion first, then compilation: torchao's order), and what puts the shared model back as
    it was for the next peer."""
    undos: list[Callable[[], None]] = []

    def undo() -> None:
        for step in reversed(undos):
            step()

    try:
        if spec.get("float8"):
            undos.append(_to_float8_as_torchao_writes_it(model))
        if spec.get("compile") == "per-layer":
            undos.append(
                _compile_each_layer(model, selective=spec.get("checkpointing") == "selective")
            )
            return model, undo
        if spec.get("checkpointing") == "hf":
            enable = getattr(model, "gradient_checkpointing_enable", None)
            disable = getattr(model, "gradient_checkpointing_disable", None)
            if enable is None or disable is None:
                raise ValueError("gradient_checkpointing_enable: not a Hugging Face model")
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            undos.append(disable)
    except BaseException:
        undo()  # the shared model as it was, for the next peer
        raise
    compile_mode = spec.get("compile")
    if compile_mode is None:
        return model, undo
    # torch.compile of a module returns an OptimizedModule (typed as a callable).
    return cast(torch.nn.Module, torch.compile(model, mode=compile_mode)), undo


def _fits(step: Callable[[int], None], device: torch.device) -> bool:
    """One step at `micro` micro-batches; False when it ran out of memory."""
    try:
        step(0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        return False
    return True


def user_loop(
    workload: Workload,
    *,
    device: torch.device,
    precision: str | None,
    fused: bool,
    compile_mode: str | None,
    warmup: int,
    windows: int,
    window_steps: int,
    spec: Mapping[str, Any] | None = None,
) -> Run:
    """The loop a user writes, timed: `warmup` steps, then `windows` windows of `window_steps`."""
    cuda = device.type == "cuda"
    spec = dict(spec or {"fused": fused, "compile": compile_mode})
    started = time.perf_counter()
    if compile_mode is not None:
        torch._dynamo.reset()  # a fresh training process: disk caches warm, memory ones empty
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = workload.model.to(device)
    model.train()
    optimizer = workload.make_optimizer(model.parameters(), False)
    if fused:
        optimizer = prepare_optimizer(optimizer, "fused", capturable=False)
    forward, undo = _prepare_model(model, spec)
    try:
        return _timed(
            workload,
            forward,
            optimizer,
            spec,
            device,
            precision,
            warmup,
            windows,
            window_steps,
            started,
        )
    finally:
        undo()


def _timed(
    workload: Workload,
    forward: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: Mapping[str, Any],
    device: torch.device,
    precision: str | None,
    warmup: int,
    windows: int,
    window_steps: int,
    started: float,
) -> Run:
    cuda = device.type == "cuda"
    compile_mode = spec.get("compile")
    micro = 1
    loader = torch.utils.data.DataLoader(
        workload.dataset,
        batch_size=workload.batch_size,
        shuffle=False,
        num_workers=2,
        pin_memory=cuda,
        collate_fn=workload.collate_fn,
        persistent_workers=True,
    )
    dtype = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}.get(precision or "")
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16-autocast" else None
    batches = _batches(loader)
    losses: list[float] = []

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def step(index: int) -> None:
        batch = tuple(t.to(device, non_blocking=True) for t in next(batches))
        if compile_mode == "reduce-overhead":
            # Inductor's graphs reuse their output buffers: mark where a new iteration begins.
            torch.compiler.cudagraph_mark_step_begin()
        autocast = (
            torch.autocast(device.type, dtype) if dtype is not None else contextlib.nullcontext()
        )
        pieces = zip(*(t.chunk(micro) for t in batch), strict=True) if micro > 1 else [batch]
        for piece in pieces:
            with autocast:
                loss = workload.loss_fn(forward, piece)
            if micro > 1:
                loss = loss / micro
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (index + 1) % READ_EVERY == 0:
            losses.append(loss.item())  # the user's sync: read the loss every 10 steps

    if spec.get("accumulate") == "halves":
        # Halve the micro-batch until one step fits, as a user reruns after each out-of-memory.
        while not _fits(step, device):
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.empty_cache()
            if micro * 2 > workload.samples_per_batch:
                raise torch.cuda.OutOfMemoryError("one sample per micro-batch does not fit")
            micro *= 2
    for index in range(warmup):
        step(index)
    sync()
    warm_s = time.perf_counter() - started
    windows_ms = []
    index = warmup
    for _ in range(windows):
        sync()
        t0 = time.perf_counter()
        for _ in range(window_steps):
            step(index)
            index += 1
        sync()
        windows_ms.append((time.perf_counter() - t0) * 1e3 / window_steps)
    # The loader's persistent workers end when it is collected, once this function returns.
    steady_s = statistics.median(windows_ms) / 1e3
    return Run(
        windows_ms=windows_ms,
        setup_s=max(0.0, warm_s - warmup * steady_s),
        losses=losses,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
        micro_batches=micro,
    )


# --------------------------------------------------------------------------------------------
# one preset
# --------------------------------------------------------------------------------------------


class PhaseLog:
    """The tuning job's phases and trials in the log, each with the seconds since the job began:
    where a long job spends its time."""

    def __init__(self, log: Callable[[str], None], started: float) -> None:
        self.log, self.started = log, started

    def _say(self, text: str) -> None:
        self.log(f"  [{time.perf_counter() - self.started:6.1f} s] {text}")

    def start(self, study: str, total: int, resumed: bool) -> None:
        self._say(f"study {study}: {total} trials{' (resumed)' if resumed else ''}")

    def phase(self, text: str) -> None:
        self._say(text)

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        shown = "-" if best is None else f"{best:.1f}/s"
        self._say(f"trial {done}/{total} {state} (best {shown})")


def tune(
    workload: str,
    preset: str,
    *,
    precision: str | None,
    storage: str,
    device: str,
    trials: int,
    timeout_s: float | None,
    model_args: Mapping[str, str],
    log: Callable[[str], None] = lambda text: None,
    protocol: Protocol | None = None,
    final_rounds: int | None = None,
    precisions: Sequence[str] | None = None,
    parity_steps: int | None = None,
    precision_parity_steps: int | None = None,
    precision_tolerance: float | None = None,
    profile: str = "none",
) -> dict[str, Any]:
    """The tuning job. `profile`: its profiles (`RunOptions.profile`; a default job's is
    `baselines`, "none" leaves them out of the tuning time). `precisions`: those it may choose
    among (`--precisions`; None: `precision`
    alone); `parity_steps`: the gate's run length (None: the tuner's default);
    `precision_parity_steps`: that of a config in another precision (None: `parity_steps`);
    `precision_tolerance`: the multiple of the seed-to-seed envelope such a config may deviate
    by (None: the tuner's, 3)."""
    started = time.perf_counter()
    # A large model's default protocol (110 steps a measurement) leaves a 10-minute run no room
    # to search: `--protocol` and `--final-rounds` shorten the job the way a user would.
    shorter: dict[str, Any] = {}
    if protocol is not None:
        shorter["protocol"] = protocol
    if final_rounds is not None:
        shorter["final_rounds"] = final_rounds
    if precisions:
        shorter["precisions"] = tuple(precisions)
    if parity_steps is not None:
        shorter["parity_steps"] = parity_steps
    if precision_parity_steps is not None:
        shorter["precision_parity_steps"] = precision_parity_steps
    if precision_tolerance is not None:
        shorter["precision_tolerance"] = precision_tolerance
    study = f"peers-{workload}-{preset}-{precision}".replace(":", "-")
    rec = run_study(
        RunOptions(
            workload=workload,
            preset=preset,
            storage=storage,
            study=study,
            space="auto",
            trials=trials,
            timeout_s=timeout_s,
            device=device,
            precision=precision,  # type: ignore[arg-type]
            model_args=dict(model_args),
            profile=profile,
            # As `python -m tuner run` without --window-steps: the scale space's shorter windows.
            auto_window_steps=protocol is None,
            **shorter,
        ),
        progress=PhaseLog(log, started),
    ).to_dict()
    failed = failed_trials(storage, study)
    for item in failed:
        log(f"  trial {item['trial']} failed: {item['reason']}")
    ran = trial_results(storage, study)
    for item in ran:
        log(f"  trial {item['trial']}: {_trial_line(item)}")
    return {
        "config": rec.get("config"),
        "precision": rec.get("precision"),
        "precisions": list(precisions) if precisions else None,
        "source": rec.get("source"),
        "reason": rec.get("reason"),
        "parity": rec.get("parity"),
        "setup_s": rec.get("setup_s"),
        "n_trials": rec.get("n_trials"),
        "failed_trials": failed,
        "trial_results": ran,
        "wall_s": time.perf_counter() - started,
        "gpu_s": rec.get("gpu_seconds"),
        "search_timeout_s": timeout_s,
        "trials": trials,
        # Where the job's time went, phase by phase, and how its search spent its trials
        # (predicted, skipped, screened out, gated; how often the predictions were right).
        "time": rec.get("time"),
        "search": rec.get("search"),
    }


def recommendation_of(
    path: Path,
    workload: str,
    preset: str,
    model_args: Mapping[str, str],
    precision: str | None,
) -> dict[str, Any]:
    """The tuning entry of a job run elsewhere: the first run of a `benchmarks/default_job.py`
    record that recommended a config for this workload, preset and model options (so the peers
    are measured against what the default job, timed there, recommended), in the precision the
    job chose. Refuses a record that has none, naming what it holds."""
    data = json.loads(path.read_text(encoding="utf-8"))
    wanted = (workload, preset, dict(model_args))
    seen = []
    for run in data.get("runs", []):
        rec = run.get("recommendation") or {}
        ran = (rec.get("workload"), rec.get("preset"), rec.get("model_args") or {})
        has = "a config" if rec.get("config") else "no config"
        seen.append(f"{run.get('run')}: {ran[0]}:{ran[1]} {ran[2]}, {has}")
        if ran != wanted or not rec.get("config"):
            continue
        chosen = rec.get("precision")
        return {
            "config": rec["config"],
            "precision": None if chosen == precision else chosen,
            "precisions": None,
            "source": f"{path.name}, run {run.get('run')!r} (commit {data['meta'].get('commit')})",
            "reason": rec.get("reason"),
            "n_trials": rec.get("n_trials"),
            "failed_trials": [],
            "wall_s": run.get("wall_s"),
            "gpu_s": rec.get("gpu_seconds"),
            "search_timeout_s": None,
            "trials": None,
        }
    raise SystemExit(
        f"--recommendation {path}: no run recommended a config for {workload}:{preset} "
        f"{dict(model_args)} {precision}; its runs: {'; '.join(seen) or 'none'}"
    )


def given_config(text: str, precision: str | None = None) -> dict[str, Any]:
    """The tuning entry of a config given as JSON (`--config`): measured against the peers
    without a tuning job, labelled as given, not as a recommendation. For a config a job found
    but could not finish deciding (a machine that went back during its final round), or one a
    job could not reach in the time a machine is lent (`precision`: the one it runs in, when not
    the preset's: `--config-precision`)."""
    try:
        config = LoopConfig.from_dict(json.loads(text)).to_dict()
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--config: {exc}") from None
    if precision is not None and precision not in trainers.PRECISIONS:
        raise SystemExit(
            f"--config-precision: {precision!r} is not a precision; allowed "
            f"{', '.join(trainers.PRECISIONS)}"
        )
    return {
        "config": config,
        "precision": precision,
        "precisions": None,
        "source": "given by --config (not a finished job's recommendation)",
        "reason": None,
        "n_trials": None,
        "failed_trials": [],
        "wall_s": None,
        "gpu_s": None,
        "search_timeout_s": None,
        "trials": None,
    }


def failed_trials(storage: str, study: str) -> list[dict[str, Any]]:
    """The tuning job's failed trials: number, config and the harness's reason (a config the
    gate or a capture refused is a result too, e.g. an eager whole-step graph of a model that
    syncs the host)."""
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(
        deepcopy=False, states=(TrialState.FAIL,)
    )
    return [
        {
            "trial": t.number,
            "config": t.user_attrs.get(keys.CONFIG),
            "reason": t.user_attrs.get(keys.FAILURE_REASON),
        }
        for t in trials
    ]


GATE_FIELDS = ("passed", "test", "steps", "exact_steps", "ratio", "multiple", "reason", "seconds")
"""What `trial_results` keeps of each trial's gate verdict (the losses stay in the study)."""


def trial_results(storage: str, study: str) -> list[dict[str, Any]]:
    """Every finished trial of the tuning job, in order: its state, precision (None: the
    study's), config, throughput and the gate's verdict in brief. What a job that may choose
    among precisions measured of each (a record then shows whether float8 paid, and how the
    gate judged it, even where the recommendation is in another precision)."""
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    )
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        verdict = t.user_attrs.get(keys.PARITY) or {}
        out.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "precision": t.user_attrs.get(keys.PRECISION),
                "config": t.user_attrs.get(keys.CONFIG),
                "samples_per_s": t.values[0] if t.values else None,
                "failure_reason": t.user_attrs.get(keys.FAILURE_REASON),
                "gate": {k: verdict[k] for k in GATE_FIELDS if k in verdict} or None,
            }
        )
    return out


def _trial_line(item: Mapping[str, Any]) -> str:
    speed = item["samples_per_s"]
    gate = item["gate"] or {}
    text = f"{item['state']}, {item['precision'] or 'the study precision'}"
    if speed is not None:
        text += f", {speed:.1f} samples/s"
    if gate.get("ratio") is not None:
        verdict = "passed" if gate.get("passed") else "rejected"
        text += f", gate {verdict} at ratio {gate['ratio']:.2f}"
    return text


def _summary(runs: Sequence[Run], flops: Callable[[float], dict[str, Any]]) -> dict[str, Any]:
    windows = [w for run in runs for w in run.windows_ms]
    peaks = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
    median = statistics.median(windows)
    return {
        "median_ms": median,
        **flops(median),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "micro_batches": runs[0].micro_batches,
        "ci95": list(bootstrap_ci(windows)),
        "setup_s": runs[0].setup_s,
        "setup_s_rounds": [r.setup_s for r in runs],
        "windows_ms": windows,
        "last_loss": runs[-1].losses[-1] if runs[-1].losses else None,
    }


def compare(
    measurer: Measurer,
    recommended: LoopConfig | None,
    *,
    precision: str | None,
    rounds: int,
    log: Callable[[str], None],
    peers: Sequence[str] = SMALL_PEERS,
    recommended_precision: str | None = None,
) -> dict[str, Any]:
    """Peers and harness settings `rounds` times, interleaved, from the same initial weights.
    `recommended_precision`: the precision a job searching precisions chose (None: `precision`);
    the recommendation is measured in it, the seed design's baseline in `precision`."""
    workload = measurer.workload
    utilisation = _utilisation(workload, measurer.device, precision)
    initial = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    protocol = measurer.protocol
    cuda = measurer.device.type == "cuda"
    harness = {"seed-baseline": BASELINES["seed-baseline"]}
    if recommended is not None:
        harness = {"recommended": recommended} | harness
    runs: dict[str, list[Run]] = {name: [] for name in [*peers, *harness]}
    errors: dict[str, str] = {}
    compile_info: dict[str, Any] = {}
    for r in range(rounds):
        for name in peers:
            spec = PEERS[name]
            if spec["compile"] == "reduce-overhead" and not cuda:
                errors[name] = "reduce-overhead needs CUDA"
                continue
            if spec.get("float8") and (why := float8_peer_error(measurer.device, precision)):
                errors[name] = why
                continue
            workload.model.load_state_dict(initial)
            for p in workload.model.parameters():
                p.grad = None
            try:
                with matmul_precision_for(precision):  # type: ignore[arg-type]
                    run = user_loop(
                        workload,
                        device=measurer.device,
                        precision=precision,
                        fused=spec["fused"],
                        compile_mode=spec["compile"],
                        warmup=max(protocol.warmup, 3),
                        windows=protocol.windows,
                        window_steps=protocol.window_steps,
                        spec=spec,
                    )
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
                log(f"round {r + 1} {name}: {errors[name]}")
                continue
            finally:
                if cuda:
                    torch.cuda.empty_cache()
            runs[name].append(run)
            log(
                f"round {r + 1} {name} {statistics.median(run.windows_ms):.3f} ms "
                f"(setup {run.setup_s:.1f} s)"
            )
        for name, config in harness.items():
            chosen = recommended_precision if name == "recommended" else None
            outcome = measurer.measure(config, precision=chosen)
            if isinstance(outcome, Failure):
                errors[name] = outcome.reason
                log(f"round {r + 1} {name}: {outcome.reason}")
                continue
            per_batch = workload.samples_per_batch
            windows = [per_batch * 1e3 / t for t in outcome.throughputs]
            setup = 0.0 if outcome.compile is None else float(outcome.compile.get("compile_s", 0))
            if outcome.compile is not None:
                compile_info[name] = dict(outcome.compile)
            runs[name].append(
                Run(
                    windows_ms=windows,
                    setup_s=setup,
                    losses=[],
                    peak_memory_bytes=outcome.peak_memory_bytes,
                    micro_batches=config.micro_batches,
                )
            )
            log(f"round {r + 1} {name} {outcome.step_ms:.3f} ms")
    out: dict[str, Any] = {"peers": {}, "harness": {}}
    for name, done in runs.items():
        group = "peers" if name in PEERS else "harness"
        if not done:
            out[group][name] = {"error": errors.get(name, "not measured")}
            continue
        out[group][name] = _summary(done, utilisation) | (
            {"error_in_a_round": errors[name]} if name in errors else {}
        )
        if name in harness:
            out[group][name]["config"] = harness[name].to_dict()
            if name in compile_info:
                out[group][name]["compile"] = compile_info[name]
    measured = {
        name: entry
        for group in ("peers", "harness")
        for name, entry in out[group].items()
        if "median_ms" in entry
    }
    if measured:
        fastest = min(measured, key=lambda n: measured[n]["median_ms"])
        out["floor"] = {"setting": fastest, "median_ms": measured[fastest]["median_ms"]}
    peer_ok = {n: e for n, e in out["peers"].items() if "median_ms" in e}
    rec = out["harness"].get("recommended", {})
    if "median_ms" in rec:
        if recommended_precision is not None:
            out["harness"]["recommended"]["precision"] = recommended_precision
        groups = {"ratio_vs_best_peer": peer_ok}
        if any(PEERS[n].get("float8") for n in peers):
            # A job allowing float8 is judged against each kind: the fastest loop without float8
            # (what float8 must beat by the margin) and the fastest with it.
            groups["ratio_vs_best_bf16_peer"] = {
                n: e for n, e in peer_ok.items() if not PEERS[n].get("float8")
            }
            groups["ratio_vs_best_float8_peer"] = {
                n: e for n, e in peer_ok.items() if PEERS[n].get("float8")
            }
        for key, members in groups.items():
            if members:
                out[key] = _ratio_vs_fastest(members, rec)
    seed = out["harness"].get("seed-baseline", {})
    if "median_ms" in seed and "median_ms" in rec:
        ratio, low, high = ratio_ci(seed["windows_ms"], rec["windows_ms"])
        out["speedup_vs_seed_baseline"] = {"ratio": ratio, "ci95": [low, high]}
    return out


def _ratio_vs_fastest(
    peers: Mapping[str, Mapping[str, Any]], rec: Mapping[str, Any]
) -> dict[str, Any]:
    """The recommendation's throughput over the fastest of `peers`', with a bootstrap CI."""
    best = min(peers, key=lambda n: peers[n]["median_ms"])
    ratio, low, high = ratio_ci(peers[best]["windows_ms"], rec["windows_ms"])
    return {"best_peer": best, "ratio": ratio, "ci95": [low, high]}


def _utilisation(
    workload: Workload, device: torch.device, precision: str | None
) -> Callable[[float], dict[str, Any]]:
    """Model TFLOP/s and MFU at a median step time: the model's FLOPs counted once
    (`trainers.flops`), the same count for every row (recomputation is not model FLOPs)."""
    from trainers.flops import count_step_flops, utilisation

    flops = count_step_flops(workload, device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    matmul = torch.get_float32_matmul_precision()

    def at(median_ms: float) -> dict[str, Any]:
        use = utilisation(
            flops, median_ms, gpu_name=gpu, precision=precision, matmul_precision=matmul
        )
        return {"flops_per_step": flops, "tflops": use.tflops, "mfu": use.mfu, "mfu_note": use.note}

    return at


def add_mfu(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` (a peers JSON) with TFLOP/s and MFU on every timed entry, recounted: the model's
    FLOPs counted here on a CPU (`trainers.flops`, the count a GPU run makes; it does not depend
    on the device), over the recorded median ms/step, against the dense peak of the GPU named in
    `meta`. For the runs recorded before MFU was, and for those whose CPU count left attention
    out (before 2026-11-26's fix in `trainers.flops`). Peak memory is what the run recorded."""
    from trainers.flops import count_step_flops, utilisation

    out = json.loads(json.dumps(data))
    gpu = out["meta"].get("gpu")
    cpu = torch.device("cpu")
    for item in out["presets"]:
        if "error" in item:
            continue
        precision = item.get("precision")
        workload = trainers.load_workload(
            item["workload"], item["preset"], seed=0, model_args=item.get("model_args") or {}
        )
        flops = count_step_flops(workload, cpu)
        entries = [*item.get("peers", {}).values(), *item.get("harness", {}).values()]
        for entry in entries:
            if not isinstance(entry, dict) or "median_ms" not in entry:
                continue
            use = utilisation(
                flops,
                entry["median_ms"],
                gpu_name=gpu,
                precision=precision,  # "tf32" and the autocasts pick their peak column
                matmul_precision="highest",
            )
            entry |= {"flops_per_step": flops, "tflops": use.tflops, "mfu": use.mfu}
            entry["mfu_note"] = f"{use.note}; FLOPs counted afterwards on a CPU"
    memory = [
        entry.get("peak_memory_bytes") is not None
        for item in out["presets"]
        for entry in [*item.get("peers", {}).values(), *item.get("harness", {}).values()]
        if isinstance(entry, dict) and "median_ms" in entry
    ]
    if all(memory):
        said = ""
    elif any(memory):
        said = "; peak memory was recorded only by the runs that show it"
    else:
        said = "; peak memory was not recorded by these runs"
    out["meta"]["mfu_added"] = (
        "MFU added afterwards by `benchmarks/peers.py --add-mfu`: FLOPs counted on a CPU over "
        "the recorded median ms/step" + said
    )
    return out


def peers_for(
    spec: str, chosen: str | None, allowed: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The peers of a preset: `--peers` if given; at scale (the llama presets) the loops users of
    0.3-8B models write, otherwise the small-model loops; with FLOAT8_PEERS beside them where the
    job may choose float8 (`allowed`, its precisions)."""
    if chosen:
        names = tuple(filter(None, chosen.split(",")))
        unknown = [n for n in names if n not in PEERS]
        if unknown:
            raise SystemExit(f"--peers: unknown {unknown}; allowed {', '.join(PEERS)}")
        return names
    base = SCALE_PEERS if ":llama" in spec else SMALL_PEERS
    if allowed and "float8" in allowed:
        return base + tuple(n for n in FLOAT8_PEERS if n not in base)
    return base


def run_preset(
    spec: str,
    precision: str | None,
    args: argparse.Namespace,
    storage: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    workload, preset = spec.rsplit(":", 1)
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    started = time.perf_counter()
    allowed = _allowed(precision, getattr(args, "allow_precisions", None))
    choice = f" (may choose {','.join(allowed)})" if allowed else ""
    given = getattr(args, "recommendation", None)
    if getattr(args, "config", None) is not None:
        log(f"== {spec} {precision}: the config given by --config")
        tuning = given_config(args.config, getattr(args, "config_precision", None))
    elif given is not None:
        log(f"== {spec} {precision}: the recommendation of {given.name}")
        tuning = recommendation_of(given, workload, preset, model_args, precision)
    else:
        log(f"== {spec} {precision}: tuning{choice}")
        tuning = tune(
            workload,
            preset,
            precision=precision,
            storage=storage,
            device=args.device,
            trials=args.trials,
            timeout_s=args.search_timeout,
            model_args=model_args,
            log=log,
            protocol=args.protocol,
            final_rounds=args.final_rounds,
            precisions=allowed,
            parity_steps=getattr(args, "parity_steps", None),
            precision_parity_steps=getattr(args, "precision_parity_steps", None),
            precision_tolerance=getattr(args, "precision_tolerance", None),
            profile=getattr(args, "profile", None) or "none",
        )
    chosen = tuning["precision"]
    log(
        f"recommended {tuning['config']}"
        + (f" in {chosen}" if chosen else "")
        + ("" if tuning.get("wall_s") is None else f" in {tuning['wall_s']:.0f} s")
    )
    measurer = Measurer(
        workload,
        preset,
        device=args.device,
        protocol=getattr(args, "peer_protocol", None) or args.protocol or Protocol(),
        model_args=model_args,
        precision=precision,  # type: ignore[arg-type]
    )
    recommended = None if tuning["config"] is None else LoopConfig.from_dict(tuning["config"])
    compared = compare(
        measurer,
        recommended,
        precision=precision,
        rounds=args.rounds,
        log=log,
        peers=peers_for(spec, getattr(args, "peers", None), allowed),
        recommended_precision=chosen,
    )
    entry: dict[str, Any] = {
        "workload": workload,
        "preset": preset,
        "model_args": model_args,
        "parameters": measurer.parameters(),
        "precision": precision,
        "tuning": tuning,
        "rounds": args.rounds,
        "protocol": measurer.protocol.to_dict(),
        **compared,
    }
    rec = compared["harness"].get("recommended", {})
    entry["recommended"] = {
        "config": tuning["config"],
        "precision": chosen or precision,
        "median_ms": rec.get("median_ms"),
        "ci95": rec.get("ci95"),
        "compile_s": (rec.get("compile") or {}).get("compile_s"),
        "setup_s": tuning.get("setup_s"),
    }
    entry["aims"] = aims(spec, precision, entry)
    entry["wall_s"] = time.perf_counter() - started
    return entry


def _allowed(precision: str | None, allow: str | None) -> tuple[str, ...] | None:
    """The tuning job's precisions: `--allow-precisions` with the preset's own first (the
    study's reference, which the gate judges the others against); None where not given."""
    if not allow:
        return None
    names = [p for p in allow.split(",") if p]
    return tuple(dict.fromkeys([precision, *names] if precision else names))


def aims(spec: str, precision: str | None, entry: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ratio = entry.get("ratio_vs_best_peer")
    if ratio is not None:
        out["ratio_lower_bound_at_least_0.98"] = ratio["ci95"][0] >= RATIO_AIM
    allowed = (entry.get("tuning") or {}).get("precisions") or ()
    if "float8" in allowed:
        # The float8 issue's aims, where the job could choose it: float8 recommended, 1.12x the
        # fastest bf16 peer and no slower than the float8 peers (CI lows).
        # A group with no measured peer (every one failed) misses its aim: nothing was beaten.
        out["recommends_float8"] = (entry.get("recommended") or {}).get("precision") == "float8"
        bf16 = entry.get("ratio_vs_best_bf16_peer")
        out[f"ratio_vs_best_bf16_peer_low_at_least_{FLOAT8_OVER_BF16_AIM}"] = (
            bf16 is not None and bf16["ci95"][0] >= FLOAT8_OVER_BF16_AIM
        )
        f8 = entry.get("ratio_vs_best_float8_peer")
        out[f"ratio_vs_best_float8_peer_low_at_least_{RATIO_AIM}"] = (
            f8 is not None and f8["ci95"][0] >= RATIO_AIM
        )
    speed = entry.get("speedup_vs_seed_baseline")
    if precision == "tf32" and spec in AIMS_TF32 and speed is not None:
        out[f"speedup_vs_seed_baseline_at_least_{AIMS_TF32[spec]}"] = (
            speed["ratio"] >= AIMS_TF32[spec]
        )
    return out


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def _cell(entry: Mapping[str, Any] | None) -> str:
    """ms/step (95 % CI), then MFU and peak memory where they were recorded."""
    if not entry or "median_ms" not in entry:
        return "-" if not entry else "failed"
    low, high = entry["ci95"]
    text = f"{entry['median_ms']:.2f} ({low:.2f}-{high:.2f})"
    if entry.get("mfu") is not None:
        text += f", MFU {100 * entry['mfu']:.1f} %"
    if entry.get("peak_memory_bytes") is not None:
        text += f", {entry['peak_memory_bytes'] / 1e9:.1f} GB"
    return text


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def short(config: Mapping[str, Any] | None) -> str:
    if not config:
        return "-"
    default = LoopConfig().to_dict()
    return ", ".join(f"{k}={v}" for k, v in config.items() if default.get(k) != v) or "defaults"


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# The recommendation against a user's own loop on {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, commit "
        f"`{meta['commit']}`, {meta['date']}. Generated from `{meta['file']}`; "
        f"command: `{meta['command']}`.",
        "",
        "Median ms/step (95 % CI) over every window of every round, interleaved in one process. "
        "Peers are plain loops (pinned 2-worker DataLoader, `loss.item()` every 10 steps); "
        "ratio = recommendation's throughput over the fastest peer's.",
        "",
    ]
    if meta.get("mfu_added"):
        lines += [meta["mfu_added"] + ".", ""]
    present = [
        name for name in PEERS if any(name in item.get("peers", {}) for item in data["presets"])
    ] or list(SMALL_PEERS)
    lines += [
        "| preset | precision | "
        + " | ".join(PEER_LABELS.get(n, n) for n in present)
        + " | seed-baseline | recommended | ratio vs best peer (95 % CI) "
        "| vs seed-baseline | tuning wall s / GPU-s |",
        "|" + "---|" * (len(present) + 7),
    ]
    for item in data["presets"]:
        if "error" in item:
            lines.append(
                f"| {item['workload']}:{item['preset']} | {item['precision']} "
                f"| failed: {item['error']} |"
            )
            continue
        peers = item["peers"]
        ratio = item.get("ratio_vs_best_peer")
        ratio_text = (
            "-"
            if ratio is None
            else f"{ratio['ratio']:.2f} ({ratio['ci95'][0]:.2f}-{ratio['ci95'][1]:.2f})"
        )
        speed = item.get("speedup_vs_seed_baseline")
        speed_text = "-" if speed is None else f"{speed['ratio']:.2f}x"
        tuning = item["tuning"]
        gpu_s = tuning.get("gpu_s")
        cells = " | ".join(_cell(peers.get(name)) for name in present)
        lines.append(
            f"| {item['workload']}:{item['preset']} | {item['precision']} | {cells} "
            f"| {_cell(item['harness'].get('seed-baseline'))} "
            f"| {_cell(item['harness'].get('recommended'))} | {ratio_text} | {speed_text} "
            f"| {_seconds(tuning.get('wall_s'))} / {_seconds(gpu_s)} |"
        )
    lines += ["", "Setup (s, first round; compile included) and the recommended configs:", ""]
    for item in data["presets"]:
        if "error" in item:
            continue
        setups = ", ".join(
            f"{name} {entry['setup_s']:.1f}"
            for name, entry in item["peers"].items()
            if "setup_s" in entry
        )
        rec = item["recommended"]
        chosen = rec.get("precision")
        in_chosen = f" in {chosen}" if chosen and chosen != item["precision"] else ""
        lines.append(
            f"- {item['workload']}:{item['preset']} {item['precision']}: {setups}; "
            f"recommended `{short(rec['config'])}`{in_chosen} (compile "
            f"{rec.get('compile_s') or 0:.1f} s); aims {item['aims']}"
        )
        tuning = item["tuning"]
        if item.get("parameters"):
            args_text = ", ".join(f"{k}={v}" for k, v in (item.get("model_args") or {}).items())
            lines.append(
                f"  - {item['parameters'] / 1e9:.2f}B parameters"
                + (f" ({args_text})" if args_text else "")
            )
        spent = phase_times(tuning.get("time"))
        if spent is not None:
            lines.append(f"  - tuning time: {spent}")
        searched = search_text(tuning.get("search"))
        if searched is not None:
            lines.append(f"  - search: {searched}")
        for key, label in (
            ("ratio_vs_best_bf16_peer", "without float8"),
            ("ratio_vs_best_float8_peer", "with float8"),
        ):
            if key in item:
                r = item[key]
                lines.append(
                    f"  - vs the fastest peer {label} ({r['best_peer']}): {r['ratio']:.2f} "
                    f"({r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})"
                )
        for name, entry in {**item["peers"], **item["harness"]}.items():
            if "error" in entry:
                lines.append(f"  - {name} failed: {entry['error'][:300]}")
        for failed in item["tuning"].get("failed_trials", []):
            lines.append(
                f"  - tuning trial {failed['trial']} (`{short(failed['config'])}`) failed: "
                f"{(failed['reason'] or '')[:300]}"
            )
        if any(r["precision"] for r in item["tuning"].get("trial_results", [])):
            # A job choosing among precisions: what it measured of each, and the gate's word.
            for ran in item["tuning"]["trial_results"]:
                lines.append(f"  - tuning trial {ran['trial']}: {_trial_line(ran)}")
    return "\n".join(lines) + "\n"


def merge(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One document from several runs on one GPU (a merged document counts as the runs it was
    made of): their presets grouped by precision in PRECISION_ORDER, in run order within one, each
    recording the run it came from; every run's meta kept, their commits and dates joined."""
    gpus = {(r["meta"]["gpu"], r["meta"]["driver"], r["meta"]["torch"]) for r in runs}
    if len(gpus) != 1:
        raise SystemExit(f"--merge: runs from different machines or stacks: {sorted(gpus)}")
    metas = [m for r in runs for m in r["meta"].get("runs", [r["meta"]])]
    presets = [
        p if "run" in p else p | {"run": r["meta"]["file"]} for r in runs for p in r["presets"]
    ]
    presets.sort(key=lambda p: _precision_rank(p.get("precision")))
    meta = dict(runs[0]["meta"])
    for key in ("commit", "date"):
        meta[key] = ", ".join(dict.fromkeys(str(m[key]) for m in metas))
    meta["command"] = " ; ".join(m["command"] for m in metas)
    meta["runs"] = metas
    return {"meta": meta, "presets": presets}


PRECISION_ORDER = ("fp32", "tf32", "bf16-autocast", "fp16-autocast")


def _precision_rank(precision: str | None) -> int:
    return (
        PRECISION_ORDER.index(precision) if precision in PRECISION_ORDER else len(PRECISION_ORDER)
    )


README_BEGIN, README_END = "<!-- peers:begin -->", "<!-- peers:end -->"


def update_readme(readme: Path, data: Mapping[str, Any]) -> None:
    """Replace the table between the README's peers markers with this document's."""
    text = readme.read_text(encoding="utf-8")
    # The markers on lines of their own: prose may name them (docs/benchmarks/results.md does).
    head, sep, rest = text.partition(f"\n{README_BEGIN}\n")
    _, sep2, tail = rest.partition(f"\n{README_END}")
    head += "\n" if sep else ""
    if not sep or not sep2:
        raise SystemExit(f"{readme}: no {README_BEGIN} ... {README_END} markers")
    table = [line for line in to_markdown(data).splitlines() if line.startswith("|")]
    meta = data["meta"]
    note = (
        f"Measured by `benchmarks/peers.py` on {meta['gpu']} (driver {meta['driver']}, CUDA "
        f"{meta['cuda']}, torch {meta['torch']}), commit `{meta['commit']}`, {meta['date']}; "
        f"generated from `docs/benchmarks/{meta['file']}`."
    )
    body = "\n".join(table) + "\n\n" + note
    readme.write_text(f"{head}{README_BEGIN}\n{body}\n{README_END}{tail}", encoding="utf-8")


def _protocol(text: str) -> Protocol:
    try:
        warmup, windows, steps = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--protocol: expected WARMUP,WINDOWS,WINDOW_STEPS (three integers), got {text!r}"
        ) from None
    return Protocol(warmup=warmup, windows=windows, window_steps=steps)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="transformer:small")
    parser.add_argument("--precisions", default="tf32")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--peers",
        default=None,
        help="comma-separated peers (default: the small-model loops, or at scale, for the llama "
        f"presets, {','.join(SCALE_PEERS)}); all: {','.join(PEERS)}",
    )
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument(
        "--allow-precisions",
        default=None,
        help="the precisions each tuning job may choose among beside the preset's own (e.g. "
        "float8: the job runs with --precisions <precision>,float8, and the float8 peers "
        f"{','.join(FLOAT8_PEERS)} join the preset's)",
    )
    parser.add_argument(
        "--parity-steps",
        type=int,
        default=None,
        help="the gate's run length in each tuning job (default: the tuner's, 20)",
    )
    parser.add_argument(
        "--precision-parity-steps",
        type=int,
        default=None,
        help="the gate's run length for a config in another precision than the preset's, "
        "judged against its seed-to-seed envelope (the float8 evidence asks at least 200; "
        "default: --parity-steps)",
    )
    parser.add_argument(
        "--precision-tolerance",
        type=float,
        default=None,
        help="the multiple of the seed-to-seed envelope a config in another precision may "
        "deviate by in each tuning job (default: the tuner's, 3)",
    )
    parser.add_argument(
        "--protocol",
        type=_protocol,
        default=None,
        help="WARMUP,WINDOWS,WINDOW_STEPS of every measurement, tuning and peers "
        "(default: the tuner's, 10,5,20)",
    )
    parser.add_argument(
        "--peer-protocol",
        type=_protocol,
        default=None,
        help="WARMUP,WINDOWS,WINDOW_STEPS of the peers' interleaved measurement alone, leaving "
        "the tuning job its own defaults (default: --protocol)",
    )
    parser.add_argument(
        "--profile",
        default="none",
        help="the tuning job's profiles: none (default: the tuning time is the search's alone) "
        "or baselines (a default job's, as `python -m tuner run` takes them)",
    )
    parser.add_argument("--final-rounds", type=int, default=None)
    parser.add_argument("--search-timeout", type=float, default=None)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--from-json", type=Path, default=None, help="regenerate the Markdown")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="skip measuring: join the presets of these JSON files (one 10-minute run each) "
        "into --out/<first file's stem>-merged.json",
    )
    parser.add_argument(
        "--readme", type=Path, default=None, help="with --merge: rewrite the README's table"
    )
    parser.add_argument(
        "--add-mfu",
        type=Path,
        default=None,
        help="skip measuring: add TFLOP/s and MFU to this JSON's entries (FLOPs counted on the "
        "CPU) and regenerate its Markdown (and with --readme, the README's table)",
    )
    parser.add_argument(
        "--recommendation",
        type=Path,
        default=None,
        help="skip the tuning job: measure the recommendation of this `benchmarks/default_job.py` "
        "record (its first run that recommended a config for the preset) against the peers",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="skip the tuning job: measure this LoopConfig (JSON) against the peers, labelled "
        "as given (for instance the fastest trial of a job that did not finish)",
    )
    parser.add_argument(
        "--config-precision",
        default=None,
        help="with --config: the precision it runs in, when not the preset's (e.g. float8)",
    )
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    if args.config_precision is not None and args.config is None:
        parser.error("--config-precision needs --config")
    if args.add_mfu is not None:
        data = add_mfu(json.loads(args.add_mfu.read_text(encoding="utf-8")))
        args.add_mfu.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        args.add_mfu.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text(encoding="utf-8"))
        args.from_json.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        return
    if args.merge is not None:
        data = merge([json.loads(p.read_text(encoding="utf-8")) for p in args.merge])
        path = args.out / f"{args.merge[0].stem}-merged.json"
        data["meta"]["file"] = path.name
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return
    device = trainers.resolve_device(args.device)
    meta, where = run_meta(device, "peers.py", sys.argv[1:] if argv is None else argv, args.commit)
    stem = f"peers-{where}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    storage = f"sqlite:///{Path(tempfile.mkdtemp(prefix='streamtune-peers-')) / 'peers.db'}"
    meta["file"] = path.name
    presets: list[dict[str, Any]] = []

    def log(text: str) -> None:
        print(text, flush=True)

    for spec in filter(None, args.presets.split(",")):
        for precision in filter(None, args.precisions.split(",")):
            try:
                presets.append(run_preset(spec, precision, args, storage, log))
            except Exception as exc:  # noqa: BLE001 - one preset's failure must not lose the rest
                log(f"== {spec} {precision}: failed: {type(exc).__name__}: {exc}")
                workload, _, preset = spec.rpartition(":")
                presets.append(
                    {
                        "workload": workload,
                        "preset": preset,
                        "precision": precision,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
            data = {"meta": meta, "presets": presets}
            path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
            log(f"wrote {path}")


if __name__ == "__main__":
    main()
