"""`Envelope`: how far a workload's losses move when only rounding changes.

The reference config is trained once from the workload's initial weights and K times from those
weights perturbed in their last bit (`Perturbation`, one seed each). The spread of the perturbed
runs around the reference is the workload's own numerical noise over these steps: what any
config that merely rounds differently may deviate by (`trainers.gate.equivalence` says how it is
judged). Measuring it costs K + 1 trainings, so an Envelope serialises to a plain dict: the
tuner measures it once per workload, preset, seed, steps, precision and device, and keeps it.

That rounding envelope judges a config that computes the same thing in another order. A config
in another precision than the reference's (float8 against bf16) rounds far more than one last
bit, by design: the question a user asks of it is whether it trains as differently from the
reference as another seed of the reference does. `spread="seeds"` measures that envelope: the K
runs are the reference trained from seeds `seed * 1000 + 1 .. + K` (other initial weights and
other batches), unperturbed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trainers.config import REFERENCE, LoopConfig
from trainers.core import resolve_device
from trainers.gate.equivalence import (
    FLOOR_ULPS,
    MULTIPLE,
    WINDOW,
    Equivalence,
    judge,
    loss_floor,
    window_envelope,
)
from trainers.gate.trajectories import (
    DETERMINISMS,
    GATE_ARGS,
    GATE_DETERMINISM,
    Determinism,
    Perturbation,
    Trajectory,
    trajectory,
)
from trainers.measure import fingerprint, fingerprint_key
from trainers.precision import MATMUL_PRECISION, Precision
from trainers.runargs import RunArgs
from trainers.workloads import WorkloadFactory, resolve_factory

PERTURBATIONS = 4
"""K, the number of perturbed runs (seeds `seed * 1000 + 1 .. + K`)."""
FORMAT = 1
"""Version of `Envelope.to_dict()`'s layout."""
SPREADS = ("rounding", "seeds")
"""What the K runs around the reference vary (see the module doc): its weights' last bits, or
the seed."""

_PRECISION_EPS: dict[str, float | None] = {
    "fp32": None,
    "tf32": 2.0**-10,  # TF32 keeps 10 mantissa bits
    "bf16-autocast": 2.0**-7,
    "fp16-autocast": 2.0**-10,
    # An envelope measured under float8 itself: bf16's step, the rounding of every layer that
    # float8 leaves in bf16. A float8 candidate is judged against a bf16-autocast reference's
    # envelope (`gate(reference_precision=...)`), whose step is bf16's anyway.
    "float8": 2.0**-7,
}
_MATMUL_PRECISION_EPS: dict[str, float | None] = {"high": 2.0**-10, "medium": 2.0**-7}


def rounding_eps(precision: Precision | None, matmul_precision: str) -> float | None:
    """The relative size of one rounding step of the precision the kernels compute in.

    None means float32: each parameter's own dtype epsilon (2^-23). TF32 and fp16 round at
    2^-10, bfloat16 at 2^-7: two runs that differ only by rounding then differ at that scale, so
    the perturbation moves the weights by that much. Without a `precision` (`run()` then keeps
    the process's float32 matmul precision), `high` (TF32) and `medium` (bfloat16) count.
    """
    if precision is not None:
        return _PRECISION_EPS[precision]
    return _MATMUL_PRECISION_EPS.get(matmul_precision)


