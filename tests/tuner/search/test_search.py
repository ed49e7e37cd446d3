"""`tuner.search.run_study` end to end: real Optuna, real SQLite under tmp_path, real CPU runs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

import trainers
from tests.tuner import workloads_for_tests as broken
from tests.tuner.conftest import Finished
from tests.tuner.tiny import (
    PROTOCOL,
    WORKLOADS,
    baseline_entries,
    counts,
    load,
    options,
    run_json,
    sqlite_url,
)
from trainers import LoopConfig
from tuner.errors import Interrupted, NoRecommendation, TunerError
from tuner.evidence import export, reader
from tuner.evidence.unrun import pruned_reason
from tuner.search import helping
from tuner.search.deciding.recommend import CPU_NOTE
from tuner.search.measuring import artifacts
from tuner.search.measuring.artifacts import share_compile_cache
from tuner.search.measuring.measure import Protocol
from tuner.search.options import BASELINES, LocalSlots, RunOptions, memory_unmeasured
from tuner.search.proposing.defaults import (
    AUTO_PATIENCE,
    AUTO_SCALE_BUDGET_S,
    AUTO_SEARCH_BUDGET_S,
    DEFAULT_WINDOW_STEPS,
    SCALE_WINDOW_STEPS,
)
from tuner.search.spaces.named import load_space
from tuner.search.spaces.own import PINNED_ALL
from tuner.search.spaces.space import config_key
from tuner.search.study import (
    apply_gpu_defaults,
    measurement_protocol,
    open_search,
    search_budget,
    search_patience,
)
from tuner.search.trials import trials_without_gain
from tuner.store import keys

# -- a full run ------------------------------------------------------------------------------


def test_run_completes_its_trials_into_sqlite(finished: Finished) -> None:
    study = load(finished.storage, finished.study)
    assert len(study.trials) == 4
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert study.user_attrs["streamtune"]["workload"] == "transformer"
    assert study.user_attrs["streamtune"]["preset"] == "tiny"
    for trial in study.trials:
        config = LoopConfig.from_dict(trial.user_attrs["config"])
        assert trial.user_attrs["config_key"] == config_key(config)
        assert config.cuda_graph is False  # dropped from the search on a CPU
        assert len(trial.user_attrs["windows"]) == PROTOCOL.windows
        assert trial.user_attrs["parity"]["passed"] is True
        low, high = trial.user_attrs["ci95"]
        assert low <= trial.value <= high
        assert study.user_attrs[f"parity/{config_key(config)}"]["passed"] is True
    # What the run returned is what the study stores.
    assert study.user_attrs["recommendation"] == json.loads(json.dumps(finished.rec))


def test_recommendation_has_the_documented_shape(finished: Finished) -> None:
    rec = finished.rec
    assert rec["study"] == "tiny-full"
    config = LoopConfig.from_dict(rec["config"])
    low, high = rec["throughput"]["ci95"]
    assert low <= rec["throughput"]["median"] <= high
    assert rec["throughput"]["median"] > 0
    assert set(rec["speedup"]) == {"pytorch-default", "seed-baseline"}
    for speedup in rec["speedup"].values():
        low, high = speedup["ci95"]
        assert 0 < low <= speedup["median"] <= high
    # The recommendation is one of the ties (the simplest of them), and ties overlap its CI.
    assert rec["source"] in {t["name"] for t in rec["ties"]}
    assert rec["was_tie"] == (len(rec["ties"]) > 1)
    finalists = {m["name"]: m for m in rec["final_round"]}
    assert {"pytorch-default", "seed-baseline"} <= set(finalists)
    assert finalists[rec["source"]]["config"] == config.to_dict()
    # final_rounds=2: one round when the first decided as the search had (`settled_after`).
    study = load(finished.storage, finished.study)
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    rounds = final["settled_after"] or 2
    assert finalists[rec["source"]]["samples"] == rounds * PROTOCOL.windows
    kept = {name: e for name, e in finalists.items() if name not in final["dropped"]}
    assert all(e["samples"] == rounds * PROTOCOL.windows for e in kept.values())
    assert rec["fingerprint"]["device_type"] == "cpu"
    assert rec["fingerprint"] == trainers.fingerprint(trainers.resolve_device("cpu"))
    assert rec["trial_counts"] == counts(4, 0, 0)
    assert rec["gpu_seconds"] > 0
    assert "pareto" not in rec  # single objective


def test_gpu_seconds_cover_every_measurement(finished: Finished) -> None:
    study = load(finished.storage, finished.study)
    trials = sum(t.user_attrs["seconds"] for t in study.trials)
    baselines = sum(e["seconds"] for e in baseline_entries(study).values())
    assert finished.rec["gpu_seconds"] > trials + baselines


def test_on_a_cpu_the_recommendation_says_stream_settings_have_no_effect(
    finished: Finished,
) -> None:
    assert finished.rec["effective"] is False
    assert finished.rec["note"] == CPU_NOTE
    assert "no effect" in finished.rec["note"]


def test_baselines_are_stored_and_remeasured_for_drift(finished: Finished) -> None:
    entries = baseline_entries(load(finished.storage, finished.study))
    # 4 trials, baseline_every=2: measured at the start and after trial 2 (not after the last).
    for name, config in BASELINES.items():
        mine = sorted(
            (e for k, e in entries.items() if k.startswith(f"{name}/")), key=lambda e: e["at_trial"]
        )
        assert [e["phase"] for e in mine] == ["start", "drift"]
        assert [e["at_trial"] for e in mine] == [0, 2]
        assert all(e["config"] == config.to_dict() for e in mine)
        assert all(len(e["windows"]) == PROTOCOL.windows for e in mine)
        assert "drift" not in mine[0]
        first, second = (statistics.median(e["windows"]) for e in mine)
        assert mine[1]["drift"] == pytest.approx((second - first) / first)


# -- resuming --------------------------------------------------------------------------------


def test_resuming_adds_trials_new_points_and_drift(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    first = run_json(options(storage, "resume", trials=3))
    assert first["trial_counts"]["complete"] == 3
    second = run_json(options(storage, "resume", trials=2))
    assert second["trial_counts"]["complete"] == 5
    study = load(storage, "resume")
    assert len(study.trials) == 5
    # Same seed, same space: the resumed run must not replay the first run's points.
    assert [t.params for t in study.trials[3:]] != [t.params for t in study.trials[:2]]
    starts = [e for e in baseline_entries(study).values() if e["phase"] == "start"]
    assert len(starts) == 4  # both baselines, at the start of each run
    resumed = [e for e in starts if e["at_trial"] == 3]
    assert len(resumed) == 2
    assert all(isinstance(e["drift"], float) for e in resumed)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"workload": "transformer"}, "workload"),
        ({"preset": "small"}, "preset"),
        ({"fix": ("num_workers=0", "num_streams=2")}, "space"),
        ({"objectives": ("throughput", "memory")}, "objectives"),
        # Another seed's trials failed every gate against the first seed's envelope (a new
        # user's trial, 2026-12-02), where the run now stops before its first trial.
        ({"seed": 7}, "seed"),
        # The stored envelope's steps: every new trial's gate failed (a user's probe).
        ({"parity_steps": 5}, "parity_steps"),
        ({"precision_parity_steps": 30}, "precision_parity_steps"),
    ],
)
def test_resuming_with_other_settings_is_a_clear_error(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    storage = sqlite_url(tmp_path)
    run_json(options(storage, "made", trials=1))
    with pytest.raises(TunerError, match=rf"^--study: 'made' was made with {field}=") as info:
        run_json(options(storage, "made", trials=1, **change))
    assert "choose another --study" in str(info.value)
    if field == "space":  # what differs, not both spaces whole
        assert "fixed.num_streams: 2" in str(info.value) and "sync_mode" not in str(info.value)
    assert len(load(storage, "made").trials) == 1  # nothing was added


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"preset": "huge"}, trainers.WorkloadError),
        ({"workload": "nope"}, trainers.WorkloadError),
        ({"workload": "tests.tuner.no_such_module:build"}, trainers.WorkloadError),
    ],
)
def test_a_bad_workload_stores_no_study(
    tmp_path: Path, change: dict[str, Any], error: type[Exception]
) -> None:
    storage = sqlite_url(tmp_path)
    with pytest.raises(error):
        run_json(options(storage, "never", **change))
    assert optuna.get_all_study_names(storage) == []
    # ... so the name is free for the corrected run.
    assert run_json(options(storage, "never", trials=1))["trial_counts"]["complete"] == 1


# -- duplicates, parity, failures ------------------------------------------------------------


def test_the_same_params_twice_pool_their_windows(tmp_path: Path) -> None:
    space = tmp_path / "one-point.json"
    space.write_text(json.dumps({"num_streams": [2], "sync_interval": 3}))
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, "dup", trials=3, space=str(space), fix=()))
    study = load(storage, "dup")
    trials = study.trials
    assert [t.params for t in trials] == [{"num_streams": 2}] * 3
    assert "duplicate_of" not in trials[0].user_attrs
    assert [t.user_attrs.get("duplicate_of") for t in trials[1:]] == [0, 0]
    assert [t.user_attrs["pooled_windows"] for t in trials] == [3, 6, 9]
    windows: list[float] = []
    for trial in trials:
        windows += trial.user_attrs["windows"]
        assert trial.value == pytest.approx(statistics.median(windows))
    # The config is checked for parity once and measured once more in the final round; a
    # baseline is checked only where it can still tie (`recommend._eligible`), which on a CPU
    # changes from run to run (CI, 2026-11-26).
    verdicts = [v for k, v in study.user_attrs.items() if k.startswith("parity/")]
    config = trials[0].user_attrs["config"]
    assert sum(v["config"] == config for v in verdicts) == 1 and len(verdicts) <= 3
    trial_entries = [m for m in rec["final_round"] if m["name"].startswith("trial-")]
    assert [m["name"] for m in trial_entries] == ["trial-0"]
    assert trial_entries[0]["config"]["sync_interval"] == 3


def test_a_config_failing_parity_is_failed_and_never_recommended(tmp_path: Path) -> None:
    # Its data depend on the DataLoader worker id: with workers the losses differ.
    storage = sqlite_url(tmp_path)
    rec = run_json(
        options(
            storage,
            "parity",
            trials=2,
            workload="tests.trainers.helpers:worker_dependent",
            fix=("num_workers=1",),
        )
    )
    study = load(storage, "parity")
    failing = LoopConfig.from_dict(study.trials[0].user_attrs["config"])
    assert failing.num_workers == 1
    for trial in study.trials:
        assert trial.state == TrialState.FAIL
        assert trial.user_attrs["failure_kind"] == "parity"
        assert trial.user_attrs["failure_reason"].startswith("parity: eager config must match")
        assert trial.user_attrs["parity"]["passed"] is False
        assert len(trial.user_attrs["windows"]) == PROTOCOL.windows  # it was measured first
    verdict = study.user_attrs[f"parity/{config_key(failing)}"]
    assert verdict["passed"] is False
    assert verdict["first_diverging_step"] == 0
    assert rec["trial_counts"] == counts(0, 2, 0)
    # Only the baselines reached the final round, and they do not keep the pin: nothing is
    # recommended, and the reason says so.
    assert rec["config"] is None
    assert rec["reason"] == "no config keeping the pins (num_workers=1) passed parity"
    assert {m["name"] for m in rec["final_round"]} == set(BASELINES)
    assert all(m["config"]["num_workers"] == 0 for m in rec["final_round"])


def test_a_failing_config_is_recorded_with_its_reason(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    rec = run_json(
        options(
            storage,
            "fails",
            trials=2,
            workload=f"{WORKLOADS}:fails_in_workers",
            fix=("num_workers=1",),
        )
    )
    study = load(storage, "fails")
    for trial in study.trials:
        assert trial.state == TrialState.FAIL
        assert trial.user_attrs["failure_kind"] == "error"
        assert trial.user_attrs["failure_reason"].startswith("error: RuntimeError:")
        assert broken.WORKER_FAILURE in trial.user_attrs["failure_reason"]
        assert trial.user_attrs["seconds"] > 0
        assert "windows" not in trial.user_attrs
    # The baselines (0 workers) ran, for the speedups; they do not keep the pin, so nothing is
    # recommended, and the reason names the pin.
    assert rec["trial_counts"] == counts(0, 2, 0)
    assert rec["failures"] == {}
    assert rec["config"] is None and "keeping the pins (num_workers=1)" in rec["reason"]


def test_a_workload_that_always_raises_fails_everything_with_its_reason(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, "raises", trials=2, workload=f"{WORKLOADS}:raises_in_loss"))
    study = load(storage, "raises")
    # Where in the user's code it raised: their loss's own line, not torch's or the loop's.
    reason = f"cuda: RuntimeError at {broken.__file__}:{broken.INJECTED_AT}: {broken.INJECTED}"
    assert [t.user_attrs["failure_reason"] for t in study.trials] == [reason, reason]
    assert all(t.state == TrialState.FAIL for t in study.trials)
    entries = baseline_entries(study)
    assert len(entries) == 2
    assert all(e["failure_reason"] == reason and "windows" not in e for e in entries.values())
    assert rec["config"] is None
    assert rec["failures"] == {"pytorch-default": reason, "seed-baseline": reason}
    assert rec["reason"] == "every final-round measurement failed (see failures)"
    assert rec["trial_counts"] == counts(0, 2, 0)
    with pytest.raises(NoRecommendation, match="every final-round measurement failed"):
        export.export(reader.recommendation(storage, "raises"), "json")


class _ArmAfter:
    """A Progress that arms one of the test workloads' switches once `after` trials are done."""

    def __init__(self, switch: str, after: int) -> None:
        self.switch = switch
        self.after = after
        self.states: list[str] = []

    def start(self, study: str, total: int, resumed: bool) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        self.states.append(state)
        if done >= self.after:
            broken.ARMED[self.switch] = True


