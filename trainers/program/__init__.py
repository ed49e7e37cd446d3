"""External training programs (any language) run under the tuner's protocol.

- `registry`: the registry file of programs (`load_registry`, `find_program`), validated by a
  pydantic model, and what a registered `Program` is.
- `protocol`: what a program gets (its environment) and what it reports (JSON lines), and how the
  report is read back as a `RunResult`.
- `runner`: launching a program with a `LoopConfig`, timeouts and stopping, and the correctness
  gate for a program's losses (`program_parity`).
- `reporting`: the helper a Python program uses to report in that protocol (`Reporter`).
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
from trainers.program.runner import ProgramFailed, program_parity, run_program

__all__ = [
    "PREFIX",
    "PROTOCOL",
    "REGISTRY_VARIABLE",
    "Program",
    "ProgramFailed",
    "ReportReader",
    "Reporter",
    "find_program",
    "load_registry",
    "program_env",
    "program_parity",
    "run_program",
]
