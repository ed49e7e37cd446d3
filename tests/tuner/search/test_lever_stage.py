"""The second stage (tuner.search.proposing.levers): the leader with each lever module's lever the
space searches, one at a time, refused combinations left out, cheapest first; real Optuna on
SQLite."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import FrozenTrial, TrialState, create_trial

import trainers
from tests.tuner.search.test_search import _complete_values, _expected_stop, _Phases
from tests.tuner.tiny import load, options, sqlite_url
from trainers.levers.loss import LOSS
from trainers.workloads import load_workload
from tuner.errors import SpaceError
from tuner.search.options import LocalSlots
from tuner.search.proposing.levers import (
    Prober,
    Staged,
    lever_stage,
    offered_levers,
    second_stage,
    waiting,
)
from tuner.search.proposing.predictions import Predictions
from tuner.search.spaces.named import load_space, without_model_refusals
from tuner.search.spaces.space import Choice, IntRange, SearchSpace
from tuner.search.study import open_search
from tuner.store import keys

LOSSES = Choice(values=("model", "compiled"))
# A space of one's own: the scale levers, and three lever modules' levers searched beside them.
SPACE = SearchSpace(
    name="own",
    params={
        "compile_scope": Choice(values=("blocks", "model")),
        "micro_batches": Choice(values=(1, 2)),
        "attention": Choice(values=("default", "cudnn")),
        "kernels": Choice(values=("torch", "liger")),
        "loss": LOSSES,
    },
    fixed={"compile": "default", "optimizer": "fused", "num_workers": 2},
)
PLAIN = {"micro_batches": 1, "attention": "default", "kernels": "torch", "loss": "model"}


def test_only_the_lever_modules_levers_are_staged() -> None:
    assert list(offered_levers(SPACE)) == ["attention", "kernels", "loss"]
    scale_only = SearchSpace(name="s", params={"micro_batches": IntRange(low=1, high=4)}, fixed={})
    assert offered_levers(scale_only) == {}
    # A space file of one's own lists them as it lists any setting.
    own = load_space({"compile_scope": ["blocks", "model"], "loss": ["model", "compiled"]})
    assert offered_levers(own) == {"loss": ("model", "compiled")}


def test_each_layer_compiled_gets_every_lever_one_at_a_time_cheapest_first() -> None:
    leader = {"compile_scope": "blocks"} | PLAIN
    staged = lever_stage(SPACE, leader, device_type="cuda", precision="bf16-autocast")
    changed = [{k: v for k, v in p.items() if leader[k] != v} for p in staged]
    # cuDNN attention costs nothing once; liger's kernels and the compiled loss cost a compile,
    # in the order their modules registered them.
    assert changed == [{"attention": "cudnn"}, {"kernels": "liger"}, {"loss": "compiled"}]
    assert all(set(p) == set(leader) for p in staged)


def test_what_the_harness_refuses_beside_the_leader_or_here_is_left_out() -> None:
    whole = {"compile_scope": "model"} | PLAIN
    # The whole model compiled: liger's loss cannot be traced, the loss is already compiled.
    staged = lever_stage(SPACE, whole, device_type="cuda", precision="bf16-autocast")
    assert staged == [whole | {"attention": "cudnn"}]
    # On a CPU none runs: cuDNN attention and liger need CUDA, and the whole model is compiled.
    assert lever_stage(SPACE, whole, device_type="cpu", precision="fp32") == []


def test_the_head_in_float8_is_staged_only_for_a_float8_leader() -> None:
    """`float8_head`'s `refuse_in`: outside float8 the run would refuse it at its start, so the
    stage leaves it out rather than enqueue a trial that fails."""
    space = SearchSpace(
        name="own",
        params={
            "compile_scope": Choice(values=("blocks", "model")),
            "float8_head": Choice(values=("bf16", "float8")),
        },
        fixed={"compile": "default"},
    )
    leader = {"compile_scope": "blocks", "float8_head": "bf16"}
    assert lever_stage(space, leader, device_type="cuda", precision="bf16-autocast") == []
    assert lever_stage(space, leader | {keys.PRECISION: "bf16-autocast"}, device_type="cuda") == []
    assert lever_stage(space, leader, device_type="cuda", precision="float8") == [
        leader | {"float8_head": "float8"}
    ]


def test_a_leader_on_a_lever_is_tried_back_at_the_default_and_keeps_its_precision() -> None:
    leader = {"compile_scope": "blocks", keys.PRECISION: "float8"} | PLAIN | {"kernels": "liger"}
    staged = lever_stage(SPACE, leader, device_type="cuda")
    assert {"kernels": "torch"} in [{k: v for k, v in p.items() if leader[k] != v} for p in staged]
    # liger beside cuDNN attention and beside the compiled loss: the second is refused.
    assert all(p[keys.PRECISION] == "float8" for p in staged)
    assert not any(p["loss"] == "compiled" and p["kernels"] == "liger" for p in staged)


def _leader(study: optuna.Study, params: dict[str, Any], value: float) -> None:
    study.add_trial(
        create_trial(
            params=params,
            distributions=SPACE.distributions(),
            value=value,
            user_attrs={keys.PRECISION: "bf16-autocast"},
        )
    )


def _stage(
    study: optuna.Study, leader: FrozenTrial | None, staged: Staged, **given: Any
) -> str | None:
    """`second_stage` on SPACE, on a GPU in bf16 unless `given` says otherwise."""
    values: dict[str, Any] = {"device_type": "cuda", "precision": "bf16-autocast"} | given
    return second_stage(study, SPACE, leader, staged=staged, **values)


def _drain(study: optuna.Study) -> None:
    """The enqueued trials run, each slower than any leader here."""
    for _ in range(waiting(study)):
        study.tell(study.ask(SPACE.distributions()), 1.0)


def test_the_stage_is_enqueued_once_per_leader_and_only_once_nothing_waits(
    tmp_path: Path,
) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    staged = Staged(margin=0.02)
    assert _stage(study, None, staged) is None  # no leader yet
    _leader(study, {"compile_scope": "blocks"} | PLAIN, 10.0)
    leader = study.trials[0]
    said = _stage(study, leader, staged)
    assert said is not None and said.startswith("second stage: trial 0 with one lever changed")
    assert said.endswith("(attention=cudnn, kernels=liger, loss=compiled): 3 enqueued")
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"]["loss"] for t in queued] == [
        "model",
        "model",
        "compiled",
    ]
    assert _stage(study, leader, Staged(margin=0.02)) is None  # something still waits
    _drain(study)
    assert waiting(study) == 0
    assert _stage(study, leader, staged) is None  # once per leader
    # A new leader within the tie margin of the staged one gets none; one beyond it does.
    _leader(study, {"compile_scope": "model"} | PLAIN, 10.1)
    assert _stage(study, study.trials[-1], staged) is None and waiting(study) == 0
    _leader(study, {"compile_scope": "blocks"} | PLAIN | {"attention": "cudnn"}, 12.0)
    said = _stage(study, study.trials[-1], staged)
    # Its way back to the default attention is trial 0's config: not enqueued again. liger's
    # kernels and the compiled loss ran behind trial 0, apart from this leader in its attention
    # alone: left out on those measurements (tuner.search.proposing.cuts).
    assert said is not None and waiting(study) == 0
    assert said.count("measured it at 1.0 samples/s against trial 0's 10.0") == 2, said


def test_a_variant_already_in_the_study_is_not_enqueued_again(tmp_path: Path) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    first = {"compile_scope": "blocks"} | PLAIN
    _leader(study, first | {"attention": "cudnn"}, 9.0)  # already measured
    _leader(study, first, 10.0)
    _stage(study, study.trials[-1], Staged(margin=0.02))
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.system_attrs["fixed_params"]["kernels"] for t in queued) == ["liger", "torch"]


def test_a_leader_with_a_setting_it_leaves_unused_still_gets_its_stage() -> None:
    space = SearchSpace(
        name="own",
        params={
            "activation_checkpointing": Choice(values=("none", "blocks")),
            "checkpoint_share": Choice(values=(1.0, 0.5)),
            "attention": Choice(values=("default", "cudnn")),
        },
        fixed={"compile": "default", "compile_scope": "model"},
    )
    # Sampled apart, the share is 0.5 beside no checkpointing, which leaves it unused: the
    # variant holds the share as the config runs it.
    leader = {"activation_checkpointing": "none", "checkpoint_share": 0.5, "attention": "default"}
    staged = lever_stage(space, leader, device_type="cuda", precision="bf16-autocast")
    assert staged == [leader | {"checkpoint_share": 1.0, "attention": "cudnn"}]


def _space_file(tmp_path: Path) -> str:
    path = tmp_path / "own.json"
    path.write_text(json.dumps({"num_streams": [1, 2], "loss": ["model", "compiled"]}))
    return str(path)


OWN_LOSS = "tests.tuner.workloads_for_tests:own_loss_function"


@pytest.mark.parametrize("trials", [1, 2])
def test_a_run_enqueues_its_leaders_stage_only_while_trials_remain(
    tmp_path: Path, trials: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loss lever without its probe, which on this CPU predicts no gain (next test).
    monkeypatch.setitem(trainers.LEVERS, "loss", dataclasses.replace(LOSS, probe=None))
    storage = sqlite_url(tmp_path)
    opts = options(
        storage, "stage", trials=trials, space=_space_file(tmp_path), patience=0, workload=OWN_LOSS
    )
    ran, lines = _run_staged(opts, trials)
    assert not [t for t in ran if t.state == TrialState.WAITING]  # nothing left for `revive`
    assert len(ran) == trials
    if trials == 2:
        # The leader with its loss function compiled, which this model has: it runs on a CPU.
        assert ran[1].params == {"num_streams": 1, "loss": "compiled"}
        assert ran[1].state == TrialState.COMPLETE, ran[1].user_attrs
        assert any(line.startswith("second stage: trial 0") for line in lines)


def test_a_run_leaves_out_what_its_probe_predicts_gains_too_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run whose loss lever's probe predicts no gain (the same milliseconds either way,
    fixed here: a CPU's timing of a 4 x 3 cross-entropy is noise): the stage enqueues nothing
    and says why; the probe runs once."""
    probed: list[object] = []

    def no_gain(where: object) -> dict[Any, float | str]:
        probed.append(where)
        return {"model": 1.0, "compiled": 1.0}

    monkeypatch.setitem(trainers.LEVERS, "loss", dataclasses.replace(LOSS, probe=no_gain))
    storage = sqlite_url(tmp_path)
    opts = options(
        storage, "stage", trials=3, space=_space_file(tmp_path), patience=0, workload=OWN_LOSS
    )
    ran, lines = _run_staged(opts, 3)
    assert [t.number for t in ran if "fixed_params" in t.system_attrs] == [0]
    said = [line for line in lines if line.startswith("second stage: trial 0")]
    assert said and "left out: loss=compiled: predicted +0.00" in said[0]
    assert "enqueued" not in said[0], said
    assert len(probed) == 1


