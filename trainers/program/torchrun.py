"""A data-parallel run of a built-in workload: torchrun of `trainers.distributed` with N processes
on this node, followed through the program protocol like any program.

`run_distributed(...)` starts `python -m torch.distributed.run --standalone --nproc-per-node N
-m trainers.distributed ...` in a session of its own (`trainers.program.runner`: its report is
read as it grows, a pruned run is stopped at its window, a run past `timeout_s` is stopped) and
returns the `RunResult` rank 0 reported, the losses being the mean over the ranks (the global
batch's). Once rank 0 has reported its end line (after every rank's losses were gathered), the
launch is stopped rather than waited for: torchrun's own teardown took about 2 s more on the CI
machine. torchrun stops the other ranks when one fails; the run then fails with a
`ProgramFailed` that names the rank torchrun saw fail first, its exit code, and the tail of that
rank's own stderr (each rank writes its own file, `trainers.distributed`). Whatever way the run
ends, any rank process still alive afterwards (torchrun killed before it could stop its
workers, which it starts in sessions of their own) is found by the pid it wrote and killed.

The collective timeout of every rank is the run's timeout: a rank that hangs either makes the
others' collectives fail (the run fails naming them, their stderr saying whom they waited for)
or the run is stopped at its timeout; no process is left behind either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainers.config import LoopConfig, field_names
from trainers.core import resolve_device
from trainers.errors import ConfigError
from trainers.measure import RunResult, Window, check_counts, window_sizes
from trainers.program.protocol import ReportReader, program_env
from trainers.program.registry import Program
from trainers.program.runner import STDERR_TAIL, ProgramFailed, ProgramStopped, _execute
from trainers.runargs import DEFAULT_ARGS, RunArgs
from trainers.tuned import ENV_PREFIX

ENTRY = "trainers.distributed"
RANK_DIR_VARIABLE = f"{ENV_PREFIX}RANK_DIR"
TIMEOUT_VARIABLE = f"{ENV_PREFIX}DIST_TIMEOUT"
FAULT_VARIABLE = f"{ENV_PREFIX}DIST_FAULT"
MATMUL_VARIABLE = f"{ENV_PREFIX}MATMUL_PRECISION"
DEFAULT_TIMEOUT_S = 900.0
MAX_NPROC = 8
NPROC_ALLOWED = f"an integer in 1..{MAX_NPROC} (processes on this node, one per GPU)"
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Set in every process launched here: NVLink multicast (NVLS, in NCCL, symmetric memory and
NVSHMEM) stays off: the lent machines do not support it, and a program that uses it can take a
shared host's GPUs out of service."""
_ROOT = Path(__file__).resolve().parents[2]
"""The folder `trainers` sits in: every rank must import the same code as this process."""
_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def check_nproc(nproc: object, field: str = "nproc_per_node") -> int:
    """`nproc` as an int; ConfigError naming `field` unless it is in 1..MAX_NPROC."""
    if not isinstance(nproc, int) or isinstance(nproc, bool) or not 1 <= nproc <= MAX_NPROC:
        raise ConfigError(field, nproc, NPROC_ALLOWED)
    return nproc


