"""Screen, then gate (`tuner.search.proposing.screen`) and predict before running
(`tuner.search.proposing.predict`), through the real search: real Optuna and SQLite under tmp_path,
real CPU runs of the tiny MLP.

The incumbent a trial is held against is the fastest complete trial of the study. A test plants
one where it needs a known figure: a complete trial added to the real study, as a worker sharing
the study would have told it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from api.schemas.jobs import TrialOut
from tests.tuner.tiny import PROTOCOL, load, options, run_json, sqlite_url
from trainers import LoopConfig
from tuner.evidence import reader
from tuner.evidence.render import search_text
from tuner.evidence.unrun import pruned_reason
from tuner.search.gating.memo import MEMO_ENV
from tuner.search.measuring.artifacts import save
from tuner.search.options import LocalSlots, RunOptions
from tuner.search.proposing import predict as pr
from tuner.search.proposing.screen import (
    SCREEN_WINDOWS,
    Incumbent,
    incumbent,
    measured_before,
    screen_record,
    screening,
)
from tuner.search.spaces.space import candidate_key
from tuner.search.study import open_search
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.phases import GATE_ENVELOPE, GATE_REFERENCE, study_time


def _one_point(tmp_path: Path, sync_interval: int = 3) -> str:
    space = tmp_path / f"one-point-{sync_interval}.json"
    space.write_text(json.dumps({"num_streams": [2], "sync_interval": sync_interval}))
    return str(space)


def _screened(storage: str, study: str, space: str, **changes: Any) -> RunOptions:
    return options(storage, study, **({"space": space, "fix": (), "screen": "on"} | changes))


def _plant(study: optuna.Study, config: LoopConfig, **attrs: Any) -> int:
    """A finished trial of `config` added to the study (as another worker would have told it)."""
    state = attrs.pop("state", TrialState.COMPLETE)
    value = attrs.get("median")
    trial = optuna.trial.create_trial(
        state=state,
        value=value if state == TrialState.COMPLETE else None,
        user_attrs={
            keys.CONFIG: config.to_dict(),
            keys.CONFIG_KEY: candidate_key(config, None, None),
            **attrs,
        },
    )
    study.add_trial(trial)
    return study.trials[-1].number


def _run_one(opts: RunOptions, plant: dict[str, Any]) -> optuna.trial.FrozenTrial:
    """Open the search, plant a trial of the space's one config, run one trial; that trial."""
    search = open_search(opts)
    try:
        config = search.space.config_from_params({"num_streams": 2})
        _plant(search.study, config, **plant)
        search.run_trials(LocalSlots(1))
    finally:
        search.close()
    return load(opts.storage or "", opts.study or "").trials[-1]


def _row(storage: str, study: str, number: int) -> dict[str, Any]:
    """Trial `number`'s row as the service serves it (`GET /jobs/{id}/trials`), checked against
    the API's schema."""
    rows, _ = reader.StudyReader(studies.open_storage(storage)).trials(study, limit=50, offset=0)
    (row,) = [r for r in rows if r["number"] == number]
    assert TrialOut.model_validate(row).model_dump(mode="json").keys() == row.keys()
    return row


