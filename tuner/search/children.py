"""The search's gate and profiler, and the child processes they run in.

Chosen once, by the kind of run, so that the search never asks which:
- a built-in workload on a GPU: the gate and the profiles each in a long-lived child process
  (`tuner.search.gating.isolated`): the gate's deterministic mode and cuBLAS workspace setting, and
  CUPTI after a profile, outlast them and slowed later measurements by up to 50 %;
- a built-in workload on a CPU: both in this process;
- a registered program: its own gate (`ProgramGate`), and no profiler (its kernels run in
  another process; `open_search` turns profiles off for it);
- N > 1 processes per trial: the data-parallel gate (`tuner.search.gating.dpgate`: the ranks under
  torchrun against one process on the same global batches), its envelope in a child process on
  a GPU; the profiles run under torchrun too (`tuner.search.deciding.dpprofile`).

On a GPU the two children start, and build their workloads, ahead of their first call (the
gate's beside the trials, the profiles' beside the final round), on a core the measurement does
not use: a build is CPU work, and at 1B the children's starts and builds were about 40 s each
of a job that waited for them (`docs/benchmarks/README.md`, 2026-11-29). The profiles' child
also runs the config the gate checks after the trials beside that gate (`warm_profiles`), where
the GPU's memory holds both, so that the recommended config's profile compiles nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from optuna.trial import FrozenTrial

from trainers import LoopConfig, RunArgs, compiles, keeps_code, usable_cores
from trainers.gate import envelope_seeds, spread_for
from tuner.search.deciding import profiling
from tuner.search.deciding.dpprofile import DataParallelProfiler
from tuner.search.deciding.profile_child import ProfileProcess
from tuner.search.gating.dpgate import DataParallelGate
from tuner.search.gating.gate import AS_THE_GATE, CrossPrecision, Gate, InProcessGate
from tuner.search.gating.isolated import ParityProcess
from tuner.search.gating.program import ProgramGate
from tuner.search.measuring.measure import Measurer
from tuner.search.options import RunOptions, baselines_for
from tuner.search.spaces.space import candidate_key
from tuner.store import keys

AHEAD_MIN_CORES = 8
"""The fewest cores this process may run on for the children to build their workloads ahead,
beside a measurement (`Children.prepare_gate`, `prepare_profiles`): the measuring process, its
DataLoader workers and pinning thread take up to 4, and a build takes one more. A lent GPU
machine has 16 per GPU. On fewer, each child builds when first used, as before."""

WARM_RESERVE_BYTES = 4 * 2**30
"""Free memory a warm-up beside the gate leaves over its estimate (`room_to_warm`): the CUDA
context of a new process and what the allocator rounds up."""


def _free_bytes(device: str) -> int:
    """The free memory of `device`'s GPU now, all processes counted (0 off a GPU)."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.mem_get_info(device)[0])


def room_to_warm(free: int, peak: int, largest: int) -> bool:
    """Whether a profile child's warm-up of a config whose measured peak is `peak` bytes may run
    beside the gate, `free` bytes of the GPU being free now: the gate's child runs the same
    model (its twin, its reference eagerly) and this process may run one more trial after a
    failed verdict, each taken as twice the `largest` peak any trial measured, plus a reserve.
    On an H200 at `llama-1b` (peaks about 32 GB) it holds; on an 80 GB GPU it does not, and the
    profile compiles the config itself, as before."""
    return free >= peak + 2 * largest + WARM_RESERVE_BYTES


