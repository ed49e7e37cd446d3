"""Running a program as a workload: one process per run, launched with its `LoopConfig` in its
environment (`trainers.program.protocol`), its report followed as it grows, stopped when pruned
(SIGTERM to its process group, then SIGKILL) or past its timeout; and the correctness gate for
a program (`program_parity`). A program that exits non-zero, breaks the protocol or runs past
its timeout is a failed run (`ProgramFailed`) whose reason quotes the end of its stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainers.config import LoopConfig
from trainers.core import resolve_device
from trainers.errors import TrainerError
from trainers.measure import RunResult, Window, check_counts, window_sizes
from trainers.program.protocol import ReportReader, program_env
from trainers.program.registry import PLACEHOLDERS, Program
from trainers.runargs import DEFAULT_ARGS, RunArgs

STDERR_TAIL = 2000
POLL_S = 0.02
GRACE_S = 5.0


class ProgramFailed(TrainerError):
    """A program run that did not deliver: exit status, malformed report, timeout."""


class ProgramStopped(ProgramFailed):
    """A run stopped because `should_stop` answered True (a cancelled job, a worker shutting
    down): what it reported is not a measurement."""


def run_program(
    program: Program,
    preset: str,
    config: LoopConfig,
    args: RunArgs = DEFAULT_ARGS,
    *,
    on_window: Callable[[int, Window], bool] | None = None,
    perturb: tuple[int, float | None] | None = None,
    on_start: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RunResult:
    """Run `program` once under `config` with `args` (`RunArgs`: its seed is the program's) and
    read its report, as `trainers.run` would measure a built-in workload. ProgramFailed when it
    does not deliver (see the module doc).

    on_start(samples_per_batch) is called when the program's start line is read, before its
    first window. should_stop() is asked at every poll of the report: True stops the program
    (ProgramStopped), so a cancel does not wait for its next window or its timeout."""
    program.check(preset, config)
    steps, warmup, windows, seed = args.steps, args.warmup, args.windows, args.seed
    check_counts(steps=steps, warmup=warmup, windows=windows)
    dev = resolve_device(args.device)
    with tempfile.TemporaryDirectory(prefix="streamtune-program-") as folder:
        report = Path(folder) / "report.jsonl"
        report.touch()
        env = program_env(program, preset, config, args, device=dev, report=report, perturb=perturb)
        fill = {
            "python": sys.executable,
            "preset": preset,
            "device": str(dev),
            "steps": str(steps),
            "warmup": str(warmup),
            "windows": str(windows),
            "seed": str(seed),
        }
        command = [_fill(part, fill) for part in program.command]
        reader = ReportReader(program.name, warmup + steps, window_sizes(steps, windows), on_start)
        stopped = _execute(
            program, command, env, Path(folder), reader, on_window, should_stop=should_stop
        )
    return reader.result(program, preset, config, warmup=warmup, stopped=stopped, dev=dev)


def _execute(
    program: Program,
    command: list[str],
    env: Mapping[str, str],
    folder: Path,
    reader: ReportReader,
    on_window: Callable[[int, Window], bool] | None,
    *,
    stop_at_end: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> bool:
    """Start the program, follow its report (`folder/report.jsonl`) until it exits or is
    stopped; True if it was stopped early. ProgramFailed with its stderr's tail if it failed,
    ProgramStopped where `should_stop` stopped it.

    stop_at_end: once the report is complete (its end line read), stop the program instead of
    waiting for it to exit: a torchrun launch spends about 2 s tearing its agent down after
    every rank has reported (`trainers.program.torchrun`)."""
    stderr_path = folder / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        try:
            process = subprocess.Popen(
                command,
                cwd=program.cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            raise ProgramFailed(f"program {program.name!r} could not start: {exc}") from exc
        try:
            stopped = _follow(
                process,
                folder / "report.jsonl",
                reader,
                on_window,
                program.timeout_s,
                stop_at_end=stop_at_end,
                should_stop=should_stop,
            )
        except BaseException:
            _stop(process)
            raise
    tail = _tail(stderr_path)
    if reader.error is not None:
        raise ProgramFailed(f"program {program.name!r}: {reader.error}; stderr: {tail}")
    complete = stop_at_end and reader.end is not None and reader.missing() is None
    if not stopped and process.returncode != 0 and not complete:
        raise ProgramFailed(
            f"program {program.name!r} exited with status {process.returncode}; stderr: {tail}"
        )
    if not stopped:
        missing = reader.missing()
        if missing is not None:
            raise ProgramFailed(f"program {program.name!r}: {missing}; stderr: {tail}")
    return stopped


def _tail(path: Path) -> str:
    """The last STDERR_TAIL bytes of the program's stderr, read from there: reading the whole
    file for them held a chatty program's log in memory (200 MB of it: +205 MB)."""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - STDERR_TAIL))
        return handle.read().decode("utf-8", "replace").strip()


def _fill(part: str, values: Mapping[str, str]) -> str:
    for key in PLACEHOLDERS:
        part = part.replace("{" + key + "}", values[key])
    return part


def _follow(
    process: subprocess.Popen[bytes],
    report: Path,
    reader: ReportReader,
    on_window: Callable[[int, Window], bool] | None,
    timeout_s: float,
    *,
    stop_at_end: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> bool:
    """Read the report as it grows until the program exits (or, with `stop_at_end`, has
    reported everything); True if it was stopped early by `on_window`. ProgramStopped once
    `should_stop()` answers True before the program has ended."""
    deadline = time.monotonic() + timeout_s
    offset = 0
    pending = b""
    with report.open("rb") as handle:
        while True:
            exited = process.poll() is not None
            handle.seek(offset)
            chunk = handle.read()
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                window = reader.feed(line)
                if reader.error is not None:
                    _stop(process)
                    return False
                if window is not None and on_window is not None:
                    index, measured = window
                    if not on_window(index, measured) and index + 1 < len(reader.sizes):
                        _stop(process)
                        return True
            if exited:
                if pending.strip():
                    reader.feed(pending)
                return False
            if stop_at_end and reader.end is not None and reader.missing() is None:
                # Everything is reported: nothing is left to shut down gracefully.
                _stop(process, grace_s=0)
                return False
            if should_stop is not None and should_stop():
                # Asked between windows too: a program compiling for minutes, or hung, would
                # otherwise hold a cancelled job's worker until its next window or its timeout.
                _stop(process)
                raise ProgramStopped(
                    f"stopped on request after {len(reader.windows)} of {len(reader.sizes)} windows"
                )
            if time.monotonic() > deadline:
                _stop(process)
                reader.error = reader.error or f"timed out after {timeout_s:.0f} s"
                return False
            time.sleep(POLL_S)


def _stop(process: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """SIGTERM to the program's process group, SIGKILL after a grace period (at once with
    `grace_s` 0)."""
    if process.poll() is not None:
        return
    try:
        if grace_s <= 0:
            raise subprocess.TimeoutExpired(process.args, 0)
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


PERTURBATIONS = 4
"""K, the perturbed reference runs of a program's noise envelope (as `trainers.gate.envelope`)."""


def program_parity(
    program: Program,
    preset: str,
    config: LoopConfig,
    args: RunArgs,
    *,
    envelope: Mapping[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The correctness gate for a program: its losses under `config` against its losses under the
    PyTorch idiom (`REFERENCE`), judged within the envelope of K reference runs from perturbed
    weights (`trainers.gate.judge`). The program's losses are all the gate sees, so every
    config takes the equivalence test (no bit-for-bit test: the twin configs of
    `trainers.gate.twin` are the harness's own).

    args: each run's steps (a trajectory: every step's loss), seed, device and precision; its
    warm-up and windows are the gate's own (none untimed, one window).
    envelope: the reference and perturbed losses of an earlier call (the second value it
    returned), measured once per study.
    should_stop: asked by each run as `run_program`'s (ProgramStopped: a cancel does not wait
    for the envelope's runs).
    """
    from trainers.config import REFERENCE
    from trainers.gate.equivalence import judge

    trajectory = args.replace(warmup=0, windows=1)
    steps, seed, precision = args.steps, args.seed, args.precision

    def losses(run_config: LoopConfig, perturb: tuple[int, float | None] | None) -> list[float]:
        result = run_program(
            program, preset, run_config, trajectory, perturb=perturb, should_stop=should_stop
        )
        return result.losses

    if envelope is None or envelope.get("steps") != steps or envelope.get("seed") != seed:
        envelope = _program_envelope(program, preset, steps, seed, precision, losses)
    reference = list(envelope["reference"])
    ours = reference if config == REFERENCE else losses(config, None)
    verdict = judge(ours, reference, [list(p) for p in envelope["perturbed"]])
    return (
        {
            "passed": verdict.passed,
            "test": "equivalence",
            "reason": verdict.reason,
            "max_rel_deviation": verdict.ratio,
            "equivalence": verdict.to_dict(),
        },
        dict(envelope),
    )


def _program_envelope(
    program: Program,
    preset: str,
    steps: int,
    seed: int,
    precision: str | None,
    losses: Callable[[LoopConfig, tuple[int, float | None] | None], list[float]],
) -> dict[str, Any]:
    """A program's noise envelope (`program_parity`'s second value): its losses under the
    reference and under it from K perturbed weights, `losses(config, perturb)` each."""
    from trainers.config import REFERENCE
    from trainers.gate.envelope import rounding_eps
    from trainers.precision import MATMUL_PRECISION

    eps = rounding_eps(precision, MATMUL_PRECISION[precision or "fp32"])  # type: ignore[arg-type]
    return {
        "program": program.name,
        "preset": preset,
        "steps": steps,
        "seed": seed,
        "precision": precision,
        "reference": losses(REFERENCE, None),
        "perturbed": [
            losses(REFERENCE, (seed * 1000 + k, eps)) for k in range(1, PERTURBATIONS + 1)
        ],
    }
