"""The profiles' child process: `ProfileProcess` runs `tuner.evidence.trace.profile_config` in a
long-lived spawned child (`tuner.search.gating.child.ChildProcess`), since a profile leaves
CUPTI attached to the process that ran it and slows every later launch there (the module doc of
`tuner.search.gating.isolated` has the figures).

Its work ahead of the profiles, while this process goes on:
- `prepare` builds the workload, beside the final round, on one core;
- `warm` runs the config the gate is checking for a few steps, beside the gate (which measures no
  speed), so that the recommended config's profile keeps the code that run compiled
  (`trainers.compilation.reuse_key`) instead of compiling it again: at `llama-1b` on an H200 that
  compile was 75 s of the cold job's 141 s of profiles (2026-11-29, 5b60579). `Search` asks for it
  only where the GPU's free memory holds it beside the gate's runs; where the gate ends first,
  the warm-up is ended (`end_unfinished`, `tuner.search.children.Children.end_warm`), else
  waited for before the next measurement (`settle`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import trainers
from trainers import LoopConfig
from tuner.evidence import trace
from tuner.search.gating.child import (
    ChildProcess,
    fork_dataloader_workers,
    give_back_memory,
    one_thread,
)

WARM_STEPS = 2
"""Steps of `warm`'s run after its warm-up: enough for the compile and a replay of its code."""

_WorkloadKey = tuple[str, str, int, tuple[tuple[str, str], ...]]
_WORKLOADS: dict[_WorkloadKey, trainers.Workload] = {}


def _built(
    workload: str, preset: str, seed: int, model_args: dict[str, str]
) -> tuple[_WorkloadKey, float]:
    """The profiles' workload in this child, built the first time: its key and the seconds the
    build took here (0 once built)."""
    key = (workload, preset, seed, tuple(sorted(model_args.items())))
    started = time.perf_counter()
    if key not in _WORKLOADS:
        _WORKLOADS[key] = trainers.load_workload(workload, preset, seed=seed, model_args=model_args)
    return key, time.perf_counter() - started


def _prepare(workload: str, preset: str, seed: int, model_args: dict[str, str]) -> float:
    """`ProfileProcess.prepare` in the child: the workload built while the measuring process
    measures, so on one thread (a core of its own, not the measurement's)."""
    with one_thread():
        return _built(workload, preset, seed, model_args)[1]


def _workload_here(
    workload: str, preset: str, seed: int, model_args: dict[str, str], matmul_precision: str
) -> tuple[trainers.Workload, float]:
    """What a profile or a warm-up runs in this child: its settings applied, then the profiles'
    workload (`_built`) and the seconds its build took here (0 once built)."""
    fork_dataloader_workers()
    trainers.set_matmul_precision(matmul_precision)
    key, built_s = _built(workload, preset, seed, model_args)
    return _WORKLOADS[key], built_s


def _warm(
    workload: str,
    preset: str,
    config: dict[str, Any],
    warmup: int,
    seed: int,
    device: str,
    matmul_precision: str,
    model_args: dict[str, str],
    precision: trainers.Precision | None,
) -> float:
    """`ProfileProcess.warm` in the child: `config` run briefly on the profiles' own workload and
    settings, so that its profile keeps the code compiled here; the model's weights put back, as
    a profile puts them back. Returns the seconds it took."""
    started = time.perf_counter()
    built, _ = _workload_here(workload, preset, seed, model_args, matmul_precision)
    loop = LoopConfig.from_dict(config)
    saved = {k: v.detach().clone() for k, v in built.model.state_dict().items()}
    try:
        # The profile's own warm-up length, so that the same code (graphs, guards) is compiled.
        args = trainers.RunArgs(
            steps=WARM_STEPS,
            warmup=max(warmup, trainers.min_warmup(loop)),
            windows=1,
            device=device,
            precision=precision,
        )
        trainers.run(built, loop, args)
    finally:
        built.model.load_state_dict(saved)
        give_back_memory()
    return time.perf_counter() - started


def _profile(
    workload: str,
    preset: str,
    config: dict[str, Any],
    steps: int,
    warmup: int,
    seed: int,
    device: str,
    matmul_precision: str,
    model_args: dict[str, str],
    precision: trainers.Precision | None,
) -> trace.Profile:
    built, built_s = _workload_here(workload, preset, seed, model_args, matmul_precision)
    try:
        profile = trace.profile_config(
            built,
            LoopConfig.from_dict(config),
            steps=steps,
            warmup=warmup,
            device=device,
            precision=precision,
        )
        # The child's own build counts too: it is the profile's cost to the job.
        phases = {"build": round(built_s, 3), **(profile.phases or {})}
        return dataclasses.replace(profile, seconds=profile.seconds + built_s, phases=phases)
    finally:
        give_back_memory()


class ProfileProcess:
    """Runs `tuner.evidence.trace.profile_config` in a child process; `profile` returns its
    Profile."""

    def __init__(
        self,
        workload: str,
        preset: str,
        *,
        steps: int,
        warmup: int,
        seed: int,
        device: str,
        matmul_precision: str,
        model_args: dict[str, str] | None = None,
        precision: trainers.Precision | None = None,
    ) -> None:
        self._args = (workload, preset)
        self._rest = (
            steps,
            warmup,
            seed,
            device,
            matmul_precision,
            dict(model_args or {}),
            precision,
        )
        self._child = ChildProcess()

    def prepare(self) -> concurrent.futures.Future[float]:
        """Start the child and build the workload in it now, while this process goes on (the
        final round): at 1B on an H200 the child's start and build took 17 s and 24 s of each
        job's first profile (2026-11-29). The build runs on the CPU, on one thread; the future
        holds its seconds."""
        workload, preset = self._args
        seed, model_args = self._rest[2], self._rest[5]
        return self._child.submit(_prepare, workload, preset, seed, model_args)

    @property
    def device(self) -> str:
        return str(self._rest[3])

    def warm(
        self, config: LoopConfig, *, precision: str | None = None
    ) -> concurrent.futures.Future[float]:
        """Run `config` (in `precision`; None: the study's) briefly in the child now, while this
        process goes on (the gate, which measures no speed): its profile after it then keeps
        what this compiled. It uses the GPU: nothing may be measured until `settle` returns.
        The future holds its seconds."""
        workload, preset = self._args
        warmup, seed, device, matmul, model_args, own = self._rest[1:]
        chosen = own if precision is None else precision
        return self._child.submit(
            _warm,
            workload,
            preset,
            config.to_dict(),
            warmup,
            seed,
            device,
            matmul,
            model_args,
            chosen,
        )

    def running(self) -> bool:
        """Whether what was started ahead (`prepare`, `warm`) still runs."""
        return self._child.running()

    def end_unfinished(self) -> bool:
        """End the child where what was started ahead still runs (`ChildProcess.end_unfinished`):
        True; the next call starts a new child and builds the workload again."""
        return self._child.end_unfinished()

    def settle(self) -> bool:
        """Wait for what was started ahead (`prepare`, `warm`). A failure is not raised: its
        child is ended (False), and the next profile starts a new one."""
        return self._child.settle()

    def profile(self, config: LoopConfig, *, precision: str | None = None) -> trace.Profile:
        """`config`'s profile, in `precision` (None: the study's)."""
        rest = self._rest if precision is None else (*self._rest[:-1], precision)
        return self._child.call(_profile, *self._args, config.to_dict(), *rest)

    def close(self) -> None:
        self._child.close()
