"""A config's eager twin: what a graph config, or one that changes the arithmetic and the loop
settings together, is owed bit for bit (`trainers.gate.parity` says when).

The twin is the reference loop with the config's arithmetic (its `NUMERICS_FIELDS`) and, for a
graph, the optimizer built `capturable=True` (`twin_of`). It keeps the reference's loop settings,
not the config's: those are owed bit-exactness anyway, and a single twin per workload then also
catches a stream bug inside a graph config. `Twin` holds its losses, run once or twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from trainers.config import REFERENCE, LoopConfig
from trainers.gate.trajectories import GATE_ARGS, trajectory, trajectory_length
from trainers.gate.verdict import first_difference, per_step
from trainers.levers import defaults_where
from trainers.runargs import RunArgs
from trainers.workloads import WorkloadFactory

__all__ = ["NUMERICS_FIELDS", "Twin", "check_twin", "twin_of"]


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
    """A config's eager twin: `losses` is its first run. Run twice (`runs` 2), `reproducible`
    says whether the second gave the same losses bit for bit (`first_difference`: where it did
    not; `max_abs_difference`: by how much at most; None in a dict from before it was recorded).
    Run once (`runs` 1), `reproducible` is None: a config that replays those losses bit for bit
    shows by that alone that the arithmetic is reproducible, so the gate runs the twin a second
    time (`confirmed`) only when the config differs from it. At 1.1B with float8 each run is a
    compile and 20 strict steps: the second run was a third of the gate."""

    config: dict[str, Any]
    capturable: bool
    losses: tuple[float, ...]
    reproducible: bool | None
    first_difference: int | None
    strict: bool
    max_abs_difference: float | None = None
    runs: int = 2

    @classmethod
    def measure(
        cls,
        workload: str | WorkloadFactory,
        config: LoopConfig,
        args: RunArgs = GATE_ARGS,
        *,
        preset: str,
        runs: int = 2,
    ) -> Twin:
        """Run the eager twin of `config` (`twin_of`) `runs` times (1 or 2), each a trajectory
        of `args` (in the config's precision)."""
        if runs not in (1, 2):
            raise ValueError(f"runs={runs!r} is invalid: allowed 1 or 2")
        twin_config, capturable = twin_of(config)
        losses, strict = _twin_run(workload, preset, twin_config, capturable, args)
        once = cls(
            config=twin_config.to_dict(),
            capturable=capturable,
            losses=losses,
            reproducible=None,
            first_difference=None,
            strict=strict,
            runs=1,
        )
        if runs == 1:
            return once
        return once.confirmed(workload, args, preset=preset)

    def confirmed(
        self, workload: str | WorkloadFactory, args: RunArgs = GATE_ARGS, *, preset: str
    ) -> Twin:
        """This twin with its second run (itself where it has one): whether it reproduces. The
        second run is as long as the first (its losses), whatever `args.steps` says."""
        if self.runs == 2:
            return self
        config, capturable = LoopConfig.from_dict(self.config), self.capturable
        again = args.replace(steps=len(self.losses))
        second, second_strict = _twin_run(workload, preset, config, capturable, again)
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
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Twin:
        fields = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        fields["losses"] = tuple(float(x) for x in fields["losses"])
        return cls(**fields)


def _twin_run(
    workload: str | WorkloadFactory,
    preset: str,
    twin_config: LoopConfig,
    capturable: bool,
    args: RunArgs,
) -> tuple[tuple[float, ...], bool]:
    """One run of an eager twin: its losses and whether it ran strict."""
    run = trajectory(workload, preset, twin_config, args, capturable=capturable)
    # Losses only: the trained model leaves the device before the next run.
    return tuple(run.losses), run.strict


def twin_of(config: LoopConfig) -> tuple[LoopConfig, bool]:
    """The eager twin's config (the reference's loop settings, `config`'s NUMERICS_FIELDS) and
    whether its optimizer is capturable (exactly when `config` is a graph)."""
    # Read live: a lever module's lever with an `equivalence` value is in the twin too.
    keep = {name: config.get(name) for name in defaults_where("equivalence")}
    return (REFERENCE.replace(**keep) if keep else REFERENCE), config.cuda_graph


def check_twin(twin: Twin, config: LoopConfig, *, steps: int) -> None:
    """A twin of another config, or of another length than the exact test's, would hold the
    config to other bits: refuse it."""
    expected, capturable = twin_of(config)
    length = trajectory_length(expected, steps)
    if len(twin.losses) != length:
        raise ValueError(f"twin ran {len(twin.losses)} steps, the exact test runs {length}")
    if twin.config != expected.to_dict() or twin.capturable != capturable:
        raise ValueError(
            f"twin is the eager twin of {twin.config} (capturable={twin.capturable}), not of "
            f"this config, whose twin is {expected.to_dict()} (capturable={capturable})"
        )
