"""Two studies of one library model at other options are told apart wherever studies are listed:
`tuner studies` (its table and `--json`) and `/v1/studies` showed both as `timm:resnet10t tiny
cpu`, the options that made them differ nowhere."""

from __future__ import annotations

import json

import optuna
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app
from tests.api.helpers import ADMIN_AUTH
from tests.tuner.test_cli_run import run_main
from tuner.store import keys

SMALL = {"image": "32", "batch": "4"}
LARGE = {"image": "64", "batch": "8"}


def _study(storage: str, name: str, model_args: dict[str, str] | None) -> None:
    # A study as `tuner run` records it (`keys.META`); None: one made before options were kept.
    meta = {"workload": "timm:resnet10t", "preset": "tiny", "hardware": "cpu"}
    if model_args is not None:
        meta["model_args"] = model_args
    study = optuna.create_study(study_name=name, storage=storage)
    study.set_user_attr(keys.META, meta)


@pytest.fixture
def three(any_storage: str) -> str:
    _study(any_storage, "small", SMALL)
    _study(any_storage, "large", LARGE)
    _study(any_storage, "older", None)
    return any_storage


def test_the_cli_lists_each_studys_options(three: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "studies", "--storage", three, "--json")
    assert code == 0
    rows = {row["study"]: row["model_args"] for row in json.loads(out)}
    assert rows == {"small": SMALL, "large": LARGE, "older": {}}
    code, out, _ = run_main(capsys, "studies", "--storage", three)
    assert code == 0
    header, *lines = out.splitlines()  # not a terminal: one tab-separated line each
    column = header.split("\t").index("model args")
    cells = {line.split("\t")[0]: line.split("\t")[column] for line in lines}
    assert cells == {"small": "image=32 batch=4", "large": "image=64 batch=8", "older": "-"}


def test_the_api_lists_each_studys_options(three: str) -> None:
    with TestClient(make_app(three)) as client:
        page = client.get("/v1/studies", headers=ADMIN_AUTH).json()
        assert {s["name"]: s["model_args"] for s in page["items"]} == {
            "small": SMALL,
            "large": LARGE,
            "older": {},
        }
        one = client.get("/v1/studies/large", headers=ADMIN_AUTH).json()
        assert one["model_args"] == LARGE
