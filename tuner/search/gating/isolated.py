"""Parity checks and profiles in separate processes, so that they cannot change the measurements.

`check_parity` switches PyTorch to deterministic kernels and sets `CUBLAS_WORKSPACE_CONFIG`. Both
are process-wide, and measured on an H100 they outlast the check: eager steps of transformer
`small` went from 14 to 21-23 ms and `medium` from 31 to 43-50 ms after one parity check in the
same process (docs/benchmarks/README.md, "Parity in its own process"). So the tuner runs every
parity check in one long-lived child process (spawned, not forked: CUDA cannot be forked), one at
a time, while the measuring process waits: two measurements never share the GPU. One part may
run in the measuring process instead: a config's own run owed no bits, or a graph config's with
its eager twin, under that process's own settings, where Dynamo there still holds what the
config's trial compiled (`ParityProcess.runs_here`, `tuner.search.gating.kept`); the child
judges its losses.

Profiles run in a second child (`tuner.search.deciding.profile_child`), one `ChildProcess`
(`tuner.search.gating.child`) like this one's, for the same reason: a `torch.profiler` pass with
CUDA activity leaves CUPTI attached to the process after it ends (Kineto does not tear it down
by default, pytorch/pytorch#144455), and on an H100 the seed baseline of transformer `small`
measured 14.3-15.3 ms before a profile and 15.4-22.5 ms after it in the same process
(docs/benchmarks/profile-overhead-*). Profiles do not share the parity child: its deterministic
mode would slow what they profile.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import trainers
from trainers import LoopConfig
from trainers.gate import PERTURBATIONS, Determinism, TwinKind
from trainers.workloads import WorkloadFactory, disable_dropout
from tuner.search.gating.child import (
    ChildProcess,
    fork_dataloader_workers,
    give_back_memory,
    one_thread,
)
from tuner.search.gating.gate import (
    AS_THE_GATE,
    TWIN_KIND,
    ConfigRun,
    CrossPrecision,
    GateRun,
    Pending,
    RunPending,
    TwinRun,
    measure_envelope,
    run_config,
    run_parts,
    run_twin,
)
from tuner.search.gating.kept import (
    KeptRun,
    run_kept,
    runs_kept,
    runs_where_trained,
    why_not_kept,
)

T = TypeVar("T")
_Here = TypeVar("_Here", ConfigRun, KeptRun)


def _gate(
    workload: str,
    preset: str,
    model_args: dict[str, str],
    config: dict[str, Any],
    args: trainers.RunArgs,
    matmul_precision: str,
    envelope: dict[str, Any] | None,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin: TwinRun | None = None,
    losses: Sequence[float] | None = None,
    twin_kind: TwinKind = TWIN_KIND,
    determinism: Determinism | None = None,
) -> GateRun:
    """The correctness gate for `config`, part by part (`tuner.search.gating.gate.run_parts`): the
    verdict, the envelope it used (measured here the first time: the parent stores it on the
    study) and the seconds of each part. `twin`: run before by `_twin` (or with `losses` by
    `run_kept`, then `determinism` "off"); `losses`: the config's own run, run by another
    process (`_config_run`)."""
    return _in_child(
        matmul_precision,
        lambda: run_parts(
            _reused_builds(workload, model_args),
            preset,
            LoopConfig.from_dict(config),
            args,
            envelope=envelope,
            config_precision=config_precision,
            cross=cross,
            twin=twin,
            run=None if losses is None else (lambda: losses),
            twin_kind=twin_kind,
            determinism=determinism,
        ),
    )


def _config_run(
    workload: str,
    preset: str,
    model_args: dict[str, str],
    config: dict[str, Any],
    args: trainers.RunArgs,
    matmul_precision: str,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin_kind: TwinKind = TWIN_KIND,
) -> ConfigRun:
    """`config`'s own run alone (`run_config`), while another process's check runs its twin."""
    return _in_child(
        matmul_precision,
        lambda: run_config(
            _reused_builds(workload, model_args),
            preset,
            LoopConfig.from_dict(config),
            args,
            config_precision=config_precision,
            cross=cross,
            twin_kind=twin_kind,
        ),
    )


def _twin(
    workload: str,
    preset: str,
    model_args: dict[str, str],
    config: dict[str, Any],
    args: trainers.RunArgs,
    matmul_precision: str,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin_kind: TwinKind = TWIN_KIND,
) -> TwinRun:
    """`config`'s twin alone (`run_twin`), while another process measures the envelope."""
    return _in_child(
        matmul_precision,
        lambda: run_twin(
            _reused_builds(workload, model_args),
            preset,
            LoopConfig.from_dict(config),
            args,
            config_precision=config_precision,
            cross=cross,
            twin_kind=twin_kind,
        ),
    )