def test_a_lever_the_model_cannot_take_is_not_enqueued(tmp_path: Path) -> None:
    """The mlp has no loss function of its own (`Lever.refuse_for`): its leader's stage is
    empty, where it was a trial enqueued to fail in one line."""
    storage = sqlite_url(tmp_path)
    opts = options(storage, "stage", trials=2, space=_space_file(tmp_path), patience=0)
    ran, lines = _run_staged(opts, 2)
    assert [t.number for t in ran if "fixed_params" in t.system_attrs] == [0]
    assert not any(line.startswith("second stage") for line in lines)


def test_a_value_the_model_cannot_take_is_left_out_of_its_space(tmp_path: Path) -> None:
    """The mlp has no loss function of its own: its space searches no compiled loss (drawn, it
    could only be refused). A built-in space stores no trace of it, so a study stored before
    the lever was offered resumes; a space of one's own that asked for it says why it is fixed.
    A workload with one keeps the lever searched."""
    storage = sqlite_url(tmp_path)
    plain = open_search(options(storage, "plain", space=_space_file(tmp_path)))
    own = open_search(options(storage, "own", workload=OWN_LOSS, space=_space_file(tmp_path)))
    try:
        assert "loss" not in plain.space.params and plain.space.fixed["loss"] == "model"
        assert [n for n in plain.space.notes if n.startswith("loss")] == [
            "loss compiled left out: Sequential cannot take it"
        ]
        scale = without_model_refusals(load_space("scale"), plain.measurer.workload.model)
        assert "loss" not in scale.params and "loss" not in scale.fixed
        assert scale.notes == load_space("scale").notes
        assert own.space.params["loss"] == Choice(values=("model", "compiled"))
    finally:
        plain.close()
        own.close()


