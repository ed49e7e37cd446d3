"""`run()`: train a workload under one LoopConfig and measure it.

Read top to bottom: check the arguments, build the run's parts (`trainers.core`: device,
precision, optimizer, (compiled) model, streams, data feed, step, loss harvester); run the
warm-up steps; run the timed windows; drain the losses; report. The parts and the stepping are
the core's, shared with `trainers.fit.Trainer`: measuring adds only the windows and the report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from trainers.compilation import CompileStats
from trainers.config import LoopConfig
from trainers.core import Engine, Session, check_run_args, min_warmup, resolve_device
from trainers.measure import RunResult, Window, WindowTimer, fingerprint, window_sizes
from trainers.runargs import DEFAULT_ARGS, RunArgs
from trainers.workloads.base import Workload

__all__ = ["CPU_NOTE", "WindowCallback", "min_warmup", "resolve_device", "run"]

WindowCallback = Callable[[int, Window], bool]
"""Called after each timed window with its index; returning False stops the run there (a pruned
trial, a cancelled job). What was measured so far stays in the result."""

CPU_NOTE = (
    "CPU run: streams, events, pinned memory and non-blocking copies do not exist on a CPU; "
    "those settings were accepted and had no effect"
)


def run(
    workload: Workload,
    config: LoopConfig,
    args: RunArgs = DEFAULT_ARGS,
    *,
    on_window: WindowCallback | None = None,
    capturable: bool | None = None,
) -> RunResult:
    """Train `workload` for `args.warmup + args.steps` steps under `config` on `args.device` in
    `args.precision`; time `args.steps` in `args.windows` windows (`RunArgs`; its seed is the
    workload's, already built).

    capturable: build the optimizer capturable (None: exactly when `config.cuda_graph`); the
    parity gate runs a graph config's eager twin with True (`trainers.gate.twin`).
    """
    dev = resolve_device(args.device)
    steps, warmup, windows, precision = args.steps, args.warmup, args.windows, args.precision
    check_run_args(config, dev, steps=steps, warmup=warmup, windows=windows, precision=precision)
    engine = Engine(workload, config, device=dev, precision=precision, capturable=capturable)
    with contextlib.closing(engine):
        session = engine.session(capacity=warmup + steps)
        with session:
            measured, stopped_early = _timed_steps(
                session, warmup=warmup, steps=steps, windows=windows, on_window=on_window
            )
            session.drain()
    compiled = engine.watch.finish([w.step_ms for w in measured])
    return _result(
        session,
        measured,
        warmup=warmup,
        steps=sum(w.steps for w in measured),
        stopped_early=stopped_early,
        compiled=compiled,
    )


def _timed_steps(
    session: Session,
    *,
    warmup: int,
    steps: int,
    windows: int,
    on_window: WindowCallback | None,
) -> tuple[list[Window], bool]:
    """The warm-up steps (compilation and capture watched), then the timed windows; the windows
    and whether `on_window` stopped the run early."""
    engine = session.engine
    timer = WindowTimer(engine.device, session.plan)
    measured: list[Window] = []
    step = 0
    for _ in range(warmup):
        with engine.watch.warmup_step():
            session.step(step)
        step += 1
    engine.watch.end_warmup()
    for index, size in enumerate(window_sizes(steps, windows)):
        timer.start()
        for _ in range(size):
            session.step(step)
            step += 1
        measured.append(timer.stop(size))
        if on_window is not None and not on_window(index, measured[-1]) and index + 1 < windows:
            return measured, True
    return measured, False


def _result(
    session: Session,
    windows: list[Window],
    *,
    warmup: int,
    steps: int,
    stopped_early: bool,
    compiled: CompileStats,
) -> RunResult:
    engine, harvester = session.engine, session.harvester
    workload, config, dev = engine.workload, engine.config, engine.device
    on_cuda = dev.type == "cuda"
    effective = {
        "streams": on_cuda,
        "sync_mode": on_cuda,
        "pin_memory": on_cuda,
        "non_blocking": on_cuda,
        "note": None if on_cuda else CPU_NOTE,
    }
    return RunResult(
        config=config.to_dict(),
        workload=workload.name,
        preset=workload.preset,
        device=str(dev),
        effective=effective,
        warmup_steps=warmup,
        steps=steps,
        stopped_early=stopped_early,
        losses=harvester.ledger.losses,
        loss_check=harvester.ledger.proof(warmup + steps),
        n_syncs=harvester.n_syncs,
        n_polls=harvester.n_polls,
        sync_wait_ms=harvester.sync_wait_s * 1e3,
        windows=windows,
        samples_per_batch=workload.samples_per_batch,
        tokens_per_sample=workload.tokens_per_sample,
        peak_memory_bytes=engine.peak_memory_bytes(),
        fingerprint=fingerprint(dev),
        # Not loop settings (they change the results) but they change the speed: recorded.
        matmul_precision=session.matmul_precision,
        precision=engine.precision,
        compile_s=compiled.compile_s,
        recompiles=compiled.recompiles,
        graph_breaks=compiled.graph_breaks,
        compile_unstable=compiled.unstable,
        compile_notes=list(compiled.notes),
        compile_cache_hits=compiled.cache_hits,
        compile_cache_misses=compiled.cache_misses,
        compile_kept_s=compiled.kept_s,
        flops_per_step=engine.flops_per_step,
        float8=None if engine.float8 is None else engine.float8.to_dict(),
    )
