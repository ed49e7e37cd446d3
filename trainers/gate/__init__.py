"""The correctness gate: does a loop setting still train the same model?

- `parity`: the verdict (`gate`): which test a config must pass (bit-exact against the
  reference, exact against its eager twin, or equivalent within the envelope), and the judgement.
  - `verdict`: what a verdict holds (`ParityVerdict`) and the step-by-step comparison (`compare`,
    `first_difference`).
  - `twin`: a config's twin, eager or loop (`Twin`, `twin_of`, `loop_twin_of`, `twin_kind`).
  - `exact`: the exact tests: the reproducibility probe asked before them, the twin comparison.
  - `reference`: the reference's runs: their determinism, their envelope's spread.
- `equivalence`: the windowed loss-trajectory test, and its tolerance (`judge`).
- `envelope`: the reference's own spread under harmless perturbations (`Envelope`).
- `reproducibility`: whether two identical eager runs agree bit for bit here (`Reproducibility`),
  asked before every exact test and cached per workload, device and precision.
- `trajectories`: the short, deterministic training runs the tests compare.
- `floor`: the eager whole-step graph's replay time, the GPU's own time for a step.
- `faults`: planted faults (a missing stream wait, a wrong op) that prove the gate can fail.
"""

from trainers.gate.envelope import (
    PERTURBATIONS,
    SPREADS,
    Envelope,
    envelope_seeds,
    rounding_eps,
)
from trainers.gate.equivalence import FLOOR_ULPS, MULTIPLE, WINDOW, Equivalence, judge
from trainers.gate.exact import TWIN_NOISE_MULTIPLE, within_twin_noise
from trainers.gate.faults import FAULT_KINDS, FAULTS, FaultKind, planted
from trainers.gate.floor import Floor, comparable_floor, floor_applies, graph_floor
from trainers.gate.parity import (
    check_parity,
    config_determinism,
    exact_length,
    gate,
    required_test,
)
from trainers.gate.reference import SEEDS_DETERMINISM, reference_determinism, spread_for
from trainers.gate.reproducibility import (
    Reproducibility,
    eager_reproducibility,
    forget,
    remember,
)
from trainers.gate.trajectories import (
    DETERMINISMS,
    GATE_ARGS,
    GATE_DETERMINISM,
    PARITY_STEPS,
    Determinism,
    Perturbation,
    Trajectory,
    parity_losses,
    trajectory,
)
from trainers.gate.twin import TWIN_KINDS, Twin, TwinKind, loop_twin_of, twin_kind, twin_of
from trainers.gate.verdict import GRAPH_RTOL, GateTest, ParityVerdict, first_difference

__all__ = [
    "DETERMINISMS",
    "FAULTS",
    "FAULT_KINDS",
    "FLOOR_ULPS",
    "GATE_ARGS",
    "GATE_DETERMINISM",
    "GRAPH_RTOL",
    "MULTIPLE",
    "PARITY_STEPS",
    "PERTURBATIONS",
    "SEEDS_DETERMINISM",
    "SPREADS",
    "TWIN_KINDS",
    "TWIN_NOISE_MULTIPLE",
    "WINDOW",
    "Determinism",
    "Envelope",
    "Equivalence",
    "FaultKind",
    "Floor",
    "GateTest",
    "ParityVerdict",
    "Perturbation",
    "Reproducibility",
    "Trajectory",
    "Twin",
    "TwinKind",
    "check_parity",
    "comparable_floor",
    "config_determinism",
    "eager_reproducibility",
    "envelope_seeds",
    "exact_length",
    "first_difference",
    "floor_applies",
    "forget",
    "gate",
    "graph_floor",
    "judge",
    "loop_twin_of",
    "parity_losses",
    "planted",
    "reference_determinism",
    "remember",
    "required_test",
    "rounding_eps",
    "spread_for",
    "trajectory",
    "twin_kind",
    "twin_of",
    "within_twin_noise",
]
