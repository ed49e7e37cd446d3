"""Opening a storage for reading only (`studies`, `best`, `export`, `report`, `load_config`):
nothing is written to the database, not even Optuna's tables.

Opening Optuna's `RDBStorage` creates its tables in whatever database it is given: the read-only
commands had added thirteen tables to another program's SQLite file, and grown an empty file to
114 KB, before saying "no studies" (a probe, 2026-12-07). So the database's tables are looked at
first: Optuna's are opened as a storage; none at all is a storage without studies, read as an
empty one; another program's tables are a one-line --storage error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
import sqlalchemy
import sqlalchemy.engine
import sqlalchemy.exc

from tuner.errors import TunerError
from tuner.store.storage import (
    check_host,
    check_url,
    close_storage,
    engine_kwargs,
    masked,
    normalise_url,
    open_storage,
    storage_errors,
)

OPTUNA_TABLES = frozenset({"studies", "version_info"})
"""Tables every Optuna RDB storage has had: a database holding both is Optuna's."""
SERVICE_TABLE_PREFIX = "streamtune_"
"""The service's own tables (`tuner.service.tables`), beside Optuna's in the same database."""


@contextmanager
def opened_storage(url: str) -> Iterator[optuna.storages.BaseStorage]:
    """The storage at `url` for one read: its connections are given back on leaving. An SQLite
    file that does not exist is an error, not a new empty database: `best`, `studies`, `report`
    and `load_config` had each left one behind, and said only "(studies: none)" (a new user's
    trial, 2026-12-02: run from another folder than the study's). A database without tables is
    read as an empty storage, and left as it is (module doc)."""
    url = normalise_url(url)
    _must_exist(url)
    if not holds_optuna(url):
        yield optuna.storages.InMemoryStorage()
        return
    storage = open_storage(url)
    try:
        yield storage
    finally:
        close_storage(storage)


def holds_optuna(url: str) -> bool:
    """Whether the database at `url` holds Optuna's tables; False where it holds no table (or
    only the service's); a TunerError naming --storage where it holds another program's."""
    check_url(url)
    with storage_errors(url):
        engine = sqlalchemy.create_engine(url, **engine_kwargs(url))
        try:
            tables = set(sqlalchemy.inspect(engine).get_table_names())
        finally:
            engine.dispose()
    if tables >= OPTUNA_TABLES:
        return True
    others = sorted(t for t in tables if not t.startswith(SERVICE_TABLE_PREFIX))
    if not others:
        return False
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    raise TunerError(
        f"--storage: {masked(url)!r} is not a streamtune (Optuna) storage: it holds other "
        f"tables ({shown}) and none of Optuna's; allowed a database `python -m tuner run` made"
    )


def _must_exist(url: str) -> None:
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return  # not a URL: `check_url` says so
    check_host(parsed, url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return
    if database.startswith("file:") or os.path.exists(database):
        return
    raise TunerError(
        f"--storage: no database at {os.path.abspath(database)} ({masked(url)!r}); a relative "
        f"path is read from the working folder, {os.getcwd()}: `python -m tuner run` makes one"
    )