@dataclasses.dataclass(kw_only=True)
class Children:
    """The gate and the profiler (None: profiles off) of one search; `close` ends their
    processes."""

    gate: Gate
    profiler: profiling.Profiler | None
    _profiles: ProfileProcess | None = None
    prepared: bool = False
    """Whether the profiles' child was started and its workload built ahead (`prepare_profiles`)."""
    warmed: str | None = None
    """Why the profiles' child warmed up a config, or why not (`warm_profiles`; None: not asked)."""
    warm_config: tuple[LoopConfig, str | None] | None = None
    """The config the profiles' child ran ahead, with its precision (None: the study's), as
    `warm_profiles` was given them; None: none ran."""

    def prepare_gate(self, envelope_seeds: Sequence[int] = ()) -> None:
        """Start the gate's child and its builds now (`ParityProcess.prepare`: the reference's
        seed, and `envelope_seeds`, `seeds_ahead`), where the gate runs in one; a no-op
        elsewhere."""
        if isinstance(self.gate, ParityProcess) and usable_cores() >= AHEAD_MIN_CORES:
            self.gate.prepare(envelope_seeds)

    def prepare_profiles(self) -> None:
        """Start the profiles' child and its build now (`ProfileProcess.prepare`), where the
        profiles run in one; a no-op elsewhere."""
        if self._profiles is not None and usable_cores() >= AHEAD_MIN_CORES:
            self._profiles.prepare()
            self.prepared = True

    def warm_profiles(
        self, config: LoopConfig, precision: str | None, *, peak: int | None, largest: int
    ) -> bool:
        """Run `config` briefly in the profiles' child now, beside the gate
        (`ProfileProcess.warm`), where there is one, on enough cores, and the GPU's free memory
        holds it (`room_to_warm`, from the config's measured `peak` and the `largest` of any
        trial). Returns whether it started; `warmed` says why or why not. Nothing may be
        measured before `settle_profiles`."""
        profiles = self._profiles
        # Only a compile the profile can keep (`trainers.keeps_code`) is worth running ahead.
        if profiles is None or usable_cores() < AHEAD_MIN_CORES:
            return False
        if not (compiles(config) and keeps_code(config)):
            return False
        free = _free_bytes(profiles.device)
        if peak is None or not room_to_warm(free, peak, largest):
            self.warmed = (
                f"left to its profile: {free / 1e9:.1f} GB free, under twice the largest trial's "
                f"peak ({largest / 1e9:.1f} GB), its own and {WARM_RESERVE_BYTES >> 30} GiB"
            )
            return False
        profiles.warm(config, precision=precision)
        self.prepared = True
        self.warm_config = (config, precision)
        self.warmed = f"run in the profiles' child beside the gate ({free / 1e9:.0f} GB free)"
        return True

    def settle_profiles(self) -> None:
        """Wait for the profiles' child's work ahead (`warm_profiles`, `prepare_profiles`); a
        failed one ends the child, so its profiles will compile and build again."""
        if self._profiles is not None and not self._profiles.settle():
            self.warm_config = None
            self.prepared = False

    def end_warm(self) -> bool:
        """Where the leader's warm-up still runs in the profiles' child when its gate has ended:
        end it rather than wait (True; `warmed` says so, and its profile will compile the config
        where the job's time allows). Waiting delays the final round, and the warm-up saves at
        most its profile's compile, which the job's aim may leave out: at 583f50a on one H200
        (the Qwen1.5-0.5B shape) the final round waited 94 s for it after a 103 s gate, and the
        recommended config's profile was then left out for the aim. What ended is then waited
        for as before (`settle_profiles`)."""
        ended = False
        if self._profiles is not None and self.warm_config is not None:
            ended = self._profiles.end_unfinished()
        if ended:
            self.warm_config, self.prepared = None, False
            self.warmed = (
                "in the profiles' child ended unfinished when the gate ended: the final round "
                "does not wait for it"
            )
        self.settle_profiles()
        return ended

    def warm_leader(
        self,
        config: LoopConfig,
        precision: str | None,
        trials: Sequence[FrozenTrial],
        reference: str | None,
    ) -> Callable[[], None] | None:
        """`warm_profiles` for the study's leader, its peak and the largest read from the
        trials (screened-out ones too: a peak is a peak); how to wait for it (None: not
        started)."""
        peaks = {
            t.user_attrs.get(keys.CONFIG_KEY): t.user_attrs.get(keys.PEAK_MEMORY) for t in trials
        }
        measured = [int(p) for p in peaks.values() if isinstance(p, int | float)]
        if not measured:
            return None
        peak = peaks.get(candidate_key(config, precision, reference))
        own = int(peak) if isinstance(peak, int | float) else None
        started = self.warm_profiles(config, precision, peak=own, largest=max(measured))
        return self.settle_profiles if started else None

    def close(self) -> None:
        self.gate.close()
        if self._profiles is not None:
            self._profiles.close()