def test_a_pin_the_model_cannot_take_fails_before_a_study_is_stored(tmp_path: Path) -> None:
    """A pinned value the model refuses (`Lever.refuse_for`) is in every draw: the job fails
    before its first trial, naming the pin and what the model allows in the lever's own words
    (`tuner.search.spaces.pinned`), and stores nothing."""
    storage = sqlite_url(tmp_path)
    space = tmp_path / "streams.json"
    space.write_text(json.dumps({"num_streams": [1, 2]}))
    opts = options(
        storage,
        "refuse",
        trials=1,
        space=str(space),
        patience=0,
        fix=("num_workers=0", "loss=compiled"),
    )
    with pytest.raises(SpaceError) as caught:
        open_search(opts)
    assert caught.value.field == "loss" and caught.value.value == "compiled"
    expected = trainers.invalid_reason({"loss": "compiled"}, model=_mlp_model())
    assert expected and expected.endswith(caught.value.allowed), (expected, caught.value.allowed)
    assert optuna.study.get_all_study_names(storage) == []


@pytest.mark.parametrize(
    ("pin", "field"),
    [
        ("activation_checkpointing=blocks", "activation_checkpointing"),
        ("compile_scope=blocks", "compile_scope"),
    ],
)
def test_a_block_lever_pinned_on_a_model_without_blocks_fails_before_a_study_is_stored(
    tmp_path: Path, pin: str, field: str
) -> None:
    # Every trial had failed, and the job recommended a baseline that ignored the pin.
    storage = sqlite_url(tmp_path)
    with pytest.raises(SpaceError) as caught:
        open_search(options(storage, "blocks", trials=1, patience=0, fix=(pin,)))
    assert caught.value.field == field and "no repeated blocks" in caught.value.allowed
    assert optuna.study.get_all_study_names(storage) == []


