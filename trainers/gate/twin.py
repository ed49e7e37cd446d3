"""A config's twin: what shows, bit for bit, that a graph config, or one that changes the
arithmetic and the loop settings together, runs its loop right (`trainers.gate.parity` says when).
Two kinds (`TwinKind`):

- "eager": the reference loop with the config's arithmetic (its `NUMERICS_FIELDS`) and, for a
  graph, the optimizer built `capturable=True` (`twin_of`). It keeps the reference's loop
  settings, not the config's: those are owed bit-exactness anyway, and a single twin per
  workload then also catches a stream bug inside a graph config. The config's own run is owed
  the twin's losses bit for bit, so both run under strict determinism: a compiled config's twin
  is then one more compilation, cold, since Inductor keys strict kernels apart (at 1B in float8,
  102 s of a 157 s gate on an H200).
- "loop": the config's loop settings with the reference's arithmetic, in the reference's
  precision (`loop_twin_of`), owed the reference's losses bit for bit; the config itself is then
  owed equivalence alone, and its run computes as the reference does (`trainers.gate.parity.
  config_determinism`): against a seed envelope (another precision) with the process's own
  kernels, those its trial compiled. Two eager runs instead of a compile. A stream or feed bug
  is in the loop code, which is the same whatever the model computes, so the loop settings on
  the eager model catch it (the planted faults' GPU tests check that with compiled configs).
  Not for a graph (a whole-step CUDA graph, or a compile mode that records Inductor's CUDA
  graphs): replaying is part of the loop there, and only the eager twin holds it to the eager
  step's bits (`twin_kind`).

`Twin` holds its losses (and, for a loop twin, the reference's it is held to), run once or twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, get_args

from trainers.config import REFERENCE, LoopConfig
from trainers.gate.trajectories import (
    DETERMINISMS,
    GATE_ARGS,
    GATE_DETERMINISM,
    Determinism,
    trajectory,
    trajectory_length,
)
from trainers.gate.verdict import first_difference, per_step
from trainers.levers import defaults_where, records_graphs
from trainers.precision import Precision
from trainers.runargs import RunArgs
from trainers.workloads import WorkloadFactory

__all__ = [
    "NUMERICS_FIELDS",
    "TWIN_KINDS",
    "Twin",
    "TwinKind",
    "check_twin",
    "loop_twin_of",
    "twin_kind",
    "twin_of",
]

TwinKind = Literal["eager", "loop"]
TWIN_KINDS: tuple[str, ...] = get_args(TwinKind)


class _EquivalenceDefaults(Mapping[str, object]):
    """`defaults_where("equivalence")` read on each access: a lever module registered after this
    module was imported (a test's own) is in it too, as it is in `twin_of` and the gate."""

    def __getitem__(self, name: str) -> object:
        return defaults_where("equivalence")[name]

    def __iter__(self) -> Iterator[str]:
        return iter(defaults_where("equivalence"))

    def __len__(self) -> int:
        return len(defaults_where("equivalence"))

    def __repr__(self) -> str:
        return f"NUMERICS_FIELDS({defaults_where('equivalence')!r})"


NUMERICS_FIELDS: Mapping[str, object] = _EquivalenceDefaults()
"""The levers that may change the arithmetic, with the value that does not: those with a value
of numerics class `equivalence` in the lever table (`trainers.levers`, which says why each is),
read live."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class Twin:
    """A config's twin (`kind`, see the module doc): `losses` is its first run. An eager twin
    run twice (`runs` 2): `reproducible` says whether the second gave the same losses bit for bit
    (`first_difference`: where it did not; `max_abs_difference`: by how much at most; None in a
    dict from before it was recorded). Run once (`runs` 1), `reproducible` is None: a config that
    replays those losses bit for bit shows by that alone that the arithmetic is reproducible, so
    the gate runs the twin a second time (`confirmed`) only when the config differs from it. At
    1.1B with float8 each run is a compile and 20 strict steps: the second run was a third of
    the gate.

    A loop twin (`kind` "loop") runs once, in `precision` (the reference's), beside `reference`:
    the reference's strict losses over as many steps, which it is owed bit for bit. Where they
    differ, the reproducibility probe of that precision says whether they could have agreed."""

    config: dict[str, Any]
    capturable: bool
    losses: tuple[float, ...]
    reproducible: bool | None
    first_difference: int | None
    strict: bool
    max_abs_difference: float | None = None
    runs: int = 2
    kind: str = "eager"
    reference: tuple[float, ...] | None = None
    precision: Precision | None = None
    determinism: Determinism = GATE_DETERMINISM

    @classmethod
    def measure(
        cls,
        workload: str | WorkloadFactory,
        config: LoopConfig,
        args: RunArgs = GATE_ARGS,
        *,
        preset: str,
        runs: int = 2,
        kind: TwinKind = "eager",
        reference_precision: Precision | None = None,
        reference: Sequence[float] | None = None,
        determinism: Determinism = GATE_DETERMINISM,
    ) -> Twin:
        """Run the twin of `config` of `kind` where the config allows it (`twin_kind`), each run
        a trajectory of `args`. An eager twin (`twin_of`) runs `runs` times (1 or 2), in the
        config's precision, under `determinism` (a loop twin runs strict whatever it says: it is
        held to the reference's strict bits). A loop twin (`loop_twin_of`) runs once in
        `reference_precision` (None: `args.precision`), beside the reference's losses under
        strict determinism (`reference`: those losses, at least `args.steps` of them; None: run
        here), once whatever `runs` says (its reproducibility is the probe's of that
        precision)."""
        if runs not in (1, 2):
            raise ValueError(f"runs={runs!r} is invalid: allowed 1 or 2")
        if kind not in TWIN_KINDS:
            raise ValueError(f"kind={kind!r} is invalid: allowed {', '.join(TWIN_KINDS)}")
        if determinism not in DETERMINISMS:
            raise ValueError(
                f"determinism={determinism!r} is invalid: allowed {', '.join(DETERMINISMS)}"
            )
        if twin_kind(config, kind) == "loop":
            return _loop_twin(workload, config, args, preset, reference_precision, reference)
        twin_config, capturable = twin_of(config)
        losses, strict = _twin_run(workload, preset, twin_config, capturable, args, determinism)
        once = cls(
            config=twin_config.to_dict(),
            capturable=capturable,
            losses=losses,
            reproducible=None,
            first_difference=None,
            strict=strict,
            runs=1,
            determinism=determinism,
        )
        if runs == 1:
            return once
        return once.confirmed(workload, args, preset=preset)

    @property
    def noisy(self) -> bool:
        """Run twice with the process's own kernels ("off", as the search's kept check runs it)
        and its runs differed: those kernels do not reproduce, so a config is held within this
        noise (`trainers.gate.within_twin_noise`) rather than to bits, and no probe of strict
        runs can say anything of them."""
        return self.determinism == "off" and self.reproducible is False

    def confirmed(
        self, workload: str | WorkloadFactory, args: RunArgs = GATE_ARGS, *, preset: str
    ) -> Twin:
        """This twin with its second run (itself where it has one): whether it reproduces. The
        second run is as long as the first (its losses), whatever `args.steps` says."""
        if self.runs == 2 or self.kind == "loop":
            # A loop twin's reproducibility is the reference's: the probe of its precision.
            return self
        config, capturable = LoopConfig.from_dict(self.config), self.capturable
        again = args.replace(steps=len(self.losses))
        second, second_strict = _twin_run(
            workload, preset, config, capturable, again, self.determinism
        )
        differ = first_difference(second, self.losses)
        largest, _, _ = per_step(second, self.losses)
        return dataclasses.replace(
            self,
            reproducible=differ is None and len(self.losses) == len(second),
            first_difference=differ,
            strict=self.strict and second_strict,
            max_abs_difference=largest,
            runs=2,
        )

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["losses"] = list(self.losses)
        if self.reference is not None:
            values["reference"] = list(self.reference)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Twin:
        fields = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        fields["losses"] = tuple(float(x) for x in fields["losses"])
        if fields.get("reference") is not None:
            fields["reference"] = tuple(float(x) for x in fields["reference"])
        return cls(**fields)


def _twin_run(
    workload: str | WorkloadFactory,
    preset: str,
    twin_config: LoopConfig,
    capturable: bool,
    args: RunArgs,
    determinism: Determinism = GATE_DETERMINISM,
) -> tuple[tuple[float, ...], bool]:
    """One run of an eager twin: its losses and whether it ran strict."""
    run = trajectory(
        workload, preset, twin_config, args, capturable=capturable, determinism=determinism
    )
    # Losses only: the trained model leaves the device before the next run.
    return tuple(run.losses), run.strict


def _loop_twin(
    workload: str | WorkloadFactory,
    config: LoopConfig,
    args: RunArgs,
    preset: str,
    reference_precision: Precision | None,
    reference: Sequence[float] | None,
) -> Twin:
    """`Twin.measure` of a loop twin: the loop settings on the reference's arithmetic, and the
    reference's strict losses beside them."""
    precision = args.precision if reference_precision is None else reference_precision
    run_args = args.replace(precision=precision)
    loop_config = loop_twin_of(config)
    losses, strict = _twin_run(workload, preset, loop_config, False, run_args)
    if reference is None:
        # Strict, as the loop twin: the seed-to-seed envelope's reference runs with the
        # process's own kernels (`SEEDS_DETERMINISM`), whose bits may change run to run.
        first = trajectory(workload, preset, REFERENCE, run_args)
        reference, strict = first.losses, strict and first.strict
        del first  # its trained model leaves the device
    elif len(reference) < len(losses):
        raise ValueError(
            f"reference of {len(reference)} steps given, the loop twin runs {len(losses)}"
        )
    return Twin(
        config=loop_config.to_dict(),
        capturable=False,
        losses=losses,
        reproducible=None,
        first_difference=None,
        strict=strict,
        runs=1,
        kind="loop",
        reference=tuple(reference[: len(losses)]),
        precision=precision,
    )


def twin_kind(config: LoopConfig, wanted: TwinKind = "eager") -> TwinKind:
    """The kind of twin `config` gets where `wanted` is asked: a loop twin only for a config
    with no graph (neither a whole-step CUDA graph nor a compile mode that records CUDA graphs,
    whose replay only the eager twin holds to the eager step's bits)."""
    if wanted == "loop" and not config.cuda_graph and not records_graphs(config.compile):
        return "loop"
    return "eager"


def loop_twin_of(config: LoopConfig) -> LoopConfig:
    """The loop twin's config: `config`'s loop settings, every NUMERICS_FIELDS lever at the
    value that keeps the reference's arithmetic."""
    return config.replace(**defaults_where("equivalence"))


def twin_of(config: LoopConfig) -> tuple[LoopConfig, bool]:
    """The eager twin's config (the reference's loop settings, `config`'s NUMERICS_FIELDS) and
    whether its optimizer is capturable (exactly when `config` is a graph)."""
    # Read live: a lever module's lever with an `equivalence` value is in the twin too.
    keep = {name: config.get(name) for name in defaults_where("equivalence")}
    return (REFERENCE.replace(**keep) if keep else REFERENCE), config.cuda_graph


def check_twin(twin: Twin, config: LoopConfig, *, steps: int) -> None:
    """A twin of another config, or of another length than the exact test's, would hold the
    config to other bits: refuse it."""
    if twin.kind == "loop":
        expected, capturable = loop_twin_of(config), False
        if twin_kind(config, "loop") != "loop":
            raise ValueError(f"a loop twin cannot judge {config.to_dict()}: it records graphs")
    else:
        expected, capturable = twin_of(config)
    length = trajectory_length(expected, steps)
    if len(twin.losses) != length:
        raise ValueError(f"twin ran {len(twin.losses)} steps, the exact test runs {length}")
    if twin.config != expected.to_dict() or twin.capturable != capturable:
        raise ValueError(
            f"twin is the eager twin of {twin.config} (capturable={twin.capturable}), not of "
            f"this config, whose twin is {expected.to_dict()} (capturable={capturable})"
        )