@pytest.fixture
def disarm() -> Iterator[None]:
    yield
    broken.ARMED.update(interrupt=False, slow=False)


def test_an_interrupted_run_keeps_its_trials_and_fails_the_running_one(
    tmp_path: Path, disarm: None
) -> None:
    storage = sqlite_url(tmp_path)
    progress = _ArmAfter("interrupt", after=1)  # Ctrl-C during the second trial
    with pytest.raises(
        Interrupted, match="to resume it: python -m tuner run --study interrupted "
    ) as info:
        run_json(
            options(
                storage, "interrupted", trials=5, workload=f"{WORKLOADS}:interrupts_when_armed"
            ),
            progress=progress,
        )
    assert "1 trials of this run are stored" in str(info.value)
    # The trials left of the run's 5: resumed without --trials, it ran up to 40.
    assert "--preset tiny --trials 4 " in str(info.value)
    study = load(storage, "interrupted")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert study.trials[1].user_attrs["failure_reason"] == "interrupted"
    assert progress.states == ["complete"]
    with pytest.raises(NoRecommendation, match="no recommendation yet"):
        reader.recommendation(storage, "interrupted")


# -- objectives, memory, timeout, pruning ----------------------------------------------------


def test_throughput_and_memory_give_a_pareto_list(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, "pareto", objectives=("throughput", "memory")))
    study = load(storage, "pareto")
    assert study.directions == [
        optuna.study.StudyDirection.MAXIMIZE,
        optuna.study.StudyDirection.MINIMIZE,
    ]
    assert all(len(t.values) == 2 for t in study.trials)
    assert isinstance(rec["pareto"], list)
    finalists = {m["name"] for m in rec["final_round"]}
    assert all(m["name"] in finalists and m["peak_memory_bytes"] is not None for m in rec["pareto"])
    # A CPU run measures no peak memory, so no config is on the front; throughput still decides.
    assert rec["pareto"] == []
    assert rec["config"] is not None


