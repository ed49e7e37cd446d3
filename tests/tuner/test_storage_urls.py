"""Storage URLs as users type them (issue 56): a password never shows in any line printed, the
usual PostgreSQL spellings work, and what streamtune cannot open is one line naming the forms
it takes. In-process through `tuner.__main__.main`, on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.tuner.test_cli_run import run_main
from tests.tuner.tiny import RUN_FLAGS
from tuner.__main__ import main
from tuner.store.storage import masked

SECRET = "s3cret-Pa55"
REPO = Path(__file__).resolve().parents[2]
# Nothing listens on this port: the driver fails to connect, and its error is printed.
CLOSED_PG = f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:5499/test"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "url",
    [
        CLOSED_PG,
        f"postgres://postgres:{SECRET}@127.0.0.1:5499/test",
        f"mysql://root:{SECRET}@127.0.0.1/db",
    ],
)
def test_no_line_run_prints_shows_the_password(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, out, err = run(
        capsys, "run", "--workload", "mlp", "--preset", "tiny", "--trials", "1", "--storage", url
    )
    assert code == 2
    assert SECRET not in out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --storage: "), err
    assert "Traceback" not in err


def test_the_progress_line_naming_the_storage_masks_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, _, err = run(capsys, "run", "--workload", "mlp", "--preset", "tiny", "--storage", CLOSED_PG)
    opening = [line for line in err.splitlines() if "opening the study in" in line]
    assert opening and opening[0].endswith("postgresql+psycopg://postgres:***@127.0.0.1:5499/test")


@pytest.mark.parametrize(
    "url", [f"mysql://root:{SECRET}@127.0.0.1/db", "oracle://scott@127.0.0.1/x", "garbage://"]
)
def test_an_unsupported_database_is_one_line_naming_the_accepted_forms(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, out, err = run(capsys, "studies", "--storage", url)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: --storage: "), err
    assert "allowed sqlite:///PATH" in err and "postgresql+psycopg://USER" in err
    assert SECRET not in err


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_postgres_and_postgresql_urls_open_with_the_installed_psycopg(
    capsys: pytest.CaptureFixture[str], pg_url: str, scheme: str
) -> None:
    url = pg_url.replace("postgresql+psycopg://", f"{scheme}://", 1)
    code, out, err = run(capsys, "studies", "--storage", url, "--json")
    assert (code, out.strip(), err) == (0, "[]", "")


def test_masked_hides_the_password_of_urls_sqlalchemy_cannot_parse_too(tmp_path: Path) -> None:
    assert masked(CLOSED_PG) == "postgresql+psycopg://postgres:***@127.0.0.1:5499/test"
    assert masked(f"not a url://me:{SECRET}@host/db") == "not a url://me:***@host/db"
    assert masked(f"sqlite:///{tmp_path}/t.db") == f"sqlite:///{tmp_path}/t.db"
    # As typed: SQLAlchemy's rendering had shown a file: URI as sqlite:///file%3A/...
    uri = f"sqlite:///file:{tmp_path}/t.db?mode=rwc&uri=true"
    assert masked(uri) == uri
    assert (
        masked("postgresql://me:p%40ss@h/db?sslmode=require")
        == "postgresql://me:***@h/db?sslmode=require"
    )


@pytest.mark.parametrize("where", ["closed", "no-folder"])
def test_a_worker_names_the_flag_and_the_fix_as_run_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    """The job tables (`tuner.service.jobtables`) had said `storage:` where `run` said
    `--storage:`, and a missing SQLite folder was the driver's "unable to open database file"."""
    url = CLOSED_PG if where == "closed" else f"sqlite:///{tmp_path / 'missing' / 'jobs.db'}"
    code, _, err = run(capsys, "worker", "--storage", url)
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code != 0 and line.startswith("error: --storage: "), err
    assert SECRET not in err
    assert where == "closed" or "does not exist; create it first" in line, line
    assert not (tmp_path / "missing").exists()


def test_serve_and_a_worker_say_a_file_that_is_not_a_database_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Both had printed a 120-line traceback from the job tables' SQLite pragmas, where `studies`
    said this line (a probe, 2026-12-07). `serve` replaces its process: run as a real one."""
    text = tmp_path / "notdb.txt"
    text.write_text("not a database\n")
    noise = tmp_path / "rand.bin"
    noise.write_bytes(bytes(range(256)) * 20)
    for path in (text, noise):
        url = f"sqlite:///{path}"
        line = f"error: --storage: cannot open {url!r}: file is not a database\n"
        assert run(capsys, "worker", "--storage", url) == (2, "", line)
        serve = ["serve", "--no-worker", "--port", "18473", "--storage", url]
        done = subprocess.run(
            [sys.executable, "-m", "tuner", *serve],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("TUNER_")},
        )
        assert (done.returncode, done.stdout, done.stderr) == (2, "", line), done.stderr


def test_a_bad_tuner_storage_is_named_as_the_environments_not_a_flag_never_given(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # It had said "--storage: 'garbage' is a path", where the user passed no --storage.
    monkeypatch.setenv("TUNER_STORAGE", "garbage")
    code, out, err = run(capsys, "studies")
    assert (code, out) == (2, "")
    assert err.startswith("error: --storage (not given; from TUNER_STORAGE): 'garbage' is a path")
    # A --storage given is the flag's, whatever the environment holds.
    code, _, err = run(capsys, "studies", f"--storage=sqlite:///{tmp_path}/none.db")
    assert code == 2 and err.startswith("error: --storage: no database at"), err


def test_run_on_a_read_only_database_is_one_line_naming_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database that opens but refuses writes: `run` had printed SQLAlchemy's traceback (a
    probe, 2026-12-08), where `worker` and the read-only commands answer in one line."""
    path = tmp_path / "ro.db"
    optuna.storages.RDBStorage(f"sqlite:///{path}")  # Optuna's tables, no study yet
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    code, out, err = run_main(capsys, "run", *RUN_FLAGS, "--trials", "1", "--storage", url)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: --storage: cannot write to {url!r}: attempt to write a rea")
    assert err.count("\n") == 1, err
    assert optuna.get_all_study_names(f"sqlite:///{path}") == []
