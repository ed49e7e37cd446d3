"""A registered program's gate (`trainers.program.program_parity`), a
`tuner.search.gating.gate.Gate`: every config takes the equivalence test against the program's
own reference and envelope, measured in the program's own runs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import trainers
from trainers import LoopConfig
from trainers.gate import ParityVerdict
from trainers.program import Program, program_parity
from tuner.search.gating.gate import (
    ConfigRun,
    GateRun,
    Parts,
    Pending,
    RunPending,
    only_one_precision,
)
from tuner.store.phases import GATE_CONFIG, GATE_ENVELOPE


class ProgramGate:
    """A registered program's gate (`trainers.program.program_parity`): every config takes the
    equivalence test against the program's own reference and envelope. The program measures its
    reference inside its envelope, so their seconds are recorded together as the envelope's."""

    def __init__(
        self,
        program: Program,
        preset: str,
        args: trainers.RunArgs,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self._program = program
        self._should_stop = should_stop  # a cancel stops its runs (ProgramStopped), no verdict
        self._preset = preset
        self._steps = args.steps
        self._args = args

    def _parity(
        self, config: LoopConfig, envelope: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return program_parity(
            self._program,
            self._preset,
            config,
            self._args,
            envelope=envelope,
            should_stop=self._should_stop,
        )

    def check(
        self,
        config: LoopConfig,
        envelope: Mapping[str, Any] | None,
        *,
        precision: str | None = None,
        pending: Pending | None = None,
        run: RunPending | None = None,
    ) -> GateRun:
        """`pending` is not waited for: the program's one run gives the envelope and the config's
        losses together (`program_parity`), so it has no twin to run first."""
        only_one_precision(precision, self._args.precision, "a program")
        parts = Parts()
        if envelope is None:
            # The reference's own check runs no config beside the envelope's runs.
            _, envelope = parts.run(GATE_ENVELOPE, lambda: self._parity(trainers.REFERENCE, None))
        known = envelope
        found, used = parts.run(GATE_CONFIG, lambda: self._parity(config, known))
        return GateRun(verdict=_program_verdict(found, self._steps), envelope=used, time=parts.time)

    runs_apart = False
    """`run` is not asked for either: one run of the program gives a config's losses and its
    judgement."""

    def config_run(self, config: LoopConfig, *, precision: str | None = None) -> ConfigRun:
        raise TypeError(
            "a program's gate runs a config's own run within its check alone (runs_apart)"
        )

    def envelope(self, *, precision: str | None = None) -> GateRun:
        only_one_precision(precision, self._args.precision, "a program")
        parts = Parts()
        _, found = parts.run(GATE_ENVELOPE, lambda: self._parity(trainers.REFERENCE, None))
        return GateRun(verdict=None, envelope=found, time=parts.time)

    def close(self) -> None:
        pass


def _program_verdict(found: Mapping[str, Any], steps: int) -> ParityVerdict:
    """`program_parity`'s dict as a ParityVerdict: the equivalence test's fields, flat."""
    equivalence = dict(found.get("equivalence") or {})
    names = {f.name for f in dataclasses.fields(ParityVerdict)}
    fields = {k: v for k, v in equivalence.items() if k in names}
    for key in ("decisive_steps", "window_deviations", "window_envelopes"):
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    return ParityVerdict(
        **fields
        | {
            "passed": bool(found["passed"]),
            "exact_required": False,
            "tolerance": float(equivalence.get("bound") or 0.0),
            "steps": steps,
            # The program reports losses only: no per-step absolute figure is known.
            "max_abs_deviation": math.nan,
            "max_rel_deviation": float(found.get("max_rel_deviation", math.inf)),
            "first_diverging_step": None,
            "reason": str(found["reason"]),
            "test": str(found.get("test", "equivalence")),
        }
    )