def test_max_memory_is_recorded_and_applied(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    said = _Phases()
    rec = run_json(options(storage, "capped", trials=2, max_memory_bytes=2**30), progress=said)
    assert rec["max_memory_bytes"] == 2**30
    assert load(storage, "capped").user_attrs["streamtune"]["max_memory_bytes"] == 2**30
    # On a CPU no peak memory is known, so the cap cannot exclude a config; a line says so (it
    # went unsaid: a new API client's trial), and not where nothing about memory was asked.
    assert rec["peak_memory_bytes"] is None
    assert rec["config"] is not None
    line = "peak memory is measured on a CUDA device only: on cpu --max-memory excludes no config"
    assert line in said.lines
    # In the recommendation too, which a service job's client reads (the line went to the log).
    assert rec["note"].endswith(f"; {line}"), rec["note"]
    plain = _Phases()
    uncapped = run_json(options(storage, "uncapped", trials=1), progress=plain)
    assert not any("peak memory" in text for text in plain.lines)
    assert "peak memory" not in uncapped["note"] and uncapped["note"].startswith("measured on")
    both = dataclasses.replace(options(storage, "x", trials=1), objectives=("throughput", "memory"))
    assert memory_unmeasured(both, "cpu") == (
        "peak memory is measured on a CUDA device only: on cpu the memory objective is not known"
    )
    assert memory_unmeasured(both, "cuda") is None


def test_timeout_stops_starting_trials(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, "timeout", trials=1000, timeout_s=1e-6))
    assert sum(rec["trial_counts"].values()) <= 1
    assert rec["config"] is not None  # the baselines are still decided between


def test_a_much_slower_config_is_pruned_after_its_second_window(
    tmp_path: Path, disarm: None
) -> None:
    storage = sqlite_url(tmp_path)
    progress = _ArmAfter("slow", after=5)  # trials 5 and 6 are far slower than trials 0-4
    rec = run_json(
        options(
            storage,
            "prune",
            trials=7,
            baseline_every=100,
            workload=f"{WORKLOADS}:slow_when_armed",
            protocol=Protocol(warmup=1, windows=4, window_steps=2),
        ),
        progress=progress,
    )
    study = load(storage, "prune")
    # PercentilePruner(25, n_startup_trials=5, n_warmup_steps=1): from the 2nd window on.
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5 + [TrialState.PRUNED] * 2
    assert [len(t.user_attrs["windows"]) for t in study.trials] == [4] * 5 + [2] * 2
    assert all("parity" not in t.user_attrs for t in study.trials[5:])  # never gated
    # Each says why, at the window it stopped (its row's `pruned_reason` was null).
    for trial in study.trials[5:]:
        said = pruned_reason(trial.user_attrs)
        assert said is not None and " samples/s at window 2, below the fastest quarter" in said
    assert all(pruned_reason(t.user_attrs) is None for t in study.trials[:5])
    assert progress.states == ["complete"] * 5 + ["pruned"] * 2
    assert rec["trial_counts"] == counts(5, 0, 2)
    assert not any(m["name"] in ("trial-5", "trial-6") for m in rec["final_round"])


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"trials": 0}, "trials"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"objectives": ("memory",)}, "objectives"),
        ({"objectives": ("throughput", "throughput")}, "objectives"),
        ({"objectives": ()}, "objectives"),
        ({"max_memory_bytes": 0}, "max_memory_bytes"),
        ({"top_k": 0}, "top_k"),
        ({"final_rounds": 0}, "final_rounds"),
        ({"baseline_every": 0}, "baseline_every"),
        ({"parity_steps": 1}, "parity_steps"),
        ({"sampler": "grid"}, "sampler"),
        ({"matmul_precision": "low"}, "matmul_precision"),
    ],
)
def test_bad_run_options_name_their_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(trainers.ConfigError) as info:
        RunOptions(workload="mlp", preset="tiny", **change)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}=")


