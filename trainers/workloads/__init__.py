"""Reference workloads, library models (`torchvision:`, `timm:`, `hf:`) and the loader for users'
own (`package.module:factory`)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import traceback
from collections.abc import Callable, Mapping
from typing import Any, cast

from trainers.errors import ConfigError, WorkloadError, did_you_mean
from trainers.workloads import adapters, convnet, mlp, transformer
from trainers.workloads.adapters import PREFIXES as LIBRARY_PREFIXES
from trainers.workloads.adapters import BoundFactory, catalog, lookup
from trainers.workloads.base import (
    Batch,
    SyntheticBatches,
    Workload,
    WorkloadFactory,
    adam,
    adamw,
    check_preset,
    disable_dropout,
)
from trainers.workloads.checks import first_batch, mark_checked, own_workload
from trainers.workloads.options import Family, OptionSpec, key_of
from trainers.workloads.reuse import ReusedBuilds
from trainers.workloads.seeded import check_seeded, seed_generators

BUILTIN: Mapping[str, WorkloadFactory] = {
    "transformer": transformer.build,
    "mlp": mlp.build,
    "convnet": convnet.build,
}

PRESETS: Mapping[str, tuple[str, ...]] = {
    "transformer": tuple(transformer.PRESETS),
    "mlp": tuple(mlp.PRESETS),
    "convnet": tuple(convnet.PRESETS),
}


def refuse_model_args(name: str, model_args: Mapping[str, str] | None) -> None:
    """Only library models take options; a built-in or a user's factory takes its preset only."""
    if model_args:
        raise WorkloadError(
            f"workload={name!r} takes no model args (got {', '.join(sorted(model_args))}): "
            f"they apply to {', '.join(f'{p}:' for p in adapters.PREFIXES)} workloads only; "
            "a built-in or package.module:factory is shaped by its preset",
            field="model_arg",
        )


def resolve_factory(name: str, model_args: Mapping[str, str] | None = None) -> WorkloadFactory:
    """A built-in name, a library model (`torchvision:resnet18`, `timm:<model>`, `hf:<kind>`)
    with its `--model-arg` options bound, or `package.module:factory` for a user's own
    workload. The library prefixes take precedence over a module of the same name."""
    bound = adapters.bind(name, model_args or {})
    if bound is not None:
        return bound
    refuse_model_args(name, model_args)
    if name in BUILTIN:
        return BUILTIN[name]
    path = _file_path_hint(name)
    if path is not None:
        raise WorkloadError(f"workload={name!r} is invalid{path}", field="workload")
    if ":" not in name:
        # `mymodels.build`: a user's factory is named with a colon before it.
        # A module of the working folder first: `examples.my_model` had been offered
        # "examples:my_model", which names no factory (a probe, 2026-12-07).
        head, dot, tail = name.rpartition(".")
        hint = _own_module_hint(name)
        hint = hint or (f" (did you mean {head}:{tail}?)" if dot and head and tail else "")
        hint = hint or did_you_mean(name, BUILTIN)
        raise WorkloadError(
            f"workload={name!r} is invalid{hint}: allowed "
            f"{', '.join(BUILTIN)}, "
            f"{', '.join(f.usage for f in catalog())} or package.module:factory",
            field="workload",
        )
    module_name, _, attr = name.partition(":")
    if not module_name or module_name.startswith(".") or not attr:
        # importlib raises ValueError or TypeError here, which would reach the user as a
        # traceback: a factory is named by an absolute module and an attribute.
        raise WorkloadError(
            f"workload={name!r} is invalid: a user's workload is package.module:factory, an "
            "absolute module name, then a colon and the factory's name",
            field="workload",
        )
    module = _import_user_module(name, module_name, attr)
    factory = getattr(module, attr, None)
    if not callable(factory):
        own = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
        hint = did_you_mean(attr, own, cutoff=0.7, prefix=f"{module_name}:")
        raise WorkloadError(
            f"workload={name!r}: {module_name!r} has no callable {attr!r}{hint}", field="workload"
        )
    # A user's callable: load_workload checks that what it returns is a Workload.
    return cast(WorkloadFactory, UserFactory(name, factory))


