"""`tuner.report`: the HTML page of real small studies (profiled on the CPU), opened in headless
Chromium, and the same storage read by optuna-dashboard."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import plotly.offline
import pytest
import typer

from tests.tuner.evidence import chromium
from tests.tuner.tiny import PROTOCOL, load, options, run_json, sqlite_url
from trainers import field_names
from tuner import cli
from tuner.__main__ import main
from tuner.errors import StudyNotFound
from tuner.evidence import profiles, trace, verdicts
from tuner.evidence.report import write_report
from tuner.search.options import RunOptions
from tuner.store import storage as studies

MAIN_PLOTS = ["speedup", "trials-over-time", *(f"setting-{f}" for f in field_names())]
SECTIONS = ("summary", "recommendation", "speedup", "trials", "settings", "pareto", "breakdown")


@dataclasses.dataclass(frozen=True)
class Reported:
    storage: str
    artifacts: Path
    rec: dict[str, Any]
    page: Path
    html: str
    pareto_page: Path
    pareto_html: str


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Reported:
    """The transformer `tiny` over the full space, its baselines and recommendation profiled
    (as `run` does with profiling on), and a two-objective mlp study beside it, unprofiled."""
    directory = tmp_path_factory.mktemp("report")
    storage = sqlite_url(directory)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        rec = run_json(
            RunOptions(
                workload="transformer",
                preset="tiny",
                trials=4,
                storage=storage,
                study="tiny-report",
                device="cpu",
                protocol=PROTOCOL,
                final_rounds=1,
                parity_steps=4,
                top_k=2,
                profile="baselines",
                profile_steps=3,
            )
        )
    artifacts = profiles.artifact_dir(storage)
    page = write_report(storage, "tiny-report", directory / "out" / "report.html")

    run_json(
        options(storage, "two-objectives", objectives=("throughput", "memory"), profile="none")
    )
    pareto_page = write_report(storage, "two-objectives", directory / "pareto.html")
    return Reported(
        storage=storage,
        artifacts=artifacts,
        rec=rec,
        page=page,
        html=page.read_text(encoding="utf-8"),
        pareto_page=pareto_page,
        pareto_html=pareto_page.read_text(encoding="utf-8"),
    )


def plot_names(page: str) -> list[str]:
    return re.findall(r'<div class="plot" data-plot="([^"]+)">', page)


# -- the page --------------------------------------------------------------------------------


def test_the_page_has_every_section_and_plot(reported: Reported) -> None:
    page = reported.html
    for section in SECTIONS:
        assert f'<section id="{section}">' in page, section
    assert plot_names(page) == [*MAIN_PLOTS, "breakdown"]
    assert f"{len(MAIN_PLOTS) + 1} plots" in page
    # One objective: the Pareto section says why it has no plot.
    assert "One objective (throughput): no Pareto front" in page


def test_the_page_shows_the_recommendation_its_ties_and_explanation(reported: Reported) -> None:
    page, rec = reported.html, reported.rec
    assert rec["explanation"].startswith(f"{verdicts.CPU_EXPLANATION}; ")
    assert rec["explanation"].endswith(" over seed-baseline")
    assert f'<p class="explanation">{html.escape(rec["explanation"])}</p>' in page
    assert f"{html.escape(str(rec['source']))}: num_streams=" in page
    for tie in rec["ties"]:
        assert f"<td>{html.escape(tie['name'])}</td>" in page
    for name in rec["speedup"]:
        assert f"<b>vs {name}</b>" in page
    assert html.escape(rec["note"]) in page  # measured on a CPU


def test_the_breakdown_compares_the_profiled_baselines_and_recommended(reported: Reported) -> None:
    page = reported.html
    section = page[page.index('<section id="breakdown">') :]
    assert html.escape(trace.CPU_NOTE) in section
    for name in ("pytorch-default", "seed-baseline", "recommended"):
        assert f"<td>{name}</td><td><b>unknown</b></td>" in section
        assert f"{name}.trace.json.gz" in section
    figure = json.loads(
        re.search(r'Plotly\.newPlot\(\s*"plot-breakdown",\s*(\[.*?\]),\s*\{', section, re.S).group(
            1
        )
    )  # type: ignore[union-attr]
    assert [t["name"] for t in figure] == [
        trace.BREAKDOWN[k] for k in ("data", "optimizer", "host", "sync")
    ]
    assert all(
        t["type"] == "bar" and t["x"] == ["pytorch-default", "seed-baseline", "recommended"]
        for t in figure
    )
    study = load(reported.storage, "tiny-report")
    stored = profiles.study_profiles(study)
    for i, name in enumerate(("pytorch-default", "seed-baseline", "recommended")):
        heights = sum(_decoded(t["y"])[i] for t in figure)
        assert heights == pytest.approx(stored[name]["step_ms"], rel=1e-6)


def _decoded(values: Any) -> list[float]:
    """Plotly may ship a list of numbers as a typed array ({dtype, bdata})."""
    if isinstance(values, dict):
        return list(np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]))
    return list(values)


def test_the_page_is_self_contained(reported: Reported) -> None:
    for page in (reported.html, reported.pareto_html):
        assert not re.search(r"<script[^>]*\ssrc=", page, re.I)
        assert not re.search(r"<link[^>]*\shref=", page, re.I)
        assert not re.search(r"<(iframe|img|object|embed)\b", page, re.I)
        assert "@import" not in page and not re.search(r"url\(\s*['\"]?https?:", page, re.I)
        # plotly.js is inlined once, in the head, and every plot is drawn from it.
        bundle = plotly.offline.get_plotlyjs()
        assert page.count(bundle[:500]) == 1
        assert page.index(bundle[:500]) < page.index("</head>")
        assert page.count("Plotly.newPlot(") == len(plot_names(page))


def test_a_two_objective_study_gets_its_pareto_front_and_no_breakdown(reported: Reported) -> None:
    page = reported.pareto_html
    assert "pareto" in plot_names(page)
    assert "breakdown" not in plot_names(page)
    assert "No profiles stored in this study" in page


def test_a_study_without_trials_still_gets_a_page(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    optuna.create_study(storage=storage, study_name="empty")
    page = write_report(storage, "empty", tmp_path / "empty.html").read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f'<section id="{section}">' in page
    assert plot_names(page) == []
    assert "No recommendation yet" in page and "The study has no trials yet." in page
    assert "with the workload, preset and settings it was made with, finishes it" in page
    assert "a stopped service job is submitted again" in page  # not the CLI's advice alone
    with pytest.raises(StudyNotFound, match="'missing'"):
        write_report(storage, "missing", tmp_path / "missing.html")


def test_the_report_command_writes_the_page(
    reported: Reported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = typer.main.get_command(cli.app)
    if "report" not in getattr(command, "commands", {}):
        pytest.skip("`report` is not wired into tuner/cli.py yet")
    out = tmp_path / "cli.html"
    code = main(
        ["report", "--study", "tiny-report", "--storage", reported.storage, "--out", str(out)]
    )
    assert (code, capsys.readouterr().out.strip()) == (0, str(out))
    assert plot_names(out.read_text(encoding="utf-8")) == plot_names(reported.html)
    assert main(["report", "--study", "missing", "--storage", reported.storage]) == 2
    assert "no study named 'missing'" in capsys.readouterr().err


# -- in a browser ----------------------------------------------------------------------------


needs_chromium = pytest.mark.skipif(
    not chromium.available(),
    reason=f"headless Chromium is not installed ({chromium.CHROMIUM}): apt-get install chromium",
)


@needs_chromium
def test_the_page_renders_every_plot_in_chromium_without_console_errors(
    reported: Reported, tmp_path: Path
) -> None:
    for page, text in (
        (reported.page, reported.html),
        (reported.pareto_page, reported.pareto_html),
    ):
        seen = chromium.render(page, tmp_path / f"profile-{page.stem}")
        expected = plot_names(text)
        assert list(seen.plots) == expected
        assert all(seen.plots[name] > 0 for name in expected), seen.plots
        assert all(seen.traces[name] > 0 for name in expected), seen.traces
        assert seen.errors == []
        assert all(url.startswith("file://") for url in seen.requests), seen.requests


@needs_chromium
def test_the_browser_check_catches_a_broken_page(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(
        '<!DOCTYPE html><html><body><div class="plot" data-plot="x"></div>'
        '<script>console.error("boom"); undefinedCall();</script></body></html>'
    )
    seen = chromium.render(broken, tmp_path / "profile", budget_s=3.0)
    assert seen.plots == {"x": 0}
    assert any("boom" in e for e in seen.errors)
    assert any("undefinedCall" in e for e in seen.errors)


# -- optuna-dashboard on the same storage ----------------------------------------------------


def test_optuna_dashboard_lists_our_studies_with_readable_names(reported: Reported) -> None:
    dashboard = pytest.importorskip("optuna_dashboard")
    werkzeug_test = pytest.importorskip("werkzeug.test")
    storage = studies.open_storage(reported.storage)
    store = optuna.artifacts.FileSystemArtifactStore(str(reported.artifacts))
    client = werkzeug_test.Client(dashboard.wsgi(storage, artifact_store=store))

    listed = client.get("/api/studies")
    assert listed.status_code == 200
    summaries = {s["study_name"]: s for s in listed.get_json()["study_summaries"]}
    assert {"tiny-report", "two-objectives"} <= set(summaries)
    assert summaries["two-objectives"]["directions"] == ["maximize", "minimize"]

    detail = client.get(f"/api/studies/{summaries['tiny-report']['study_id']}?after=0")
    assert detail.status_code == 200
    body = detail.get_json()
    assert "num_streams" in {p["name"] for p in body["union_search_space"]}
    assert {"config", "median", "windows"} <= {a["key"] for a in body["union_user_attrs"]}
    first = body["trials"][0]
    assert {p["name"] for p in first["params"]} >= {"num_streams", "sync_interval", "sync_mode"}
    config = next(a["value"] for a in first["user_attrs"] if a["key"] == "config")
    assert (
        json.loads(config) == load(reported.storage, "tiny-report").trials[0].user_attrs["config"]
    )
    study_attrs = {a["key"] for a in body["user_attrs"]}
    assert {
        "streamtune",
        "recommendation",
        "profile/seed-baseline",
        "profile/recommended",
    } <= study_attrs
    files = {a["filename"]: a["artifact_id"] for a in body["artifacts"]}
    assert set(files) == {
        "pytorch-default.trace.json.gz",
        "seed-baseline.trace.json.gz",
        "recommended.trace.json.gz",
    }
    assert profiles.load_trace(reported.artifacts, files["recommended.trace.json.gz"])[
        "traceEvents"
    ]