# -- precision and library-model options: fixed per study, never shared ------------------------


def test_the_precision_is_the_studys_and_a_resume_in_another_is_refused(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, None, trials=1, precision="bf16-autocast"))
    assert rec["study"].endswith("-cpu-bf16-autocast")
    meta = load(storage, rec["study"]).user_attrs["streamtune"]
    assert (meta["precision"], meta["shape"], meta["model_args"]) == (
        "bf16-autocast",
        "mlp-tiny",
        {},
    )
    with pytest.raises(TunerError, match="precision='bf16-autocast', this run has 'fp32'"):
        run_json(options(storage, rec["study"], trials=1, precision="fp32"))


def test_a_precision_and_a_matmul_precision_together_are_refused() -> None:
    with pytest.raises(trainers.ConfigError, match="precision"):
        options("sqlite://", "x", precision="tf32", matmul_precision="high")
    with pytest.raises(trainers.ConfigError, match="precision='fp64'"):
        options("sqlite://", "x", precision="fp64")


def test_model_args_are_refused_for_a_built_in(tmp_path: Path) -> None:
    with pytest.raises(trainers.WorkloadError, match="takes no model args"):
        run_json(options(sqlite_url(tmp_path), "m", trials=1, model_args={"batch": "4"}))


# -- compilation: one Inductor cache per study, its cost recorded per trial ----------------------


def test_the_compile_cache_is_shared_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TUNER_COMPILE_CACHE", str(tmp_path / "shared"))
    chosen = share_compile_cache(options(sqlite_url(tmp_path), "c"))
    assert chosen == str((tmp_path / "shared").resolve()) == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    monkeypatch.delenv("TUNER_COMPILE_CACHE")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    beside = share_compile_cache(options(sqlite_url(tmp_path), "c"))
    assert beside == str((tmp_path / "t-artifacts" / "inductor-cache").resolve())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    assert share_compile_cache(options(sqlite_url(tmp_path), "c")) == str(tmp_path / "users")


def test_inductors_own_default_does_not_pass_for_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing Inductor's config writes its default folder into TORCHINDUCTOR_CACHE_DIR (torchao's
    float8 does it before any compile): the study's folder still wins over that default."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    assert cache_dir() == os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()
    monkeypatch.setenv("TUNER_COMPILE_CACHE", str(tmp_path / "shared"))
    chosen = share_compile_cache(options(sqlite_url(tmp_path), "c"))
    assert chosen == str((tmp_path / "shared").resolve()) == os.environ["TORCHINDUCTOR_CACHE_DIR"]


def test_a_job_gives_the_process_its_cache_setting_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job points TORCHINDUCTOR_CACHE_DIR at its study's folder for its own children; once it
    ends, the process's next job (a worker's, a script's) chooses its own folder, not the first's,
    which had looked like the user's choice."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TUNER_COMPILE_CACHE", raising=False)
    first, second = sqlite_url(tmp_path, "first.db"), sqlite_url(tmp_path, "second.db")
    run_json(options(first, "one", trials=1))
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    run_json(options(second, "two", trials=1))
    cache = Path(load(second, "two").user_attrs["streamtune"]["compile_cache"])
    assert cache == (tmp_path / "second-artifacts" / "inductor-cache").resolve()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    run_json(options(first, "three", trials=1))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users")


@pytest.mark.slow
def test_a_compiled_trial_records_its_compile_cost_and_fills_the_studys_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TUNER_COMPILE_CACHE", raising=False)
    storage = sqlite_url(tmp_path)
    rec = run_json(
        options(
            storage,
            "compiled",
            trials=1,
            space="compile",
            fix=("num_workers=0", "compile=default", "optimizer=foreach"),
        )
    )
    study = load(storage, "compiled")
    trial = study.trials[0]
    assert trial.user_attrs["config"]["compile"] == "default"
    cost = trial.user_attrs["compile"]
    assert cost["compile_s"] > 0 and cost["graph_breaks"] == 0 and not cost["unstable"]
    cache = Path(study.user_attrs["streamtune"]["compile_cache"])
    # The study's own folder, not Inductor's default (which the trial's compile wrote into
    # TORCHINDUCTOR_CACHE_DIR before the study opened), and the compile filled it.
    assert cache == (tmp_path / "t-artifacts" / "inductor-cache").resolve()
    assert cache.is_dir() and any(cache.rglob("*"))
    # The job's compile artefacts, saved into that folder for another machine to load.
    assert rec["search"]["compile_artifacts"]["saved"] > 0
    assert (cache / artifacts.ARTIFACTS_FILE).is_file()
    # Compiled kernels change rounding: the gate judged it by equivalence to the reference (its
    # loop settings, if any, against an eager twin bit for bit).
    config = trainers.LoopConfig.from_dict(trial.user_attrs["config"])
    assert trial.user_attrs["parity"]["test"] == trainers.required_test(config)
    assert "equivalence" in trial.user_attrs["parity"]["test"]
    assert trial.user_attrs["parity"]["passed"]
    assert rec["trial_counts"]["complete"] == 1


def test_break_even_counts_the_steps_a_setup_cost_needs_to_pay_for_itself() -> None:
    from tuner.search.deciding.recommend import _break_even

    assert _break_even(0.0, 0.01, 0.02) == 0  # no extra setup: even from the first step
    assert _break_even(30.0, 0.010, 0.020) == 3000  # 30 s saved back at 10 ms a step
    assert _break_even(30.0, 0.020, 0.020) is None  # never, when not faster
    assert _break_even(1.0, 0.003, 0.010) == 143


