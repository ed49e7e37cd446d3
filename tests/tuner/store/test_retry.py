"""Which database errors the retry waits out (`tuner.store.retry`): real PostgreSQL, whose server
ends a session's connection inside its transaction, as a restart does."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy as sa
import sqlalchemy.orm

from tests.conftest import PG_SERVER
from tuner.store.retry import Backoff, is_transient

pytestmark = pytest.mark.postgres


def _lost_in_a_transaction(pg_url: str) -> sa.exc.PendingRollbackError:
    """What a session raises when its connection was ended inside a transaction and it is used
    again before a rollback: the error Optuna's storage wraps in StorageInternalError."""
    engine = sa.create_engine(pg_url)
    admin = sa.create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    try:
        with sa.orm.Session(engine) as session:
            pid = session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with admin.connect() as conn:
                conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(sa.exc.OperationalError):
                session.execute(sa.text("SELECT 1"))
            with pytest.raises(sa.exc.PendingRollbackError) as info:
                session.execute(sa.text("SELECT 1"))
            return info.value
    finally:
        engine.dispose()
        admin.dispose()


def _as_optuna_raises(cause: BaseException) -> optuna.exceptions.StorageInternalError:
    try:
        raise optuna.exceptions.StorageInternalError("raised during the commit") from cause
    except optuna.exceptions.StorageInternalError as exc:
        return exc


def test_a_connection_lost_inside_a_transaction_is_waited_out(pg_url: str) -> None:
    wrapped = _as_optuna_raises(_lost_in_a_transaction(pg_url))
    assert is_transient(wrapped)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise wrapped
        return "written"

    assert Backoff(base_s=0.01, max_s=0.02).call(flaky, what="a write") == "written"
    assert len(calls) == 2


class _Base(sqlalchemy.orm.DeclarativeBase):
    pass


class _Row(_Base):
    __tablename__ = "rows"
    id: sqlalchemy.orm.Mapped[int] = sqlalchemy.orm.mapped_column(primary_key=True)


def _failed_flush() -> sa.exc.PendingRollbackError:
    """What a session raises when used again after a flush failed on its data (a key taken)."""
    engine = sa.create_engine("sqlite://")
    _Base.metadata.create_all(engine)
    try:
        with sqlalchemy.orm.Session(engine) as session:
            session.add_all([_Row(id=1)])
            session.commit()
            session.add(_Row(id=1))
            with pytest.raises(sa.exc.IntegrityError):
                session.flush()
            with pytest.raises(sa.exc.PendingRollbackError) as info:
                session.execute(sa.text("SELECT 1"))
            return info.value
    finally:
        engine.dispose()


def test_an_error_in_the_data_is_not_waited_out() -> None:
    data = sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
    assert not is_transient(_as_optuna_raises(data))
    assert not is_transient(_as_optuna_raises(ValueError("no cause of the database's")))
    # The session used again after that flush: the same class of error as a lost connection's,
    # not waited out (the call again would meet the same data).
    assert not is_transient(_as_optuna_raises(_failed_flush()))