def _mlp_model() -> torch.nn.Module:
    return load_workload("mlp", "tiny").model


def _run_staged(opts: Any, trials: int) -> tuple[list[FrozenTrial], list[str]]:
    search = open_search(opts)
    progress = _Phases()
    search.progress = progress
    try:
        search.study.enqueue_trial({"num_streams": 1, "loss": "model"})
        search.run_trials(LocalSlots(trials))
    finally:
        search.close()
    return load(opts.storage, opts.study).get_trials(), progress.lines


def test_the_probes_leave_out_what_gains_too_little_and_order_the_rest() -> None:
    """`Predictions`: a value predicted to gain no more than the floor (the tie margin of the
    leader's step), or that cannot run the model's calls, is left out naming why; a lever whose
    probe found none of its work in the model is left out; a lever without a probe is kept;
    the larger predicted gain goes first among values of one cost."""
    leader = {"compile_scope": "blocks"} | PLAIN
    ms = {"attention": {"default": 20.0, "cudnn": 19.5}, "loss": {}}
    kept = Predictions(ms=ms, floor_ms=0.2)
    assert kept.gain("attention", "default", "cudnn") == pytest.approx(0.5)
    assert kept.gain("kernels", "torch", "liger") is None  # no probe: no prediction
    assert "does none of the work it changes" in str(kept.gain("loss", "model", "compiled"))
    staged = lever_stage(SPACE, leader, device_type="cuda", precision="bf16-autocast")
    assert len(staged) == 3
    predicted = lever_stage(
        SPACE, leader, device_type="cuda", precision="bf16-autocast", predictions=kept
    )
    assert [{k: v for k, v in p.items() if leader[k] != v} for p in predicted] == [
        {"attention": "cudnn"},
        {"kernels": "liger"},
    ]
    too_little = Predictions(ms=ms, floor_ms=0.6)
    why = too_little.gain("attention", "default", "cudnn")
    assert isinstance(why, str) and "predicted +0.50 ms a step against default" in why
    cannot = Predictions(
        ms={"attention": {"default": 20.0, "cudnn": "No available kernel"}}, floor_ms=0
    )
    assert cannot.gain("attention", "default", "cudnn") == "attention=cudnn: No available kernel"
    # Of one lever's values, the larger predicted gain alone (a probe ranks them).
    three = SearchSpace(
        name="own",
        params={"attention": Choice(values=("default", "cudnn", "flash"))},
        fixed={"compile": "default"},
    )
    ordered = Predictions(
        ms={"attention": {"default": 20.0, "cudnn": 19.0, "flash": 15.0}}, floor_ms=0.1
    )
    ahead = lever_stage(three, {"attention": "default"}, device_type="cuda", predictions=ordered)
    assert [p["attention"] for p in ahead] == ["flash"]
    # A value the probe did not time is unpredicted: kept beside the lever's first.
    untimed = Predictions(ms={"attention": {"default": 20.0, "flash": 15.0}}, floor_ms=0.1)
    ahead = lever_stage(three, {"attention": "default"}, device_type="cuda", predictions=untimed)
    assert [p["attention"] for p in ahead] == ["flash", "cudnn"]
    # Another lever keeps its own first (the compiled loss costs a compile: after attention).
    crossed = SearchSpace(
        name="own",
        params=three.params | {"compile_scope": SPACE.params["compile_scope"], "loss": LOSSES},
        fixed={"compile": "default"},
    )
    both = Predictions(ms={**ordered.ms, "loss": {"model": 9.0, "compiled": 8.0}}, floor_ms=0.1)
    leader = {"attention": "default", "compile_scope": "blocks", "loss": "model"}
    ahead = lever_stage(crossed, leader, device_type="cuda", predictions=both)
    assert _moves(ahead, leader) == [{"attention": "flash"}, {"loss": "compiled"}]