def test_the_recommendation_reports_setup_and_break_even(tmp_path: Path) -> None:
    rec = run_json(options(sqlite_url(tmp_path), "setup", trials=2, train_steps=1000))
    assert rec["train_steps"] == 1000 and rec["setup_s"] == 0.0
    # Nothing compiled: nothing to pay back against either baseline.
    assert rec["break_even_steps"] == {"pytorch-default": 0, "seed-baseline": 0}
    with pytest.raises(trainers.ConfigError, match="train_steps"):
        options(sqlite_url(tmp_path), "x", train_steps=0)


def test_a_study_stored_before_shapes_and_precisions_resumes_as_it_was(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    run_json(options(storage, "old", trials=1))
    study = load(storage, "old")
    meta = {
        k: v
        for k, v in study.user_attrs["streamtune"].items()
        if k not in ("shape", "precision", "model_args")
    }
    study.set_user_attr("streamtune", meta)  # as an earlier version stored it
    assert run_json(options(storage, "old", trials=1))["trial_counts"]["complete"] >= 1
    with pytest.raises(TunerError, match="precision='fp32', this run has 'bf16-autocast'"):
        run_json(options(storage, "old", trials=1, precision="bf16-autocast"))


# -- patience --------------------------------------------------------------------------------


class _Phases:
    """A Progress that keeps the phase lines (the CLI prints them)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def start(self, study: str, total: int, resumed: bool) -> None:
        pass

    def phase(self, text: str) -> None:
        self.lines.append(text)

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        pass


def _complete_values(storage: str, study: str) -> list[float]:
    trials = load(storage, study).get_trials(states=(TrialState.COMPLETE,))
    return [t.value for t in sorted(trials, key=lambda t: t.number)]


def _expected_stop(values: list[float], patience: int, margin: float, first: int = 0) -> int:
    """The number of complete trials at which the rule stops a run that started after `first`
    of them: the first count k, k - first >= patience, whose last `patience` brought no gain."""
    for k in range(first + patience, len(values) + 1):
        if trials_without_gain(values[:k], margin) >= patience:
            return k
    return len(values)


def test_patience_stops_a_run_whose_trials_stop_gaining_and_a_resume_runs_that_many_more(
    tmp_path: Path,
) -> None:
    storage = sqlite_url(tmp_path)
    # A 99 % margin: almost no trial counts as a gain, so the rule must stop the run long
    # before its 40 trials; where it stops follows from the measured values alone.
    opts = options(storage, "patient", trials=40, patience=2, tie_margin=0.99, baseline_every=100)
    progress = _Phases()
    recommendation = run_json(opts, progress=progress)
    values = _complete_values(storage, "patient")
    assert len(load(storage, "patient").trials) == len(values)  # none failed or pruned
    assert len(values) == _expected_stop(values, 2, 0.99) < 40
    assert any(line.startswith("patience: 2 trials in a row") for line in progress.lines)
    # The recommendation says why it has fewer trials than asked (the job row shows it).
    ended = recommendation["search"]["ended"]
    assert ended["by"] == "patience" and ended["why"] in progress.lines
    assert f"stopped after {len(values)} trials" in ended["why"]

    # Resumed, the study has already stalled: this run still runs `patience` trials of its own.
    run_json(opts)
    resumed = _complete_values(storage, "patient")
    assert resumed[: len(values)] == values
    assert len(resumed) == _expected_stop(resumed, 2, 0.99, first=len(values)) < len(values) + 40


def test_patience_counts_the_trials_a_jobs_other_workers_ran_since_this_one_joined(
    tmp_path: Path,
) -> None:
    """A worker of a job on N GPUs runs about 1/N of its trials: the rule counts every trial
    begun since the worker joined the study, its own and the others', so the job stops as soon
    as one process alone would (on 4 H100s every worker first ran 4 trials of its own, and the
    job ran all 40)."""
    storage = sqlite_url(tmp_path)
    opts = options(storage, "shared", trials=40, patience=2, tie_margin=0.99, baseline_every=100)
    worker = open_search(opts)  # joins first, as the job's workers do before any trial
    try:
        # Another worker of the job runs 5 trials meanwhile; with a 99 % margin a gain is a
        # trial at twice the best before it, which a loaded CPU can still show, so the patience
        # is set to the count since the last gain the values give.
        run_json(dataclasses.replace(opts, patience=0, trials=5))
        values = _complete_values(storage, "shared")
        assert len(values) == 5
        since = trials_without_gain(values, 0.99)
        assert since >= 1, f"the last of {values} doubled the best: CPU noise beyond this test"
        worker.options = dataclasses.replace(worker.options, patience=since)
        progress = _Phases()
        worker.progress = progress
        worker.run_trials(LocalSlots(40))
        assert worker.done == 0  # the study had stalled since it joined: nothing more to run
        assert any(line.startswith(f"patience: {since} trials in a row") for line in progress.lines)
    finally:
        worker.close()


def test_the_default_budget_of_a_job_on_several_gpus_is_one_gpus_budget_shared() -> None:
    auto = load_space("auto", cuda=True).name
    scale = load_space("scale", cuda=True).name
    assert search_budget(None, auto) == AUTO_SEARCH_BUDGET_S
    assert search_budget(None, auto, workers=4) == AUTO_SEARCH_BUDGET_S / 4
    assert search_budget(None, scale, workers=4) == AUTO_SCALE_BUDGET_S / 4
    # A budget the user gave is wall-clock seconds, whatever the GPUs; a CPU space has none.
    assert search_budget(300.0, auto, workers=4) == 300.0
    assert search_budget(None, load_space("auto", cuda=False).name, workers=4) is None


def test_a_jobs_worker_keeps_the_requests_budget_and_shares_the_default_over_its_gpus(
    tmp_path: Path,
) -> None:
    """A service job's worker (and each worker of `run --gpus N`): the job's slots keep the
    deadline, so the budget is returned, not set on the worker's run: the request's when it
    gave one, else one GPU's default over the GPUs; the patience is set as on one GPU."""
    search = open_search(options(sqlite_url(tmp_path), "job-budget", space="scale"))
    try:
        progress = _Phases()
        # This search measures on the CPU: there, neither default is set (a CPU job on the
        # scale space stopped after 5 of its 40 trials on the GPU's patience).
        assert apply_gpu_defaults(search, progress, workers=4, job=True) is None
        assert apply_gpu_defaults(search, progress, job_timeout_s=60.0, job=True) == 60.0
        assert search.options.patience is None and not progress.lines
        gpu = {"on_gpu": True}
        shared = apply_gpu_defaults(
            search, progress, workers=4, job_timeout_s=None, job=True, **gpu
        )
        assert shared == AUTO_SCALE_BUDGET_S / 4
        assert search.options.timeout_s is None and search.options.patience == AUTO_PATIENCE
        assert any("over 4" in line for line in progress.lines)
        kept = apply_gpu_defaults(search, progress, workers=4, job_timeout_s=600.0, job=True, **gpu)
        assert kept == 600.0 and search.options.timeout_s is None
        # One GPU's run (`run_study`) sets the default on its own options.
        assert apply_gpu_defaults(search, progress, on_gpu=True) == AUTO_SCALE_BUDGET_S
        assert search.options.timeout_s == AUTO_SCALE_BUDGET_S
    finally:
        search.close()


def test_patience_zero_runs_every_trial(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    recommendation = run_json(options(storage, "impatient", trials=4, patience=0, tie_margin=0.99))
    assert len(_complete_values(storage, "impatient")) == 4
    assert recommendation["search"]["ended"] == {
        "by": "trials",
        "why": "every trial asked for was run (4)",
    }


def test_a_search_budget_that_runs_out_is_said_in_the_recommendation(tmp_path: Path) -> None:
    opts = options(sqlite_url(tmp_path), "hasty", trials=40, timeout_s=1e-6, tie_margin=0.99)
    recommendation = run_json(opts)
    assert recommendation["search"]["ended"]["by"] == "timeout"
    done = recommendation["trial_counts"]["complete"]
    assert recommendation["search"]["ended"]["why"] == f"timeout: stopped after {done} trials"


def test_trials_without_gain_counts_since_the_last_gain_above_the_margin() -> None:
    assert trials_without_gain([], 0.01) == 0
    assert trials_without_gain([100.0], 0.01) == 0
    assert trials_without_gain([100.0, 90.0, 95.0], 0.01) == 2
    assert trials_without_gain([100.0, 90.0, 102.0], 0.01) == 0
    # A gain inside the margin is noise: it raises the best but does not reset the count, so a
    # creep of 0.5 % steps never counts as a gain...
    assert trials_without_gain([100.0, 100.5, 101.0, 101.5], 0.01) == 3
    # ...and the next real gain is measured against the raised best (101.5 x 1.01 = 102.5).
    assert trials_without_gain([100.0, 100.5, 101.0, 101.5, 102.0], 0.01) == 4
    assert trials_without_gain([100.0, 100.5, 101.0, 101.5, 103.0], 0.01) == 0
    # Margin 0: any strict gain counts; a tie does not.
    assert trials_without_gain([1.0, 1.0, 1.0], 0.0) == 2
    assert trials_without_gain([1.0, 1.0, 1.5], 0.0) == 0


RECORDED_TRIALS = (
    Path(__file__).resolve().parents[3]
    / "docs/benchmarks/raw/default-job-h100-2026-11-24-warm/trials.json"
)


@pytest.mark.parametrize(("job", "stops_after", "seconds"), [("cold", 17, 168), ("warm", 16, 93)])
def test_the_default_patience_replayed_on_recorded_h100_trials_loses_nothing_outside_the_tie(
    job: str, stops_after: int, seconds: int
) -> None:
    """AUTO_PATIENCE's evidence (its docstring): the default job's trials as the H100 ran them
    (patience 8 then), replayed through the patience rule: where it stops, how long after the
    first trial began, and that the best found by then ties the best of all of them."""
    trials = json.loads(RECORDED_TRIALS.read_text())[job]
    began = dt.datetime.fromisoformat(trials[0]["start"])
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    best_of_all = max(t["samples_per_s"] for t in complete)
    values: list[float] = []
    for trial in complete:
        values.append(trial["samples_per_s"])
        if trials_without_gain(values, RunOptions(workload="w", preset="p").tie_margin) >= (
            AUTO_PATIENCE
        ):
            break
    else:
        pytest.fail("the patience rule never stopped the recorded job")
    ended = dt.datetime.fromisoformat(trial["complete"])
    assert (trial["number"], round((ended - began).total_seconds())) == (stops_after, seconds)
    assert max(values) >= best_of_all / (1 + RunOptions(workload="w", preset="p").tie_margin)


RECORDED_1B_LOG = (
    Path(__file__).resolve().parents[3]
    / "docs/benchmarks/raw/default-job-h100-2026-11-26-llama-1b-396a502"
    / "default-job-h100-2026-11-26-llama-1b-cold.log"
)
_TRIAL_LINE = re.compile(
    r"^\[\s*([\d.]+) s\] trial (\d+) \(\d+/\d+\) (\w+): (?:([\d.]+) samples/s )?.* in ([\d.]+) s"
)


def test_the_scale_budget_replayed_on_the_recorded_1b_job_runs_its_corners_and_stops() -> None:
    """AUTO_SCALE_BUDGET_S's evidence (its docstring): the cold default job on the 1.1B preset
    as the H100 ran it without a budget (40 trials), replayed through the budget rule (no trial
    starts once the budget has passed since the first began): the four corners start, no fifth
    trial does, and the fastest trial of the whole run is among those that ran."""
    trials = []
    for line in RECORDED_1B_LOG.read_text().splitlines():
        found = _TRIAL_LINE.match(line)
        if found:
            ended, number, state, value, seconds = found.groups()
            start = float(ended) - float(seconds)
            trials.append((int(number), start, float(ended), state, float(value or 0.0)))
    assert [t[0] for t in trials] == list(range(len(trials))) and len(trials) >= 30
    budget = search_budget(None, load_space("scale", cuda=True).name)
    assert budget == AUTO_SCALE_BUDGET_S
    deadline = trials[0][1] + budget
    ran = [t for t in trials if t[1] <= deadline]
    assert [t[0] for t in ran] == [0, 1, 2, 3]
    assert max(t[4] for t in ran) == max(t[4] for t in trials)
    # The trials of that 2026-11-26 job (H100, no screening or predictions yet) end about 10
    # minutes into it: the budget lets the last corner start and no fifth trial. The job's
    # time aim (600 s since 2026-12-02) then cuts the final round's optional parts.
    assert ran[-1][2] < 11 * 60


def test_only_the_scale_space_shortens_a_window_the_user_left_to_the_job() -> None:
    scale = load_space("scale", cuda=True).name
    given = Protocol(warmup=7, windows=4, window_steps=DEFAULT_WINDOW_STEPS, seed=3)
    auto = RunOptions(workload="mlp", preset="tiny", protocol=given, auto_window_steps=True)
    chosen = measurement_protocol(auto, scale)
    assert chosen == dataclasses.replace(given, window_steps=SCALE_WINDOW_STEPS)
    assert SCALE_WINDOW_STEPS < DEFAULT_WINDOW_STEPS
    # The user's own window length, and every other space, keep the protocol as it is.
    assert measurement_protocol(dataclasses.replace(auto, auto_window_steps=False), scale) == given
    for name in ("auto", "compile"):
        assert measurement_protocol(auto, load_space(name, cuda=True).name) == given
    assert measurement_protocol(auto, load_space("auto", cuda=False).name) == given


def test_a_scale_study_measures_and_stores_the_shorter_windows(tmp_path: Path) -> None:
    """Through open_search on a real study (the scale space named, as a GPU picks it for a model
    from 250M parameters): the measurer and the study's stored protocol both get the scale
    window, so a resumed or shared study reads what was measured."""
    storage = sqlite_url(tmp_path)
    opts = options(
        storage,
        "scale-windows",
        space="scale",
        protocol=Protocol(warmup=1, windows=3, window_steps=DEFAULT_WINDOW_STEPS),
        auto_window_steps=True,
    )
    search = open_search(opts)
    try:
        assert search.measurer.protocol.window_steps == SCALE_WINDOW_STEPS
        assert search.options.protocol.window_steps == SCALE_WINDOW_STEPS
        stored = optuna.load_study(study_name="scale-windows", storage=storage)
        assert json.dumps(stored.user_attrs).count(f'"window_steps": {SCALE_WINDOW_STEPS}') >= 1
    finally:
        search.close()
    kept = open_search(dataclasses.replace(opts, study="scale-kept", auto_window_steps=False))
    try:
        assert kept.measurer.protocol.window_steps == DEFAULT_WINDOW_STEPS
    finally:
        kept.close()


def test_only_a_single_objective_job_on_the_default_space_on_a_gpu_gets_a_default_patience() -> (
    None
):
    auto = load_space("auto", cuda=True).name
    base = RunOptions(workload="mlp", preset="tiny")
    assert search_patience(base, auto) == AUTO_PATIENCE == 4
    assert search_patience(dataclasses.replace(base, patience=3), auto) == 3
    assert search_patience(dataclasses.replace(base, patience=0), auto) == 0
    assert search_patience(base, load_space("scale", cuda=True).name) == AUTO_PATIENCE
    assert search_patience(base, load_space("compile", cuda=True).name) is None
    assert search_patience(base, load_space("auto", cuda=False).name) is None
    pareto = dataclasses.replace(base, objectives=("throughput", "memory"))
    assert search_patience(pareto, auto) is None


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({"patience": -1}, "0..100000"),
        ({"patience": 2, "objectives": ("throughput", "memory")}, "throughput,memory"),
    ],
)
def test_bad_patience_names_its_field_and_what_is_allowed(
    change: dict[str, Any], allowed: str
) -> None:
    with pytest.raises(trainers.ConfigError) as info:
        RunOptions(workload="mlp", preset="tiny", **change)
    assert info.value.field == "patience"
    assert allowed in str(info.value)


