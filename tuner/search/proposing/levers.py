"""The second stage of a search: the leader with each lever the built-in spaces offer.

The first stage (`tuner.search.proposing.stages`) runs the corners of the scale levers (compile
scope, recomputation, micro-batches) with every other lever at its default, so a lever module's
lever (`trainers.levers`: the attention kernel, liger-kernel's kernels, the compiled loss, the
head in float8) is reached, if at all, only by the sampler's draws. A lever's gain is measured on
the config it would change: so once nothing is waiting in the study, the leader (the fastest
trial that can still be recommended, `screen.incumbent`) is enqueued again with each value each
offered lever takes that it does not, one lever at a time; a new leader faster than the staged
one by more than the tie margin (a variant, or a draw of the sampler) gets the same, so gains
compose one lever at a time (coordinate ascent). Staged only while trials remain and within the
search budget: what waits at the end would run unbudgeted in `Search.revive`.
A variant the harness refuses for this device, precision or model, or beside the leader's other
settings (`trainers.invalid_reason`: liger-kernel beside the whole model compiled, the compiled
loss for a model without a loss function, the head in float8 outside float8) is left out, and one
already in the study is not enqueued again (`skip_if_exists`).

Before the variants are enqueued, the levers' probes (`Lever.probe`: attention's backends timed
on the model's SDPA calls, its loss function eager and compiled, its head's matmul in bf16 and in
float8) predict what each value saves a step, once per precision and only where a variant they
predict could be enqueued (`Prober`); a value predicted to gain no more than the tie margin of
the leader's step, or that cannot run the model's calls, is left out, and the progress line says
why (`Predictions`). A variant left out so is not run either when the sampler draws it, or when
one enqueued for an earlier leader comes up after a faster one (`tuner.search.proposing.drawn`).

A leader in bf16, in a study that may also run float8, gets one more kind of variant: the
leader moved into float8, with each combination of the values the offered float8-only levers
take in the space (`float8_head`, `float8_linears`; a combination the harness refuses, or one
that runs as another, left out), among them the leader in plain float8 and its head alone in
float8 (`float8_linears='none'` beside `float8_head='float8'`). The first stage tries float8
only at its corners (the whole model's with the float8 levers its probes pick:
`tuner.search.proposing.held`) and the one-lever variants need a float8 leader, so without
these a bf16 leader was never tried with what float8 gives at its largest matmul: on the
Qwen1.5-0.5B shape (2026-11-30, one H200; vocabulary 151,936) the default job kept bf16 after
plain float8 ran 1.2 % behind, with its head never in float8 (1.047x on the Qwen2-style decoder
before). Their prediction is what the float8 levers' probes, run in float8, say the
combination saves against each lever's `unconverted` value (what a bf16 step runs), summed over
every such lever, the space's or not: plain float8 is predicted from its linears alone. A move
is staged only where predicted, and only from bf16, whose step those figures are.

Two cuts on the evidence (`tuner.search.proposing.cuts`, which says why): of one lever's
predicted values only the first in this order is staged, and a value a trial measured behind
(beside other levers alone) is not staged again.

Order: cheapest one-off cost first (`trainers.Lever.cost_order`: no cost, then a compile), then
the larger predicted gain, then the order the levers were registered in. Each variant is a
trial like any other: the screen stops a losing one after its first windows and the gate judges
the one that leads. Enqueued trials are the search's plan, so the patience rule waits for them
(`TrialRunner.out_of_patience`); the budget does not. A variant that fails only in its run
(liger's patch changing nothing on a model of a type it names) fails in one line, a trial. A
space that searches no lever module's lever (`full`, or any for a model that takes none of
the offered values: `without_model_refusals`) has no second stage; the built-in spaces search
the float8 head where the study may run float8, `scale` the compiled loss too (`offered` in
their modules), and a space of one's own may search any. The `scale` space's whole-step CUDA
graph (`tuner.search.spaces.staged`: a setting the sampler never draws) is one more variant of
each leader, unpredicted (no probe prices it), after the levers that cost no compile.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import optuna
from optuna.trial import FrozenTrial, TrialState

import trainers
from tuner.search.proposing.cuts import first_of_each_lever, lost_before
from tuner.search.proposing.predictions import Predict, Predictions, unpredicted
from tuner.search.spaces.space import Choice, SearchSpace
from tuner.search.spaces.staged import STAGED_ONLY, staged_fields
from tuner.store import keys

if TYPE_CHECKING:
    from torch import nn


def offered_levers(space: SearchSpace) -> dict[str, tuple[Any, ...]]:
    """The lever modules' levers `space` searches (the ones that are not `LoopConfig` fields:
    no corner sets them), each with the values it searches."""
    fields = {field.name for field in dataclasses.fields(trainers.LoopConfig)}
    return {
        name: spec.values
        for name, spec in space.params.items()
        if name in trainers.LEVERS and name not in fields and isinstance(spec, Choice)
    }


def lever_stage(
    space: SearchSpace,
    leader: Mapping[str, Any],
    *,
    device_type: str,
    precision: str | None = None,
    model: nn.Module | None = None,
    predictions: Predictions | None = None,
    precisions: Sequence[str] = (),
    in_float8: Predictions | None = None,
) -> list[dict[str, Any]]:
    """The params to enqueue: `leader` (a trial's params) with one offered lever changed each,
    the ones the harness runs here (on `device_type`, in `precision`, for `model` where given)
    and, with `predictions`, the ones not predicted to gain too little (of a lever's, the first
    alone); cheapest first, then the largest predicted gain. Each holds the searched settings as
    the config runs them (`trainers.canonical`), so two that run one config are one trial.
    `precisions`: the study's (a trial's `precision` param); where float8 is one and the
    leader's is another, the leader moved into float8 too, predicted by `in_float8`."""
    found = _variants(space, leader, device_type, precision, model, predictions)
    found += _into_float8(space, leader, device_type, precision, precisions, model, in_float8)
    return [v.params for v in first_of_each_lever(sorted(found, key=_order)) if v.left_out is None]