@dataclasses.dataclass(kw_only=True, frozen=True)
class Envelope:
    """The reference trajectory and K perturbed ones, with what they were measured under.

    `to_dict()` holds the raw losses (the figures are derived from them); `from_dict()` reads it
    back. The derived figures for a window of W steps: `windows(W)` (E_j per window) and `floor`.
    """

    workload: str
    preset: str
    seed: int
    steps: int
    device: str
    hardware: str
    precision: Precision | None
    matmul_precision: str
    eps: float | None
    """The perturbation's relative size; None: each parameter dtype's machine epsilon."""
    strict: bool
    """Whether every run had strictly deterministic kernels (False: warn-only mode was needed)."""
    reference: tuple[float, ...]
    perturbed: tuple[tuple[float, ...], ...]
    perturbation_seeds: tuple[int, ...]
    spread: str = "rounding"
    """"rounding": the K runs are the reference's weights perturbed in their last bit (seeds
    of the perturbation); "seeds": the reference trained from those seeds instead (`eps` unused)."""
    determinism: str = GATE_DETERMINISM
    """The mode its runs were asked to compute under (`trajectory`; "strict" in a dict from before
    it was recorded); `strict` says whether strict determinism then held."""

    @classmethod
    def measure(
        cls,
        workload: str | WorkloadFactory,
        preset: str,
        args: RunArgs = GATE_ARGS,
        *,
        perturbations: int = PERTURBATIONS,
        eps: float | None = None,
        reference: Sequence[float] | None = None,
        config: LoopConfig = REFERENCE,
        spread: str = "rounding",
        determinism: Determinism | None = None,
    ) -> Envelope:
        """Train the reference (unless `reference` is given: it must be the reference's losses
        for these arguments) and `perturbations` perturbed copies of it, each a trajectory of
        `args` (its steps, seed, device and precision).

        eps None: `rounding_eps(precision, torch.get_float32_matmul_precision())`.
        config: the reference's config (the loop's `REFERENCE`; a data-parallel run is judged
        against one process accumulating the ranks' shards as micro-batches,
        `tuner.search.gating.dpgate`).
        spread: "rounding" (the K runs perturbed in their last bit) or "seeds" (trained from K
        other seeds: the envelope a config in another precision is judged against).
        determinism: every run's (`trajectory`; None: the gate's, strict). `strict` records
        whether all of them held strict determinism.
        """
        _check_measure(spread, perturbations)
        mode = GATE_DETERMINISM if determinism is None else determinism
        factory = resolve_factory(workload) if isinstance(workload, str) else workload
        dev = resolve_device(args.device)
        args = args.replace(device=dev)
        precision = args.precision
        matmul_precision = _matmul_precision_of(precision)
        if eps is None:
            eps = rounding_eps(precision, matmul_precision)
        seeds = envelope_seeds(args.seed, perturbations)
        name = workload if isinstance(workload, str) else getattr(workload, "__name__", "?")
        around = _Around(factory, preset, config, args, mode, spread, eps)
        runs = _Runs.measure(around, name, reference, seeds)
        return cls(
            workload=runs.workload,
            preset=preset,
            seed=args.seed,
            steps=args.steps,
            device=str(dev),
            hardware=fingerprint_key(fingerprint(dev)),
            precision=precision,
            matmul_precision=matmul_precision,
            eps=eps,
            strict=runs.strict,
            reference=runs.reference,
            perturbed=runs.perturbed,
            perturbation_seeds=seeds[: len(runs.perturbed)],
            spread=spread,
            determinism=mode,
        )

    @property
    def floor(self) -> float:
        return loss_floor(self.reference)

    @property
    def flat(self) -> bool:
        """Whether every run around the reference gave its very losses. Of a seed envelope: the
        workload built one model from every seed (pretrained weights, say) and, its batches the
        same for every seed, nothing varied, so the envelope is the loss floor alone."""
        return all(run == self.reference for run in self.perturbed)

    def judged_against(self) -> str:
        """The verdict's words for a seed envelope: which one judged the config, and, where it is
        flat, why any change of rounding fails it and what gives it a spread."""
        k = len(self.perturbed)
        said = (
            f"judged against the reference's seed-to-seed envelope ({k} other "
            f"seed{'s' if k != 1 else ''} in {self.precision or 'fp32'})"
        )
        if not self.flat:
            return said
        return (
            f"{said}, where every seed gave the reference's own losses: workload "
            f"{self.workload!r} builds the same weights from every seed (pretrained weights, "
            "say) and its batches do not depend on it, so the envelope is the loss floor alone "
            "and another precision's rounding exceeds it; build from `seed` what may differ "
            "between runs (a new layer's initial weights, dropout) to give it a spread"
        )

    def windows(self, window: int = WINDOW) -> list[float]:
        """E_j for windows of `window` steps."""
        return window_envelope(self.reference, self.perturbed, window)

    def judge(
        self,
        losses: Sequence[float],
        *,
        window: int = WINDOW,
        multiple: float = MULTIPLE,
        check_drift: bool = True,
    ) -> Equivalence:
        """The equivalence test of `losses` against this envelope's reference."""
        return judge(
            losses,
            self.reference,
            self.perturbed,
            window=window,
            multiple=multiple,
            floor_ulps=FLOOR_ULPS,
            check_drift=check_drift,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `envelope` and `floor` (window `WINDOW`) are for people to read
        and are recomputed from the losses by `from_dict`."""
        values = dataclasses.asdict(self)
        values["reference"] = list(self.reference)
        values["perturbed"] = [list(run) for run in self.perturbed]
        values["perturbation_seeds"] = list(self.perturbation_seeds)
        return {
            "format": FORMAT,
            **values,
            "window": WINDOW,
            "envelope": self.windows(),
            "floor": self.floor,
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Envelope:
        if values.get("format") != FORMAT:
            raise ValueError(
                f"envelope format={values.get('format')!r} is invalid: allowed {FORMAT}"
            )
        # Envelopes stored before `spread` existed were all rounding envelopes, and all strict.
        values = {"spread": "rounding", "determinism": GATE_DETERMINISM, **values}
        if values["determinism"] not in DETERMINISMS:
            raise ValueError(
                f"envelope determinism={values['determinism']!r} is invalid: allowed "
                f"{', '.join(DETERMINISMS)}"
            )
        if values["spread"] not in SPREADS:
            raise ValueError(
                f"envelope spread={values['spread']!r} is invalid: allowed {', '.join(SPREADS)}"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"envelope dict lacks {', '.join(missing)}")
        fields = {n: values[n] for n in names}
        fields["reference"] = tuple(_loss(x) for x in values["reference"])
        fields["perturbed"] = tuple(tuple(_loss(x) for x in run) for run in values["perturbed"])
        fields["perturbation_seeds"] = tuple(int(k) for k in values["perturbation_seeds"])
        if any(len(run) != len(fields["reference"]) for run in fields["perturbed"]):
            raise ValueError("envelope dict: every perturbed run needs the reference's length")
        return cls(**fields)


def _loss(value: object) -> float:
    """A stored loss: JSON carries NaN and infinities as null (`json_safe`), read back as NaN, so
    a reused envelope whose reference was not finite fails its check as the first one did (it
    was "float() argument must be ... not 'NoneType'")."""
    return math.nan if value is None else float(value)  # type: ignore[arg-type]


def envelope_seeds(seed: int, perturbations: int = PERTURBATIONS) -> tuple[int, ...]:
    """The seeds of an envelope's K runs around the reference of `seed`: those its perturbations
    are drawn from, or, for a seed envelope, those the reference is trained from instead (a
    process that builds ahead builds these)."""
    return tuple(seed * 1000 + k + 1 for k in range(perturbations))


def _check_measure(spread: str, perturbations: int) -> None:
    if spread not in SPREADS:
        raise ValueError(f"spread={spread!r} is invalid: allowed {', '.join(SPREADS)}")
    if perturbations < 1:
        raise ValueError(f"perturbations={perturbations!r} is invalid: allowed >= 1")


def _matmul_precision_of(precision: Precision | None) -> str:
    """What run() computes under: a precision sets its own matmul precision for the run."""
    if precision is None:
        return torch.get_float32_matmul_precision()
    return MATMUL_PRECISION[precision]


@dataclasses.dataclass(frozen=True)
class _Runs:
    """An envelope's runs: the reference's losses and its K runs' around it (`Envelope.spread`),
    whether strict determinism held in all of them, the workload's name."""

    workload: str
    reference: tuple[float, ...]
    perturbed: tuple[tuple[float, ...], ...]
    strict: bool

    @classmethod
    def measure(
        cls, around: _Around, name: str, reference: Sequence[float] | None, seeds: Sequence[int]
    ) -> _Runs:
        """Train the reference (unless its losses are given: `name` is then the workload's) and
        one run around it per seed, one at a time; a seed envelope stops at its first run that
        repeats the reference."""
        strict = True
        if reference is None:
            ref = around.reference()
            reference, strict, name = ref.losses, ref.strict, ref.workload.name
            del ref
        perturbed = []
        for k in seeds:
            losses, held, name = around.run(k)
            perturbed.append(losses)
            strict = strict and held
            if around.spread == "seeds" and losses == tuple(reference):
                # Another seed gave the reference's very losses: the workload builds the same
                # model and batches from every seed (pretrained weights), so the other seeds
                # would too, and the envelope is the loss floor alone (`Envelope.flat`); their
                # runs would cost K-1 trainings (about 15 s at 0.5B) for nothing.
                break
        return cls(
            workload=name, reference=tuple(reference), perturbed=tuple(perturbed), strict=strict
        )


@dataclasses.dataclass(frozen=True)
class _Around:
    """The runs of one envelope: the reference's trajectory of `args` under `determinism`, and
    the K runs around it (`Envelope.spread`: from another seed, or perturbed by `eps`)."""

    factory: WorkloadFactory
    preset: str
    config: LoopConfig
    args: RunArgs
    determinism: Determinism
    spread: str
    eps: float | None

    def reference(self) -> Trajectory:
        return trajectory(
            self.factory, self.preset, self.config, self.args, determinism=self.determinism
        )

    def run(self, k: int) -> tuple[tuple[float, ...], bool, str]:
        """One of the envelope's K runs: the losses, whether strict determinism held, the
        workload's name. Only the losses are kept: the trained model leaves the device before
        the next run (4.4 GB of weights and as much of gradients at 1.1B)."""
        args, perturbation = self.args, None
        if self.spread == "seeds":
            args = args.replace(seed=k)
        else:
            perturbation = Perturbation(seed=k, eps=self.eps)
        run = trajectory(
            self.factory,
            self.preset,
            self.config,
            args,
            perturbation=perturbation,
            determinism=self.determinism,
        )
        return tuple(run.losses), run.strict, run.workload.name