def seeds_ahead(options: RunOptions, envelope_known: Callable[[str], bool]) -> tuple[int, ...]:
    """The seeds a seed envelope of this study trains the reference from
    (`trainers.gate.envelope_seeds`), where a trial may run in a precision whose envelope is one
    (`trainers.gate.spread_for`) and not measured yet (`envelope_known`, by precision): the gate's
    child builds them ahead with the reference's seed. Else none."""
    allowed: tuple[Any, ...] = options.allowed_precisions  # RunOptions checked each
    wanted = [
        precision
        for precision in allowed
        if spread_for(precision, options.precision) == "seeds" and not envelope_known(precision)
    ]
    return envelope_seeds(options.protocol.seed) if wanted else ()


def open_children(
    options: RunOptions, measurer: Measurer, should_stop: Callable[[], bool] | None = None
) -> Children:
    """The gate and profiler for `measurer`'s kind of run (see the module doc). `should_stop`:
    a program's or a torchrun launch's gate runs ask it (a cancel: ProgramStopped)."""
    if measurer.program is not None:
        args = gate_args(options, measurer)
        gate = ProgramGate(measurer.program, options.preset, args, should_stop=should_stop)
        return Children(gate=gate, profiler=None)
    if measurer.nproc > 1:
        return _data_parallel(options, measurer, should_stop)
    if measurer.device.type != "cuda":
        profiler = profiling.in_process(
            measurer.workload,
            device=measurer.device,
            steps=options.profile_steps,
            warmup=options.protocol.warmup,
            precision=options.precision,
        )
        local = InProcessGate(
            options.workload,
            options.preset,
            gate_args(options, measurer),
            model_args=options.model_args,
            cross=cross_precision(options),
        )
        return Children(gate=local, profiler=profiler)
    # On a GPU: each in a child process of its own (see the module doc).
    profiles = ProfileProcess(
        options.workload,
        options.preset,
        steps=options.profile_steps,
        warmup=options.protocol.warmup,
        seed=options.protocol.seed,
        device=str(measurer.device),
        matmul_precision=options.matmul_precision,
        model_args=dict(options.model_args),
        precision=options.precision,
    )
    parity = ParityProcess(
        options.workload,
        options.preset,
        gate_args(options, measurer),
        cross=cross_precision(options),
        matmul_precision=options.matmul_precision,
        model_args=dict(options.model_args),
    )
    return Children(gate=parity, profiler=profiles.profile, _profiles=profiles)


def gate_args(options: RunOptions, measurer: Measurer) -> RunArgs:
    """What every gate's runs share, built once here: the gate's steps, the study's seed, the
    measurer's device and the study's precision."""
    return RunArgs(
        steps=options.parity_steps,
        seed=options.protocol.seed,
        device=measurer.device,
        precision=options.precision,
    )


def cross_precision(options: RunOptions) -> CrossPrecision:
    """How the gate judges a config in another precision than the study's, as the user set it."""
    tolerance = options.precision_tolerance
    return CrossPrecision(
        steps=options.precision_parity_steps,
        multiple=AS_THE_GATE.multiple if tolerance is None else tolerance,
    )


def _data_parallel(
    options: RunOptions, measurer: Measurer, should_stop: Callable[[], bool] | None
) -> Children:
    gate = DataParallelGate(
        options.workload,
        options.preset,
        gate_args(options, measurer),
        nproc=measurer.nproc,
        matmul_precision=options.matmul_precision,
        model_args=options.model_args,
        isolate=measurer.device.type == "cuda",
        batch=list(baselines_for(measurer.nproc).values()),
        should_stop=should_stop,
    )
    if measurer.device.type != "cuda":
        # Over gloo the collectives run on host threads: no kernel to overlap (dpprofile).
        return Children(gate=gate, profiler=None)
    profiler = DataParallelProfiler(
        options.workload,
        options.preset,
        nproc=measurer.nproc,
        steps=options.profile_steps,
        warmup=options.protocol.warmup,
        seed=options.protocol.seed,
        device=measurer.device,
        matmul_precision=options.matmul_precision,
        model_args=options.model_args,
        precision=options.precision,
    )
    return Children(gate=gate, profiler=profiler)