def test_a_precision_the_device_cannot_run_is_one_error_before_any_study(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    with pytest.raises(TunerError, match=r"^--precision: .*compute capability 8\.9") as info:
        run_json(options(storage, "f8", precision="float8"))
    assert "device is cpu" in str(info.value)
    assert optuna.study.get_all_study_names(storage) == []


def test_an_idle_worker_measures_the_envelope_the_configs_to_gate_are_judged_by(
    tmp_path: Path,
) -> None:
    """`helping.next_envelope`: the envelope of the first config to gate (in another precision
    than the study's, the reference's seed-to-seed one), then the others' in their order; none
    stored or tried twice; the study's own where no config is there to gate yet."""
    opts = options(
        sqlite_url(tmp_path),
        "envelopes",
        trials=10,
        screen="on",
        precisions=("fp32", "bf16-autocast"),
    )
    helper = open_search(opts)
    try:
        study = helper.study
        assert helping.next_envelope(helper, set()) == (keys.ENVELOPE, None)  # nothing to gate

        def add(config: LoopConfig, precision: str, value: float | None) -> None:
            trial = study.ask()
            trial.set_user_attr(keys.CONFIG, config.to_dict())
            trial.set_user_attr(keys.PRECISION, precision)
            key = helper.parity_cache.key(config, precision).removeprefix(keys.PARITY_PREFIX)
            trial.set_user_attr(keys.CONFIG_KEY, key)
            if value is not None:
                study.tell(trial, value)

        add(LoopConfig(num_streams=2), "bf16-autocast", 100.0)
        add(LoopConfig(num_streams=1), "fp32", None)  # running
        assert helping.next_envelope(helper, set()) == (keys.PRECISION_ENVELOPE, "bf16-autocast")
        assert helping.next_envelope(helper, {keys.PRECISION_ENVELOPE}) == (keys.ENVELOPE, "fp32")
        study.set_user_attr(keys.PRECISION_ENVELOPE, {"stored": True})
        study.set_user_attr(keys.ENVELOPE, {"stored": True})
        assert helping.next_envelope(helper, set()) is None
    finally:
        helper.close()


def test_an_idle_worker_gates_what_the_final_round_can_reach_then_the_running_trials(
    tmp_path: Path,
) -> None:
    """`Search.help_gate`'s order (`helping.next_to_gate`): the complete trials within the final
    round's reach, fastest first and one per config, then the trials still running, oldest
    first; never a config whose verdict is stored, nor one out of reach."""
    opts = options(sqlite_url(tmp_path), "helping", trials=10, screen="on", tie_margin=0.05)
    helper = open_search(opts)
    try:
        study = helper.study

        def add(config: LoopConfig, value: float | None) -> None:
            trial = study.ask()
            trial.set_user_attr(keys.CONFIG, config.to_dict())
            key = helper.parity_cache.key(config).removeprefix(keys.PARITY_PREFIX)
            trial.set_user_attr(keys.CONFIG_KEY, key)
            if value is not None:
                study.tell(trial, value)

        fast, close, slow, running = (LoopConfig(num_streams=n) for n in (2, 3, 4, 1))
        add(slow, 50.0)  # beyond the 5 % margin and the screen's spare: out of reach
        add(close, 97.0)
        add(fast, 100.0)
        add(fast, 99.0)  # the same config again: gated once
        add(running, None)
        order = []
        tried: set[str] = set()
        while (found := helping.next_to_gate(helper, tried)) is not None:
            tried.add(found[0])
            order.append(found[1])
        assert order == [fast, close, running]
        # A verdict already stored (the finalizer's, another helper's) is not asked again.
        study.set_user_attr(helper.parity_cache.key(close), {"passed": True})
        after = helping.next_to_gate(helper, {helper.parity_cache.key(fast)})
        assert after is not None and after[1] == running
    finally:
        helper.close()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0.0, -5.0])