def test_a_study_without_a_precision_does_not_stage_the_head_in_float8() -> None:
    """A study of no `--precision` runs in float32: `float8_head`'s precision rule refuses it
    there, as the run would."""
    space = SearchSpace(
        name="own", params={"float8_head": Choice(values=("bf16", "float8"))}, fixed={}
    )
    assert lever_stage(space, {"float8_head": "bf16"}, device_type="cuda", precision=None) == []


def test_the_probes_are_not_asked_where_no_variant_they_predict_could_be_enqueued(
    tmp_path: Path,
) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    asked: list[int] = []

    def predict(leader: FrozenTrial, precision: str | None) -> Predictions:
        asked.append(leader.number)
        return Predictions(ms={}, floor_ms=0.0)

    # On a CPU every variant here is refused (cuDNN attention, liger), the compiled loss too:
    # nothing to predict, so no forward of the model is spent on it.
    _leader(study, {"compile_scope": "model"} | PLAIN, 10.0)
    said = _stage(
        study,
        study.trials[0],
        Staged(margin=0.02),
        device_type="cpu",
        precision="fp32",
        predict=predict,
    )
    assert said is None and asked == []


def test_the_stage_asks_the_probes_once_due_and_says_what_they_left_out(tmp_path: Path) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    asked: list[tuple[int, str | None]] = []

    def predict(leader: FrozenTrial, precision: str | None) -> Predictions:
        asked.append((leader.number, precision))
        return Predictions(ms={"attention": {"default": 20.0, "cudnn": 19.99}}, floor_ms=1.0)

    staged = Staged(margin=0.02)
    _leader(study, {"compile_scope": "blocks"} | PLAIN, 10.0)
    said = _stage(study, study.trials[0], staged, predict=predict)
    assert asked == [(0, "bf16-autocast")]
    assert said is not None and "(kernels=liger, loss=compiled): 2 enqueued" in said, said
    assert "left out: attention=cudnn: predicted +0.01 ms" in said
    # Not due (the leader is staged already): the probes are not asked again.
    _drain(study)
    _stage(study, study.trials[0], staged, predict=predict)
    assert len(asked) == 1