def _own_module_hint(name: str) -> str:
    """ " (did you mean um:FACTORY?)" where `name` is a module in the working folder (`--workload
    um` beside um.py had been told only the built-in names); "" otherwise. Found, not imported:
    its top-level code runs once the factory is named."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    origin = None if spec is None else spec.origin
    if origin is None or not os.path.abspath(origin).startswith(os.getcwd() + os.sep):
        return ""
    return (
        f" (did you mean {name}:FACTORY? {name} is a module here: name its factory after a colon)"
    )


def _file_path_hint(name: str) -> str | None:
    """Where `name`'s module is a file's path (`./models/net.py`, `models/net.py:build`): how to
    name it as a module instead; None otherwise. `./models/net.py` had been offered
    "did you mean ./models/net:py?" (a probe, 2026-12-06)."""
    module, colon, attr = name.partition(":")
    if not (module.endswith(".py") or "/" in module or "\\" in module):
        return None
    factory = attr if colon and attr else "FACTORY"
    if os.path.isabs(module):
        # Dotted from the root ("tmp.probe.um.um") names no module: the file's own name, run
        # from its folder (a probe, 2026-12-06).
        folder, stem = os.path.split(module.removesuffix(".py"))
        return (
            f": a module is named, not its file (did you mean {stem}:{factory}? run from "
            f"{folder}, or add it to PYTHONPATH)"
        )
    dotted = module.removesuffix(".py").replace("\\", "/").strip("/").removeprefix("./")
    dotted = ".".join(part for part in dotted.split("/") if part not in ("", "."))
    return (
        f": a module is named, not its file (did you mean {dotted}:{factory}? run from the "
        "folder that holds the top package, or add it to PYTHONPATH)"
    )


def _import_inside(exc: BaseException) -> str | None:
    """`file:line` of the import statement in the user's module that raised `exc`, or None
    where the module itself was not found (no frame of the user's code ran)."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<")
        and os.path.dirname(f.filename) != _IMPORTLIB
        and f.filename != __file__
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


_IMPORTLIB = os.path.dirname(importlib.__file__)
_PREFIX_ALIASES = {"tv": "torchvision", "transformers": "hf", "huggingface": "hf"}


def _prefix_hint(module_name: str, attr: str) -> str:
    """ " (did you mean torchvision:resnet18?)" where a module not found is a library prefix
    misspelt (`torchvison:`, `tim:`), short or cased (`tv:`, `HF:`); a typo only (0.8): `mm:build`
    had been asked "did you mean timm:build?" (ratio 0.67)."""
    alias = _PREFIX_ALIASES.get(module_name.lower(), module_name.lower())
    return did_you_mean(alias, LIBRARY_PREFIXES, suffix=f":{attr}", cutoff=0.8)


def _import_user_module(name: str, module_name: str, attr: str) -> Any:
    """The module of a user's `package.module:factory`; what its import raises, in one line."""
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as exc:
        # The user's own file does not parse: where, not a traceback through the tuner.
        raise WorkloadError(
            f"workload={name!r}: cannot import {module_name!r}: {exc.msg} "
            f"({exc.filename}, line {exc.lineno})",
            field="workload",
        ) from exc
    except SystemExit as exc:
        # A module that exits when imported (a script's `sys.exit()` at top level) would end
        # the tuner without a word.
        raise WorkloadError(
            f"workload={name!r}: importing {module_name!r} called sys.exit({exc.code!r}); a "
            "workload's module must import without running its script (put it under "
            "`if __name__ == '__main__':`)",
            field="workload",
        ) from exc
    except ImportError as exc:
        if module_name == "program":
            # A registered program (`program:NAME`) trains in its own process: nothing here
            # can build it, and "cannot import 'program'" told the user nothing.
            raise WorkloadError(
                f"workload={name!r} is a registered program: it trains itself (its settings "
                f"from `python -m tuner export --format env`); only `python -m tuner run "
                f"--program {attr}` runs it from here",
                field="workload",
            ) from exc
        inside = _import_inside(exc)
        if inside is not None:
            # The module was found and its own import failed (a package it needs is not
            # installed): the folder advice below had sent the user after the wrong cause.
            raise WorkloadError(
                f"workload={name!r}: importing {module_name!r} failed at {inside}: {exc} (a "
                "module it imports is missing from this environment: install it, or fix the "
                "import)",
                field="workload",
            ) from exc
        hint = _prefix_hint(module_name, attr)
        raise WorkloadError(
            f"workload={name!r}: cannot import {module_name!r}{hint}: {exc} (a module is "
            "imported by name: run from the folder that holds it, or add that folder to "
            "PYTHONPATH)",
            field="workload",
        ) from exc
    except Exception as exc:
        # The module's own top-level code raised (a data file read at import, a KeyError): where,
        # in one line, not 30 lines of traceback through the tuner (a probe, 2026-12-06).
        where = _import_inside(exc) or module_name
        message = " ".join(str(exc).split()) or "(no message)"
        raise WorkloadError(
            f"workload={name!r}: importing {module_name!r} raised {type(exc).__name__} at "
            f"{where}: {message}",
            field="workload",
        ) from exc
    return module


class UserFactory:
    """A user's `package.module:factory`, whose own errors become one-line `WorkloadError`s.

    A wrong signature (no `seed` keyword, say) or an exception inside the factory would otherwise
    reach the user as a traceback through the tuner's frames; the error names the workload, the
    cause and the file and line where it was raised, which is what the user has to fix. Keeps the
    factory's module and name, which key its probes (`trainers.gate.reproducibility`).
    """

    def __init__(self, name: str, factory: Callable[..., Any]) -> None:
        self.name = name
        self.factory = factory
        self.__module__ = getattr(factory, "__module__", type(self).__module__)
        self.__qualname__ = getattr(factory, "__qualname__", "<factory>")
        self.__name__ = getattr(factory, "__name__", "<factory>")

    @property
    def presets(self) -> tuple[str, ...] | None:
        """The presets the factory declares (`declared_presets`), None where it declares none."""
        return declared_presets(self.factory, self.name)

    def __call__(self, preset: str, *, seed: int) -> Workload:
        if self.presets is not None:
            check_preset(self.name, preset, self.presets)
        seed_generators(seed)  # a factory that draws without reading `seed` keeps to it too
        try:
            built = self.factory(preset, seed=seed)
        except WorkloadError as exc:
            raise self._refielded(exc) from exc
        except KeyError as exc:  # `{"tiny": 64, ...}[preset]`: the factory has no such preset
            if exc.args != (preset,):
                raise WorkloadError(self._raised(exc), field="workload") from exc
            raise WorkloadError(
                f"preset={preset!r} is invalid for workload {self.name!r}: its factory raised "
                f"{_one_line(exc, self.factory)} (a factory that declares its presets, "
                "`factory.presets = ('tiny', ...)`, has them named, and checked before a job "
                "is queued)",
                field="preset",
            ) from exc
        except TypeError as exc:
            if _takes(self.factory, preset, seed):
                raise WorkloadError(self._raised(exc), field="workload") from exc
            raise WorkloadError(
                f"workload={self.name!r}: the factory must be callable as "
                f"factory(preset, *, seed): {exc}{_defined_at(self.factory)}",
                field="workload",
            ) from exc
        except ConfigError as exc:  # a part it built refused (`workload_from_parts`)
            raise WorkloadError(self._raised(exc), field="workload") from exc
        except ValueError as exc:
            # The factory refusing its preset names it (`unknown preset 'huge'`); another
            # ValueError ("my config file is missing") is the workload's, not the preset's.
            # Named as a word or quoted: "image too small" under preset small is the workload's.
            said = str(exc)
            quoted = (repr(preset), f'"{preset}"')
            named = re.search(r"\bpresets?\b", said) is not None or any(q in said for q in quoted)
            field = "preset" if named else "workload"
            raise WorkloadError(self._raised(exc), field=field) from exc
        except Exception as exc:
            if type(exc).__name__ == "OutOfMemoryError":  # torch's: a trial's failure, as usual
                raise
            raise WorkloadError(self._raised(exc), field="workload") from exc
        except SystemExit as exc:  # it ended the tuner with its code and not a word
            raise WorkloadError(
                f"workload={self.name!r}: the factory called sys.exit({exc.code!r}); allowed a "
                f"factory that returns a Workload or raises{_defined_at(self.factory)}",
                field="workload",
            ) from exc

        if not isinstance(built, Workload):
            return cast(Workload, built)  # not one: `load_workload` says so, naming it
        if (built.name, built.preset) == ("custom", "custom"):
            # `workload_from_parts`' defaults: named as the user named it and its preset
            # (`tuner train` printed "workload custom / custom").
            built = dataclasses.replace(built, name=self.name, preset=preset)
        # What would fail every step fails here, in one line; batches of another shape are fed
        # as tuples (`trainers.workloads.checks`): at every build, the gate's included.
        built = own_workload(built, self.name)
        check_seeded(self.factory, self.name, preset, seed, built.model)
        return built

    def _refielded(self, exc: WorkloadError) -> WorkloadError:
        """`exc` as this workload's: a part `workload_from_parts` refused inside the factory
        names its argument (`optimizer`, `data`, `loss_fn`), which the CLI read as a flag of its
        own (`--optimizer`), and the parts' default name (`custom`), not the user's."""
        field = exc.field or "workload"
        own = field in ("workload", "preset") or field.startswith("model_arg")
        if own and "'custom'" not in str(exc):
            return exc
        said = str(exc).removeprefix("workload 'custom': ").removeprefix("workload='custom': ")
        part = "" if field in ("workload", "preset") else f"{field}: "
        if said.startswith(part):
            part = ""
        return WorkloadError(f"workload={self.name!r}: {part}{said}", field="workload")

    def _raised(self, exc: BaseException) -> str:
        return f"workload={self.name!r}: the factory raised {_one_line(exc, self.factory)}"


def declared_presets(factory: Callable[..., Any], name: str) -> tuple[str, ...] | None:
    """The presets a user's factory declares as its attribute `presets` (a tuple or list of
    names: `build.presets = ("tiny", "small")`), which a preset is checked against before the
    factory runs, here and when a service takes a job; None where it declares none."""
    declared = getattr(factory, "presets", None)
    if declared is None:
        return None
    if not isinstance(declared, list | tuple) or not all(isinstance(p, str) for p in declared):
        raise WorkloadError(
            f"workload={name!r}: its factory's presets must be a tuple or list of names, "
            f"not {declared!r}",
            field="workload",
        )
    if not declared:
        raise WorkloadError(
            f"workload={name!r}: its factory declares no presets (an empty `presets`)",
            field="workload",
        )
    return tuple(declared)


def _takes(factory: Callable[..., Any], preset: str, seed: int) -> bool:
    """Whether `factory(preset, seed=seed)` binds to the factory's signature (True when it has
    none to read: the TypeError then came from inside it)."""
    try:
        inspect.signature(factory).bind(preset, seed=seed)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin)
        return True
    return True


