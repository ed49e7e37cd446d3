"""The read-only commands (`studies`, `best`, `export`, `report`) leave a database's schema as
they found it: they had created Optuna's thirteen tables in another program's SQLite file, and
grown an empty file to 114 KB, before saying "no studies" (a probe, 2026-12-07). In-process
through `tuner.__main__.main`, on real SQLite files and a real PostgreSQL schema."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from tests.tuner.test_cli_run import run_main
from tests.tuner.tiny import sqlite_url
from tuner.__main__ import main


def commands(tmp_path: Path) -> list[list[str]]:
    out = str(tmp_path / "report.html")
    return [
        ["studies"],
        ["studies", "--json"],
        ["best", "--study", "s"],
        ["export", "--study", "s"],
        ["report", "--study", "s", "--out", out],
    ]


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_another_programs_sqlite_file_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("create table users(id int)")
    before = path.read_bytes()
    url = sqlite_url(tmp_path, "other.db")
    line = (
        f"error: --storage: {url!r} is not a streamtune (Optuna) storage: it holds other tables "
        "(users) and none of Optuna's; allowed a database `python -m tuner run` made\n"
    )
    for command in commands(tmp_path):
        assert run_main(capsys, *command, "--storage", url) == (2, "", line), command
        assert path.read_bytes() == before, command
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("kind", ["zero-byte", "no-table"])
def test_a_database_without_tables_has_no_studies_and_stays_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    if kind == "no-table":  # an SQLite database, its header written, no table in it
        with sqlite3.connect(path) as conn:
            conn.execute("pragma user_version = 7")
    before = path.read_bytes()
    url = sqlite_url(tmp_path, "empty.db")
    for command in commands(tmp_path):
        code, out, err = run_main(capsys, *command, "--storage", url)
        if command[0] == "studies":
            assert (code, err) == (0, "") and out in ("no studies in this storage\n", "[]\n")
        else:
            line = "error: --study: no study named 's' in this storage (studies: none)\n"
            assert (code, out, err) == (2, "", line), command
        assert path.read_bytes() == before, command


def test_an_optuna_storage_is_still_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path)
    optuna.create_study(study_name="s", storage=url)
    code, out, _ = run_main(capsys, "studies", "--storage", url, "--json")
    assert code == 0 and '"study": "s"' in out


@pytest.mark.postgres
def test_a_postgresql_database_is_read_as_an_sqlite_file_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    # Empty: no studies, and still no table; another program's: refused, its tables alone.
    for command in commands(tmp_path):
        code, _, err = run_main(capsys, *command, "--storage", pg_url)
        assert code == (0 if command[0] == "studies" else 2) and "--storage" not in err, err
        assert tables(pg_url) == set(), command
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("create table users(id int)"))
    engine.dispose()
    for command in commands(tmp_path):
        code, out, err = run_main(capsys, *command, "--storage", pg_url)
        assert (code, out) == (2, ""), command
        assert "is not a streamtune (Optuna) storage: it holds other tables (users)" in err, err
        assert err.count("\n") == 1 and tables(pg_url) == {"users"}, command


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["best", "--study", "a", "--study", "b"], "--study"),
        (["best", "--study=a", "--json", "--study", "b"], "--study"),
        (["export", "--study", "s", "--format", "json", "--format=env"], "--format"),
        (["report", "--study", "s", "--out", "a.html", "--out", "b.html"], "--out"),
        (["studies", "--storage", "x", "--storage", "y"], "--storage"),
    ],
)
def test_a_single_valued_flag_given_twice_is_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], flag: str
) -> None:
    # Click took the last silently: `best --study A --study B` printed B's recommendation.
    line = f"error: {flag}: given more than once; allowed once\n"
    assert run_main(capsys, *args) == (2, "", line)


def test_flags_that_repeat_and_a_value_like_a_flag_are_let_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path)
    optuna.create_study(study_name="--study", storage=url)  # a value, not a second --study
    code, _, err = run_main(capsys, "best", "--study", "--study", "--storage", url)
    assert code == 1 and "has no recommendation yet" in err, err
    code, out, _ = run_main(capsys, "studies", "--json", "--json", "--storage", url)
    assert code == 0 and '"study": "--study"' in out


def test_a_flag_given_twice_elsewhere_keeps_the_last_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Scripts override a base set of flags (`run $DEFAULTS --trials 5`), so the last is kept;
    # `run --workload mlp --workload convnet` had tuned convnet with no word.
    args = ["run", "--workload", "mlp", "--preset", "tiny", "--workload=convnet", "--trials"]
    assert main([*args, "2", "--trials", "3", "--device", "cuda:99"]) == 2
    err = capsys.readouterr().err
    notes = [line.partition("] ")[2] for line in err.splitlines() if "] note:" in line]
    assert notes == [
        "note: --workload given 2 times; using the last, 'convnet' ('mlp' ignored)",
        "note: --trials given 2 times; using the last, '3' ('2' ignored)",
    ]
    assert err.splitlines()[-1].startswith("error: --device"), err
    # A refused flag is still one line; the same value twice says nothing.
    code, _, err = run_main(capsys, *args, "0", "--trials", "0", "--preset", "tiny")
    assert code == 2 and err.startswith("error: --trials") and err.count("\n") == 1, err
    flags = ["train", "--workload", "mlp", "--preset", "tiny", "--device", "cpu", "--warmup"]
    code, out, err = run_main(capsys, *flags, "1", "--steps", "4", "--steps", "2", "--json")
    assert code == 0 and json.loads(out)["steps"] == 2
    assert err == "note: --steps given 2 times; using the last, '2' ('4' ignored)\n"


def test_the_notes_of_one_command_line_are_not_said_by_the_next() -> None:
    from tuner.repeats import OVERRIDDEN

    # In one process (a test, an embedding) the next command must not repeat them.
    main(["train", "--steps", "0", "--steps", "-1"])
    assert OVERRIDDEN.get() == ()
