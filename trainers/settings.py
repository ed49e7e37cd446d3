"""`load_config`: the tuned `LoopConfig` from wherever the tuner left it.

- a study: `load_config(study="name", storage="sqlite:///streamtune.db")` reads the
  recommendation the tuner stored on it. trainers knows no Optuna: it reads the one attribute
  from Optuna's database tables (`studies`, `study_user_attributes`) with SQLAlchemy;
- a file: the output of `python -m tuner export --format json` or of `best --json`;
- a mapping of the same, or a LoopConfig;
- the environment: `STREAMTUNE_<FIELD>` variables (`export --format env`), the default when
  nothing else is named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainers.config import LoopConfig
from trainers.errors import ConfigError

ENV_PREFIX = "STREAMTUNE_"
RECOMMENDATION_ATTR = "recommendation"
"""The study attribute the tuner stores its recommendation under (`tuner.store.keys`)."""


def load_config(
    source: LoopConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    study: str | None = None,
    storage: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> LoopConfig:
    """The config in `source`, in study `study` of `storage`, or in `environ` (default:
    os.environ). ConfigError names what was missing or wrong."""
    if study is not None or storage is not None:
        if source is not None:
            raise ConfigError("source", str(source), "None when study= and storage= are given")
        if not study or not storage:
            raise ConfigError(
                "study" if not study else "storage",
                study if not study else storage,
                "both study= and storage= (a database URL such as sqlite:///streamtune.db)",
            )
        return _from_mapping(read_study_recommendation(storage, study), f"study {study!r}")
    if source is None:
        variables = os.environ if environ is None else environ
        if not any(key.startswith(ENV_PREFIX) for key in variables):
            raise ConfigError(
                "source",
                None,
                f"a LoopConfig, a JSON file, study= and storage=, or {ENV_PREFIX}* variables "
                "(none is set)",
            )
        return config_from_env(variables)
    if isinstance(source, LoopConfig):
        return source
    if isinstance(source, Mapping):
        return _from_mapping(source, "the mapping")
    path = Path(source)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError("source", str(source), "an existing JSON file") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError("source", str(source), f"a JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError("source", str(source), "a JSON object")
    return _from_mapping(data, str(path))


def config_from_env(environ: Mapping[str, str]) -> LoopConfig:
    """A LoopConfig from STREAMTUNE_* variables (the `env` export); unset fields keep their
    defaults."""
    values: dict[str, Any] = {}
    for field, default in LoopConfig().to_dict().items():
        name = f"{ENV_PREFIX}{field.upper()}"
        raw = environ.get(name)
        if raw is None:
            continue
        if isinstance(default, bool):
            if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ConfigError(name, raw, "true or false (also 1/0, yes/no)")
            values[field] = raw.lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            try:
                values[field] = int(raw)
            except ValueError as exc:
                raise ConfigError(name, raw, "an integer") from exc
        else:
            values[field] = raw
    return LoopConfig(**values)


def read_study_recommendation(storage: str, study: str) -> Mapping[str, Any]:
    """The recommendation stored on `study`, read from Optuna's tables in `storage`."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(storage)
    except (sqlalchemy.exc.ArgumentError, ImportError) as exc:
        raise ConfigError(
            "storage", storage, f"a database URL SQLAlchemy can open ({exc})"
        ) from exc
    query = sqlalchemy.text(
        "SELECT a.value_json FROM study_user_attributes a JOIN studies s "
        "ON a.study_id = s.study_id WHERE s.study_name = :study AND a.key = :key"
    )
    try:
        with engine.connect() as connection:
            row = connection.execute(query, {"study": study, "key": RECOMMENDATION_ATTR}).first()
            exists = row is not None or (
                connection.execute(
                    sqlalchemy.text("SELECT 1 FROM studies WHERE study_name = :study"),
                    {"study": study},
                ).first()
                is not None
            )
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise ConfigError(
            "storage", storage, f"a tuner database ({exc.__class__.__name__})"
        ) from exc
    finally:
        engine.dispose()
    if not exists:
        raise ConfigError("study", study, f"a study in {storage}")
    if row is None:
        raise ConfigError("study", study, "a study whose run has finished (no recommendation yet)")
    data = json.loads(row[0])
    if not isinstance(data, dict):
        raise ConfigError("study", study, "a study with a recommendation object")
    return data


def _from_mapping(data: Mapping[str, Any], where: str) -> LoopConfig:
    """A LoopConfig dict, or a recommendation holding one under "config"."""
    if "config" in data:
        config = data["config"]
        if config is None:
            raise ConfigError(
                "config", None, f"a recommended config ({where} has none: {data.get('reason')})"
            )
        if not isinstance(config, Mapping):
            raise ConfigError("config", type(config).__name__, f"a mapping in {where}")
        return LoopConfig.from_dict(dict(config))
    return LoopConfig.from_dict(dict(data))
