"""Precision searched only when allowed (`RunOptions.precisions`, `--precisions`): the checks, a
real CPU study over fp32 and bf16-autocast (real Optuna, SQLite, runs and gate), its
recommendation, its summary and its export."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import trainers
import tuner
from tests.tuner.test_cli_run import run_main
from tests.tuner.tiny import RUN_FLAGS, load, options, sqlite_url
from trainers import LoopConfig
from trainers.gate import twin_kind
from tuner.__main__ import main
from tuner.errors import TunerError
from tuner.evidence import export
from tuner.evidence.progress import final_line
from tuner.evidence.recommendation import Recommendation
from tuner.search.gating.gate import TWIN_KIND
from tuner.search.options import RunOptions
from tuner.search.spaces.space import config_key
from tuner.search.study import open_search, run_study
from tuner.store import keys

ALLOWED = ("fp32", "bf16-autocast")
PRECISION_STEPS = 7
"""The gate's run length for a config in bf16 here (RUN_FLAGS' --parity-steps is another)."""
TOLERANCE = 5.0
"""--precision-tolerance here: the multiple of that envelope a bf16 config may deviate by."""

# -- the checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"precisions": ("fp32", "fp64")}, "precisions", "precisions='fp64' is invalid"),
        ({"precisions": ("fp32", "fp32")}, "precisions", "each precision once (fp32 twice)"),
        ({"precisions": ()}, "precisions", "one or more of fp32"),
        (
            {"precisions": ALLOWED, "precision": "tf32"},
            "precision",
            "one of precisions (fp32, bf16-autocast)",
        ),
        (
            {"precisions": ALLOWED, "nproc_per_node": 2},
            "precisions",
            "one precision with nproc_per_node > 1",
        ),
        (
            {"precisions": ALLOWED, "workload": "program:anything"},
            "precisions",
            "one precision for a program",
        ),
        (
            {"precisions": ALLOWED, "precision_parity_steps": 1},
            "precision_parity_steps",
            "an integer >= 2, or unset for parity_steps",
        ),
        (
            {"precisions": ALLOWED, "precision_tolerance": 0.0},
            "precision_tolerance",
            "a number > 0 (a multiple of the envelope), or unset",
        ),
        (
            {"precisions": ALLOWED, "precision_tolerance": float("nan")},
            "precision_tolerance",
            "a number > 0",
        ),
    ],
)
def test_bad_precisions_are_refused_naming_the_field(
    changes: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(trainers.ConfigError) as caught:
        RunOptions(**({"workload": "mlp", "preset": "tiny"} | changes))
    assert caught.value.field == field
    assert message in str(caught.value)


def test_the_reference_precision_is_the_one_named_or_the_first_allowed() -> None:
    first = RunOptions(workload="mlp", preset="tiny", precisions=ALLOWED)
    assert first.precision == "fp32" and first.multi_precision
    named = RunOptions(workload="mlp", preset="tiny", precisions=ALLOWED, precision="bf16-autocast")
    assert named.precision == "bf16-autocast" and named.allowed_precisions == ALLOWED
    # One allowed precision is a study fixed to it, as `precision` alone makes.
    one = RunOptions(workload="mlp", preset="tiny", precisions=("bf16-autocast",))
    assert one.precision == "bf16-autocast" and not one.multi_precision
    assert not RunOptions(workload="mlp", preset="tiny").multi_precision


def test_cli_refuses_float8_on_a_cpu_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    code, out, err = run_main(
        capsys, "run", *RUN_FLAGS, "--storage", storage, "--precisions", "fp32,float8"
    )
    assert code != 0 and out == ""
    assert err.startswith("error: --precisions: ") and "float8" in err and "CUDA" in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [
        ("--precision-parity-steps", "1", "an integer >= 2, or unset for parity_steps"),
        ("--precision-tolerance", "0", "a number > 0 (a multiple of the envelope), or unset"),
    ],
)
def test_cli_names_the_flag_of_a_bad_cross_precision_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, allowed: str
) -> None:
    code, out, err = run_main(
        capsys,
        "run",
        *RUN_FLAGS,
        "--storage",
        sqlite_url(tmp_path),
        "--precisions",
        ",".join(ALLOWED),
        flag,
        value,
    )
    assert code != 0 and out == ""
    assert err.startswith(f"error: {flag}: ") and err.rstrip().endswith(f"allowed {allowed}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_names_the_flag_of_an_unknown_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(
        capsys, "run", *RUN_FLAGS, "--storage", sqlite_url(tmp_path), "--precisions", "fp32,fp64"
    )
    assert code != 0
    assert err.startswith("error: --precisions: precisions='fp64' is invalid: allowed one of fp32")
    assert "Traceback" not in err


# -- a real study ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Searched:
    storage: str
    study: str
    rec: dict[str, Any]
    err: str


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Searched:
    """`python -m tuner run --precisions fp32,bf16-autocast --json` on mlp tiny, on the CPU."""
    storage = sqlite_url(tmp_path_factory.mktemp("precisions"))
    # Module-scoped, so captured here (capsys is per test); the tests share one study.
    out, err = io.StringIO(), io.StringIO()
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        warnings.simplefilter("ignore")
        code = main(
            [
                "run",
                *RUN_FLAGS,
                "--storage",
                storage,
                "--trials",
                "4",
                "--timeout",
                "120",
                "--precisions",
                ",".join(ALLOWED),
                "--precision-parity-steps",
                str(PRECISION_STEPS),
                "--precision-tolerance",
                str(TOLERANCE),
                "--json",
            ]
        )
    assert code == 0, err.getvalue()
    rec = json.loads(out.getvalue())
    return Searched(storage=storage, study=rec["study"], rec=rec, err=err.getvalue())


def test_trials_carry_both_precisions_as_a_param(searched: Searched) -> None:
    study = load(searched.storage, searched.study)
    ran = [t for t in study.trials if keys.CONFIG in t.user_attrs]
    assert {t.params["precision"] for t in ran} == set(ALLOWED)
    for trial in ran:
        config = LoopConfig.from_dict(trial.user_attrs[keys.CONFIG])
        precision = trial.params["precision"]
        assert trial.user_attrs[keys.PRECISION] == precision
        # The reference precision keeps the plain key; another is a candidate of its own.
        expected = config_key(config) + ("" if precision == "fp32" else f"@{precision}")
        assert trial.user_attrs[keys.CONFIG_KEY] == expected
    meta = study.user_attrs["streamtune"]
    assert meta["precision"] == "fp32" and meta["precisions"] == list(ALLOWED)
    # A study searching precisions never shares a name with one fixed to one of them.
    assert searched.study.endswith("-precisions-fp32-bf16-autocast")


def test_bf16_trials_are_judged_by_equivalence_against_the_fp32_reference(
    searched: Searched,
) -> None:
    study = load(searched.storage, searched.study)
    judged = [
        t
        for t in study.trials
        if t.params.get("precision") == "bf16-autocast" and keys.PARITY in t.user_attrs
    ]
    assert judged, "no bf16 trial reached the gate"
    for trial in judged:
        verdict = trial.user_attrs[keys.PARITY]
        assert verdict["test"] in ("equivalence", "exact+equivalence")
        assert (verdict["precision"], verdict["reference_precision"]) == ("bf16-autocast", "fp32")
        # Cached apart from the same config in fp32.
        assert f"parity/{trial.user_attrs[keys.CONFIG_KEY]}" in study.user_attrs
        assert trial.user_attrs[keys.CONFIG_KEY].endswith("@bf16-autocast")
        # Over --precision-parity-steps, against fp32's seed-to-seed envelope, measured with
        # the process's own kernels; a twin's bits (loop settings) over the gate's own 4 steps.
        # The config's own run is strict only where it owes the eager twin's bits; through the
        # loop twin (the search's) it computes as the envelope did.
        assert verdict["steps"] == PRECISION_STEPS
        kind = twin_kind(LoopConfig.from_dict(trial.user_attrs[keys.CONFIG]), TWIN_KIND)
        owes_bits = kind == "eager" and verdict["test"] == "exact+equivalence"
        assert verdict["determinism"] == ("strict" if owes_bits else "off")
        assert verdict["reference_determinism"] == "off"
        if verdict["test"] == "exact+equivalence" and not verdict.get("exact_skipped"):
            assert verdict["exact_against"] == f"{kind} twin"
        assert verdict["exact_steps"] == (None if verdict["test"] == "equivalence" else 4)
        assert "seed-to-seed envelope (4 other seeds in fp32)" in verdict["reason"]
        # The user's tolerance, in the verdict and its reason (the report shows both).
        assert (
            verdict["multiple"] == TOLERANCE and f"{TOLERANCE:g}x the envelope" in verdict["reason"]
        )
    fp32 = [t for t in study.trials if t.params.get("precision") == "fp32"]
    gated = [t.user_attrs[keys.PARITY] for t in fp32 if keys.PARITY in t.user_attrs]
    assert all(v["precision"] == v["reference_precision"] == "fp32" for v in gated)
    assert all(v["steps"] != PRECISION_STEPS and "seed-to-seed" not in v["reason"] for v in gated)
    assert all(v.get("multiple") in (None, 3.0) for v in gated)
    assert all(v["reference_determinism"] == "strict" for v in gated)
    # The shorter exact test was exercised: some bf16 config owed its twin's bits.
    assert any(t.user_attrs[keys.PARITY]["exact_steps"] == 4 for t in judged)
    # Two envelopes, each measured once: the rounding one of the fp32 configs' gates, and the
    # seed-to-seed one of the bf16 configs'.
    rounding = study.user_attrs[keys.ENVELOPE]
    seeds = study.user_attrs[keys.PRECISION_ENVELOPE]
    assert (rounding["spread"], seeds["spread"]) == ("rounding", "seeds")
    assert seeds["steps"] == PRECISION_STEPS != rounding["steps"]
    assert rounding["precision"] == seeds["precision"] == "fp32"
    assert seeds["perturbation_seeds"] == [1, 2, 3, 4]
    # The seed-to-seed runs computed with the process's own kernels, the rounding ones strict.
    assert (seeds["strict"], rounding["strict"]) == (False, True)


def test_the_recommendation_names_its_precision(searched: Searched) -> None:
    rec = searched.rec
    assert rec["config"] is not None
    assert rec["precision"] in ALLOWED
    assert rec["reference_precision"] == "fp32" and rec["precisions"] == list(ALLOWED)
    assert rec["tie_rule"].startswith("the study's precision (fp32) first")
    parsed = Recommendation.from_dict(rec)
    assert parsed.trained_precision == rec["precision"]
    assert Recommendation.from_dict(parsed.to_dict()) == parsed
    # The summary's last line names it too.
    assert f", {rec['precision']}]" in final_line(parsed)
    assert f", {rec['precision']}]" in searched.err


def test_the_export_carries_the_chosen_precision(searched: Searched, tmp_path: Path) -> None:
    rec = Recommendation.from_dict(searched.rec)
    chosen = searched.rec["precision"]
    exported = tmp_path / "tuned.json"
    exported.write_text(export.export(rec, "json"))
    assert json.loads(exported.read_text())["precision"] == chosen
    assert trainers.load_config(exported) == LoopConfig.from_dict(searched.rec["config"])
    assert trainers.load_precision(exported) == chosen
    env = dict(line.split("=", 1) for line in export.export(rec, "env").splitlines())
    assert trainers.load_precision(environ=env) == chosen
    assert trainers.load_config(environ=env) == LoopConfig.from_dict(searched.rec["config"])
    assert f"PRECISION = {chosen!r}" in export.export(rec, "python")


@pytest.mark.parametrize("fixed", ["fp32", "bf16-autocast"])
def test_a_study_fixed_to_one_precision_exports_it_and_is_trained_in_it(
    fixed: str, tmp_path: Path
) -> None:
    """No `precisions`: no precision param and the plain keys; the export, `tuner.
    load_precision` and the exported script still name the precision the study measured in (a
    study fixed to bf16 was trained in fp32 from its own export)."""
    storage = sqlite_url(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = run_study(options(storage, "one", trials=2, precision=fixed))
    study = load(storage, "one")
    assert all("precision" not in t.params for t in study.trials)
    assert rec.precision is None and rec.precisions is None
    assert "reference_precision" not in rec.to_dict()
    exported = tmp_path / "tuned.json"
    exported.write_text(export.export(rec, "json"))
    # fp32's export is the bare config (LoopConfig.from_dict takes it); a Trainer's default
    # precision is fp32 arithmetic.
    named = None if fixed == "fp32" else fixed
    assert json.loads(exported.read_text()).get("precision") == named
    assert trainers.load_precision(exported) == named
    assert trainers.load_config(exported) == LoopConfig.from_dict(rec.to_dict()["config"])
    env = dict(line.split("=", 1) for line in export.export(rec, "env").splitlines())
    assert trainers.load_precision(environ=env) == named
    assert tuner.load_precision(storage, "one") == fixed
    assert f"PRECISION = {fixed!r}" in export.export(rec, "python")
    trainer = trainers.Trainer(
        trainers.load_workload("mlp", "tiny"),
        tuner.load_config(storage, "one"),
        device="cpu",
        precision=tuner.load_precision(storage, "one"),
    )
    assert trainer.precision_plan.autocast_dtype == (None if fixed == "fp32" else torch.bfloat16)


def test_a_resume_with_other_precisions_is_refused(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    open_search(options(storage, "p", precisions=ALLOWED)).close()
    with pytest.raises(TunerError, match=r"made with precisions=\['fp32', 'bf16-autocast'\]"):
        open_search(options(storage, "p", precisions=("fp32",)))