def _envelope(
    workload: str,
    preset: str,
    model_args: dict[str, str],
    args: trainers.RunArgs,
    matmul_precision: str,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
) -> GateRun:
    """The envelope a config in `config_precision` is judged against, alone
    (`measure_envelope`)."""
    return _in_child(
        matmul_precision,
        lambda: measure_envelope(
            _reused_builds(workload, model_args),
            preset,
            args,
            config_precision=config_precision,
            cross=cross,
        ),
    )


def _in_child(matmul_precision: str, part: Callable[[], T]) -> T:
    """One gate part in the child: the settings every part needs first, the memory its run
    cached given back after (`give_back_memory`)."""
    import torch  # in the child

    fork_dataloader_workers()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts here
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    torch.set_float32_matmul_precision(matmul_precision)
    try:
        return part()
    finally:
        give_back_memory()


_BUILDS: dict[tuple[str, tuple[tuple[str, str], ...]], trainers.ReusedBuilds] = {}


KEPT_BUILDS = 1 + PERTURBATIONS
"""The builds the gate's child keeps (where the host has room, `trainers.ReusedBuilds`): the
reference's seed and a seed envelope's four, so that its runs after the envelope do not build the
reference's seed again (18 s at 1.2B, 2026-12-01)."""


def _reused_builds(workload: str, model_args: dict[str, str]) -> trainers.ReusedBuilds:
    """The factory of `workload`, building each (preset, seed) once in this child: the gate's ten
    or so runs per config start from copies (`trainers.workloads.reuse`). One workload's builds
    are kept at a time (`KEPT_BUILDS` of its seeds at most): another workload's replace them."""
    key = (workload, tuple(sorted(model_args.items())))
    if key not in _BUILDS:
        _BUILDS.clear()
        factory = trainers.resolve_factory(workload, model_args)
        _BUILDS[key] = trainers.ReusedBuilds(factory, keep=KEPT_BUILDS)
    return _BUILDS[key]


def _prepare_gate(
    workload: str,
    preset: str,
    model_args: dict[str, str],
    seed: int,
    matmul_precision: str,
    envelope_seeds: Sequence[int] = (),
) -> float:
    """`ParityProcess.prepare` in the child: the pristine builds of the reference's seed and of
    `envelope_seeds` (a seed envelope's, `trainers.gate.envelope_seeds`) kept, on one thread (a
    core of its own, beside the measurement), under the settings every part runs with
    (`_in_child`). The reference's first; each seed only while another build would be kept
    beside it (`trainers.ReusedBuilds.room_for_another`: a seed built and dropped is only time)."""
    import torch  # in the child

    fork_dataloader_workers()
    # Before CUDA starts here, as for every part (`_in_child`): a factory may build on the GPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_float32_matmul_precision(matmul_precision)
    started = time.perf_counter()
    try:
        builds = _reused_builds(workload, model_args)
        with one_thread():
            builds(preset, seed=seed)  # the copy is dropped
            for each in envelope_seeds:
                if (preset, seed) not in builds.kept or not builds.room_for_another():
                    break  # the reference's build first: a seed never takes its place
                if each != seed:
                    builds(preset, seed=each)
        return time.perf_counter() - started
    finally:
        give_back_memory()  # a factory that built on the GPU: the trials need its memory