class Variant(NamedTuple):
    """One variant of a stage: its place (cost, minus the predicted gain, registration order),
    the lever it changes, its params, why the probes' predictions leave it out (None: they
    keep it), and the milliseconds a step they predict it saves (None: unpredicted)."""

    order: tuple[int, float, int]
    lever: str
    params: dict[str, Any]
    left_out: str | None
    gain: float | None = None


def _order(variant: Variant) -> tuple[int, float, int]:
    return variant.order


def _variants(
    space: SearchSpace,
    leader: Mapping[str, Any],
    device_type: str,
    precision: str | None,
    model: nn.Module | None,
    predictions: Predictions | None,
) -> list[Variant]:
    # A study without a precision runs in float32 (its matmul precision fp32 or tf32, which no
    # lever's rule tells apart): a lever that needs another one (the head in float8) is refused.
    precision = leader.get(keys.PRECISION, precision) or "fp32"
    current = settings_of(space, leader)
    registered = list(trainers.LEVERS)
    found: list[Variant] = []
    for name, values in (offered_levers(space) | staged_fields(space)).items():
        lever, order = trainers.LEVERS[name], registered.index(name)
        now = current.get(name, lever.default)
        for value in values:
            # A staged setting is tried away from the value every draw keeps, not back to it.
            if value == now or STAGED_ONLY.get(name, now) == value:
                continue
            changed = current | {name: value}
            why = trainers.invalid_reason(
                changed, precision=precision, device_type=device_type, model=model
            )
            if why is not None:
                continue
            runs = trainers.canonical(changed, pinned=space.fixed)
            variant = {field: runs[field] for field in space.params}
            if keys.PRECISION in leader:
                variant[keys.PRECISION] = leader[keys.PRECISION]
            gain = None if predictions is None else predictions.gain(name, now, value)
            left_out = gain if isinstance(gain, str) else None
            ahead = gain if isinstance(gain, float) else 0.0
            place = (lever.cost_order(value), -ahead, order)
            predicted = gain if isinstance(gain, float) else None
            found.append(Variant(place, name, variant, left_out, predicted))
    return found


