"""Typed options of the library-model families, parsed from `--model-arg key=value` strings.

A family (`torchvision`, `timm`, `hf:causal-lm`, ...) declares each option once: its type, its
default, the range or choices allowed and a line of help. Presets are overrides of those
defaults (`default` overrides nothing), and the user's options override the preset, so every
workload's effective shape is one flat, typed mapping that can be listed (`catalog()`) and
written into a study's name (`workload_key()`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Literal

from trainers.errors import WorkloadError, did_you_mean
from trainers.workloads.base import check_preset

Value = int | float | str | bool
Kind = Literal["int", "float", "str", "bool"]

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
NOUNS: Mapping[Kind, str] = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
}
TYPES: Mapping[Kind, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "str": str,
    "bool": bool,
}


def format_value(value: Value) -> str:
    """How a value is written back (`--model-arg`, study names): bools as true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class OptionSpec:
    """One option: `low`/`high` bound numbers (inclusive), `choices` lists every allowed value."""

    name: str
    kind: Kind
    default: Value
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Value, ...] | None = None

    def __post_init__(self) -> None:
        # A spec whose own default is refused is a programming error: fail at import.
        self.check(self.default, raw=format_value(self.default))

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(format_value(c) for c in self.choices)
        noun, low, high = NOUNS[self.kind], _bound(self.low), _bound(self.high)
        if low is not None and high is not None:
            return f"{noun} in {low}..{high}"
        if low is not None:
            return f"{noun} >= {low}"
        if high is not None:
            return f"{noun} <= {high}"
        return noun

    def error(self, raw: str) -> WorkloadError:
        # A near miss among named choices (`arch=gptneox` for gpt_neox) gets the closest names.
        hint = "" if self.choices is None else did_you_mean(raw, map(format_value, self.choices))
        return WorkloadError(
            f"model_arg.{self.name}={raw!r} is invalid{hint}: allowed {self.allowed()}",
            field=f"model_arg.{self.name}",
        )

    def parse(self, raw: str) -> Value:
        """The typed value of the string `raw`; WorkloadError naming key, value and allowance.
        A number or bool given from Python (`model_args={"ffn": 4096}`) is read as its text."""
        if isinstance(raw, bool):
            raw = str(raw).lower()
        elif isinstance(raw, int | float):
            raw = str(raw)
        elif not isinstance(raw, str):
            raise self.error(raw)
        text = raw.strip()
        value: Value
        try:
            if self.kind == "int":
                value = int(text)
            elif self.kind == "float":
                value = float(text)
            elif self.kind == "bool":
                if text.lower() not in TRUE + FALSE:
                    raise ValueError(text)
                value = text.lower() in TRUE
            else:
                value = text
        except ValueError:
            raise self.error(raw) from None
        return self.check(value, raw=raw)

    def check(self, value: Value, *, raw: str) -> Value:
        """`value` if allowed (a preset's, a default or a parsed one), else WorkloadError."""
        if not isinstance(value, TYPES[self.kind]) or (
            self.kind != "bool" and isinstance(value, bool)
        ):
            raise self.error(raw)
        if self.choices is not None and value not in self.choices:
            raise self.error(raw)
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(raw)
        if self.kind in ("int", "float") and not isinstance(value, bool):
            number = float(value)
            if (self.low is not None and number < self.low) or (
                self.high is not None and number > self.high
            ):
                raise self.error(raw)
        # 1 and 1.0 are one learning rate, and must give one study name (`key_of`).
        return float(value) if self.kind == "float" else value


Fill = Callable[
    [dict[str, Value], Mapping[str, Value], Callable[[str], OptionSpec]], dict[str, Value]
]


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Family:
    """A kind of library model, as `catalog()` lists it for `python -m tuner models`.

    `usage` is how a workload of the family is named (`torchvision:<model_name>`); `presets` maps
    each preset to the options it sets, over the options' defaults.
    """

    name: str
    usage: str
    description: str
    options: tuple[OptionSpec, ...]
    presets: Mapping[str, Mapping[str, Value]]
    fill: Fill | None = None
    """Options read from elsewhere, over the preset's and under the user's (`hf:causal-lm`'s
    sizes from its `config` file): `fill(values, the user's overrides, self.option)`."""
    check: Callable[[Mapping[str, Value]], None] | None = None
    """What no single option can say (`hf:`'s heads must divide the width), on the effective
    options: checked wherever they are resolved, so a service refuses them before a job is
    queued, as `run` does (a job with hidden=30, heads=4 had failed in its worker)."""

    def __post_init__(self) -> None:
        for preset, values in self.presets.items():
            for key, value in values.items():
                spec = self.option(key)
                spec.check(value, raw=f"{format_value(value)} (preset {preset})")

    def option(self, key: str) -> OptionSpec:
        for spec in self.options:
            if spec.name == key:
                return spec
        raise WorkloadError(
            f"model_arg {key!r} is unknown for {self.usage}: allowed "
            + ", ".join(spec.name for spec in self.options),
            field=f"model_arg.{key}",
        )

    def parse(self, model_args: Mapping[str, str]) -> dict[str, Value]:
        """`--model-arg` strings to typed values; only the keys given (see `resolve`)."""
        return {key: self.option(key).parse(raw) for key, raw in model_args.items()}

    def preset_values(self, preset: str) -> dict[str, Value]:
        """Every option's value under `preset`, before the user's options."""
        check_preset(self.usage, preset, self.presets)
        values = {spec.name: spec.default for spec in self.options}
        values.update(self.presets[preset])
        # Through `check` again, only to give every float option a float (see `check`).
        return {key: self.option(key).check(v, raw=format_value(v)) for key, v in values.items()}

    def resolve(self, preset: str, overrides: Mapping[str, Value]) -> dict[str, Value]:
        """The effective options: the defaults, then the preset's, then the user's."""
        values = self.preset_values(preset)
        for key, value in overrides.items():
            values[self.option(key).name] = value
        if self.fill is not None:
            values = self.fill(values, overrides, self.option)
        if self.check is not None:
            self.check(values)
        return values


def key_of(values: Mapping[str, Value]) -> str:
    """`a=1,b=x`: sorted by key, so the same options always give the same string. An empty
    string (`hf:causal-lm`'s `config`: none) is left out, so an option added with it as its
    default leaves every earlier study's name as it was."""
    return ",".join(
        f"{key}={format_value(values[key])}" for key in sorted(values) if values[key] != ""
    )


def _bound(value: float | None) -> str | None:
    """A range's end as written: `1048576`, not `%g`'s `1.04858e+06`, which is another number."""
    if value is None:
        return None
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
