"""Reading results back (`tuner.results`, `tuner.study`, `tuner.decide`'s bookkeeping) on real
SQLite studies: the recommendation, its export formats, the study list, storage URLs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

import trainers
from tests.tuner.conftest import Finished
from tests.tuner.tiny import sqlite_url
from trainers import LoopConfig, field_names
from tuner.errors import NoRecommendation, StudyNotFound, TunerError
from tuner.evidence import export, reader
from tuner.evidence.recommendation import Recommendation
from tuner.search.deciding import decide
from tuner.search.spaces.space import config_key
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.counting import count_trials, gpu_seconds


def env_lines(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines()]
    return {name: value for name, value in pairs}


def exec_python(text: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(text, "<export>", "exec"), namespace)
    return namespace["config"]


# -- best ------------------------------------------------------------------------------------


def test_recommendation_reads_back_what_the_run_stored(finished: Finished) -> None:
    rec = reader.recommendation(finished.storage, finished.study)
    assert rec == finished.recommendation
    assert rec.to_dict() == json.loads(json.dumps(finished.rec))
    assert Recommendation.from_dict(rec.to_dict()) == rec


def test_a_missing_study_is_an_error_naming_study_and_listing_the_known_ones(
    finished: Finished,
) -> None:
    with pytest.raises(StudyNotFound) as info:
        reader.recommendation(finished.storage, "missing")
    assert str(info.value) == (
        "--study: no study named 'missing' in this storage (studies: tiny-full)"
    )


def test_a_study_without_recommendation_says_how_to_finish_it(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    optuna.create_study(storage=storage, study_name="unfinished")
    with pytest.raises(NoRecommendation, match="or `python -m tuner run --study unfinished` with"):
        reader.recommendation(storage, "unfinished")


# -- export ----------------------------------------------------------------------------------


def test_export_json_is_the_recommended_config(finished: Finished) -> None:
    exported = json.loads(export.export(finished.recommendation, "json"))
    assert exported == finished.rec["config"]
    assert LoopConfig.from_dict(exported).to_dict() == exported


def test_export_env_is_inverted_by_config_from_env(finished: Finished) -> None:
    text = export.export(finished.recommendation, "env")
    variables = env_lines(text)
    assert len(variables) == len(field_names())  # one variable per lever of the table
    assert all(name.startswith("STREAMTUNE_") for name in variables)
    assert export.config_from_env(variables) == LoopConfig.from_dict(finished.rec["config"])


def test_export_python_execs_to_the_recommended_config(finished: Finished) -> None:
    text = export.export(finished.recommendation, "python")
    assert text.startswith("# streamtune recommendation for study 'tiny-full' on cpu\n")
    assert exec_python(text) == LoopConfig.from_dict(finished.rec["config"])


@pytest.mark.parametrize(
    "config",
    [
        LoopConfig(),
        LoopConfig(
            num_streams=4,
            sync_interval=37,
            sync_mode="query",
            prefetch_depth=4,
            pin_memory=True,
            non_blocking=True,
            num_workers=2,
            cuda_graph=True,
        ),
        LoopConfig(num_streams=2, sync_interval=10, sync_mode="event", non_blocking=True),
    ],
)
def test_every_export_round_trips(config: LoopConfig) -> None:
    rec = Recommendation.from_dict(
        {"study": "s", "config": config.to_dict(), "hardware": "NVIDIA-H100-80GB-HBM3"}
    )
    assert LoopConfig.from_dict(json.loads(export.export(rec, "json"))) == config
    assert export.config_from_env(env_lines(export.export(rec, "env"))) == config
    assert exec_python(export.export(rec, "python")) == config


def test_config_from_env_reads_only_its_variables_and_defaults_the_rest() -> None:
    config = export.config_from_env(
        {
            "STREAMTUNE_NUM_STREAMS": "3",
            "STREAMTUNE_PIN_MEMORY": "1",
            "STREAMTUNE_NON_BLOCKING": "False",
            "PATH": "/usr/bin",
            "NUM_STREAMS": "4",
        }
    )
    assert config == LoopConfig(num_streams=3, pin_memory=True, non_blocking=False)
    assert export.config_from_env({}) == LoopConfig()


def test_export_errors(finished: Finished) -> None:
    with pytest.raises(TunerError, match=r"^--format: 'yaml' is invalid: allowed json, env, py"):
        export.export(finished.recommendation, "yaml")
    with pytest.raises(
        NoRecommendation, match="'s' recommends no config to export: no config passed"
    ):
        export.export(
            Recommendation.from_dict(
                {
                    "study": "s",
                    "config": None,
                    "reason": "no config passed parity (and the memory cap)",
                }
            ),
            "json",
        )


# -- studies ---------------------------------------------------------------------------------


def test_studies_lists_the_finished_study(finished: Finished) -> None:
    rows = reader.list_studies(finished.storage)
    assert [row["study"] for row in rows] == ["tiny-full"]
    row = rows[0]
    assert (row["workload"], row["preset"], row["hardware"]) == ("transformer", "tiny", "cpu")
    assert row["trials"]["complete"] == 4
    assert row["trials"]["failed"] == 0
    assert row["best_throughput"] == finished.rec["throughput"]["median"]
    assert row["best_from"] == "final round"  # not a search trial's short measurement
    assert row["recommended"] == finished.rec["config"]


def test_studies_without_recommendation_or_meta(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    plain = optuna.create_study(storage=storage, study_name="plain", direction="maximize")
    plain.set_user_attr(keys.META, {"preset": "tiny"})  # streamtune's, its workload not stored
    plain.add_trial(create_trial(value=5.0))
    plain.add_trial(create_trial(value=7.5))
    plain.add_trial(create_trial(state=TrialState.FAIL))
    # Trials and no META: another Optuna program's study, whose values are not throughputs.
    other = optuna.create_study(storage=storage, study_name="other", direction="maximize")
    other.add_trial(create_trial(value=9.0))
    (row,) = reader.list_studies(storage)
    assert row["study"] == "plain"
    assert row["workload"] is None
    assert (row["best_throughput"], row["best_from"]) == (7.5, "trial 1")
    assert row["recommended"] is None
    assert row["trials"]["complete"] == 2
    assert row["trials"]["failed"] == 1
    empty = sqlite_url(tmp_path, "empty.db")
    optuna.storages.RDBStorage(empty)  # a database with no study (one not there is an error)
    assert reader.list_studies(empty) == []


# -- the bookkeeping the recommendation is built from ----------------------------------------


def _trial(
    config: LoopConfig,
    windows: list[float],
    memory: int | None = None,
    state: TrialState = TrialState.COMPLETE,
) -> optuna.trial.FrozenTrial:
    return create_trial(
        state=state,
        value=None if state != TrialState.COMPLETE else max(windows),
        user_attrs={
            "config": config.to_dict(),
            "config_key": config_key(config),
            "windows": windows,
            "peak_memory_bytes": memory,
            "seconds": 1.0,
        },
    )


def test_top_configs_pool_duplicates_rank_by_median_and_honour_the_cap(tmp_path: Path) -> None:
    a, b, c, d = (LoopConfig(num_streams=n) for n in (1, 2, 3, 4))
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    study.add_trial(_trial(a, [10.0, 10.0, 10.0], memory=100))  # 0
    study.add_trial(_trial(b, [20.0, 20.0, 20.0], memory=500))  # 1
    study.add_trial(_trial(a, [40.0, 40.0, 40.0], memory=100))  # 2: a pools to 25
    study.add_trial(_trial(c, [30.0, 31.0, 32.0], memory=50))  # 3
    study.add_trial(_trial(d, [99.0, 99.0], state=TrialState.PRUNED))  # 4: not complete
    study.add_trial(create_trial(value=1e9))  # 5: not a streamtune trial

    def names(k: int, cap: int | None) -> list[str]:
        return [name for name, _ in decide.top_configs(study, k, cap)]

    assert names(3, None) == ["trial-3", "trial-0", "trial-1"]
    assert names(1, None) == ["trial-3"]
    assert names(3, 200) == ["trial-3", "trial-0"]
    assert names(3, 10) == []
    assert [config for _, config in decide.top_configs(study, 2, None)] == [c, a]


def test_trial_counts_and_device_seconds_add_up(tmp_path: Path) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    study.add_trial(_trial(LoopConfig(), [1.0]))
    study.add_trial(_trial(LoopConfig(), [1.0], state=TrialState.FAIL))
    study.add_trial(_trial(LoopConfig(), [1.0], state=TrialState.PRUNED))
    study.set_user_attr("baseline/pytorch-default/1", {"seconds": 2.5})
    study.set_user_attr("baseline/seed-baseline/2", {"seconds": None, "failure_reason": "x"})
    study.set_user_attr("parity/abc", {"seconds": 0.25, "passed": True})
    study.set_user_attr("final/xyz", {"seconds": 4.0, "entries": []})
    study.set_user_attr("recommendation", {"seconds": 100.0})  # not a measurement
    trials = study.get_trials(deepcopy=False)
    assert count_trials(trials).to_dict() == {
        "complete": 1,
        "failed": 1,
        "pruned": 1,
        "interrupted": 0,
        "running": 0,
        "waiting": 0,
    }
    assert gpu_seconds(trials, study.user_attrs) == pytest.approx(3 * 1.0 + 2.5 + 0.25 + 4.0)


# -- storage ---------------------------------------------------------------------------------


def test_storage_url_prefers_the_flag_then_tuner_storage_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    assert studies.storage_url() == "sqlite:///tuner.db"
    monkeypatch.setenv("TUNER_STORAGE", "sqlite:////tmp/from-env.db")
    assert studies.storage_url() == "sqlite:////tmp/from-env.db"
    assert studies.storage_url("sqlite:////tmp/flag.db") == "sqlite:////tmp/flag.db"


def test_tuner_storage_is_where_results_are_read(
    finished: Finished, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_STORAGE", finished.storage)
    rows = reader.list_studies(studies.storage_url())
    assert [row["study"] for row in rows] == ["tiny-full"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        # A bare path: told the SQLite URL it probably meant.
        ("not a url", "--storage: 'not a url' is a path, not a database URL: for an SQLite file"),
        # One line naming the forms streamtune takes, not a driver's ImportError (issue 56).
        ("nosuchdb://u@h/x", "--storage: 'nosuchdb://u@h/x' is not a supported database: allowed"),
        ("mysql://u@h/x", "--storage: 'mysql://u@h/x' is not a supported database: allowed"),
        ("sqlite:////nonexistent-dir/sub/t.db", "--storage: the folder /nonexistent-dir/sub"),
    ],
)
def test_a_bad_storage_url_is_an_error_naming_storage(url: str, message: str) -> None:
    with pytest.raises(TunerError) as info:
        studies.open_storage(url)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_default_study_names_are_readable_and_stable() -> None:
    assert (
        studies.default_study_name("transformer-small", "NVIDIA-H100-80GB-HBM3", "full")
        == "transformer-small-NVIDIA-H100-80GB-HBM3"
    )
    assert studies.default_study_name("mlp-tiny", "cpu", "streams") == "mlp-tiny-cpu-streams"
    named = studies.default_study_name("pkg.mod:build-tiny", "cpu", "/some/dir/my space.json")
    assert named == "pkg.mod-build-tiny-cpu-my-space"
    # Two shapes or two precisions never share a study.
    shaped = studies.default_study_name(
        "torchvision:resnet18-tiny-batch=2,image=32", "cpu", "full", precision="bf16-autocast"
    )
    assert shaped == "torchvision-resnet18-tiny-batch-2-image-32-cpu-bf16-autocast"
    assert shaped != studies.default_study_name(
        "torchvision:resnet18-tiny-batch=4,image=32", "cpu", "full", precision="bf16-autocast"
    )


def test_the_recommendation_says_which_correctness_test_trusted_it(finished: Finished) -> None:
    gate = finished.rec["parity"]
    assert gate["passed"] is True
    config = LoopConfig.from_dict(finished.rec["config"])
    assert gate["test"] == trainers.required_test(config)
    assert gate["reason"]
    # Stored on the study with the envelope the gate measured once for it.
    study = optuna.load_study(study_name=finished.study, storage=finished.storage)
    envelope = trainers.Envelope.from_dict(study.user_attrs["envelope"])
    assert envelope.preset == "tiny" and len(envelope.perturbed) >= 2
