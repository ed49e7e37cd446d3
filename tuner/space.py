"""The tuner's search space: which `LoopConfig` settings Optuna searches, and over what values.

One `SearchSpace` maps an Optuna trial to a `trainers.LoopConfig` (`SearchSpace.suggest`). The
Optuna parameter names are the `LoopConfig` field names, suggested in `LoopConfig` field order, so
a study's trials can be turned back into configs (`SearchSpace.config_from_params`).

Spaces come from `load_space`: the built-ins `streams` (the three stream/sync settings) and `full`
(the default: everything but `non_blocking`), or a JSON file. Every bad input raises
`tuner.errors.SpaceError` naming the setting (or "space" / "fix" for the file or pin as a whole).

Also here: `simplicity_key` (the order the tuner breaks ties in, simplest first) and `config_key`
(a short stable id of a config, for caching per config).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import optuna

from trainers import ConfigError, LoopConfig, field_names
from tuner.errors import SpaceError

__all__ = [
    "BUILTIN_SPACES",
    "DEFAULT_SPACE",
    "SIMPLICITY_ORDER",
    "Choice",
    "IntRange",
    "SearchSpace",
    "Spec",
    "config_key",
    "full_space",
    "load_space",
    "parse_fix",
    "simplicity_key",
    "streams_space",
]

BUILTIN_SPACES: tuple[str, ...] = ("streams", "full")
DEFAULT_SPACE = "full"

_SPACE_ALLOWED = "streams, full or a .json file"
_RANGE_KEYS = ("low", "high", "log")
_DICT_KEYS = ("name", "params", "fixed", "notes")
_CPU_GRAPH_NOTE = "cuda_graph fixed to false: no CUDA device"
_CPU_GRAPH_ALLOWED = "false (CUDA graphs need a CUDA device)"

_Kind = Literal["int", "bool", "str"]


@dataclasses.dataclass(kw_only=True, frozen=True)
class Choice:
    """A categorical setting: Optuna picks one of `values` (any sequence is stored as a tuple)."""

    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))


@dataclasses.dataclass(kw_only=True, frozen=True)
class IntRange:
    """An integer setting in `low..high`, both ends included; `log` samples on a log scale."""

    low: int
    high: int
    log: bool = False


Spec = Choice | IntRange


# --------------------------------------------------------------------------------------------
# per-field checks
# --------------------------------------------------------------------------------------------


def _field_kinds() -> dict[str, _Kind]:
    """LoopConfig field -> "int", "bool" or "str" (a Literal such as sync_mode), in field order."""
    hints = typing.get_type_hints(LoopConfig)
    kinds: dict[str, _Kind] = {}
    for name in field_names():
        hint = hints[name]
        kinds[name] = "bool" if hint is bool else "int" if hint is int else "str"
    return kinds


_KINDS = _field_kinds()
_FIELDS_ALLOWED = f"a LoopConfig field: {', '.join(field_names())}"


def _check_field_name(field: str, value: object) -> None:
    """Raise SpaceError(field, value, the field names) unless `field` is a LoopConfig field."""
    if field not in _KINDS:
        raise SpaceError(field, value, _FIELDS_ALLOWED)


def _check_value(field: str, value: object) -> None:
    """Raise SpaceError naming `field` unless `LoopConfig(field=value)` is valid."""
    setting: dict[str, Any] = {field: value}
    try:
        LoopConfig(**setting)
    except ConfigError as exc:
        raise SpaceError(exc.field, value, exc.allowed) from exc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_spec(field: str, spec: object) -> None:
    """Raise SpaceError naming `field` unless `spec` is a valid Choice or IntRange for it.

    A Choice must be non-empty, without duplicates, and every value a valid setting; an IntRange
    needs an integer field, integer bounds with low <= high, low >= 1 when log, and both ends
    valid settings (LoopConfig's constraints are ranges, so every value between is valid too).
    """
    if isinstance(spec, Choice):
        if not spec.values:
            raise SpaceError(field, list(spec.values), "a non-empty list of choices")
        for value in spec.values:
            _check_value(field, value)
        if len(set(spec.values)) != len(spec.values):
            raise SpaceError(field, list(spec.values), "a list of distinct choices")
    elif isinstance(spec, IntRange):
        shown = {"low": spec.low, "high": spec.high, "log": spec.log}
        if _KINDS[field] != "int":
            raise SpaceError(field, shown, "a list of choices or a single value (not an integer)")
        if not (_is_int(spec.low) and _is_int(spec.high)):
            raise SpaceError(field, shown, "integer bounds low and high")
        if not isinstance(spec.log, bool):
            raise SpaceError(field, shown, "log true or false")
        if spec.low > spec.high:
            raise SpaceError(field, shown, "low <= high")
        if spec.log and spec.low < 1:
            raise SpaceError(field, shown, "low >= 1 when log is true")
        _check_value(field, spec.low)
        _check_value(field, spec.high)
    else:
        raise SpaceError(field, spec, "a Choice or an IntRange")


def _spec_to_json(spec: Spec) -> list[Any] | dict[str, Any]:
    if isinstance(spec, Choice):
        return list(spec.values)
    return {"low": spec.low, "high": spec.high, "log": spec.log}


def _spec_from_json(field: str, raw: object) -> Spec | None:
    """The file form of one setting -> its Spec, or None for a scalar (a fixed value).

    A list is a Choice; an object is an IntRange with keys low, high and optional log. The spec
    is checked here (SpaceError naming `field`); scalars are checked by the caller.
    """
    spec: Spec
    if isinstance(raw, list):
        spec = Choice(values=tuple(raw))
    elif isinstance(raw, dict):
        if _KINDS.get(field) != "int":
            raise SpaceError(field, raw, "a list of choices or a single value (not an integer)")
        extra = [key for key in raw if key not in _RANGE_KEYS]
        if extra or "low" not in raw or "high" not in raw:
            raise SpaceError(field, raw, 'a range {"low": int, "high": int, "log": bool}')
        spec = IntRange(low=raw["low"], high=raw["high"], log=raw.get("log", False))
    else:
        return None
    _check_spec(field, spec)
    return spec


# --------------------------------------------------------------------------------------------
# the space
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True)
class SearchSpace:
    """The settings a study searches (`params`) and pins (`fixed`); the rest keep their defaults.

    name: "streams", "full" or the JSON file's path.
    params: LoopConfig field -> Choice or IntRange; the field names are the Optuna param names.
    fixed: LoopConfig field -> value, used as is in every config.
    notes: why the space differs from what was asked (e.g. cuda_graph dropped on a CPU).

    Built checked: every key a LoopConfig field, params and fixed disjoint, every spec and fixed
    value valid (SpaceError naming the field). Both mappings are copied into LoopConfig field
    order, so `suggest`, `distributions` and `to_dict` all follow that order.
    """

    name: str
    params: dict[str, Spec]
    fixed: dict[str, Any]
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpaceError("name", self.name, "a non-empty string")
        for field, spec in self.params.items():
            _check_field_name(field, spec)
            _check_spec(field, spec)
        for field, value in self.fixed.items():
            _check_field_name(field, value)
            if field in self.params:
                raise SpaceError(field, value, "either searched (params) or fixed, not both")
            _check_value(field, value)
        notes = tuple(self.notes)
        if not all(isinstance(note, str) for note in notes):
            raise SpaceError("notes", list(notes), "a list of strings")
        order = field_names()
        object.__setattr__(self, "params", {f: self.params[f] for f in order if f in self.params})
        object.__setattr__(self, "fixed", {f: self.fixed[f] for f in order if f in self.fixed})
        object.__setattr__(self, "notes", notes)

    def suggest(self, trial: optuna.trial.BaseTrial) -> LoopConfig:
        """Ask `trial` for every searched setting, in LoopConfig field order, and build the config.

        IntRange -> `trial.suggest_int(field, low, high, log=log)`; Choice ->
        `trial.suggest_categorical(field, values)`. Fixed settings are added as they are.
        """
        suggested: dict[str, Any] = {}
        for field, spec in self.params.items():
            if isinstance(spec, IntRange):
                suggested[field] = trial.suggest_int(field, spec.low, spec.high, log=spec.log)
            else:
                suggested[field] = trial.suggest_categorical(field, spec.values)
        return LoopConfig(**self.fixed, **suggested)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """The Optuna distribution of every searched setting (what `suggest` asks for)."""
        result: dict[str, optuna.distributions.BaseDistribution] = {}
        for field, spec in self.params.items():
            if isinstance(spec, IntRange):
                result[field] = optuna.distributions.IntDistribution(
                    spec.low, spec.high, log=spec.log
                )
            else:
                result[field] = optuna.distributions.CategoricalDistribution(spec.values)
        return result

    def config_from_params(self, params: Mapping[str, Any]) -> LoopConfig:
        """Rebuild the config of a trial from its params (e.g. `FrozenTrial.params`) plus `fixed`.

        `params` must hold exactly the searched settings, each inside its spec; otherwise a
        SpaceError names the setting (the trial does not belong to this space).
        """
        for field, value in params.items():
            if field not in self.params:
                raise SpaceError(field, value, f"a searched setting: {', '.join(self.params)}")
        for field, spec in self.params.items():
            if field not in params:
                raise SpaceError(field, None, "a value in the trial's params")
            value = params[field]
            if isinstance(spec, IntRange):
                if not (_is_int(value) and spec.low <= value <= spec.high):
                    raise SpaceError(field, value, f"an integer in {spec.low}..{spec.high}")
            elif not any(type(value) is type(c) and value == c for c in spec.values):
                raise SpaceError(field, value, f"one of {', '.join(map(repr, spec.values))}")
        return LoopConfig(**self.fixed, **{field: params[field] for field in self.params})

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: name, params (lists / range objects as in a file), fixed, notes.

        `SearchSpace.from_dict(json.loads(json.dumps(space.to_dict()))) == space`.
        """
        return {
            "name": self.name,
            "params": {field: _spec_to_json(spec) for field, spec in self.params.items()},
            "fixed": dict(self.fixed),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """The inverse of `to_dict`; checked like a space file (SpaceError naming what is wrong)."""
        if not isinstance(data, Mapping):
            raise SpaceError("space", data, "an object with keys name, params, fixed, notes")
        for key in data:
            if key not in _DICT_KEYS:
                raise SpaceError(key, data[key], f"a key of: {', '.join(_DICT_KEYS)}")
        for key in ("name", "params", "fixed"):
            if key not in data:
                raise SpaceError(key, None, f"the key {key} is required")
        raw_params, raw_fixed = data["params"], data["fixed"]
        if not isinstance(raw_params, Mapping):
            raise SpaceError("params", raw_params, "an object of setting -> list or range")
        if not isinstance(raw_fixed, Mapping):
            raise SpaceError("fixed", raw_fixed, "an object of setting -> value")
        params: dict[str, Spec] = {}
        for field, raw in raw_params.items():
            _check_field_name(field, raw)
            spec = _spec_from_json(field, raw)
            if spec is None:
                raise SpaceError(field, raw, "a list of choices or a range object")
            params[field] = spec
        notes = data.get("notes", [])
        if not isinstance(notes, list | tuple):
            raise SpaceError("notes", notes, "a list of strings")
        return cls(name=data["name"], params=params, fixed=dict(raw_fixed), notes=tuple(notes))


# --------------------------------------------------------------------------------------------
# built-in spaces and files
# --------------------------------------------------------------------------------------------

_STREAMS_PARAMS: dict[str, Spec] = {
    "num_streams": IntRange(low=2, high=4),
    "sync_interval": IntRange(low=1, high=100, log=True),
    "sync_mode": Choice(values=("event", "synchronize", "query")),
}


def streams_space() -> SearchSpace:
    """The seed design: streams 2..4, sync interval 1..100 (log), sync mode; the rest pinned."""
    return SearchSpace(
        name="streams",
        params=dict(_STREAMS_PARAMS),
        fixed={
            "pin_memory": True,
            "non_blocking": True,
            "prefetch_depth": 0,
            "num_workers": 0,
            "cuda_graph": False,
        },
    )


def full_space() -> SearchSpace:
    """The default: `streams` plus cuda_graph, prefetch_depth 0..4, pin_memory, num_workers."""
    return SearchSpace(
        name="full",
        params={
            **_STREAMS_PARAMS,
            "cuda_graph": Choice(values=(False, True)),
            "prefetch_depth": IntRange(low=0, high=4),
            "pin_memory": Choice(values=(False, True)),
            "num_workers": Choice(values=(0, 1, 2, 4)),
        },
        fixed={"non_blocking": True},
    )


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise SpaceError(key, value, "each setting listed once")
        seen[key] = value
    return seen


def _space_from_file(path: str) -> SearchSpace:
    """Read a space file: {field: [choices] | {"low", "high", "log"?} | fixed scalar}."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpaceError("space", path, f"a readable .json file ({reason})") from exc
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise SpaceError("space", path, f"a valid JSON file ({where})") from exc
    if not isinstance(data, dict):
        raise SpaceError("space", data, "a JSON object of LoopConfig field -> list, range or value")
    params: dict[str, Spec] = {}
    fixed: dict[str, Any] = {}
    for field, raw in data.items():
        _check_field_name(field, raw)
        spec = _spec_from_json(field, raw)
        if spec is None:
            _check_value(field, raw)
            fixed[field] = raw
        else:
            params[field] = spec
    return SearchSpace(name=path, params=params, fixed=fixed)


def _without_graph_on_cpu(space: SearchSpace) -> SearchSpace:
    """Drop cuda_graph from the search (fixed false, with a note); a required graph is an error."""
    if space.fixed.get("cuda_graph") is True:
        raise SpaceError("cuda_graph", True, _CPU_GRAPH_ALLOWED)
    spec = space.params.get("cuda_graph")
    if spec is None:
        return space
    if isinstance(spec, Choice) and False not in spec.values:
        raise SpaceError("cuda_graph", list(spec.values), _CPU_GRAPH_ALLOWED)
    params = {field: s for field, s in space.params.items() if field != "cuda_graph"}
    return dataclasses.replace(
        space,
        params=params,
        fixed={**space.fixed, "cuda_graph": False},
        notes=(*space.notes, _CPU_GRAPH_NOTE),
    )


def load_space(spec: str, *, fix: Sequence[str] = (), cuda: bool = True) -> SearchSpace:
    """The space named by `spec` ("streams", "full" or a path ending in .json), pins applied.

    Each `fix` item ("name=value", see `parse_fix`) takes its setting out of the search and pins
    it, whatever the space said. With `cuda=False`, cuda_graph is taken out of the search and
    fixed to false (with a note); cuda_graph pinned or fixed to true is then a SpaceError.
    """
    if spec == "streams":
        space = streams_space()
    elif spec == "full":
        space = full_space()
    elif spec.lower().endswith(".json"):
        space = _space_from_file(spec)
    else:
        raise SpaceError("space", spec, _SPACE_ALLOWED)
    pins = parse_fix(fix)
    if pins:
        space = dataclasses.replace(
            space,
            params={field: s for field, s in space.params.items() if field not in pins},
            fixed={**space.fixed, **pins},
        )
    if not cuda:
        space = _without_graph_on_cpu(space)
    return space


# --------------------------------------------------------------------------------------------
# --fix pins
# --------------------------------------------------------------------------------------------

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _convert(field: str, text: str) -> Any:
    kind = _KINDS[field]
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise SpaceError(field, text, "an integer") from None
    if kind == "bool":
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise SpaceError(field, text, "true/false, 1/0 or yes/no")
    return text


def parse_fix(items: Sequence[str]) -> dict[str, Any]:
    """Parse "name=value" pins into LoopConfig field -> typed, validated value (in item order).

    Integers via int(); booleans accept true/false/1/0/yes/no (any case); sync_mode is a string.
    Errors: no "=" -> SpaceError field "fix"; unknown name, bad value or a setting pinned twice ->
    SpaceError naming the setting.
    """
    pins: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise SpaceError("fix", item, "name=value with name a LoopConfig field")
        name, text = name.strip(), text.strip()
        _check_field_name(name, text)
        if name in pins:
            raise SpaceError(name, text, "each setting pinned once")
        value = _convert(name, text)
        _check_value(name, value)
        pins[name] = value
    return pins


# --------------------------------------------------------------------------------------------
# ordering and ids
# --------------------------------------------------------------------------------------------

_SYNC_MODE_RANK = {"synchronize": 0, "event": 1, "query": 2}

SIMPLICITY_ORDER = (
    "fewer streams, then no CUDA graph, smaller prefetch_depth, fewer num_workers, "
    "sync_mode synchronize < event < query, pin_memory off, non_blocking off, "
    "smaller sync_interval"
)
"""How `simplicity_key` orders configs, simplest first (for output)."""


def simplicity_key(config: LoopConfig) -> tuple[int, ...]:
    """Sort key, smaller = simpler, in the order of `SIMPLICITY_ORDER`.

    `LoopConfig()` (the PyTorch default) has the smallest key of every config: each component
    is at its minimum there.
    """
    return (
        config.num_streams,
        int(config.cuda_graph),
        config.prefetch_depth,
        config.num_workers,
        _SYNC_MODE_RANK[config.sync_mode],
        int(config.pin_memory),
        int(config.non_blocking),
        config.sync_interval,
    )


def config_key(config: LoopConfig) -> str:
    """A short stable id of a config: sha1 of its sorted-key compact JSON, first 12 hex chars."""
    canonical = json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(canonical.encode("utf-8"), usedforsecurity=False).hexdigest()[:12]