FLOAT8 = "float8"


def float8_levers(space: SearchSpace, precision: str) -> dict[str, tuple[Any, ...]]:
    """The offered levers with a value that runs in float8 but not in `precision`, and an
    `unconverted` value to predict them against, each with the space's values (an enqueued
    value must be one of them: Optuna's distribution)."""
    found: dict[str, tuple[Any, ...]] = {}
    for name, values in offered_levers(space).items():
        lever = trainers.LEVERS[name]
        if lever.unconverted is None:
            continue
        if any(
            lever.precision_refusal(v, precision) and not lever.precision_refusal(v, FLOAT8)
            for v in values
        ):
            found[name] = values
    return found


def settings_of(space: SearchSpace, leader: Mapping[str, Any]) -> dict[str, Any]:
    """The settings `leader` (a trial's params) runs, its precision aside, as
    `trainers.canonical` holds them."""
    settings = {k: v for k, v in leader.items() if k != keys.PRECISION}
    return trainers.canonical(space.fixed | settings, pinned=space.fixed)


def _into_float8(
    space: SearchSpace,
    leader: Mapping[str, Any],
    device_type: str,
    precision: str | None,
    precisions: Sequence[str],
    model: nn.Module | None,
    predictions: Predictions | None,
) -> list[Variant]:
    """The leader moved into float8 with each combination of the float8-only levers' offered
    values the harness runs (see the module doc); none where the study cannot run float8 as a
    trial's precision or the leader runs in it already."""
    precision = leader.get(keys.PRECISION, precision) or "fp32"
    # From bf16 alone: the probes' `unconverted` figures are bf16's (float8 computes the rest of
    # the step in bf16 too), so they do not predict a move from fp32, tf32 or fp16.
    if FLOAT8 not in precisions or precision != BF16:
        return []
    levers = float8_levers(space, precision)
    if not levers:
        return []
    found: list[Variant] = []
    for chosen, variant, settled in float8_combinations(
        space, settings_of(space, leader), levers, device_type, model
    ):
        # Only where predicted: each move compiles the whole float8 model, and up to five of
        # them would run on the probes' word alone. Predicted over every float8 lever, the
        # space's or not (one fixed, or at its default, still runs its linears in float8).
        gain = unpredicted(chosen) if predictions is None else predictions.into(settled, chosen)
        left_out = gain if isinstance(gain, str) else None
        ahead = gain if isinstance(gain, float) else 0.0
        # A compile (the converted model's), after every lever of the leader's own precision
        # that costs as much.
        place = (_COMPILE, -ahead, len(trainers.LEVERS))
        predicted = gain if isinstance(gain, float) else None
        found.append(Variant(place, FLOAT8, variant, left_out, predicted))
    return found


def float8_combinations(
    space: SearchSpace,
    current: Mapping[str, Any],
    levers: Mapping[str, Sequence[Any]],
    device_type: str,
    model: nn.Module | None,
) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """`current` (settings, `settings_of`) in float8 with each combination of the values of
    `levers` (`float8_levers`) that the harness runs on `device_type` for `model` and that runs
    as itself: the combination chosen, the trial's params (the space's fields and the
    precision), and every float8 lever's value as it runs (`Predictions.into`'s `settled`)."""
    for combination in itertools.product(*levers.values()):
        chosen = dict(zip(levers, combination, strict=True))
        changed = dict(current) | chosen
        if trainers.invalid_reason(changed, precision=FLOAT8, device_type=device_type, model=model):
            continue
        runs = trainers.canonical(changed, pinned=space.fixed)
        if any(runs[n] != v for n, v in chosen.items()):
            continue  # it runs as another combination (a lever inert beside the others)
        variant = {field: runs[field] for field in space.params} | {keys.PRECISION: FLOAT8}
        settled = {n: runs.get(n, trainers.LEVERS[n].default) for n in unconverted_levers()}
        yield chosen, variant, settled