def test_a_search_probes_its_own_workload_once_per_precision(tmp_path: Path) -> None:
    """The `Prober`, on a real search's measurer: the transformer's own SDPA calls timed on this
    CPU, the floor the tie margin of the leader's step, the seconds counted as measurement; not
    run again. (On a CPU the search's own space drops the CUDA kernels: the stage's space here
    keeps them, as a GPU's would.)"""
    search = open_search(options(sqlite_url(tmp_path), "probed", workload="transformer"))
    said: list[str] = []
    try:
        prober = Prober(
            search.measurer,
            SPACE,
            0.05,
            timing=lambda: search.clock.timing("measure"),
            say=said.append,
        )
        leader = create_trial(
            params={"compile_scope": "blocks"} | PLAIN,
            distributions=SPACE.distributions(),
            value=100.0,
        )
        before = search.clock.seconds["measure"]
        predictions = prober(leader, "bf16-autocast")
        assert predictions is not None and not said, said
        assert isinstance(predictions.ms["attention"]["default"], float)
        samples = search.measurer.workload.samples_per_batch
        assert predictions.floor_ms == pytest.approx(samples / 100.0 * 1e3 * 0.05)
        assert search.clock.seconds["measure"] > before
        again = prober(leader, "bf16-autocast")
        assert again is not None and again.ms is predictions.ms
        assert set(prober.probed) == {"bf16-autocast"}
        # A leader with no throughput (every window failed to count) gets no prediction.
        stalled = create_trial(
            params=dict(leader.params), distributions=SPACE.distributions(), value=0.0
        )
        assert prober(stalled, "bf16-autocast") is None
    finally:
        search.close()


def test_a_probe_whose_values_cannot_run_in_the_leaders_precision_is_not_run(
    tmp_path: Path,
) -> None:
    """The float8 head's probe (a compile of the head, its logits in memory) only for a float8
    leader: a bf16 leader could not take its value, so nothing it predicts would be enqueued."""
    search = open_search(options(sqlite_url(tmp_path), "probed", workload="transformer"))
    space = dataclasses.replace(
        SPACE, params=SPACE.params | {"float8_head": Choice(values=("bf16", "float8"))}
    )
    try:
        timing = lambda: search.clock.timing("measure")  # noqa: E731
        said: list[str] = []
        prober = Prober(search.measurer, space, 0.05, timing=timing, say=said.append)
        leader = create_trial(
            params={"compile_scope": "blocks"} | PLAIN | {"float8_head": "bf16"},
            distributions=space.distributions(),
            value=100.0,
        )
        bf16 = prober(leader, "bf16-autocast")
        assert bf16 is not None and "attention" in bf16.ms and "float8_head" not in bf16.ms
        assert not said
        # In float8 it is run: on this CPU the run's float8 plan refuses the device, which the
        # stage says, leaving the lever unpredicted.
        float8 = prober(leader, "float8")
        assert float8 is not None and "float8_head" not in float8.ms
        assert any(line.startswith("the float8_head lever's probe failed") for line in said)
    finally:
        search.close()


