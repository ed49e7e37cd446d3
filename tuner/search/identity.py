"""What model a study measured: its architecture and the code that builds and trains it.

A study's name comes from the workload, preset and hardware, which stay the same while a user
fixes their model: without this, running again after a fix resumed the old study and mixed the
old model's trials (its failures included) into the new one's. `model_identity` is stored on the
study (`keys.META["model"]`); `study_for_model` sends a run whose model differs to a study of its
own, named after the model, and leaves the old one as it was.
"""

from __future__ import annotations

import hashlib
import inspect
import shlex
from typing import Any

import optuna

import trainers
from tuner.store.keys import META
from tuner.store.storage import same_question


def model_identity(
    workload: trainers.Workload, name: str, model_args: dict[str, str]
) -> dict[str, str]:
    """`architecture`: a digest of the module tree and every parameter's name, shape and dtype;
    `code`: a digest of the source files of the factory and of the loss (the user's module, or
    trainers' own for a built-in); `digest`: of both."""
    architecture = trainers.architecture_digest(workload.model)
    files = {
        _source_file(trainers.resolve_factory(name, model_args)),
        _source_file(workload.loss_fn),
    }
    sources = []
    for path in sorted(f for f in files if f is not None):
        with open(path, "rb") as handle:
            sources.append(handle.read().decode("utf-8", "replace"))
    code = digest(*sources)
    return {"architecture": architecture, "code": code, "digest": digest(architecture, code)}


def study_for_model(
    storage: optuna.storages.BaseStorage, name: str, info: dict[str, Any]
) -> tuple[str, str | None]:
    """`name`, or where that study asked the same question (`same_question`) of another model:
    `name-model-<digest>` and the one line that says so and how to go back to the old study. A
    study made for another question is `open_study`'s error; one stored before models were
    recorded is resumed as it always was."""
    model = info["model"]
    try:
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
    except KeyError:  # no such study yet
        return name, None
    meta = attrs.get(META)
    if not isinstance(meta, dict) or not same_question(meta, info):
        return name, None
    stored = meta.get("model")
    if not isinstance(stored, dict) or stored.get("digest") == model["digest"]:
        return name, None
    new = f"{name}-model-{model['digest']}"
    what = "architecture" if stored.get("architecture") != model["architecture"] else "code"
    return new, (
        f"the model's {what} changed since study {name} was measured: new study {new}, not "
        f"mixed with it; to resume {name}, run again with the model and code it measured "
        f"(read it: python -m tuner best --study {shlex.quote(name)})"
    )


def _source_file(thing: Any) -> str | None:
    """The source file of a function, a callable object's class, or a user factory's wrapped
    function (`trainers.workloads.UserFactory`); None where there is none (a builtin)."""
    target = getattr(thing, "factory", thing)
    for candidate in (target, type(target)):
        try:
            found = inspect.getsourcefile(candidate)
        except TypeError:
            continue
        if found is not None:
            return found
    return None


def digest(*parts: str) -> str:
    """As `trainers.architecture_digest` digests a model: 8 hex digits of the parts' SHA-256."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]