def test_a_search_budget_that_is_not_a_finite_positive_number_is_refused(
    timeout: float, tmp_path: Path
) -> None:
    """NaN compares false with everything: `--timeout nan` passed a `<= 0` check and the run
    said "search budget nan s" (a new user's trial, 2026-12-02)."""
    with pytest.raises(trainers.ConfigError, match=r"^timeout_s=.* is invalid: allowed a finite"):
        options(sqlite_url(tmp_path), "x", timeout_s=timeout)


def test_a_run_of_every_trial_asked_for_says_no_timeout(tmp_path: Path) -> None:
    # "timeout: stopped after 2 trials" was printed where --trials 2 had all run, the budget
    # running out after the last (a new user's trial, 2026-12-02).
    storage = sqlite_url(tmp_path)
    progress = _Phases()
    # 50 ms: the first trial starts well inside it and ends past it (a trial is a build and
    # several timed windows).
    run_json(options(storage, "all-run", trials=1, timeout_s=0.05), progress=progress)
    assert len(_complete_values(storage, "all-run")) == 1
    assert not any(line.startswith("timeout:") for line in progress.lines), progress.lines
    # With trials left the budget still stops the run, and says so.
    progress = _Phases()
    run_json(options(storage, "cut", trials=5, timeout_s=0.05), progress=progress)
    assert len(_complete_values(storage, "cut")) < 5
    assert any(line.startswith("timeout: stopped after") for line in progress.lines)