def test_a_slower_screen_is_pruned_and_never_gated(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    opts = _screened(storage, "slower", _one_point(tmp_path))
    # An incumbent no CPU run can come near: the trial loses on its screen.
    trial = _run_one(opts, {"median": 1e12, keys.WINDOWS: [1e12]})
    assert trial.state == TrialState.PRUNED
    record = trial.user_attrs[keys.SCREEN]
    assert record["stage"] == "screen" and record["outcome"] == "lost"
    assert record["incumbent"]["throughput"] == 1e12
    # The service's row says why, as the CLI's line does.
    row = _row(storage, "slower", trial.number)
    assert row["state"] == "pruned" and row["same_as"] is None
    assert row["pruned_reason"] == pruned_reason(trial.user_attrs)
    assert (
        f"below trial {record['incumbent']['trial']}'s 1,000,000,000,000.0" in row["pruned_reason"]
    )
    # Stopped after its screen, before the protocol's other windows.
    assert PROTOCOL.windows > SCREEN_WINDOWS
    assert len(trial.user_attrs[keys.WINDOWS]) == SCREEN_WINDOWS
    # Never gated: no verdict on the trial, none cached on the study, no reference measured.
    study = load(storage, "slower")
    assert keys.PARITY not in trial.user_attrs
    assert not [k for k in study.user_attrs if k.startswith(keys.PARITY_PREFIX)]
    assert keys.ENVELOPE not in study.user_attrs


def test_a_trial_that_ties_goes_on_and_is_gated_in_the_final_round(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    # The same config twice, at a margin no CPU noise crosses: the second ties the first.
    opts = _screened(storage, "ties", _one_point(tmp_path), trials=2, tie_margin=0.9)
    rec = run_json(opts)
    study = load(storage, "ties")
    first, second = study.trials
    assert keys.SCREEN not in first.user_attrs  # nothing to hold the first trial against
    assert second.user_attrs[keys.SCREEN]["outcome"] == "contender"
    assert second.user_attrs[keys.SCREEN]["incumbent"]["trial"] == 0
    for trial in (first, second):
        assert trial.state == TrialState.COMPLETE
        assert len(trial.user_attrs[keys.WINDOWS]) == PROTOCOL.windows  # measured whole
        assert trial.user_attrs[keys.GATE_DEFERRED] is True and keys.PARITY not in trial.user_attrs
    # Gated once, in the final round: its verdict is on the study and the recommendation.
    config_key = first.user_attrs[keys.CONFIG_KEY]
    assert study.user_attrs[f"{keys.PARITY_PREFIX}{config_key}"]["passed"] is True
    assert rec["search"]["screening"] is True
    assert rec["search"]["gated"] == 1 and rec["search"]["screened_out"] == 0
    assert rec["search"]["complete"] == 2


def test_a_candidate_predicted_not_to_fit_is_never_run(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    opts = _screened(storage, "oom", _one_point(tmp_path))
    # The same config ran out of memory before: keeping as many activations, this one cannot fit.
    trial = _run_one(
        opts, {"state": TrialState.FAIL, keys.FAILURE_KIND: "oom", keys.FAILURE_REASON: "oom"}
    )
    assert trial.state == TrialState.PRUNED
    prediction = trial.user_attrs[keys.PREDICTION]
    assert prediction["skip"] == "memory" and prediction["fits"] is False
    assert prediction["memory_basis"] == 0
    assert keys.WINDOWS not in trial.user_attrs  # never measured
    assert _row(storage, "oom", trial.number)["pruned_reason"] == f"not run: {prediction['reason']}"
    assert keys.PREDICTION_CHECK not in trial.user_attrs


def test_the_prediction_is_kept_beside_the_measurement(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    opts = _screened(storage, "kept", _one_point(tmp_path))
    # A slow earlier measurement of the same family: the basis of the speed prediction.
    trial = _run_one(opts, {"median": 1e-6, keys.WINDOWS: [1e-6]})
    assert trial.state == TrialState.COMPLETE
    prediction = trial.user_attrs[keys.PREDICTION]
    assert prediction["time_basis"] == 0 and prediction["skip"] is None
    assert prediction["throughput"] == pytest.approx(1e-6)
    assert prediction["incumbent"] == pytest.approx(1e-6)
    # Predicted to tie the incumbent, measured faster: not behind it either way.
    assert trial.user_attrs[keys.PREDICTION_CHECK] == {"fit_right": None, "order_right": True}
    assert trial.user_attrs["median"] > 1e-6


def test_a_later_job_reuses_the_reference_and_envelope_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across jobs on the same model, shape, precision and machine (`tuner.search.gating.memo`): the
    second job gates another config, against the first job's reference and envelope."""
    monkeypatch.setenv(MEMO_ENV, "on")
    storage = sqlite_url(tmp_path)
    first = run_json(_screened(storage, "first", _one_point(tmp_path, 3), trials=1))
    second = run_json(_screened(storage, "second", _one_point(tmp_path, 5), trials=1))
    assert first["search"]["reference_reused"] == []
    assert second["search"]["reference_reused"] == [keys.ENVELOPE]
    # The configs both jobs gated were not checked again. Which configs each gated depends on
    # the run (which config leads, which baselines the final round keeps): on a loaded machine
    # about one run in three shared none, so the reuse is asserted where both gated one.
    gated = [
        {k for k in load(storage, n).user_attrs if k.startswith(keys.PARITY_PREFIX)}
        for n in ("first", "second")
    ]
    reused = second["search"]["verdicts_reused"]
    assert first["search"]["verdicts_reused"] == 0
    assert (reused > 0) == bool(gated[0] & gated[1]), (reused, gated)
    said = search_text(second["search"]) or ""
    assert reused == 0 or f"{reused} gate verdicts reused" in said
    phases = [
        (study_time(load(storage, n).user_attrs) or {})["phases"] for n in ("first", "second")
    ]
    assert phases[0][GATE_REFERENCE] > 0 and phases[0][GATE_ENVELOPE] > 0
    assert phases[1].get(GATE_REFERENCE, 0.0) == 0.0 and phases[1].get(GATE_ENVELOPE, 0.0) == 0.0
    text = search_text(second["search"])
    assert text is not None and "reused from an earlier job" in text
    assert "reused" not in (search_text(first["search"]) or "")


# -- the rules, on their own -------------------------------------------------------------------


def test_screening_is_on_for_the_scale_space_unless_asked_otherwise() -> None:
    assert screening("auto", "scale", multi_objective=False)
    assert not screening("auto", "auto", multi_objective=False)
    assert screening("on", "auto", multi_objective=False)
    assert not screening("off", "scale", multi_objective=False)
    assert not screening("on", "scale", multi_objective=True)  # a slower one can be on the front


def test_a_bad_screen_mode_names_the_field() -> None:
    with pytest.raises(Exception, match=r"screen=.*auto, on, off"):
        options("sqlite://", "s", screen="sometimes")


def test_the_screen_holds_its_best_window_and_the_measurement_its_median() -> None:
    against = Incumbent(trial=4, throughput=100.0)
    # One stalled window does not prune a config whose other window ties.
    assert screen_record("screen", [50.0, 99.5], against, 0.01)["outcome"] == "contender"
    assert screen_record("screen", [50.0, 98.0], against, 0.01)["outcome"] == "lost"
    assert screen_record("measured", [50.0, 99.5, 98.0], against, 0.01)["outcome"] == "lost"
    assert screen_record("measured", [101.0], None, 0.01)["outcome"] == "contender"


def _known(number: int, precision: str | None = "bf16-autocast", **fields: Any) -> Any:
    config = LoopConfig(**fields.pop("config", {}))
    return pr._Known(
        number=number,
        config=config,
        precision=precision,
        throughput=fields.get("throughput"),
        peak_bytes=fields.get("peak"),
        out_of_memory=fields.get("oom", False),
    )


GB = 1_000_000_000
PLAIN = {"compile": "default", "compile_scope": "blocks"}


def test_memory_is_predicted_from_a_measured_peak_and_the_levers() -> None:
    params = 1_000_000_000  # 16 GB of state
    known = [_known(0, config=PLAIN, peak=56 * GB, throughput=10.0)]  # 40 GB of activations

    def peak(**levers: Any) -> pr.Prediction:
        return pr.predict(
            LoopConfig(**PLAIN, **levers),
            "bf16-autocast",
            known,
            parameters=params,
            device_bytes=80 * GB,
            incumbent=None,
            margin=0.01,
        )

    assert peak().peak_bytes == pytest.approx(56 * GB)
    assert peak(micro_batches=2).peak_bytes == pytest.approx(36 * GB)
    selective = peak(activation_checkpointing="selective").peak_bytes
    assert selective is not None and 16 * GB < selective < 56 * GB
    # Twice the batch's activations would not fit: 16 + 80 GB.
    doubled = [_known(0, config={**PLAIN, "micro_batches": 2}, peak=56 * GB)]
    over = pr.predict(
        LoopConfig(**PLAIN),
        "bf16-autocast",
        doubled,
        parameters=params,
        device_bytes=80 * GB,
        incumbent=None,
        margin=0.01,
    )
    assert over.fits is False and over.skip == "memory"
    # Another precision's measurement predicts nothing about this one's memory.
    other = pr.predict(
        LoopConfig(**PLAIN),
        "float8",
        known,
        parameters=params,
        device_bytes=80 * GB,
        incumbent=None,
        margin=0.01,
    )
    assert other.fits is None and not other.predicted


def test_recomputation_where_the_plain_step_fits_is_predicted_to_lose_and_skipped() -> None:
    known = [_known(0, config=PLAIN, throughput=100.0, peak=40 * GB)]
    best = Incumbent(trial=0, throughput=100.0)
    kwargs: dict[str, Any] = {
        "parameters": 10**9,
        "device_bytes": 80 * GB,
        "incumbent": best,
        "margin": 0.01,
    }
    selective = pr.predict(
        LoopConfig(**PLAIN, activation_checkpointing="selective"), "bf16-autocast", known, **kwargs
    )
    assert selective.skip == "slower" and selective.throughput == pytest.approx(100 / 1.10)
    # The other compile scope is another family: its speed is not predicted, it is measured.
    whole = pr.predict(
        LoopConfig(compile="default", compile_scope="model"), "bf16-autocast", known, **kwargs
    )
    assert whole.throughput is None and whole.skip is None
    # Checked against what the run gave: predicted to lose, and it did.
    checked = pr.check(selective.to_dict(), out_of_memory=False, throughput=90.0, margin=0.01)
    assert checked == {"fit_right": True, "order_right": True}
    wrong = pr.check(selective.to_dict(), out_of_memory=True, throughput=None, margin=0.01)
    assert wrong == {"fit_right": False, "order_right": None}


# -- an incumbent that cannot be recommended ---------------------------------------------------


def test_a_trial_screened_against_a_config_the_gate_fails_is_run_again_and_recommended(
    tmp_path: Path,
) -> None:
    """The incumbent is planted with a config that fails the gate (its data depend on the
    DataLoader worker: with a worker the losses differ). The real trial is screened out against
    it; before the final round the gate fails the incumbent, and the trial runs again."""
    storage = sqlite_url(tmp_path)
    opts = _screened(
        storage,
        "revive",
        _one_point(tmp_path),
        workload="tests.trainers.helpers:worker_dependent",
        fix=("num_workers=0",),
        trials=1,
    )
    search = open_search(opts)
    try:
        failing = search.space.config_from_params({"num_streams": 2}).replace(num_workers=1)
        planted = _plant(search.study, failing, median=1e12, **{keys.WINDOWS: [1e12]})
        search.run_trials(LocalSlots(1))
        screened = search.study.trials[-1]
        assert screened.state == TrialState.PRUNED
        assert screened.user_attrs[keys.SCREEN]["incumbent"]["trial"] == planted
        rec = search.decide().to_dict()
    finally:
        search.close()
    study = load(storage, "revive")
    verdict = study.user_attrs[f"{keys.PARITY_PREFIX}{candidate_key(failing, None, None)}"]
    assert verdict["passed"] is False
    again = study.trials[-1]
    assert again.number > screened.number and again.params == screened.params
    assert again.state == TrialState.COMPLETE
    assert keys.SCREEN not in again.user_attrs  # no incumbent left that could be recommended
    # The failing config never reaches the final round; the one that passes does.
    assert all(e["config"]["num_workers"] == 0 for e in rec["final_round"])
    assert f"trial-{again.number}" in {e["name"] for e in rec["final_round"]}


def test_an_incumbent_over_the_memory_cap_or_failed_is_no_incumbent() -> None:
    study = optuna.create_study(direction="maximize")
    slow, fast = LoopConfig(num_streams=2), LoopConfig(num_streams=3)
    _plant(study, slow, median=10.0, **{keys.PEAK_MEMORY: 100})
    _plant(study, fast, median=20.0, **{keys.PEAK_MEMORY: 900})
    assert incumbent(study.trials) == Incumbent(trial=1, throughput=20.0)
    assert incumbent(study.trials, cap=500) == Incumbent(trial=0, throughput=10.0)
    failed = {candidate_key(fast, None, None)}
    assert incumbent(study.trials, failed=failed) == Incumbent(trial=0, throughput=10.0)
    assert incumbent(study.trials, failed=failed, cap=50) is None


def test_saving_artefacts_where_it_cannot_is_one_reason_and_no_failure(tmp_path: Path) -> None:
    saved, why = save(tmp_path / "gone")
    # Nothing compiled in this process, or a folder that is not there: never an exception.
    assert saved == 0
    assert why is None or len(why.splitlines()) == 1
    assert not list(tmp_path.glob("**/*.part-*"))


def test_a_memory_prediction_skips_only_on_a_basis_of_its_own_family() -> None:
    params = 1_000_000_000
    kwargs: dict[str, Any] = {
        "parameters": params,
        "device_bytes": 80 * GB,
        "incumbent": None,
        "margin": 0.01,
    }
    # A graph-captured whole-model basis: another family; its prediction is kept, not acted on.
    other = [_known(0, config={"compile": "default", "compile_scope": "model"}, peak=70 * GB)]
    wide = pr.predict(LoopConfig(**PLAIN, micro_batches=1), "bf16-autocast", other, **kwargs)
    doubled = pr.predict(LoopConfig(**PLAIN), "bf16-autocast", other, **kwargs)
    assert doubled.skip is None and wide.skip is None
    # A trial of the family that fitted with as many activations: this one fits too.
    fitted = [
        _known(0, config={**PLAIN, "micro_batches": 2}, peak=56 * GB),
        _known(1, config=PLAIN, peak=79 * GB),
    ]
    plain = pr.predict(LoopConfig(**PLAIN), "bf16-autocast", fitted, **kwargs)
    assert plain.skip is None


def test_a_repeat_job_does_not_measure_again_a_config_the_earlier_job_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler proposes the space's one config again and again: the repeat job runs none of
    those (`measured_before`), each recorded beside the copied trial that measured it; the
    final round still measures that config on this machine."""
    monkeypatch.setenv(MEMO_ENV, "on")
    storage, space = sqlite_url(tmp_path), _one_point(tmp_path)
    run_json(_screened(storage, "first", space, trials=1, patience=0))
    rec = run_json(_screened(storage, "second", space, trials=3, patience=0))
    copied, *sampled = load(storage, "second").trials
    assert copied.user_attrs[keys.COPIED_FROM] == {"study": "first", "trial": 0}
    assert [t.state for t in sampled] == [TrialState.PRUNED] * 2
    for trial in sampled:
        assert trial.user_attrs[keys.SAME_AS] == copied.number
        assert keys.WINDOWS not in trial.user_attrs and keys.TIME not in trial.user_attrs
        assert f"trial {copied.number}, copied from an earlier job" in (
            pruned_reason(trial.user_attrs) or ""
        )
    assert rec["search"]["skipped_same"] == 2
    rows = [_row(storage, "second", t.number) for t in (copied, *sampled)]
    assert [row["same_as"] for row in rows] == [None, copied.number, copied.number]
    assert rows[0]["pruned_reason"] is None
    assert all(f"trial {copied.number}, copied" in row["pruned_reason"] for row in rows[1:])
    assert "2 not run: a config an earlier job measured" in (search_text(rec["search"]) or "")
    assert rec["config"] is not None and rec["final_round"]


def test_only_a_sampled_copy_of_a_measured_copied_config_is_not_run() -> None:
    config = LoopConfig(num_streams=2)
    key = candidate_key(config, None, None)
    copied = {keys.CONFIG_KEY: key, keys.COPIED_FROM: {"study": "first", "trial": 0}}

    def trial(number: int, state: TrialState, fixed: bool = False, **attrs: Any) -> Any:
        made = optuna.trial.create_trial(
            state=state,
            value=1.0 if state == TrialState.COMPLETE else None,
            user_attrs=attrs,
            system_attrs={"fixed_params": {"num_streams": 2}} if fixed else {},
        )
        made.number = number
        return made

    now = trial(5, TrialState.RUNNING, **{keys.CONFIG_KEY: key})
    assert measured_before(5, [trial(0, TrialState.COMPLETE, **copied), now]) == 0
    lost = {keys.SCREEN: {"outcome": "lost"}}
    assert measured_before(5, [trial(1, TrialState.PRUNED, **copied, **lost), now]) == 1
    # Not measured: a copied trial skipped on its prediction, or one that failed.
    assert measured_before(5, [trial(2, TrialState.PRUNED, **copied), now]) is None
    assert measured_before(5, [trial(2, TrialState.FAIL, **copied), now]) is None
    # This job's own measurement of it: measured again, its windows pooled.
    own = trial(3, TrialState.COMPLETE, **{keys.CONFIG_KEY: key})
    assert measured_before(5, [own, now]) is None
    # Another config, or an enqueued trial (a stage's, or one `revive` runs again): it runs.
    other = {**copied, keys.CONFIG_KEY: candidate_key(LoopConfig(num_streams=1), None, None)}
    assert measured_before(5, [trial(0, TrialState.COMPLETE, **other), now]) is None
    enqueued = trial(5, TrialState.RUNNING, fixed=True, **{keys.CONFIG_KEY: key})
    assert measured_before(5, [trial(0, TrialState.COMPLETE, **copied), enqueued]) is None
