"""`load_config`: the tuned `LoopConfig` from wherever the tuner left it.

- a file: the output of `python -m tuner export --format json` or of `best --json`;
- a mapping of the same, a LoopConfig, or a recommendation object (anything with `to_dict()`,
  e.g. `tuner.recommendation(storage, study)`);
- the environment: `STREAMTUNE_<FIELD>` variables (`export --format env`), the default when
  nothing else is named.

`load_precision` reads, from the same sources, the precision a study that searched precisions
chose (`"precision"` in the JSON, `STREAMTUNE_PRECISION`): train with it, as the tuner measured.

A study itself is read by `tuner.load_config(storage, study)`: trainers knows no database (the
layer rule in tests/test_layers.py).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainers.config import LoopConfig
from trainers.errors import ConfigError

ENV_PREFIX = "STREAMTUNE_"


def load_config(
    source: LoopConfig | Mapping[str, Any] | str | os.PathLike[str] | Any = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> LoopConfig:
    """The config in `source`, or in `environ` (default: os.environ) when `source` is None.
    ConfigError names what was missing or wrong."""
    if source is None:
        variables = os.environ if environ is None else environ
        if not any(key.startswith(ENV_PREFIX) for key in variables):
            raise ConfigError(
                "source",
                None,
                f"a LoopConfig, a recommendation, a JSON file, or {ENV_PREFIX}* variables "
                "(none is set)",
            )
        return config_from_env(variables)
    if isinstance(source, LoopConfig):
        return source
    if isinstance(source, Mapping):
        return _from_mapping(source, "the mapping")
    to_dict = getattr(source, "to_dict", None)
    if callable(to_dict):
        return _from_mapping(to_dict(), type(source).__name__)
    if not isinstance(source, str | os.PathLike):
        raise ConfigError(
            "source",
            type(source).__name__,
            "a LoopConfig, a mapping, a recommendation or a JSON file path",
        )
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


def load_precision(
    source: Mapping[str, Any] | str | os.PathLike[str] | Any = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The precision named where `load_config` reads the config (a JSON file or mapping's
    `"precision"`, a recommendation's, or `STREAMTUNE_PRECISION` when `source` is None); None
    where none is named (train in the precision the study was fixed to). ConfigError names an
    unknown one."""
    if source is None:
        value = (os.environ if environ is None else environ).get(f"{ENV_PREFIX}PRECISION")
        return _precision(value, f"{ENV_PREFIX}PRECISION")
    if isinstance(source, Mapping):
        return _precision(source.get("precision"), "precision")
    to_dict = getattr(source, "to_dict", None)
    if callable(to_dict):
        return _precision(to_dict().get("precision"), "precision")
    if not isinstance(source, str | os.PathLike):
        return None
    try:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("source", str(source), f"a readable JSON file ({exc})") from exc
    return _precision(data.get("precision") if isinstance(data, dict) else None, "precision")


def _precision(value: object, field: str) -> str | None:
    from trainers.precision import parse_precision  # torch only when a precision is asked for

    return parse_precision(value, field)


def config_from_env(environ: Mapping[str, str]) -> LoopConfig:
    """A LoopConfig from STREAMTUNE_* variables (the `env` export); unset fields keep their
    defaults."""
    values: dict[str, Any] = {}
    _refuse_misspelt(environ)
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
        elif isinstance(default, float):
            try:
                values[field] = float(raw)
            except ValueError as exc:
                raise ConfigError(name, raw, "a number") from exc
        else:
            values[field] = raw
    return LoopConfig.from_dict(values)


def _refuse_misspelt(environ: Mapping[str, str]) -> None:
    """ConfigError for a STREAMTUNE_ variable a letter or two from a field's (`STREAMTUNE_
    SYNC_MODEE`), which was ignored: the config trained with the default instead. Others are
    left alone: STREAMTUNE_ also prefixes variables of other tools (a benchmark's
    STREAMTUNE_COMMIT)."""
    fields = [field.upper() for field in LoopConfig().to_dict()] + ["PRECISION"]
    for name in environ:
        suffix = name.removeprefix(ENV_PREFIX)
        if name.startswith(ENV_PREFIX) and suffix not in fields:
            # By the part after the prefix: STREAMTUNE_COMMIT is not close to STREAMTUNE_COMPILE.
            close = difflib.get_close_matches(suffix, fields, n=1, cutoff=0.85)
            if close:
                raise ConfigError(name, environ[name], f"{ENV_PREFIX}{close[0]}, a config variable")


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
    # An export of a study that searched precisions names the chosen one beside the config's
    # fields (`load_precision` reads it); it is no LoopConfig field.
    fields = {k: v for k, v in data.items() if k != "precision"}
    _precision(data.get("precision"), "precision")
    return LoopConfig.from_dict(fields)
