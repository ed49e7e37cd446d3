"""The CLI and the API accept and refuse the same requests, for the settings they share one rule
for: the number of trials (`DEFAULT_TRIALS`, `MAX_TRIALS`), the device's syntax, what a `cpu`
device cannot run, and
every setting's pin (`--fix name=value` against the job's `fix`, each value from the lever table).
The values are generated from those rules, so a change to one side alone fails here. The CLI runs
as a user runs it (typer's runner on the real app), the API through its real app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.api.helpers import AUTH
from trainers import LEVERS, Lever
from tuner.__main__ import main
from tuner.cli import app
from tuner.errors import SpaceError
from tuner.search.proposing.defaults import DEFAULT_TRIALS, MAX_TRIALS
from tuner.search.spaces.named import load_space
from tuner.search.spaces.pinned import check_pins
from tuner.search.spaces.processes import for_processes

TRIAL_COUNTS = sorted({0, 1, DEFAULT_TRIALS, MAX_TRIALS, MAX_TRIALS + 1, -1})


def _cli(args: list[str], tmp_path: Path) -> tuple[int, str]:
    storage = f"sqlite:///{tmp_path / 'cli.db'}"
    result = CliRunner().invoke(app, ["run", "--storage", storage, *args])
    # The refusal is on stderr, the progress on stdout: a user sees both.
    return result.exit_code, result.stdout + result.stderr


def _cli_refuses_trials(value: int, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> bool:
    # An unknown workload: an accepted count goes on to that refusal, and nothing runs.
    storage = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["run", "--workload", "no-such", "--preset", "tiny", f"--trials={value}"]
    code = main([*args, "--storage", storage])
    err = capsys.readouterr().err
    assert code != 0, err
    return "--trials" in err


def _api_refuses_trials(client: TestClient, value: int) -> bool:
    job = {"workload": "no-such", "preset": "tiny", "trials": value}
    response = client.post("/v1/jobs", json=job, headers=AUTH)
    assert response.status_code == 422, response.text
    return any(e["loc"][:2] == ["body", "trials"] for e in response.json()["detail"])


@pytest.mark.parametrize("value", TRIAL_COUNTS)
def test_the_cli_and_the_api_accept_the_same_numbers_of_trials(
    client: TestClient, capsys: pytest.CaptureFixture[str], tmp_path: Path, value: int
) -> None:
    refused = not 1 <= value <= MAX_TRIALS
    assert _cli_refuses_trials(value, capsys, tmp_path) is refused
    assert _api_refuses_trials(client, value) is refused


def test_both_default_to_the_same_number_of_trials(client: TestClient) -> None:
    job = {"workload": "mlp", "preset": "tiny", "device": "cpu"}
    created = client.post("/v1/jobs", json=job, headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["trials"] == DEFAULT_TRIALS
    # The CLI's default as a user sees it, in its help.
    help_text = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    assert f"[default: {DEFAULT_TRIALS}]" in help_text.split("--trials", 1)[1].split("--", 1)[0]


def test_float8_on_the_cpu_is_refused_by_both_naming_the_precision(
    client: TestClient, tmp_path: Path
) -> None:
    job = {"workload": "mlp", "preset": "tiny", "device": "cpu", "precision": "float8"}
    response = client.post("/v1/jobs", json=job, headers=AUTH)
    assert response.status_code == 422, response.text
    (error,) = [e for e in response.json()["detail"] if e["loc"][:2] == ["body", "precision"]]
    # In a process of its own, as a user runs it: the refusal comes after PyTorch loads.
    run = subprocess.run(
        [
            *(sys.executable, "-m", "tuner", "run", "--workload", "mlp", "--preset", "tiny"),
            *(
                "--device",
                "cpu",
                "--precision",
                "float8",
                "--storage",
                f"sqlite:///{tmp_path}/f.db",
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = run.stderr
    assert run.returncode != 0 and "--precision" in output, output
    # One rule (`trainers.check_precision_here`): the same reason in both.
    reason = output.split("--precision:", 1)[1].strip().split(";")[0].strip()
    assert reason and reason in error["msg"], (reason, error["msg"])


DEVICE_CASES = ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "gpu", "cuda:x", "cuda:", "CPU", ""]
DEVICE_CASES += ["cpu\n", "auto\n", "cuda:1\n", "cuda:01", "cuda:00", "cuda:1000"]
"""A final newline, which `$` lets through: each side refusing it alone is what is tested."""


def _cli_refuses_device(value: str) -> bool:
    """`--device` as the CLI reads it (`trainers.resolve_device`): refused for its syntax, or
    accepted (CUDA itself missing on this machine is another refusal, not the syntax's)."""
    import trainers

    try:
        trainers.resolve_device(value)
    except trainers.ConfigError:
        return True
    except trainers.UnsupportedOnDevice:
        return False
    return False


@pytest.mark.parametrize("value", DEVICE_CASES)
def test_the_cli_and_the_api_read_one_device_syntax(client: TestClient, value: str) -> None:
    job = {"workload": "mlp", "preset": "tiny", "device": value}
    response = client.post("/v1/jobs", json=job, headers=AUTH)
    assert response.status_code in (201, 422), response.text
    refused = response.status_code == 422
    if refused:
        assert [e["loc"][:2] for e in response.json()["detail"]] == [["body", "device"]]
    else:
        assert response.json()["device"] == value
    assert _cli_refuses_device(value) is refused, value
    assert refused is (value.strip() != value or value not in DEVICE_CASES[:5]), value


def test_the_api_still_reads_n_trials_its_former_name(client: TestClient) -> None:
    job = {"workload": "mlp", "preset": "tiny", "device": "cpu", "n_trials": 7}
    created = client.post("/v1/jobs", json=job, headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["trials"] == 7 and "n_trials" not in created.json()
    bad = client.post("/v1/jobs", json=job | {"n_trials": 0}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "n_trials"]


def _lever_values(item: Lever) -> list[Any]:
    """Each value `item` declares, and values next to them it does not: its default (which a pin
    may name whatever owns it), the bounds of a span and one past each, or each option and one
    of the same type that is none of them."""
    if item.span is not None:
        low, high = item.span.low, item.span.high
        bounds = [low, low - 1] + ([] if high is None else [high, high + 1])
        return [item.default, *(v for v in bounds if v != item.default)]
    wrong: dict[str, Any] = {"str": "no-such", "bool": "maybe", "int": 3, "float": 0.3}
    return [*item.values(), wrong[item.kind]]


LEVER_CASES = [(item.name, value) for item in LEVERS.values() for value in _lever_values(item)]


def _cli_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _cli_accepts_pin(name: str, value: Any) -> bool:
    """`--fix name=value` as `python -m tuner run` reads it: the text parsed and checked by the
    space it pins, for one process per trial, then refused where no draw could run it in the
    study's precisions (none given: fp32) or beside the other settings (`check_pins`,
    in `tuner.search.study.open_search`'s order). The model's own refusals are the worker's in
    the API, which has the model: not compared here."""
    try:
        space = for_processes(load_space("auto", fix=[f"{name}={_cli_text(value)}"], cuda=True), 1)
        check_pins(space, ("fp32",), None)
    except SpaceError:
        return False
    return True


def test_the_lever_table_has_cases_for_every_setting() -> None:
    assert {name for name, _ in LEVER_CASES} == set(LEVERS)
    # Each setting has a value both accept and one both refuse (the next test compares them).
    for name in LEVERS:
        outcomes = {_cli_accepts_pin(n, v) for n, v in LEVER_CASES if n == name}
        assert outcomes == {True, False}, name


@pytest.mark.parametrize(("name", "value"), LEVER_CASES)
def test_the_cli_and_the_api_accept_the_same_pins(
    client: TestClient, name: str, value: Any
) -> None:
    job = {"workload": "mlp", "preset": "tiny", "fix": {name: value}}
    response = client.post("/v1/jobs", json=job, headers=AUTH)
    assert response.status_code in (201, 422), response.text
    assert (response.status_code == 201) is _cli_accepts_pin(name, value), response.text


PRECISION_CASES: list[tuple[dict[str, Any], str]] = [
    # (the request's precision fields, the field refused): the rules between them are
    # `trainers.PrecisionSpec.of`'s, applied once where each request enters.
    ({"precisions": ["fp32", "fp32"]}, "precisions"),
    ({"precision": "tf32", "precisions": ["fp32", "bf16-autocast"]}, "precision"),
    ({"precisions": ["fp32", "bf16-autocast"], "nproc_per_node": 2}, "precisions"),
]


def _cli_flags(fields: dict[str, Any]) -> list[str]:
    flags = []
    for name, value in fields.items():
        text = ",".join(value) if isinstance(value, list) else str(value)
        flags += [f"--{name.replace('_', '-')}", text]
    return flags


@pytest.mark.parametrize(("fields", "field"), PRECISION_CASES)
def test_the_cli_and_the_api_refuse_the_same_precisions_with_the_same_reason(
    client: TestClient,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    fields: dict[str, Any],
    field: str,
) -> None:
    job = {"workload": "mlp", "preset": "tiny", "device": "cpu"} | fields
    response = client.post("/v1/jobs", json=job, headers=AUTH)
    assert response.status_code == 422, response.text
    (error,) = [e for e in response.json()["detail"] if e["loc"][:2] == ["body", field]]
    storage = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["run", "--workload", "mlp", "--preset", "tiny", "--device", "cpu"]
    code = main([*args, *_cli_flags(fields), "--storage", storage])
    err = capsys.readouterr().err
    flag = f"--{field.replace('_', '-')}"
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code != 0 and line.startswith(f"error: {flag}: "), err
    reason = line.split(f"{flag}: ", 1)[1].strip()
    assert reason == error["msg"], (reason, error["msg"])