def torchrun_command(
    nproc: int, module: str, args: Sequence[str], *, python: str = sys.executable
) -> list[str]:
    """torchrun of `python -m module args` with `nproc` processes on this node, rendezvous on a
    free local port (c10d, `--standalone`), no restart: a failed rank fails the run."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={check_nproc(nproc)}",
        "--max-restarts=0",
        "-m",
        module,
        *args,
    ]


def entry_args(
    workload: str,
    preset: str,
    model_args: Mapping[str, str] | None,
    *,
    gate: bool,
    also: Sequence[LoopConfig] = (),
    trace: Path | None = None,
) -> list[str]:
    args = ["--workload", workload, "--preset", preset]
    if trace is not None:
        args += ["--trace", str(trace)]
    for key, value in (model_args or {}).items():
        args += ["--model-arg", f"{key}={value}"]
    for config in also:
        args += ["--also", json.dumps(config.to_dict(), separators=(",", ":"))]
    return args + (["--gate"] if gate else [])


def launch_env(folder: Path, timeout_s: float, matmul_precision: str | None) -> dict[str, str]:
    """What every rank gets on top of the protocol's variables: the code this process runs, the
    rank folder, the collective timeout, this process's float32 matmul precision (a process
    setting: it is not inherited), NVLink multicast off."""
    paths = [str(_ROOT), os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **NCCL_ENV,
        MATMUL_VARIABLE: matmul_precision or torch.get_float32_matmul_precision(),
        "PYTHONPATH": os.pathsep.join(paths),
        RANK_DIR_VARIABLE: str(folder),
        TIMEOUT_VARIABLE: str(timeout_s),
        # One thread per rank unless asked: torchrun's own default, said here so it is not
        # printed as a warning into the stderr a failure quotes.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def run_distributed(
    workload: str,
    preset: str,
    config: LoopConfig,
    args: RunArgs = DEFAULT_ARGS,
    *,
    nproc: int,
    on_window: Callable[[int, Window], bool] | None = None,
    model_args: Mapping[str, str] | None = None,
    gate: bool = False,
    perturb: tuple[int, float | None] | None = None,
    on_start: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    matmul_precision: str | None = None,
    also: Sequence[LoopConfig] = (),
    trace: Path | None = None,
) -> RunResult:
    """Train `workload` under `config` with `nproc` processes and `args` (`RunArgs`; see the
    module doc) and return rank 0's report. gate: dropout off and deterministic kernels (the
    gate's trajectories).
    matmul_precision: the ranks' float32 matmul precision (None: this process's).
    also: with `gate`, more configs trained after `config` in the same launch, each for as many
    steps (one launch instead of one each); their losses are in `effective["also"]`.
    trace: rank 0 records its third of three windows into this Chrome trace file
    (`windows` must be 3: the first runs unprofiled, the second warms the profiler up).
    should_stop: asked as the report is read; True stops the launch (ProgramStopped)."""
    steps, warmup, windows = args.steps, args.warmup, args.windows
    dev = _checked_device(nproc, args, also=also, gate=gate, trace=trace)
    entry = entry_args(workload, preset, model_args, gate=gate, also=also, trace=trace)
    program = _launch_program(nproc, workload, preset, entry, timeout_s)
    with tempfile.TemporaryDirectory(prefix="streamtune-torchrun-") as name:
        folder = Path(name)
        (folder / "report.jsonl").touch()
        env = program_env(
            program,
            preset,
            config,
            args,
            device=dev,
            report=folder / "report.jsonl",
            perturb=perturb,
        ) | launch_env(folder / "ranks", timeout_s, matmul_precision)
        reader = ReportReader(program.name, warmup + steps, window_sizes(steps, windows), on_start)
        stopped = _follow_launch(program, env, folder, reader, on_window, nproc, should_stop)
    result = reader.result(program, preset, config, warmup=warmup, stopped=stopped, dev=dev)
    return dataclasses.replace(result, workload=workload, effective=_effective(nproc, reader.end))


def _checked_device(
    nproc: int,
    args: RunArgs,
    *,
    also: Sequence[LoopConfig],
    gate: bool,
    trace: Path | None,
) -> torch.device:
    """`run_distributed`'s arguments checked before anything starts: the device to run on."""
    check_nproc(nproc)
    if also and not gate:
        raise ConfigError("also", [c.to_dict() for c in also], "() unless gate=True")
    check_counts(steps=args.steps, warmup=args.warmup, windows=args.windows)
    dev = resolve_device(args.device)
    if trace is not None and args.windows != 3:
        raise ConfigError("windows", args.windows, "3 with a trace (wait, warm up, record)")
    return dev


def _launch_program(
    nproc: int, workload: str, preset: str, args: Sequence[str], timeout_s: float
) -> Program:
    """The torchrun launch as a program: followed through the protocol like any other."""
    return Program(
        name=f"torchrun {nproc} x {workload}",
        command=tuple(torchrun_command(nproc, ENTRY, args)),
        cwd=Path.cwd(),
        presets=(preset,),
        settings=field_names(),
        timeout_s=timeout_s,
    )


def _effective(nproc: int, end: Mapping[str, Any] | None) -> dict[str, Any]:
    """The launch beyond its config, from rank 0's end line (None where none was read): the world
    size, the backend, the replicas, each rank's losses and the `also` configs' losses."""
    end = end or {}
    return {
        "world_size": nproc,
        "backend": end.get("backend"),
        "replicas": end.get("replicas"),
        "rank_losses": end.get("rank_losses"),
        "also": end.get("also") or [],
    }


