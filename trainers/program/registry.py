"""The registry of programs: a JSON file naming each program, its command and what it implements.

    {"programs": {"NAME": {"command": ["python", "train.py", "--preset", "{preset}"],
                           "presets": ["tiny", "small"], "settings": ["sync_interval"],
                           "cwd": ".", "env": {}, "timeout_s": 600}}}

The file is validated by a pydantic model (`RegistryFile`); a bad entry is a ConfigError naming
the field (`programs.NAME.command`), its value, what is allowed and the file. `cwd` (default: the
file's folder) is relative to the file. `$TUNER_PROGRAMS` names the registry a tuner reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainers.config import LoopConfig, field_names
from trainers.errors import ConfigError, WorkloadError
from trainers.tuned import ENV_PREFIX

PREFIX = "program:"
REGISTRY_VARIABLE = "TUNER_PROGRAMS"
DEFAULT_TIMEOUT_S = 600.0
PLACEHOLDERS = ("python", "preset", "device", "steps", "warmup", "windows", "seed")
"""What `{...}` in a registered command may name."""
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")  # `{"a": 1}` in an argument is no placeholder
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ProgramEntry(BaseModel):
    """One program of the registry file, as written there. Each field's description is what the
    error for a bad value says is allowed."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    command: list[str] = Field(
        min_length=1,
        description="a non-empty list of strings ({python}, {preset}, {device}, {steps}, "
        "{warmup}, {windows} and {seed} are replaced)",
    )
    presets: list[str] = Field(
        default_factory=list,
        validate_default=True,
        min_length=1,
        description="a non-empty list of preset names",
    )
    settings: list[str] = Field(
        default_factory=list,
        description="a list of LoopConfig fields: " + ", ".join(field_names()),
    )
    cwd: str = Field(default=".", description="a folder path, relative to the registry file")
    env: dict[str, str] = Field(default_factory=dict, description="an object of string variables")
    timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S, gt=0, allow_inf_nan=False, description="a number of seconds > 0"
    )

    @field_validator("command")
    @classmethod
    def _known_placeholders(cls, command: list[str]) -> list[str]:
        # An unknown `{name}` was passed to the program as written, and failed there.
        unknown = sorted({m for part in command for m in _PLACEHOLDER.findall(part)})
        unknown = [name for name in unknown if name not in PLACEHOLDERS]
        if unknown:
            raise ValueError("unknown placeholders: " + ", ".join(f"{{{n}}}" for n in unknown))
        if any("\0" in part for part in command) or not command[0]:
            raise ValueError("an empty program, or a NUL character, cannot be run")
        return command

    @field_validator("presets")
    @classmethod
    def _preset_names(cls, presets: list[str]) -> list[str]:
        # Each is passed as {preset}: an empty one or a NUL had failed every run at its start.
        for preset in presets:
            if not preset.strip() or "\0" in preset:
                raise ValueError(f"preset {preset!r}: allowed a non-empty name without NUL")
        return presets

    @field_validator("env")
    @classmethod
    def _variables(cls, env: dict[str, str]) -> dict[str, str]:
        # A bad name or a NUL failed every run at its start, the protocol's own names were
        # overridden by the protocol without a word.
        for name, value in env.items():
            if not _VARIABLE.fullmatch(name):
                raise ValueError(f"{name!r} is not a variable name (letters, digits, _)")
            if name.startswith(ENV_PREFIX):
                raise ValueError(f"{name} is the protocol's own (it sets every {ENV_PREFIX}*)")
            if "\0" in value:
                raise ValueError(f"the value of {name} holds a NUL character")
        return env

    @field_validator("settings")
    @classmethod
    def _loop_fields(cls, settings: list[str]) -> list[str]:
        unknown = sorted(set(settings) - set(field_names()))
        if unknown:
            raise ValueError(f"not LoopConfig fields: {', '.join(unknown)}")
        return settings


class RegistryFile(BaseModel):
    """The registry file: an object whose `programs` names at least one program."""

    programs: dict[str, ProgramEntry] = Field(
        min_length=1, description="an object of named programs"
    )

    @field_validator("programs")
    @classmethod
    def _names(cls, programs: dict[str, ProgramEntry]) -> dict[str, ProgramEntry]:
        # A study's name is made of the program's: `a b` and `a/b` had collapsed into one.
        for name in programs:
            if not _NAME.fullmatch(name):
                raise ValueError(
                    f"program name {name!r}: allowed letters, digits, '.', '_' and '-', "
                    "starting with a letter or digit"
                )
        return programs


@dataclasses.dataclass(frozen=True, kw_only=True)
class Program:
    """One registered program: what to run and what it implements."""

    name: str
    command: tuple[str, ...]
    cwd: Path
    presets: tuple[str, ...]
    settings: tuple[str, ...]
    """The LoopConfig fields the program implements; every other field must keep its default."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def check(self, preset: str, config: LoopConfig | None = None) -> None:
        """WorkloadError for a preset it does not have; ConfigError for a setting it ignores."""
        if preset not in self.presets:
            raise WorkloadError(
                f"preset={preset!r} is invalid for program {self.name!r}: allowed "
                + ", ".join(self.presets),
                field="preset",
            )
        if config is None:
            return
        refused = self.lacking(config.to_dict())
        if refused is not None:
            raise ConfigError(*refused)

    def lacking(self, values: Mapping[str, Any]) -> tuple[str, Any, str] | None:
        """The first of `values` set to other than its default that the program does not
        implement, as (field, value, what is allowed); None if there is none."""
        defaults = LoopConfig().to_dict()
        for field, value in values.items():
            if field not in self.settings and value != defaults[field]:
                return (
                    field,
                    value,
                    f"{defaults[field]!r}: program {self.name!r} does not implement {field} "
                    f"(it implements {', '.join(self.settings) or 'none'})",
                )
        return None


def load_registry(path: str | os.PathLike[str]) -> dict[str, Program]:
    """The programs of the registry file at `path` (see the module doc). ConfigError naming the
    field, its value and the file for anything the file gets wrong."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(REGISTRY_VARIABLE, str(path), "an existing registry file") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(REGISTRY_VARIABLE, str(path), f"a JSON file ({exc})") from exc
    except UnicodeDecodeError as exc:  # before ValueError's other kinds: the text itself
        raise ConfigError(REGISTRY_VARIABLE, str(path), f"a UTF-8 JSON file ({exc})") from exc
    except OSError as exc:  # a folder, a file it may not read: a traceback had ended the run
        why = exc.strerror or type(exc).__name__
        raise ConfigError(
            REGISTRY_VARIABLE, str(path), f"a registry file it can read ({why})"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError("programs", None, f"an object of named programs (in {file})")
    try:
        registry = RegistryFile.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, data, file) from None
    for name, entry in registry.programs.items():
        if not (file.parent / entry.cwd).is_dir():  # every run had failed, naming no field
            raise ConfigError(
                f"programs.{name}.cwd",
                entry.cwd,
                f"an existing folder, relative to the registry file (in {file})",
            )
    return {
        name: Program(
            name=name,
            command=tuple(entry.command),
            cwd=(file.parent / entry.cwd).resolve(),
            presets=tuple(entry.presets),
            settings=tuple(entry.settings),
            env=dict(entry.env),
            timeout_s=float(entry.timeout_s),
        )
        for name, entry in registry.programs.items()
    }


def _config_error(exc: ValidationError, data: dict[str, Any], file: Path) -> ConfigError:
    """The first of pydantic's errors as a ConfigError: `programs.NAME.FIELD`, the value as the
    file has it (None where it is missing), and the field's description as what is allowed."""
    error = exc.errors()[0]
    # programs, NAME, FIELD: an error inside a list or object is reported for the whole field.
    loc = [str(part) for part in error["loc"][:3]]
    value: Any = data
    for part in loc:
        value = value.get(part) if isinstance(value, dict) else None
    field = ProgramEntry.model_fields.get(loc[-1]) if len(loc) == 3 else None
    if value is None and field is not None and not field.is_required():
        # Left out, a field with a default is that default (presets: an empty list).
        value = field.get_default(call_default_factory=True)
    if error["type"] == "extra_forbidden":
        allowed = "one of " + ", ".join(ProgramEntry.model_fields)
    elif len(loc) == 2 and loc[0] == "programs":
        allowed = "an object with command, presets and settings"
    elif len(loc) == 3:
        allowed = ProgramEntry.model_fields[loc[2]].description or ""
    else:
        allowed = RegistryFile.model_fields["programs"].description or ""
    return ConfigError(".".join(loc), value, f"{allowed} (in {file}: {error['msg']})")


def find_program(name: str, environ: Mapping[str, str] | None = None) -> Program:
    """The program `name` ("program:NAME" or "NAME") of the registry in $TUNER_PROGRAMS."""
    variables = os.environ if environ is None else environ
    short = name.removeprefix(PREFIX)
    path = variables.get(REGISTRY_VARIABLE)
    if not path:
        raise WorkloadError(
            f"workload={name!r}: no program registry: set {REGISTRY_VARIABLE} to a registry "
            "file on this machine (see trainers/program/registry.py)",
            field="workload",
        )
    programs = load_registry(path)
    if short not in programs:
        raise WorkloadError(
            f"workload={name!r} is invalid: allowed "
            + ", ".join(f"{PREFIX}{known}" for known in programs),
            field="workload",
        )
    return programs[short]
