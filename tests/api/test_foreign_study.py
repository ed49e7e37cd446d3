"""A study another Optuna program made in the same storage is not taken for streamtune's: `tuner
studies` had listed its objective as best samples/s, `best` had advised `python -m tuner run
--study foreign` (streamtune's trials in someone else's study), `report` had written a page and
GET /v1/studies/foreign had answered 200 with workload null (a probe, 2026-12-07). Streamtune's
mark is `keys.META` on the study, stored by every version since the first."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app
from tests.api.helpers import ADMIN_AUTH
from tests.tuner.test_cli_run import run_main
from tuner.store import keys

SAID = "study 'foreign' is not a streamtune study (made by another Optuna program)"


@pytest.fixture
def mixed(any_storage: str) -> str:
    foreign = optuna.create_study(study_name="foreign", storage=any_storage)
    foreign.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2, n_trials=3)
    # Streamtune's as its first version stored it (a trial, and META without later fields).
    ours = optuna.create_study(study_name="ours", storage=any_storage, direction="maximize")
    ours.set_user_attr(keys.META, {"workload": "mlp", "preset": "tiny", "hardware": "cpu"})
    ours.add_trial(optuna.trial.create_trial(value=100.0, user_attrs={"config": {}}))
    # Just created: META not stored yet (`open_study`), taken as streamtune's.
    optuna.create_study(study_name="new", storage=any_storage)
    return any_storage


def test_the_cli_refuses_a_foreign_study_and_lists_only_streamtunes(
    mixed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "report.html")
    for command in (["best"], ["export"], ["report", "--out", out]):
        code, printed, err = run_main(capsys, *command, "--study", "foreign", "--storage", mixed)
        assert (code, printed, err) == (2, "", f"error: --study: {SAID}\n"), command
    assert not Path(out).exists()
    code, printed, _ = run_main(capsys, "studies", "--storage", mixed, "--json")
    assert code == 0 and sorted(row["study"] for row in json.loads(printed)) == ["new", "ours"]
    code, _, err = run_main(capsys, "best", "--study", "new", "--storage", mixed)
    assert code == 1 and "or `python -m tuner run --study new` with the workload" in err, err


def test_the_api_answers_404_for_a_foreign_study_and_lists_only_streamtunes(mixed: str) -> None:
    with TestClient(make_app(mixed)) as client:
        for path in ("/v1/studies/foreign", "/v1/studies/foreign/best"):
            response = client.get(path, headers=ADMIN_AUTH)
            assert response.status_code == 404, response.text
            assert response.json()["detail"] == SAID
        page = client.get("/v1/studies", headers=ADMIN_AUTH).json()
        assert [s["name"] for s in page["items"]] == ["new", "ours"] and page["total"] == 2
        ours = client.get("/v1/studies/ours", headers=ADMIN_AUTH).json()
        assert ours["workload"] == "mlp" and ours["trials"]["complete"] == 1