def unconverted_levers() -> tuple[str, ...]:
    """The levers that say what a bf16 step runs (`Lever.unconverted`): a move's prediction."""
    return tuple(n for n, lever in trainers.LEVERS.items() if lever.unconverted is not None)


# Where a compile falls in the levers' cost order (`trainers.Lever.cost_order`): the compiler's
# own value that costs one.
_COMPILE = trainers.LEVERS["compile"].cost_order("default")
BF16 = "bf16-autocast"


def waiting(study: optuna.Study) -> int:
    """How many enqueued trials (a stage's) have not started yet."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


@dataclasses.dataclass
class Staged:
    """The leaders given a second stage in this process, and the fastest of them: a new leader
    gets one only when it beats that by more than the tie margin (a lead within the noise would
    stage the same levers again on a config measured as the same, and the patience waits for
    staged trials)."""

    margin: float
    leaders: set[int] = dataclasses.field(default_factory=set)
    best: float | None = None

    def wants(self, leader: FrozenTrial) -> bool:
        if leader.number in self.leaders or not leader.values:
            return False
        return self.best is None or leader.values[0] > self.best * (1.0 + self.margin)

    def add(self, leader: FrozenTrial) -> None:
        self.leaders.add(leader.number)
        self.best = max(self.best or 0.0, leader.values[0])


@dataclasses.dataclass
class Prober:
    """The levers' probes for one search process (`trainers.probe_levers`), run where a stage is
    due and once per precision, on one forward of the whole first batch: a leader that
    recomputes its blocks or splits the batch in micro-batches runs the same work at other
    shapes or twice, which the figures do not scale for. Their seconds are measurement
    (`timing`). None where they cannot run here (a program's model is elsewhere, a
    data-parallel study measures in other processes) or the leader has no throughput."""

    # The search's `Measurer` (its workload, device, program, processes): this room does not
    # import the measuring one (tests/test_layers.py).
    measurer: Any
    space: SearchSpace
    margin: float
    timing: Callable[[], AbstractContextManager[object]]
    say: Callable[[str], None]
    probed: dict[str | None, trainers.Probed] = dataclasses.field(default_factory=dict)
    tried: dict[str | None, set[str]] = dataclasses.field(default_factory=dict)

    def __call__(
        self, leader: FrozenTrial, precision: str | None, names: Collection[str] | None = None
    ) -> Predictions | None:
        """The predictions for `leader` in `precision`, from the probes of `names` (None: the
        levers the space offers), each lever probed once per precision."""
        measurer = self.measurer
        if measurer.program is not None or measurer.nproc > 1:
            return None
        if not leader.values or leader.values[0] <= 0:
            return None
        figures = self.probed.setdefault(precision, {})
        tried = self.tried.setdefault(precision, set())
        wanted = list(offered_levers(self.space)) if names is None else list(names)
        missing = [n for n in wanted if n not in tried]
        if missing:
            with self.timing():
                figures.update(self._probe(precision, missing))
            tried.update(missing)
        return self.known(leader.values[0], precision)

    def known(self, throughput: float, precision: str | None) -> Predictions | None:
        """What the probes that already ran in `precision` predict for a leader of
        `throughput` (samples/s); none is run here. None where none ran there."""
        figures = self.probed.get(precision)
        if figures is None or throughput <= 0:
            return None
        step_ms = self.measurer.workload.samples_per_batch / throughput * 1e3
        return Predictions(ms=figures, floor_ms=step_ms * self.margin)

    def _probe(self, precision: str | None, names: Sequence[str]) -> trainers.Probed:
        """Each lever's probe on its own: one that fails leaves that lever unpredicted."""
        probed: trainers.Probed = {}
        offered = offered_levers(self.space)
        for name in names:
            lever = trainers.LEVERS[name]
            values = offered.get(name, lever.values())
            others = [v for v in values if v != lever.default]
            if all(lever.precision_refusal(v, precision or "fp32") for v in others):
                continue  # no value it predicts runs in this precision (the float8 head in bf16)
            try:
                probed |= trainers.probe_levers(
                    self.measurer.workload,
                    [name],
                    device=self.measurer.device,
                    precision=trainers.parse_precision(precision),
                )
            except Exception as exc:  # noqa: BLE001 - a failed microbenchmark must not end a search
                self.say(f"the {name} lever's probe failed ({exc!r:.200}): staged unpredicted")
        return probed