def _follow_launch(
    program: Program,
    env: Mapping[str, str],
    folder: Path,
    reader: ReportReader,
    on_window: Callable[[int, Window], bool] | None,
    nproc: int,
    should_stop: Callable[[], bool] | None = None,
) -> bool:
    """Run the launch to its end line (or its failure, naming the rank); whatever happens, no
    rank process outlives it. True if `on_window` stopped it early."""
    try:
        command = list(program.command)
        return _execute(
            program,
            command,
            env,
            folder,
            reader,
            on_window,
            stop_at_end=True,
            should_stop=should_stop,
        )
    except ProgramStopped:
        raise  # no rank failed: the launch was stopped on request
    except ProgramFailed as exc:
        raise ProgramFailed(rank_failure(str(exc), folder, nproc)) from None
    finally:
        kill_leftovers(folder / "ranks")


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-STDERR_TAIL:]
    except FileNotFoundError:
        return "(no stderr file: the rank never started)"
    return data.decode("utf-8", "replace").strip() or "(empty)"


def _exit_words(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def rank_failure(reason: str, folder: Path, nproc: int) -> str:
    """Why the run failed, naming the rank that failed first and quoting its own stderr; a
    cause the user can fix (`_known_cause`) first, on a line of its own."""
    said = _rank_failure(reason, folder, nproc)
    ranks = folder / "ranks"
    known = _known_cause(
        "\n".join(_tail(ranks / f"rank{r}.stderr") for r in range(nproc)) if ranks.exists() else ""
    )
    return said if known is None else f"{known}\n{said}"


_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


def _known_cause(stderr: str) -> str | None:
    """A one-line cause for what the ranks' stderr shows, where the user's model is at fault:
    DDP's reducer stopping at a parameter the loss never used had shown 30 lines of torch's
    traceback, whose advice (`find_unused_parameters=True`) no setting here gives."""
    if "Expected to have finished reduction in the prior iteration" not in stderr:
        return None
    found = _UNUSED.search(stderr)
    which = (
        f" (rank {found.group(1)}: indices {found.group(2).strip()} of model.parameters())"
        if found
        else ""
    )
    return (
        f"parallel=ddp: some of the model's parameters get no gradient{which}: DDP needs every "
        "parameter that requires a gradient to take part in the loss; use them in the forward "
        "and the loss, or set requires_grad=False on those it leaves out"
    )


def _rank_failure(reason: str, folder: Path, nproc: int) -> str:
    torchrun = (
        (folder / "stderr.txt").read_text("utf-8", "replace")
        if (folder / "stderr.txt").exists()
        else ""
    )
    found = (
        _ROOT_CAUSE.search(torchrun[torchrun.find("Root Cause") :])
        if "Root Cause" in torchrun
        else None
    )
    ranks = folder / "ranks"
    if found is not None:
        rank, code = _first_failure(torchrun, int(found.group(1)), int(found.group(2)))
        after = (
            ""
            if rank == int(found.group(1))
            else (f"; rank {found.group(1)} then stopped ({_exit_words(int(found.group(2)))})")
        )
        return (
            f"rank {rank} of {nproc} failed ({_exit_words(code)}){after}; torchrun stopped the "
            f"others. rank {rank}'s stderr: {_tail(ranks / f'rank{rank}.stderr')}"
        )
    tails = "; ".join(f"rank {r}: {_tail(ranks / f'rank{r}.stderr')[-400:]}" for r in range(nproc))
    head = reason.split("; stderr:", 1)[0]
    return f"{head} ({nproc} ranks, every rank stopped); the ranks' stderr: {tails}"


_AFTER_A_PEER = (-signal.SIGABRT, -signal.SIGTERM)
"""How a rank ends because of another: aborted when a peer vanishes from under a collective
(gloo's "terminate called without an active exception"), or terminated by torchrun."""


def _first_failure(torchrun: str, rank: int, code: int) -> tuple[int, int]:
    """The failed rank to name: torchrun's root cause (`rank`, `code`: its first observed
    failure), unless that rank ended as ranks do after a peer (`_AFTER_A_PEER`) while another
    listed in torchrun's summary failed otherwise (killed by SIGKILL, an exit code): that one
    failed first. On a CPU (2026-11-28, CI) rank 1 was killed and torchrun named rank 0, whose
    gloo collective aborted the moment rank 1 went."""
    if code in _AFTER_A_PEER:
        for other in _ROOT_CAUSE.finditer(torchrun):
            if int(other.group(2)) not in _AFTER_A_PEER:
                return int(other.group(1)), int(other.group(2))
    return rank, code


def _alive_rank(pid: int) -> bool:
    """Whether `pid` is a live rank process of this module (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return ENTRY.encode() in cmdline and state != "Z"


def kill_leftovers(ranks: Path, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every rank process of `ranks` (the pids they wrote) still alive; their pids."""
    killed = []
    for pid_file in sorted(ranks.glob("rank*.pid")):
        pid = int(pid_file.read_text() or 0)
        if pid and _alive_rank(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    deadline = time.monotonic() + wait_s
    while any(_alive_rank(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed
