"""Where studies live: the storage URL, study names, opening and resuming a study.

The embedded default is an SQLite file, `./tuner.db`; any Optuna RDB URL works through `--storage`
or `TUNER_STORAGE` (PostgreSQL: `postgresql+psycopg://user@host/db`). What is stored on a study
is listed in `tuner.store.keys`.
"""

from __future__ import annotations

import gc
import os
import random
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
import sqlalchemy.engine
import sqlalchemy.exc

from tuner.errors import StudyNotFound, TunerError, named
from tuner.store.keys import MEMO_PREFIX, META
from tuner.store.retry import POSTGRES_ISOLATION, lost_create_race

DEFAULT_STORAGE = "sqlite:///tuner.db"
CREATE_RACE_ATTEMPTS = 6
# How long a process that finds a study just created waits for its creator to store META: the
# creator writes it right after `create_study`, but SQLite's one writer lock can hold that write
# back for seconds while other workers of the same job write.
META_WAIT_S = 60.0

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)


# What `--storage` and TUNER_STORAGE take: the backends whose drivers streamtune installs.
ACCEPTED_FORMS = (
    "sqlite:///PATH (a file; sqlite:////ABSOLUTE/PATH) or "
    "postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DB"
)
SUPPORTED_BACKENDS = ("sqlite", "postgresql")


def storage_url(explicit: str | None = None) -> str:
    return normalise_url(explicit or os.environ.get("TUNER_STORAGE") or DEFAULT_STORAGE)


def normalise_url(url: str) -> str:
    """`postgres://` and `postgresql://` (what hosted PostgreSQL services hand out) name the
    psycopg driver that streamtune installs: SQLAlchemy knows no `postgres` dialect, and reads a
    bare `postgresql` as psycopg2, which is not installed."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"
    return url


def masked(url: str) -> str:
    """The URL as any printed, logged or stored line may show it: its password as `***`, the
    rest as typed. SQLAlchemy's rendering percent-encodes, so a SQLite `file:` URI had been
    shown, and offered back in commands, as `sqlite:///file%3A/...`."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        parsed = None  # not a URL to SQLAlchemy, but it may still carry `user:password@`
    if parsed is not None and parsed.password is None:
        return url
    hidden = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url, count=1)
    if parsed is not None and hidden == url:  # a password where the pattern found none
        return parsed.render_as_string(hide_password=True)
    return hidden


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url`; a bad URL is an error naming --storage.

    Workers started together on an empty database all create Optuna's tables at once; those
    that lose the race find them made, and open the storage again.
    """
    for attempt in range(CREATE_RACE_ATTEMPTS - 1):
        try:
            return _open_storage(url)
        except (sqlalchemy.exc.SQLAlchemyError, TunerError) as exc:
            if not lost_create_race(exc.__cause__ if isinstance(exc, TunerError) else exc):
                raise
        gc.collect()  # the lost attempt's engine, in a reference cycle, holds a connection
        # Apart, or the same losers meet again at the next step of the creation (the tables,
        # then Alembic's version row: five processes on a new SQLite file lost three times).
        time.sleep(random.uniform(0.0, 0.1 * (attempt + 1)))
    return _open_storage(url)


def close_storage(storage: optuna.storages.BaseStorage | None) -> None:
    """Give back the database connections of a storage `open_storage` made. Optuna's RDBStorage
    has no close of its own: its engine's pool (held in reference cycles) keeps them open until
    the garbage collector runs, and a long-lived process (the API, a test run, a user's script
    calling `load_config` in a loop) would run the server out of connections. None: nothing."""
    if isinstance(storage, optuna.storages.RDBStorage):
        storage.remove_session()
        storage.engine.dispose()


def check_host(parsed: sqlalchemy.engine.URL, url: str) -> None:
    if parsed.get_backend_name() == "sqlite" and parsed.host:
        # `sqlite://tmp/x.db` reads `tmp` as a host, and SQLite takes none: its path is lost.
        raise TunerError(
            f"--storage: {masked(url)!r} names a host ({parsed.host!r}); an SQLite file's URL "
            "has three slashes and its path, sqlite:///relative.db or sqlite:////absolute/x.db"
        )


def check_url(url: str) -> None:
    """A one-line `--storage` error for what is not a database URL; a bare file path (what a
    user most often gives) is told the SQLite URL that names it."""
    try:
        backend = sqlalchemy.engine.make_url(url).get_backend_name()
    except sqlalchemy.exc.ArgumentError as exc:
        if "://" not in url:
            # sqlite:/// + a relative path, sqlite://// + an absolute one (its own leading /).
            raise TunerError(
                f"--storage: {masked(url)!r} is a path, not a database URL: for an SQLite file "
                f"give --storage sqlite:///{url} (PostgreSQL: postgresql+psycopg://USER@HOST/DB)"
            ) from exc
        raise TunerError(
            f"--storage: {masked(url)!r} is not a database URL: allowed {ACCEPTED_FORMS}"
        ) from exc
    if backend not in SUPPORTED_BACKENDS:
        # mysql://, oracle://...: SQLAlchemy would fail later on a driver that is not installed.
        raise TunerError(
            f"--storage: {masked(url)!r} is not a supported database: allowed {ACCEPTED_FORMS}"
        )
    database = sqlalchemy.engine.make_url(url).database
    if backend == "sqlite" and database in (None, "", ":memory:"):
        # An in-memory database: the run ended with its study gone, and the export command it
        # printed found no study.
        raise TunerError(
            f"--storage: {masked(url)!r} keeps nothing after the run (an in-memory SQLite "
            "database): allowed an SQLite file, e.g. sqlite:///tuner.db"
        )


SQLITE_FOLDER_RULE = (
    "an SQLite file's folder must exist: streamtune creates the file and its "
    "<name>-artifacts/ folder beside it, never the folders on the way to it"
)


STUDY_NAME_LENGTH = 512
"""The longest study name Optuna's tables hold (PostgreSQL refuses a longer one)."""


def check_study_name(name: str | None) -> None:
    """A one-line `--study` error for a name a user gave that no study should have: blank, with
    spaces around it or control characters (a study no later command finds as typed), longer
    than Optuna's column, or under the prefix of the gate's memo studies, which hold no trials;
    None: the default name."""
    if name is None:
        return
    why = None
    if not name.strip():
        why = "a name that is not blank"
    elif name != name.strip():
        why = "a name without spaces around it"
    elif any(not c.isprintable() for c in name):
        why = "printable characters"
    elif len(name) > STUDY_NAME_LENGTH:
        why = f"at most {STUDY_NAME_LENGTH} characters (it has {len(name)})"
    elif name.startswith(MEMO_PREFIX):
        why = f"a name not starting {MEMO_PREFIX!r} (the gate's memo studies)"
    elif "/" in name:  # the service's /v1/studies/{name} could list it, never fetch it
        why = "a name without '/'"
    if why is not None:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise TunerError(f"--study: {shown!r} is invalid: allowed {why}")


def check_sqlite_path(url: str) -> None:
    """For an SQLite file URL, a one-line `--storage` error naming the path when its folder is
    missing or not writable (SQLite's own "unable to open database file" names neither).

    The rule (`SQLITE_FOLDER_RULE`): no folder is created for a database, so a mistyped path
    cannot create folders anywhere on the machine; create them first (`mkdir -p`). Other URLs
    (PostgreSQL, in-memory SQLite, `file:` URIs) are left to their driver.
    """
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return  # not a URL: `_open_storage` says so
    database = parsed.database
    check_host(parsed, url)
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return
    if database.startswith("file:"):
        return
    path = os.path.abspath(database)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise TunerError(
            f"--storage: the folder {folder} of {masked(url)!r} does not exist; create it first "
            f"(mkdir -p {folder}): {SQLITE_FOLDER_RULE}"
        )
    if not os.path.exists(path) and not os.access(folder, os.W_OK | os.X_OK):
        raise TunerError(
            f"--storage: cannot create the database {path} of {masked(url)!r}: its folder is not "
            "writable; pass a path in a folder you can write to"
        )


def _open_storage(url: str) -> optuna.storages.BaseStorage:
    url = normalise_url(url)
    check_url(url)
    check_sqlite_path(url)
    with storage_errors(url):
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))


def engine_kwargs(url: str) -> dict[str, Any]:
    """How streamtune's engines of the Optuna storage at `url` connect."""
    if url.startswith("sqlite"):
        # Several processes may write one SQLite file: wait for the lock rather than fail.
        return {"connect_args": {"timeout": 60}}
    if url.startswith("postgresql"):
        # Optuna's own read-modify-write of a trial assumes READ COMMITTED; a server defaulting to
        # SERIALIZABLE would fail them (POSTGRES_ISOLATION).
        return {"pool_pre_ping": True, "isolation_level": POSTGRES_ISOLATION}
    return {"pool_pre_ping": True}


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """A database at `url` that cannot be opened, as one line naming --storage: for every
    opener of a storage (Optuna's, the service's job tables), so that `serve` and `worker` say
    what `studies` says; they had printed a 120-line traceback for a file that is not a database."""
    try:
        yield
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ValueError) as exc:
        raise TunerError(f"--storage: {masked(url)!r} is not a usable database URL: {exc}") from exc
    except sqlalchemy.exc.DatabaseError as exc:  # unreachable, or SQLite's "file is not a database"
        raise TunerError(f"--storage: cannot open {masked(url)!r}: {exc.orig}") from exc
    except ImportError as exc:  # the URL's database driver is not installed
        cause = exc.__cause__ or exc
        raise TunerError(
            f"--storage: no database driver for {masked(url)!r} is installed ({cause})"
        ) from exc


def default_study_name(shape: str, hardware: str, space: str, *, precision: str = "fp32") -> str:
    """Readable and stable: `transformer-small-NVIDIA-H100-80GB-HBM3` (+ `-streams`,
    `-bf16-autocast` etc.). `shape` is the workload's key (`trainers.workload_key`: name, preset,
    model options)."""
    parts = [shape, hardware]
    if space != "full":
        parts.append(os.path.splitext(os.path.basename(space))[0])
    if precision != "fp32":
        parts.append(precision)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts))


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    names = optuna.get_all_study_names(storage)
    if name not in names:
        # The gate's shared verdicts are not studies a user asks for (tuner.search.gating.memo).
        known = ", ".join(n for n in names if not n.startswith(MEMO_PREFIX)) or "none"
        raise StudyNotFound(f"--study: no study named {name!r} in this storage (studies: {known})")
    study = optuna.load_study(study_name=name, storage=storage)
    check_streamtune(name, study.user_attrs, len(study.get_trials(deepcopy=False)))
    return study


def made_by_streamtune(user_attrs: dict[str, Any], n_trials: int) -> bool:
    """Whether a study is streamtune's: every version has stored META on a study right after
    creating it (`open_study`). One without META and without trials is taken for streamtune's:
    its creator may not have stored META yet (`_written_meta`)."""
    return isinstance(user_attrs.get(META), dict) or n_trials == 0


def check_streamtune(name: str, user_attrs: dict[str, Any], n_trials: int) -> None:
    """StudyNotFound naming --study for a study another Optuna program made: its numbers are not
    throughputs, and `best` had invited a `run` that would add streamtune's trials to it."""
    if not made_by_streamtune(user_attrs, n_trials):
        raise StudyNotFound(f"--study: {not_streamtune(name)}")


def not_streamtune(name: str) -> str:
    return f"study {named(name)} is not a streamtune study (made by another Optuna program)"


def meta(study: optuna.Study) -> dict[str, Any]:
    value = study.user_attrs.get(META)
    if not isinstance(value, dict):
        raise TunerError(f"study {study.study_name!r} was not made by streamtune (no {META!r})")
    return value


def _written_meta(study: optuna.Study, wait_s: float) -> dict[str, Any]:
    """`meta(study)`, once the process that created the study has stored it: between its
    `create_study` and its `set_user_attr` another process sees the study without META (a CI run
    at 798224c failed so, three workers opening one job's study). Only a study without trials is
    waited for: one with trials and no META was made by something else."""
    deadline = time.monotonic() + wait_s
    while not isinstance(study.user_attrs.get(META), dict) and time.monotonic() < deadline:
        if study.get_trials(deepcopy=False):
            break
        time.sleep(0.1)
    return meta(study)


# What a resumed study must have been made for: otherwise its numbers answer another question.
SAME_QUESTION = (
    "workload",
    "preset",
    "space",
    "objectives",
    "hardware",
    "shape",
    "precision",
    "precisions",
    # The workload's weights and data, and the gate's reference: a resumed study of another
    # seed failed every new trial's gate against the envelope the first seed measured.
    "seed",
    # The gate's reference and envelope are trajectories of this many steps: a study resumed
    # with another number failed every new trial's gate ("envelope measured for ... steps 20,
    # the gate runs ... steps 5", a user's probe, 2026-12-05).
    "parity_steps",
    "precision_parity_steps",
)
SAME_TIMING = ("protocol",)
"""What a study resumed by `python -m tuner run` must also match: how each trial is timed. A study
resumed with other windows mixed two protocols in one final round, and said the baselines'
change as drift ("clocks, other load?"), while its record kept the first (a probe, 2026-12-07).
A service job's workers time it as their own settings say (`TUNER_MEASURE_*`), so a job is not
refused when one of another setting joins it."""


def same_question(stored: dict[str, Any], info: dict[str, Any]) -> bool:
    """Whether a study's stored META was made for the question `info` asks (`SAME_QUESTION`)."""
    stored, asked = _with_later_fields(stored), _with_later_fields(info)
    return all(stored.get(field) == asked.get(field) for field in SAME_QUESTION)


def open_study(
    storage: optuna.storages.BaseStorage,
    name: str,
    *,
    info: dict[str, Any],
    directions: list[optuna.study.StudyDirection],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    meta_wait_s: float = META_WAIT_S,
    same_timing: bool = False,
) -> tuple[optuna.Study, bool]:
    """Create the study, or resume it when it exists and was made for the same question.

    Returns (study, resumed). A study of the same name made for another workload, preset, space,
    objective or hardware is an error naming what differs: its numbers would not answer this run;
    with `same_timing`, one timed by another protocol too (`SAME_TIMING`).
    A study another process has just created, its META not yet stored, is waited for up to
    `meta_wait_s` (the workers of one `--gpus` job open its study together).
    """
    try:
        # Created here or not is the storage's answer, not a list read before: two workers of
        # one job that both read "absent" would each take the study for their own.
        with _writable(storage):
            study = optuna.create_study(
                storage=storage,
                study_name=name,
                directions=directions,
                sampler=sampler,
                pruner=pruner,
            )
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    else:
        study.set_user_attr(META, info)
        return study, False
    stored = _with_later_fields(_written_meta(study, meta_wait_s))
    asked = _with_later_fields(info)
    for field in SAME_QUESTION + (SAME_TIMING if same_timing else ()):
        if stored.get(field) != asked.get(field):
            there, here = _differing(stored.get(field), asked.get(field))
            raise TunerError(
                f"--study: {name!r} was made with {field}={there}, this run has {here}; "
                "resume it with the same settings or choose another --study"
            )
    return study, True


@contextmanager
def _writable(storage: optuna.storages.BaseStorage) -> Iterator[None]:
    """A database that opens but refuses the study's first write (a read-only SQLite file, an
    `?mode=ro` URI, a PostgreSQL user without INSERT) as one line naming --storage: `run` had
    printed SQLAlchemy's 30-frame traceback where the read-only commands work."""
    try:
        yield
    except (sqlalchemy.exc.DatabaseError, optuna.exceptions.StorageInternalError) as exc:
        # Optuna wraps the driver's refusal in its own error ("invalid data in the commit").
        cause = exc if isinstance(exc, sqlalchemy.exc.DatabaseError) else exc.__cause__
        if not isinstance(cause, sqlalchemy.exc.DatabaseError):
            raise
        url = masked(str(getattr(storage, "url", "?")))
        raise TunerError(
            f"--storage: cannot write to {url!r}: {cause.orig}; tuning stores its trials there, "
            "so pass a database you can write to (best, export, report and studies only read)"
        ) from exc


def drop_unmeasured(study: optuna.Study) -> None:
    """Delete `study` where none of its trials has run (only enqueued ones): a run that made it
    and whose workload was then refused (the PyTorch loop's own loss not finite) left it empty,
    and a run of the fixed workload with another seed was refused as "made with seed=0" (a
    user's probe, 2026-12-05)."""
    trials = study.get_trials(deepcopy=False)
    if all(t.state == optuna.trial.TrialState.WAITING for t in trials):
        optuna.delete_study(study_name=study.study_name, storage=study._storage)


_ABSENT = "(absent)"


def _differing(there: Any, here: Any, shown: int = 6) -> tuple[str, str]:
    """Two values that differ, as what differs between them: a mapping (a study's space) by the
    paths of its differing keys, at most `shown` of them, notes only where nothing else differs
    (the whole of both had filled a screen to say that one pin changed)."""
    if not (isinstance(there, dict) and isinstance(here, dict)):
        return repr(there), repr(here)
    paths: list[tuple[str, Any, Any]] = []

    def walk(a: dict[str, Any], b: dict[str, Any], prefix: str) -> None:
        for key in sorted(set(a) | set(b), key=str):
            x, y = a.get(key, _ABSENT), b.get(key, _ABSENT)
            if isinstance(x, dict) and isinstance(y, dict):
                walk(x, y, f"{prefix}{key}.")
            elif x != y:
                paths.append((f"{prefix}{key}", x, y))

    walk(there, here, "")
    # A space's notes say why its settings are as they are: they differ with them.
    settled = [p for p in paths if p[0].rsplit(".", 1)[-1] != "notes"]
    paths = settled or paths
    more = f", and {len(paths) - shown} more" if len(paths) > shown else ""

    def side(i: int) -> str:
        items = (f"{path}: {'(absent)' if v[i] == _ABSENT else repr(v[i])}" for path, *v in paths)
        return "{" + ", ".join(list(items)[:shown]) + more + "}"

    return side(0), side(1)


def precision_of(matmul_precision: str) -> str:
    """The precision a study without `--precision` is measured in: what its float32 matmul
    setting amounts to (`highest`: fp32, `high`: TF32)."""
    return {"highest": "fp32", "high": "tf32"}.get(
        matmul_precision, f"fp32 (matmul {matmul_precision})"
    )


def _with_later_fields(stored: dict[str, Any]) -> dict[str, Any]:
    """A study stored before `shape` and `precision` were recorded: what they were then (no
    model options; the precision its matmul setting amounted to)."""
    protocol = stored.get("protocol")
    if isinstance(protocol, dict):  # its seed is compared as the study's own `seed`
        stored = stored | {"protocol": {k: v for k, v in protocol.items() if k != "seed"}}
    return {
        "shape": f"{stored.get('workload')}-{stored.get('preset')}",
        "precision": precision_of(stored.get("matmul_precision", "highest")),
        # A study stored before precisions could be searched searched none.
        "precisions": None,
        "seed": 0,  # stored from 2026-12-02; the default seed before
        # Stored from 2026-12-05; the defaults before (another number failed every gate).
        "parity_steps": 20,
        "precision_parity_steps": None,
    } | stored


def entries(study: optuna.Study, prefix: str) -> dict[str, Any]:
    return {k[len(prefix) :]: v for k, v in study.user_attrs.items() if k.startswith(prefix)}