def test_patience_waits_for_the_trials_a_stage_enqueued(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    # A 99 % margin: almost no trial gains, so patience 2 alone stops the run after about 3.
    opts = options(storage, "staged", trials=40, patience=2, tie_margin=0.99, baseline_every=100)
    search = open_search(opts)
    try:
        for _ in range(5):
            search.study.enqueue_trial({})
        search.run_trials(LocalSlots(40))
    finally:
        search.close()
    values = _complete_values(storage, "staged")
    # The rule alone almost always stops before the five (a 99 % margin); the run waited for
    # them. (A loaded CPU can run a trial twice as fast as the first, a gain even at 99 %: CI,
    # 2026-12-06, 1452 then 3105 samples/s. Then the rule itself had not stopped early.)
    assert len(values) >= 5
    # After the five, the rule as before: the first count from 5 on whose last 2 did not gain.
    assert len(values) == _expected_stop(values, 2, 0.99, first=5 - 2)


# A space that may run float8: the float8-only levers beside the compile scope.
FLOAT8_SPACE = SearchSpace(
    name="own",
    params={
        "compile_scope": Choice(values=("blocks", "model")),
        "float8_head": Choice(values=("bf16", "float8")),
        "float8_linears": Choice(values=("all", "8M", "none")),
    },
    fixed={"compile": "default"},
)
BOTH = ("bf16-autocast", "float8")
# Their probes in float8: the head gains 4 ms; every linear in float8 loses 5 ms against bf16
# ("none", what a bf16 step runs), 8M 2 ms.
IN_FLOAT8 = {
    "float8_head": {"bf16": 10.0, "float8": 6.0},
    "float8_linears": {"all": 30.0, "8M": 27.0, "none": 25.0},
}


def _moves(staged: list[dict[str, Any]], leader: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in p.items() if leader.get(k) != v} for p in staged]


def test_a_bf16_leader_is_moved_into_float8_where_the_probes_predict_a_gain() -> None:
    """The leader in float8 with each combination of the float8 levers' values and their
    `unconverted` one (`none`), the head in bf16 beside `none` refused; predicted against what a
    bf16 step runs (the head in bf16, no linear in float8), summed; largest gain first."""
    leader = {"compile_scope": "model", "float8_head": "bf16", "float8_linears": "all"}
    leader |= {keys.PRECISION: "bf16-autocast"}
    predicted = Predictions(ms=IN_FLOAT8, floor_ms=1.0)
    head_alone = {"float8_head": "float8", "float8_linears": "none"}
    assert predicted.into(head_alone, head_alone) == 4.0
    mlp = {"float8_head": "float8", "float8_linears": "8M"}
    assert predicted.into(mlp, mlp) == 2.0
    plain = {"float8_head": "bf16", "float8_linears": "all"}
    why = predicted.into(plain, plain)
    assert isinstance(why, str) and why.startswith("float8 with float8_head=bf16, float8_lin")
    assert "predicted -5.00 ms a step against the leader's" in why
    staged = lever_stage(
        FLOAT8_SPACE, leader, device_type="cuda", precisions=BOTH, in_float8=predicted
    )
    assert _moves(staged, leader) == [
        {keys.PRECISION: "float8", "float8_head": "float8", "float8_linears": "none"},
        {keys.PRECISION: "float8", "float8_head": "float8", "float8_linears": "8M"},
    ]
    # A floor above the head's gain leaves every move out.
    higher = Predictions(ms=IN_FLOAT8, floor_ms=4.0)
    assert (
        lever_stage(FLOAT8_SPACE, leader, device_type="cuda", precisions=BOTH, in_float8=higher)
        == []
    )


def test_a_move_into_float8_is_staged_only_where_float8_may_run_and_is_predicted() -> None:
    leader = {"compile_scope": "model", "float8_head": "bf16", "float8_linears": "all"}
    bf16 = leader | {keys.PRECISION: "bf16-autocast"}
    predicted = Predictions(ms=IN_FLOAT8, floor_ms=1.0)
    # A study of one precision, or one whose trials cannot run float8: no move.
    for precisions in ((), ("bf16-autocast", "fp32")):
        assert (
            lever_stage(
                FLOAT8_SPACE, bf16, device_type="cuda", precisions=precisions, in_float8=predicted
            )
            == []
        )
    # Not predicted (no probe ran in float8), or a probe without a figure: left out.
    assert lever_stage(FLOAT8_SPACE, bf16, device_type="cuda", precisions=BOTH) == []
    partial = Predictions(ms={"float8_head": IN_FLOAT8["float8_head"]}, floor_ms=1.0)
    head_alone = {"float8_head": "float8", "float8_linears": "none"}
    why = partial.into(head_alone, head_alone)
    assert isinstance(why, str) and why.endswith("no probe predicted it")
    # From fp32 (or fp16, tf32) no move: the probes' figures are bf16's.
    fp32 = leader | {keys.PRECISION: "fp32"}
    assert (
        lever_stage(
            FLOAT8_SPACE,
            fp32,
            device_type="cuda",
            precisions=("fp32", "float8"),
            in_float8=predicted,
        )
        == []
    )
    # Where float8 cannot run a value, the probe's figure says why.
    cannot = Predictions(
        ms={
            "float8_head": {"bf16": 1.0, "float8": "needs compute capability 8.9"},
            "float8_linears": {"all": 1.0, "8M": 1.0, "none": 1.0},
        },
        floor_ms=0.0,
    )
    why = cannot.into(head_alone, head_alone)
    assert isinstance(why, str) and "float8_head=float8: needs compute capability" in why
    # A float8 leader gets its own levers one at a time, and no move.
    float8 = leader | {keys.PRECISION: "float8"}
    staged = lever_stage(
        FLOAT8_SPACE, float8, device_type="cuda", precisions=BOTH, in_float8=predicted
    )
    assert _moves(staged, float8) == [{"float8_head": "float8"}, {"float8_linears": "8M"}]