def _defined_at(factory: Callable[..., Any]) -> str:
    """` (file:line)` of the factory's definition, what the user edits; empty when unknown."""
    try:
        path = inspect.getsourcefile(factory)
        _, line = inspect.getsourcelines(factory)
    except (OSError, TypeError):
        return ""
    return f" ({path}:{line})" if path else ""


def _one_line(exc: BaseException, factory: Callable[..., Any]) -> str:
    """`Type: message (file:line)`: the error and the innermost frame of the factory's own file
    it passed through (the line the user wrote, not one inside torch or trainers), else the
    innermost frame it was raised in."""
    message = " ".join(str(exc).split()) or "(no message)"
    frames = list(traceback.extract_tb(exc.__traceback__))
    try:
        own = inspect.getsourcefile(factory)
    except TypeError:
        own = None
    frames = [f for f in frames if f.filename == own] or frames
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {message}{where}"


def load_workload(
    name: str, preset: str, *, seed: int = 0, model_args: Mapping[str, str] | None = None
) -> Workload:
    """Build a fresh workload (new model, same data) for `name` and `preset` from `seed`.

    model_args: `--model-arg key=value` options of a library model, as strings.
    """
    _check_load_args(name, preset, seed, model_args)
    factory = resolve_factory(name, model_args)
    workload = factory(preset, seed=seed)  # a user factory's errors are WorkloadErrors
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload={name!r}: the factory returned {type(workload).__name__}, not a Workload",
            field="workload",
        )
    return mark_checked(workload)  # a user's factory's went through `own_workload` already


def _check_load_args(name: object, preset: object, seed: object, model_args: object) -> None:
    """The arguments' types, named: `seed="0"` had raised "can only concatenate str (not
    "int") to str", `model_args=["layers=2"]` an AttributeError (a probe, 2026-12-08)."""
    for field, value in (("workload", name), ("preset", preset)):
        if not isinstance(value, str):
            raise WorkloadError(f"{field}={value!r} is invalid: allowed a name (str)", field=field)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise WorkloadError(f"seed={seed!r} is invalid: allowed 0 to 4294967295", field="seed")
    if model_args is not None and not isinstance(model_args, Mapping):
        raise WorkloadError(
            f"model_args={model_args!r} is invalid: allowed a mapping of option to value, e.g. "
            '{"layers": "2"}',
            field="model_arg",
        )


def workload_key(name: str, preset: str, model_args: Mapping[str, str] | None = None) -> str:
    """`name-preset`, and for a library model its effective options, sorted:
    `torchvision:resnet18-tiny-batch=2,...,image=32`. Two shapes never share a key (a study's
    name), and the same shape always gets the same key, however its options were spelled.
    Imports no library: the model's name is not checked here."""
    bound = adapters.bind(name, model_args or {}, check_model=False)
    if bound is None:
        refuse_model_args(name, model_args)
        return f"{name}-{preset}"
    return f"{name}-{preset}-{key_of(bound.options(preset))}"


_SHAPES: Mapping[str, Mapping[str, Any]] = {
    "transformer": transformer.PRESETS,
    "mlp": mlp.PRESETS,
    "convnet": convnet.PRESETS,
}


def samples_per_batch_of(
    name: str, preset: str, model_args: Mapping[str, str] | None = None
) -> int | None:
    """The samples of one batch of `name` at `preset`, known without building it: a built-in's
    preset, a library model's `batch` option; None for a user's factory, or where the preset
    or an option is not valid (building it says why). The service refuses a process count that
    does not divide it when the job is posted, where it had failed once a worker built it."""
    try:
        bound = adapters.bind(name, model_args or {}, check_model=False)
        if bound is not None:
            batch = bound.options(preset).get("batch")
            return None if batch is None else int(batch)
    except (WorkloadError, ConfigError, ValueError):
        return None
    shape = _SHAPES.get(name, {}).get(preset)
    return None if shape is None else int(shape.batch)


__all__ = [
    "BUILTIN",
    "LIBRARY_PREFIXES",
    "PRESETS",
    "Batch",
    "BoundFactory",
    "Family",
    "OptionSpec",
    "ReusedBuilds",
    "SyntheticBatches",
    "Workload",
    "WorkloadFactory",
    "adam",
    "adamw",
    "catalog",
    "check_preset",
    "disable_dropout",
    "first_batch",
    "load_workload",
    "lookup",
    "resolve_factory",
    "samples_per_batch_of",
    "seed_generators",
    "workload_key",
]
