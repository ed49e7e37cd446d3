"""The tuner's search space: which `LoopConfig` settings Optuna searches, and over what values.

One `SearchSpace` maps an Optuna trial to a `trainers.LoopConfig` (`SearchSpace.suggest`). The
Optuna parameter names are the `LoopConfig` field names, suggested in `LoopConfig` field order, so
a study's trials can be turned back into configs (`SearchSpace.config_from_params`). Every bad
input raises `tuner.errors.SpaceError` naming the setting.

Where spaces come from (the built-ins, a JSON file, a mapping from the API, `--fix` pins) is
`tuner.search.spaces.named`. Also here: `simplicity_key` (the order the tuner breaks ties in,
simplest first) and `config_key` (a short stable id of a config, for caching per config).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import optuna

from trainers import (
    LEVERS,
    TIE_ORDER,
    ConfigError,
    LoopConfig,
    a_field,
    canonical,
    check_setting,
    field_names,
)
from tuner.errors import SpaceError

__all__ = [
    "SIMPLICITY_ORDER",
    "Choice",
    "IntRange",
    "SearchSpace",
    "Spec",
    "config_key",
    "simplicity_key",
]

_RANGE_KEYS = ("low", "high", "log")
_DICT_KEYS = ("name", "params", "fixed", "notes")

_Kind = Literal["int", "bool", "float", "str"]


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


class _Kinds(Mapping[str, _Kind]):
    """LoopConfig field -> "int", "bool", "float" or "str", in table order: each lever's declared
    `kind`, read live from the lever table (a lever module registered later is in it)."""

    def __getitem__(self, name: str) -> _Kind:
        return LEVERS[name].kind

    def __iter__(self) -> Iterator[str]:
        return iter(LEVERS)

    def __len__(self) -> int:
        return len(LEVERS)


KINDS: Mapping[str, _Kind] = _Kinds()


def check_field_name(field: str, value: object) -> None:
    """Raise SpaceError(field, value, the field names) unless `field` is a LoopConfig field."""
    if field not in KINDS:
        raise SpaceError(field, value, a_field(field))


def check_value(field: str, value: object) -> None:
    """Raise SpaceError naming `field` unless `value` is one of the field's allowed values
    (whatever the other settings: a combination is checked when a config is built)."""
    try:
        check_setting(field, value)
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
            check_value(field, value)
        if len(set(spec.values)) != len(spec.values):
            raise SpaceError(field, list(spec.values), "a list of distinct choices")
    elif isinstance(spec, IntRange):
        shown = {"low": spec.low, "high": spec.high, "log": spec.log}
        if KINDS[field] != "int":
            raise SpaceError(field, shown, "a list of choices or a single value (not an integer)")
        if not (_is_int(spec.low) and _is_int(spec.high)):
            raise SpaceError(field, shown, "integer bounds low and high")
        if not isinstance(spec.log, bool):
            raise SpaceError(field, shown, "log true or false")
        if spec.low > spec.high:
            raise SpaceError(field, shown, "low <= high")
        if spec.log and spec.low < 1:
            raise SpaceError(field, shown, "low >= 1 when log is true")
        check_value(field, spec.low)
        check_value(field, spec.high)
    else:
        raise SpaceError(field, spec, "a Choice or an IntRange")


def _spec_to_json(spec: Spec) -> list[Any] | dict[str, Any]:
    if isinstance(spec, Choice):
        return list(spec.values)
    return {"low": spec.low, "high": spec.high, "log": spec.log}


def spec_from_json(field: str, raw: object) -> Spec | None:
    """The file form of one setting -> its Spec, or None for a scalar (a fixed value).

    A list is a Choice; an object is an IntRange with keys low, high and optional log. The spec
    is checked here (SpaceError naming `field`); scalars are checked by the caller.
    """
    spec: Spec
    if isinstance(raw, list):
        spec = Choice(values=tuple(raw))
    elif isinstance(raw, dict):
        if KINDS.get(field) != "int":
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
            check_field_name(field, spec)
            _check_spec(field, spec)
        for field, value in self.fixed.items():
            check_field_name(field, value)
            if field in self.params:
                raise SpaceError(field, value, "either searched (params) or fixed, not both")
            check_value(field, value)
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
        # A setting inert under another's value (checkpoint_share without checkpointing) takes
        # its default, so the config is the canonical one.
        return LoopConfig.from_dict(canonical({**self.fixed, **suggested}, pinned=self.fixed))

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
        return LoopConfig.from_dict(
            canonical(
                {**self.fixed, **{field: params[field] for field in self.params}}, pinned=self.fixed
            )
        )

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
            check_field_name(field, raw)
            spec = spec_from_json(field, raw)
            if spec is None:
                raise SpaceError(field, raw, "a list of choices or a range object")
            params[field] = spec
        notes = data.get("notes", [])
        if not isinstance(notes, list | tuple):
            raise SpaceError("notes", notes, "a list of strings")
        return cls(name=data["name"], params=params, fixed=dict(raw_fixed), notes=tuple(notes))


# --------------------------------------------------------------------------------------------
# ordering and ids
# --------------------------------------------------------------------------------------------

_TIE_LEVERS = tuple(LEVERS[name] for name in TIE_ORDER)
_OPTIMIZERS_BEYOND = LEVERS["optimizer"].ordered().partition(" < ")[2]

SIMPLICITY_ORDER = (
    f"no data parallelism ({LEVERS['parallel'].ordered()}), then no compile "
    f"({LEVERS['compile'].ordered()}), then the "
    f"optimizer as built (< {_OPTIMIZERS_BEYOND}), then "
    "fewer streams, then no CUDA graph, smaller prefetch_depth, fewer num_workers, "
    f"sync_mode {LEVERS['sync_mode'].ordered()}, pin_memory off, non_blocking off, "
    "smaller sync_interval, then the data-parallel settings at their defaults"
)
"""How `simplicity_key` orders configs, simplest first (for output): the lever table's
`TIE_ORDER` and ranks, in words."""


def simplicity_key(config: LoopConfig) -> tuple[int, ...]:
    """Sort key, smaller = simpler, in the order of `SIMPLICITY_ORDER`: the rank of each lever in
    `trainers.levers.TIE_ORDER`, from the lever table.

    `LoopConfig()` (the PyTorch default) has the smallest key of every config: each component
    is at its minimum there. Compilation comes first: it costs a compile in every run that
    adopts it, and a tie should not ask a user to pay that for nothing.
    """
    return tuple(lever.rank(getattr(config, lever.name)) for lever in _TIE_LEVERS)


def config_key(config: LoopConfig) -> str:
    """A short stable id of a config: sha1 of its sorted-key compact JSON, first 12 hex chars.

    A lever added after configs were stored (`Lever.added` >= 1) is left out while at its
    default, so every config that could be stored before it existed keeps its key (its cached
    parity verdict, its pooled windows)."""
    values = {k: v for k, v in config.to_dict().items() if LEVERS[k].keyed_at(v)}
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(canonical.encode("utf-8"), usedforsecurity=False).hexdigest()[:12]


def candidate_key(config: LoopConfig, precision: str | None, reference: str | None) -> str:
    """The key of `config` run in `precision`: `config_key` in the study's reference precision
    (so a single-precision study's keys stay what they were), `<config_key>@<precision>` in
    another: a config in two precisions is two candidates, cached and pooled apart."""
    key = config_key(config)
    return key if precision is None or precision == reference else f"{key}@{precision}"