def second_stage(
    study: optuna.Study,
    space: SearchSpace,
    leader: FrozenTrial | None,
    *,
    device_type: str,
    precision: str | None,
    staged: Staged,
    model: nn.Module | None = None,
    predict: Predict | None = None,
    precisions: Sequence[str] = (),
) -> str | None:
    """Enqueue the second stage for `leader` once nothing waits in `study` (`precision`: the
    study's own, where its trials do not search one); returns the progress line, None where
    nothing was enqueued or left out (every variant already in the study, on a resume or beside
    another worker, included). `model`: the workload's (None: a program's, built elsewhere), so
    that a lever the model cannot take is not enqueued (`Lever.refuse_for`); `predict(leader,
    its precision)`: the probes' predictions, asked only here, once a stage is due.
    `precisions`: the precisions the study's trials search (empty: one, the study's)."""
    if leader is None or not staged.wants(leader) or waiting(study):
        return None
    precision = leader.params.get(keys.PRECISION, precision)
    led = leader.params

    def variants(own: Predictions | None, moved: Predictions | None) -> list[Variant]:
        found = _variants(space, led, device_type, precision, model, own)
        return found + _into_float8(space, led, device_type, precision, precisions, model, moved)

    found = variants(None, None)
    # The probes (seconds of the device) only where a variant they predict could be enqueued:
    # in the leader's precision for its own levers, in float8 for a move into float8.
    if predict is not None:
        own = [v for v in found if v.lever != FLOAT8 and trainers.LEVERS[v.lever].probe]
        moved = [v for v in found if v.lever == FLOAT8]
        if own or moved:
            found = variants(
                predict(leader, precision) if own else None,
                predict(leader, FLOAT8, unconverted_levers()) if moved else None,
            )
    found = first_of_each_lever(sorted(found, key=_order))  # stable: ties keep declared order
    found = lost_before(
        found,
        led,
        study.get_trials(deepcopy=False) if len(study.directions) == 1 else (),
        levers=[*offered_levers(space), *staged_fields(space)],
        runs=lambda p: settings_of(space, p) | {keys.PRECISION: p.get(keys.PRECISION, precision)},
        margin=staged.margin,
    )
    chosen = [v for v in found if v.left_out is None]
    for variant in chosen:
        study.enqueue_trial(variant.params, skip_if_exists=True)
    staged.add(leader)
    enqueued = waiting(study)
    left_out = "; ".join(v.left_out for v in found if v.left_out is not None)
    if not enqueued and not left_out:
        return None
    said = f"second stage: trial {leader.number}{_changes(led, precision, chosen, enqueued)}"
    return said + (f"; left out: {left_out}" if left_out else "")


def _changes(
    leader: Mapping[str, Any], precision: str | None, chosen: list[Variant], enqueued: int
) -> str:
    """What the stage's line says it enqueued: each variant's changes (a move into float8,
    several settings at once, joined by "+"), with the gain the probes predicted for it where
    they did: a trial that then ties says how far the probe was off (2026-12-02: the Qwen1.5
    shape's `float8_linears=none` was enqueued on a prediction and tied, and no line said by
    how much it was predicted to gain)."""

    def said(variant: Variant) -> str:
        p = variant.params
        changes = ("+" if p.get(keys.PRECISION) != precision else ", ").join(
            f"{k}={v}" for k, v in p.items() if leader.get(k) != v
        )
        if changes and variant.gain is not None:
            changes += f" predicted {variant.gain:+.2f} ms a step"
        return changes

    levers = ", ".join(filter(None, map(said, chosen)))
    if not levers:
        return ""
    into = precision != FLOAT8 and any(v.params.get(keys.PRECISION) == FLOAT8 for v in chosen)
    return (
        " with one lever changed each"
        + (", or moved into float8" if into else "")
        + f" ({levers}): {enqueued} enqueued"
    )
