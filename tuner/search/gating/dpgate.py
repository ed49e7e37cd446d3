"""The correctness gate for a study of N > 1 processes: the ranks agree, and the run is equivalent
to one process training the same global batches.

A data-parallel step computes, on each of N ranks, the mean loss of its shard, and applies the
mean of the N shards' gradients. One process accumulating the same N shards as micro-batches
(`LoopConfig(micro_batches=N)`) computes exactly that; with a per-sample mean loss it is also the
plain reference's step, up to rounding (measured on a CPU: mlp tiny under DDP and FSDP2 equal the
accumulating process bit for bit, and the plain reference within 2.4e-7). Where a loss is not a
per-sample mean (the transformer's cross-entropy over its non-padding tokens), every DDP user
trains the mean of the shards' means instead (1.6e-2 from the plain reference on transformer
tiny, 5e-7 from the accumulating process): the gate's reference is therefore the accumulating
process, for N a micro-batch count (1, 2, 4, 8), and the plain reference otherwise.

`DataParallelGate.check(config, envelope)`:
1. the envelope (once per study): that reference trained, and K copies from weights perturbed by
   rounding, in one process (`trainers.gate.Envelope.measure`); in a child process on a GPU, like
   the single-process gate, so that its deterministic settings never reach a measurement;
2. the config trained by N ranks under torchrun as the gate's trajectories are (dropout off,
   deterministic kernels, the same steps): the ranks' losses and parameters are gathered and
   checked to agree (DDP's replicas identical), else the run fails naming the rank;
3. the equivalence test of the mean losses against the envelope (`Envelope.judge`).

A launch costs the start of N + 1 Python processes (4-6 s on the 2-core CI machine, more with
NCCL on GPUs), so the first check also trains the study's baselines in the same launch, one after
the other (`run_distributed(also=...)`); their later checks judge those losses. Should that
launch fail, the config is tried again alone, so a baseline's failure is never another's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trainers
from trainers import LoopConfig, RunArgs
from trainers.gate import Envelope, ParityVerdict
from trainers.program import ProgramStopped, run_distributed
from tuner.search.gating.child import ChildProcess
from tuner.search.gating.gate import ConfigRun, GateRun, Pending, RunPending, only_one_precision
from tuner.store.phases import GATE_CONFIG, GATE_ENVELOPE

_ACCUMULATES = (1, 2, 4, 8)


def dp_reference(nproc: int) -> LoopConfig:
    """The one-process loop a run of `nproc` ranks is owed (see the module doc)."""
    return (
        trainers.REFERENCE.replace(micro_batches=nproc)
        if nproc in _ACCUMULATES
        else (trainers.REFERENCE)
    )


def measure_envelope(
    workload: str,
    preset: str,
    model_args: dict[str, str],
    nproc: int,
    args: RunArgs,
    matmul_precision: str,
) -> dict[str, Any]:
    """The envelope of `dp_reference(nproc)` (runs where it is called: a child on a GPU)."""
    trainers.set_matmul_precision(matmul_precision)
    envelope = Envelope.measure(
        trainers.resolve_factory(workload, model_args),
        preset,
        args,
        config=dp_reference(nproc),
    )
    return envelope.to_dict()


def equivalence_verdict(losses: list[float], envelope: Envelope, *, note: str) -> ParityVerdict:
    """The equivalence test of `losses` against `envelope`'s reference, as a verdict."""
    reference = envelope.reference
    if len(losses) != len(reference):
        raise ValueError(f"{len(losses)} losses against {len(reference)} in the reference")
    diffs = [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    rel = [
        d / abs(r) if r else (0.0 if d == 0 else math.inf)
        for d, r in zip(diffs, reference, strict=True)
    ]
    first = next((i for i, d in enumerate(diffs) if d != 0), None)
    eq = envelope.judge(losses)
    names = {f.name for f in dataclasses.fields(ParityVerdict)}
    fields = {k: v for k, v in dataclasses.asdict(eq).items() if k in names}
    fields.pop("passed", None)
    fields.pop("reason", None)
    return ParityVerdict(
        **fields
        | {
            "passed": eq.passed,
            "exact_required": False,
            "tolerance": eq.bound,
            "steps": len(reference),
            "max_abs_deviation": max(diffs, default=0.0),
            "max_rel_deviation": max(rel, default=0.0),
            "first_diverging_step": first,
            "reason": f"{note}; {eq.reason}",
            "test": "equivalence",
            "losses": tuple(losses),
            # The ranks run deterministic kernels in warn-only mode: an op without a
            # deterministic kernel must not fail one rank of N (`trainers.distributed`).
            "determinism": "warn-only",
            "decisive_steps": tuple(eq.decisive_steps),
            "window_deviations": tuple(eq.window_deviations),
            "window_envelopes": tuple(eq.window_envelopes),
        }
    )


class DataParallelGate:
    """The gate of a study of `nproc` processes (see the module doc); a
    `tuner.search.gating.gate.Gate`."""

    def __init__(
        self,
        workload: str,
        preset: str,
        args: RunArgs,
        *,
        nproc: int,
        matmul_precision: str,
        model_args: Mapping[str, str] | None = None,
        isolate: bool = False,
        batch: Sequence[LoopConfig] = (),
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self._args = (workload, preset, dict(model_args or {}), nproc)
        # A cancel stops a config's launch (ProgramStopped), not the envelope's, which may run in
        # a child process a callable does not reach.
        self._should_stop = should_stop
        self.nproc = nproc
        # The gate's steps, seed, device (by name: it travels to a child) and precision.
        self.run_args = args.replace(device=str(args.device))
        self.steps = args.steps
        self.seed = args.seed
        self.device = str(args.device)
        self.matmul_precision = matmul_precision
        self.precision = args.precision
        self._child = ChildProcess() if isolate else None
        # Trained beside the first config checked (`batch`: the baselines), then judged from here.
        self._pending = list(batch)
        self._trained: dict[LoopConfig, tuple[list[float], str]] = {}

    def _envelope(self) -> dict[str, Any]:
        args = (*self._args, self.run_args, self.matmul_precision)
        if self._child is not None:
            return self._child.call(measure_envelope, *args)
        return measure_envelope(*args)

    def _losses(self, config: LoopConfig) -> tuple[list[float], str]:
        """`config`'s gate losses and what the ranks said: trained before, or now (with the
        pending batch when there is one)."""
        if config in self._trained:
            return self._trained.pop(config)
        also = [c for c in self._pending if c != config]
        self._pending = []
        if also:
            try:
                return self._launch(config, also)
            except ProgramStopped:
                raise
            except trainers.TrainerError:
                pass  # tried again alone: a baseline's failure must not fail this config
        return self._launch(config, [])

    def _launch(self, config: LoopConfig, also: list[LoopConfig]) -> tuple[list[float], str]:
        workload, preset, model_args, nproc = self._args
        warmup = trainers.min_warmup(config)
        result = run_distributed(
            workload,
            preset,
            config,
            # The gate's trajectory: untimed compilation steps included, `steps` losses in all.
            self.run_args.replace(steps=max(1, self.steps - warmup), warmup=warmup, windows=1),
            nproc=nproc,
            model_args=model_args,
            gate=True,
            matmul_precision=self.matmul_precision,
            also=also,
            should_stop=self._should_stop,
        )
        effective = result.effective

        def note(other: LoopConfig) -> str:
            return (
                f"the ranks agree (world size {effective['world_size']}, "
                f"{effective['backend']}; replicas "
                f"{'identical' if other.parallel == 'ddp' else 'sharded'}); against one process "
                f"on the same global batches ({dp_reference(nproc).micro_batches} micro-batches)"
            )

        for other, found in zip(also, effective["also"], strict=True):
            self._trained[other] = (list(found["losses"]), note(other))
        return result.losses, note(config)

    def check(
        self,
        config: LoopConfig,
        envelope: Mapping[str, Any] | None,
        *,
        precision: str | None = None,
        pending: Pending | None = None,
        run: RunPending | None = None,
    ) -> GateRun:
        """`pending` is not waited for: `--gpus N` (whose workers share a gate) refuses a
        data-parallel job, so no other process measures this envelope."""
        only_one_precision(precision, self.precision, "data-parallel trials")
        times: dict[str, float] = {}
        started = time.perf_counter()
        found = dict(envelope) if envelope is not None else self._envelope()
        if envelope is None:
            times[GATE_ENVELOPE] = time.perf_counter() - started
        started = time.perf_counter()
        losses, note = self._losses(config)
        verdict = equivalence_verdict(losses, Envelope.from_dict(found), note=note)
        times[GATE_CONFIG] = time.perf_counter() - started
        return GateRun(verdict=verdict, envelope=found, time=times)

    runs_apart = False
    """`run` is not asked for either: the ranks run a config's losses in one launch."""

    def config_run(self, config: LoopConfig, *, precision: str | None = None) -> ConfigRun:
        raise TypeError(
            "a data-parallel gate runs a config's own run within its check alone (runs_apart)"
        )

    def envelope(self, *, precision: str | None = None) -> GateRun:
        only_one_precision(precision, self.precision, "data-parallel trials")
        started = time.perf_counter()
        found = self._envelope()
        return GateRun(
            verdict=None, envelope=found, time={GATE_ENVELOPE: time.perf_counter() - started}
        )

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
