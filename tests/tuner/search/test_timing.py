"""Where a study's time goes (`tuner.search.measuring.timing`, `tuner.store.phases`): a real tiny
study on the CPU records every phase, per session and per trial, and the summary, the report and the
readers show them."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from api.schemas.jobs import TrialOut
from api.schemas.studies import StudyOut
from tests.tuner.tiny import load, options, sqlite_url
from tuner.evidence import reader, render
from tuner.evidence.recommendation import Recommendation
from tuner.evidence.report import build_report
from tuner.search.study import run_study
from tuner.store import storage as studies
from tuner.store.phases import IDLE, LABELS, PHASES, study_time


@dataclasses.dataclass(frozen=True)
class Timed:
    storage: str
    study: optuna.Study
    rec: Recommendation
    elapsed_s: float


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Timed:
    """Three trials whose test needs the eager twin (a foreach optimizer beside loop settings),
    two final rounds, the baselines and the recommended config profiled."""
    storage = sqlite_url(tmp_path_factory.mktemp("timed"))
    opts = options(
        storage,
        "timed",
        fix=("num_workers=0", "optimizer=foreach"),
        profile="baselines",
        final_rounds=2,
    )
    started = time.monotonic()
    rec = run_study(opts)
    elapsed = time.monotonic() - started
    return Timed(storage=storage, study=load(storage, "timed"), rec=rec, elapsed_s=elapsed)


def test_every_phase_is_recorded_and_they_add_up_to_the_wall_time(timed: Timed) -> None:
    sessions = [v for k, v in timed.study.user_attrs.items() if k.startswith("time/")]
    assert len(sessions) == 1
    session = sessions[0]
    phases = session["phases"]
    assert set(phases) == {*PHASES, IDLE}
    assert all(seconds >= 0.0 for seconds in phases.values())
    # Disjoint parts of the wall time: without idle they never exceed it.
    assert sum(phases[p] for p in PHASES) <= session["wall_s"]
    assert sum(phases.values()) == pytest.approx(session["wall_s"], rel=1e-9)
    # The session is this run: it began after the call and was last stored just before it
    # returned (the recommendation's own write and closing the study come after).
    assert session["wall_s"] <= timed.elapsed_s
    assert session["wall_s"] >= timed.elapsed_s - max(2.0, 0.1 * timed.elapsed_s)
    # What this study ran, each took time (compile is 0 on this space: nothing compiles).
    for phase in PHASES:
        if phase != "compile":
            assert phases[phase] > 0.0, phase
    assert phases["compile"] == 0.0


def test_each_trial_records_its_own_phases(timed: Timed) -> None:
    session = study_time(timed.study.user_attrs)
    assert session is not None
    trials = [t for t in timed.study.trials if t.state == TrialState.COMPLETE]
    assert len(trials) == 3
    for trial in trials:
        spent = trial.user_attrs["time"]
        assert spent["measure"] > 0.0 and spent["compile"] == 0.0
        assert spent["gate_config"] > 0.0 and spent["gate_twin"] > 0.0
        assert trial.user_attrs["parity"]["test"] == "exact+equivalence"
    # The reference and its envelope ran once, for the first trial checked.
    assert sum("gate_reference" in t.user_attrs["time"] for t in trials) == 1
    assert sum("gate_envelope" in t.user_attrs["time"] for t in trials) == 1
    # The trials' shares are part of the study's totals (baselines measure too).
    for phase in ("measure", "gate_twin", "gate_reference"):
        share = sum(t.user_attrs["time"].get(phase, 0.0) for t in trials)
        assert 0.0 < share <= session["phases"][phase] + 1e-9


def test_the_recommendation_the_summary_and_the_report_show_them(timed: Timed) -> None:
    assert timed.rec.time is not None
    assert set(timed.rec.time["phases"]) == {*PHASES, IDLE}
    stored = reader.recommendation(timed.storage, "timed")
    assert stored.time == timed.rec.time
    out = io.StringIO()
    render.recommendation(Console(file=out, width=200), stored)
    line = next(x for x in out.getvalue().splitlines() if x.lstrip().startswith("time"))
    # Each phase that took a tenth of a second or more is named with its seconds; those that
    # would read "0.0 s" are left out (how long each took depends on the machine).
    for phase, seconds in timed.rec.time["phases"].items():
        shown = f"{seconds:.1f}" != "0.0"
        assert (f"{LABELS[phase]} {seconds:.1f} s" in line) == shown, (phase, seconds, line)
    assert f"{timed.rec.time['wall_s']:.1f} s" in line
    page = build_report(timed.study)
    assert 'id="phases"' in page and 'class="trial-phases"' in page
    for phase in (*PHASES, IDLE):
        assert LABELS[phase] in page


def test_the_study_and_trial_readers_serve_them(timed: Timed) -> None:
    studies_reader = reader.StudyReader(studies.open_storage(timed.storage))
    summary = studies_reader.summary("timed")
    assert summary["time"] == study_time(timed.study.user_attrs)
    assert StudyOut.of(summary).time == summary["time"]
    rows, total = studies_reader.trials("timed", limit=10, offset=0)
    assert total == 3 and all(row["time"]["measure"] > 0.0 for row in rows)
    assert TrialOut.model_validate(rows[0]).time == rows[0]["time"]


def test_a_study_resumed_adds_a_session(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    run_study(options(storage, "twice", trials=1, profile="none"))
    run_study(options(storage, "twice", trials=1, profile="none"))
    total = study_time(load(storage, "twice").user_attrs)
    assert total is not None and total["sessions"] == 2
    out = io.StringIO()
    render.recommendation(Console(file=out, width=200), reader.recommendation(storage, "twice"))
    assert "over 2 sessions" in out.getvalue()
