"""External training programs (any language) run under the tuner's protocol.

- `registry`: the registry file of programs (`load_registry`, `find_program`), validated by a
  pydantic model, and what a registered `Program` is.
- `protocol`: what a program gets (its environment) and what it reports (JSON lines), and how the
  report is read back as a `RunResult`.
- `runner`: launching a program with a `LoopConfig`, timeouts and stopping, and the correctness
  gate for a program's losses (`program_parity`).
- `reporting`: the helper a Python program uses to report in that protocol (`Reporter`).
- `torchrun`: a data-parallel run of a built-in workload, torchrun of `trainers.distributed` with
  N processes, read through the same protocol (`run_distributed`).
"""

from trainers.program.protocol import PROTOCOL, ReportReader, program_env
from trainers.program.registry import (
    PREFIX,
    REGISTRY_VARIABLE,
    Program,
    find_program,
    load_registry,
)
from trainers.program.reporting import Reporter
from trainers.program.runner import ProgramFailed, ProgramStopped, program_parity, run_program
from trainers.program.torchrun import MAX_NPROC, NCCL_ENV, check_nproc, run_distributed

__all__ = [
    "MAX_NPROC",
    "NCCL_ENV",
    "PREFIX",
    "PROTOCOL",
    "REGISTRY_VARIABLE",
    "Program",
    "ProgramFailed",
    "ProgramStopped",
    "ReportReader",
    "Reporter",
    "check_nproc",
    "find_program",
    "load_registry",
    "program_env",
    "program_parity",
    "run_distributed",
    "run_program",
]