class ParityProcess:
    """Runs the correctness gate (`tuner.search.gating.gate.run_parts`) in a child process (a
    config's own run made where its trial compiled where it may be: `runs_here`): a `Gate`."""

    runs_apart = True

    def __init__(
        self,
        workload: str,
        preset: str,
        args: trainers.RunArgs,
        *,
        matmul_precision: str,
        model_args: dict[str, str] | None = None,
        cross: CrossPrecision = AS_THE_GATE,
        where_trained: bool = True,
        twin_kind: TwinKind = TWIN_KIND,
    ) -> None:
        self._args = (workload, preset, dict(model_args or {}))
        self.where_trained = where_trained
        """Whether a config's own run (with its eager twin where it owes that one's bits) runs
        in this process, the trials' own (`tuner.search.gating.kept`), rather than in the child."""
        self.twin_kind = twin_kind
        """The twin a config with no graph is checked through (`TWIN_KIND`; a test's "eager")."""
        self._factory: WorkloadFactory | None = None
        # Sent to the child as they are: a device given as torch.device travels as its name.
        self.run_args = args.replace(device=str(args.device))
        self.cross = cross
        self.matmul_precision = matmul_precision
        self._child = ChildProcess()
        self._apart: str | None = None  # the last check's `GateRun.twin_apart`

    def check(
        self,
        config: LoopConfig,
        envelope: Mapping[str, Any] | None = None,
        *,
        precision: str | None = None,
        pending: Pending | None = None,
        run: RunPending | None = None,
    ) -> GateRun:
        """The verdict, the envelope (`envelope`, or measured now when None) and the seconds of
        each part of the gate; `precision`: the config's, when not the study's (`run_parts`).
        `pending`: the envelope measured by another process, and `run`: the config's own run,
        likewise; each waited for here (in this process, which can read the study) once the
        config's twin has run (in the child, or here with the config: `runs_kept`). Where
        `runs_here` allows it, the config's own run (and its eager twin, `runs_kept`) is made in
        this process, where its trial's compiled code is; a config that did not replay its kept
        twin bit for bit, or whose kept runs failed, is checked in the child as before."""
        self._apart = None
        here: KeptRun | ConfigRun | None = self._kept_here(config, precision)
        twin = None if not isinstance(here, KeptRun) else here.twin
        losses: Sequence[float] | None = None if twin is None or here is None else here.losses
        if (envelope is None and pending is not None) or run is not None:
            if twin is None:
                twin = self._child.call(_twin, *self._child_args(config, precision))
            if envelope is None and pending is not None:
                envelope = pending()
            if run is not None and losses is None:
                losses = run()
        if here is None and losses is None and self._owed_no_bits_here(config, precision):
            here = self._run_here(config, precision, run_config)
            losses = None if here is None else here.losses
        checked = self._child.call(
            _gate,
            *self._args,
            config.to_dict(),
            self.run_args,
            self.matmul_precision,
            None if envelope is None else dict(envelope),
            precision,
            self.cross,
            twin,
            None if losses is None else list(losses),
            self.twin_kind,
            "off" if isinstance(here, KeptRun) and here.twin is not None else None,
        )
        if here is None:
            return dataclasses.replace(checked, twin_apart=self._apart)
        spent = dict(checked.time)
        for part, seconds in here.time.items():
            spent[part] = spent.get(part, 0.0) + seconds
        # A kept twin the config did not replay: the child ran both again, strict.
        kept = isinstance(here, KeptRun) and here.twin is not None
        made = kept or isinstance(here, ConfigRun)
        apart = here.apart if isinstance(here, KeptRun) and not kept else None
        return dataclasses.replace(
            checked, time=spent, config_here=made, twin_here=kept, twin_apart=apart
        )

    def runs_here(self, config: LoopConfig, precision: str | None = None) -> bool:
        """Whether `config`'s own gate run in `precision` (None: the study's) is made in this
        process (`where_trained`, and `runs_where_trained` or `runs_kept`): it then compiles
        nothing its trial compiled here."""
        return self._owed_no_bits_here(config, precision) or self._runs_kept(config, precision)

    def _owed_no_bits_here(self, config: LoopConfig, precision: str | None) -> bool:
        return self.where_trained and runs_where_trained(
            config, self.run_args, **self._options(precision)
        )

    def _runs_kept(self, config: LoopConfig, precision: str | None) -> bool:
        return self.where_trained and runs_kept(config, self.run_args, **self._options(precision))

    def _options(self, precision: str | None) -> dict[str, Any]:
        # The precision as the study gave it: `RunOptions` checked it.
        return {"config_precision": precision, "cross": self.cross, "twin_kind": self.twin_kind}

    def _child_args(self, config: LoopConfig, precision: str | None) -> tuple[Any, ...]:
        """A child part's arguments for `config` (`_twin`, `_config_run`)."""
        return (
            *self._args,
            config.to_dict(),
            self.run_args,
            self.matmul_precision,
            precision,
            self.cross,
            self.twin_kind,
        )

    def _kept_here(self, config: LoopConfig, precision: str | None) -> KeptRun | None:
        """`config` and its eager twin run here (`run_kept`) where `runs_kept` allows it. None
        where they did not run, or failed: the child decides, as where they disagree, since
        only runs that agree count here (`tuner.search.gating.kept`)."""
        if not self._runs_kept(config, precision):
            self._apart = (
                why_not_kept(config, self.run_args, **self._options(precision))
                if self.where_trained
                else None
            )
            return None
        try:
            return self._run_here(config, precision, run_kept)
        except Exception as exc:  # noqa: BLE001 - the child's strict check runs it again and judges
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            self._apart = f"its kept runs failed ({text})"
            return None

    def _run_here(
        self, config: LoopConfig, precision: str | None, runs: Callable[..., _Here]
    ) -> _Here | None:
        """`config`'s own run in this process (`runs`: `run_config` or, with its eager twin,
        `run_kept`), under this process's own settings as its trials ran, where Dynamo still
        holds its trial's code (`trainers.compilation.holds_compiled`) and turning dropout off
        changes nothing (else the graphs differ from the trial's): a run that would compile
        here would also drop the code kept for others. None: run it in the child. What the
        runs cached goes back to the GPU after them (`give_back_memory`): the child judges
        next, and runs the twin where it has not yet."""
        workload, preset, model_args = self._args
        if self._factory is None:
            self._factory = trainers.resolve_factory(workload, model_args)
        built = [self._factory(preset, seed=self.run_args.seed)]
        own = precision if precision is not None else self.run_args.precision
        device = trainers.resolve_device(self.run_args.device)
        if disable_dropout(built[0].model):
            self._apart = "the model has dropout, which the gate turns off: other graphs"
            return None
        held = trainers.compilation.why_not_held(built[0].model, config, own, device)
        if held is not None:
            self._apart = f"Dynamo does not hold its trial's code here: {held}"
            return None
        factory = self._factory

        def build(name: str, *, seed: int) -> trainers.Workload:
            return built.pop() if built else factory(name, seed=seed)  # the one built above

        try:
            return runs(
                build,
                preset,
                config,
                self.run_args,
                config_precision=precision,
                cross=self.cross,
            )
        except Exception as exc:  # noqa: BLE001 - raised again below
            # Without its traceback, whose frames hold the failed run's model and activations:
            # a check that ran out of memory beside the profiles' warm-up runs again
            # (`ParityCache._gate_check`) and needs that memory back first.
            error = exc.with_traceback(None)
        finally:
            built.clear()
            give_back_memory()
        raise error

    def prepare(self, envelope_seeds: Sequence[int] = ()) -> concurrent.futures.Future[float]:
        """Start the child and build the workload in it now, while this process measures the
        trials: at `llama-1b` on an H200 the child's start and build were about 30 s of the
        gate, which runs after the trials (2026-11-29). `envelope_seeds`: a seed envelope's
        (`trainers.gate.envelope_seeds`), built too where the study will measure one (at 1.2B
        its four builds were 72 s of the gate, 2026-12-01). One thread, on the CPU; the future
        holds the builds' seconds. Their copies stand in for builds (`trainers.ReusedBuilds`),
        so the gate's runs are what they would have been."""
        workload, preset, model_args = self._args
        seed, matmul = self.run_args.seed, self.matmul_precision
        return self._child.submit(
            _prepare_gate, workload, preset, model_args, seed, matmul, tuple(envelope_seeds)
        )

    def config_run(self, config: LoopConfig, *, precision: str | None = None) -> ConfigRun:
        return self._child.call(_config_run, *self._child_args(config, precision))

    def envelope(self, *, precision: str | None = None) -> GateRun:
        return self._child.call(
            _envelope, *self._args, self.run_args, self.matmul_precision, precision, self.cross
        )

    def close(self) -> None:
        self._child.close()