def test_tf32_where_it_computes_as_fp32_runs_and_a_line_says_so(tmp_path: Path) -> None:
    """A study in tf32 on a CPU measured fp32 under another name and said nothing (2026-12-04)."""
    import torch

    import trainers

    storage = sqlite_url(tmp_path)
    said = _Phases()
    rec = run_json(options(storage, "tf32", trials=1, precision="tf32"), progress=said)
    assert rec["config"] is not None
    line = "--precision tf32: on cpu tf32 computes as fp32 (TF32 is NVIDIA's tensor-core format)"
    assert line in said.lines
    plain = _Phases()
    run_json(options(storage, "fp32", trials=1), progress=plain)
    assert not any("tf32" in text for text in plain.lines)
    assert trainers.tf32_unused(torch.device("cpu")) is not None


def test_a_job_says_where_a_pin_wins_over_its_own_space(tmp_path: Path) -> None:
    said = _Phases()
    own = {"sync_interval": [1, 2], "num_workers": 0}
    fix = ("num_workers=0", "sync_interval=2")
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, "own", trials=1, space=own, fix=fix), progress=said)
    ran = [t.user_attrs["config"] for t in load(storage, "own").trials if "config" in t.user_attrs]
    assert ran and all(config["sync_interval"] == 2 for config in ran)
    line = "pinned sync_interval=2: the pin wins over space 'custom', which searched 1, 2"
    assert line in said.lines
    assert not any("num_workers=0: the pin wins" in text for text in said.lines)
    # Where the recommendation, `best` and a job show it (it had been a progress line only),
    # and that the pin left nothing to search (each trial had run one config, unsaid).
    assert line in rec["search"]["space_notes"], rec["search"]
    assert PINNED_ALL in rec["search"]["space_notes"] and PINNED_ALL in said.lines
    wider = {"sync_interval": [1, 2], "num_streams": [1, 2]}
    rec = run_json(options(storage, "wider", trials=1, space=wider, fix=("sync_interval=2",)))
    assert PINNED_ALL not in rec["search"]["space_notes"], rec["search"]


def test_a_baseline_that_does_not_keep_the_pins_is_measured_and_not_recommended(
    tmp_path: Path,
) -> None:
    # `--fix num_streams=3` had recommended a baseline of 1 or 2 streams where it won.
    storage = sqlite_url(tmp_path)
    rec = run_json(options(storage, "pinned", trials=2, fix=("num_streams=3",)))
    assert rec["config"] is not None and rec["config"]["num_streams"] == 3, rec["source"]
    assert rec["source"] not in BASELINES
    measured = {entry["name"] for entry in rec["final_round"]}
    assert set(BASELINES) <= measured  # still measured: the speedups are over them


def test_a_trial_the_pruner_judges_at_its_last_window_completes_and_says_nothing_of_it(
    tmp_path: Path, disarm: None
) -> None:
    storage = sqlite_url(tmp_path)
    progress = _ArmAfter("slow", after=5)
    run_json(
        options(
            storage,
            "prune-last",
            trials=7,
            baseline_every=100,
            workload=f"{WORKLOADS}:slow_when_armed",
            protocol=Protocol(warmup=1, windows=2, window_steps=2),
        ),
        progress=progress,
    )
    study = load(storage, "prune-last")
    # The pruner fires at window 2, the last: nothing is left to stop, so the run completes,
    # and its row had said "stopped by the pruner" beside state complete.
    slow = study.trials[5:]
    assert [t.state for t in slow] == [TrialState.COMPLETE] * 2
    assert all(t.user_attrs.get("pruned_at") is None for t in slow)
    assert all(pruned_reason(t.user_attrs) is None for t in slow)
