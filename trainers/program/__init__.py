"""External training programs (any language) run under the tuner's protocol.

- `runner`: the registry of programs, launching one with a `LoopConfig` in its environment, and
  reading back its windows and losses as a `RunResult`.
- `reporting`: the helper a Python program uses to report in that protocol (`Reporter`).
"""

from trainers.program.reporting import Reporter
from trainers.program.runner import (
    PREFIX,
    REGISTRY_VARIABLE,
    Program,
    ProgramFailed,
    find_program,
    load_registry,
    program_parity,
    run_program,
)

__all__ = [
    "PREFIX",
    "REGISTRY_VARIABLE",
    "Program",
    "ProgramFailed",
    "Reporter",
    "find_program",
    "load_registry",
    "program_parity",
    "run_program",
]
