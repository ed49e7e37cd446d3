"""What the gate judges a config against: the reference's runs (its losses and its envelope), under
which determinism they run (`reference_determinism`), which envelope applies (`spread_for`), the
arguments of the gate's runs (`run_arguments`), and whether a given envelope is of these runs
(`check_envelope`). `trainers.gate.parity` runs them.
"""

from __future__ import annotations

import dataclasses

from trainers.core import resolve_device
from trainers.gate.envelope import Envelope
from trainers.gate.trajectories import GATE_DETERMINISM, Determinism
from trainers.precision import Precision, check_precision_here
from trainers.runargs import RunArgs

__all__ = [
    "SEEDS_DETERMINISM",
    "check_envelope",
    "reference_determinism",
    "run_arguments",
    "spread_for",
]

SEEDS_DETERMINISM: Determinism = "off"
"""How the reference and its seed-to-seed envelope run (`spread_for` "seeds": a config in another
precision). Another seed draws other initial weights and other batches: its losses move at the
scale of the loss's own batch-to-batch noise, while a kernel's run-to-run rounding moves them at
the rounding envelope's (2.1e-5 over 200 steps on llama-1b in bf16,
docs/benchmarks/peers-h100-2026-11-26-llama-1b-float8.json). Strict determinism then buys that
judgement nothing and costs its five long runs (deterministic attention and embedding backward
kernels), and off, they run the kernels a timed run runs. The config itself still runs strict
whenever it owes its eager twin bit for bit."""


def spread_for(precision: Precision | None, reference_precision: Precision | None) -> str:
    """The envelope a config is judged against (`Envelope.spread`): a config in the reference's
    own precision may only round differently ("rounding"); one in another precision (float8
    against bf16) is owed no more than another seed of the reference moves ("seeds")."""
    return "rounding" if precision == reference_precision else "seeds"


def reference_determinism(spread: str) -> Determinism:
    """How the reference and its envelope of this spread run: strict for a rounding envelope
    (its configs may owe the reference's bits), `SEEDS_DETERMINISM` for a seed-to-seed one."""
    return SEEDS_DETERMINISM if spread == "seeds" else GATE_DETERMINISM


@dataclasses.dataclass(frozen=True)
class GateRuns:
    """The arguments of one gate's runs: the config's (`config`: its losses, its eager twin, the
    probe) and the reference's (`reference`: its losses, its envelope), the same steps, seed and
    device, each in its own precision; the reference's under `reference_determinism`, the one
    its envelope's spread asks (`SEEDS_DETERMINISM` against another precision)."""

    config: RunArgs
    reference: RunArgs
    reference_determinism: Determinism


def run_arguments(args: RunArgs, *, reference: Precision | None) -> GateRuns:
    """`GateRuns` of a gate of `args` (`args.precision`: the config's) against a reference in
    `reference`."""
    precision = args.precision
    if precision != reference and precision is not None:
        # A candidate precision this device cannot run (float8 on a CPU) is refused in one
        # line before the reference's runs, not after them.
        check_precision_here(precision, resolve_device(args.device))
    return GateRuns(
        config=args,
        reference=args.replace(precision=reference),
        reference_determinism=reference_determinism(spread_for(precision, reference)),
    )


def check_envelope(
    envelope: Envelope, *, preset: str, steps: int, seed: int, precision: Precision | None
) -> None:
    """An envelope of other runs would judge against another reference: refuse it."""
    wanted = {"preset": preset, "steps": steps, "seed": seed, "precision": precision}
    got = {key: getattr(envelope, key) for key in wanted}
    if got != wanted:
        raise ValueError(f"envelope measured for {got}, the gate runs {wanted}")