def test_the_stage_probes_in_float8_for_a_move_and_enqueues_it_in_float8(tmp_path: Path) -> None:
    """`second_stage` on a real study: a bf16 leader whose only variants are moves asks the
    probes in float8 alone, enqueues the predicted move with its precision, and says so."""
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    distributions = FLOAT8_SPACE.distributions() | {
        keys.PRECISION: optuna.distributions.CategoricalDistribution(list(BOTH))
    }
    leader = {"compile_scope": "model", "float8_head": "bf16", "float8_linears": "all"}
    study.add_trial(
        create_trial(
            params=leader | {keys.PRECISION: "bf16-autocast"},
            distributions=distributions,
            value=10.0,
        )
    )
    asked: list[tuple[int, str | None, Any]] = []

    def predict(trial: FrozenTrial, precision: str | None, names: Any = None) -> Predictions:
        asked.append((trial.number, precision, names))
        return Predictions(ms=IN_FLOAT8, floor_ms=3.0)

    said = second_stage(
        study,
        FLOAT8_SPACE,
        study.trials[0],
        device_type="cuda",
        precision=None,
        staged=Staged(margin=0.02),
        predict=predict,
        precisions=BOTH,
    )
    # The float8 levers' probes alone, whether the space searches them or not.
    assert asked == [(0, "float8", ("float8_head", "float8_linears"))]
    assert (
        said is not None
        and "or moved into float8 (float8_head=float8+float8_linears=none+precision=float8 "
        "predicted +4.00 ms a step): 1 enqueued; left out: "
        in said
    ), said
    assert "float8 with float8_head=float8, float8_linears=8M: predicted +2.00 ms" in said
    trial = study.ask(distributions)
    assert trial.params == {
        "compile_scope": "model",
        "float8_head": "float8",
        "float8_linears": "none",
        keys.PRECISION: "float8",
    }


def test_a_move_is_predicted_with_the_float8_levers_the_space_does_not_search() -> None:
    """A space that searches the head alone (a study stored before float8_linears, or one of
    one's own): the move still runs every other linear in float8, so the linears' figure counts
    at the lever's default (`all`), and the head's 4 ms do not outweigh their 5."""
    head_only = dataclasses.replace(
        FLOAT8_SPACE, params={k: v for k, v in FLOAT8_SPACE.params.items() if k != "float8_linears"}
    )
    leader = {"compile_scope": "model", "float8_head": "bf16", keys.PRECISION: "bf16-autocast"}
    predicted = Predictions(ms=IN_FLOAT8, floor_ms=0.5)
    assert (
        lever_stage(head_only, leader, device_type="cuda", precisions=BOTH, in_float8=predicted)
        == []
    )
    cheaper = {"float8_head": {"bf16": 10.0, "float8": 4.0}} | {
        "float8_linears": IN_FLOAT8["float8_linears"]
    }
    staged = lever_stage(
        head_only,
        leader,
        device_type="cuda",
        precisions=BOTH,
        in_float8=Predictions(ms=cheaper, floor_ms=0.5),
    )
    assert _moves(staged, leader) == [{"float8_head": "float8", keys.PRECISION: "float8"}]
