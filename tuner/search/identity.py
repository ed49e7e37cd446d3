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
import json
import os
import random
import shlex
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch

import trainers
from trainers.program import Program
from trainers.workloads import LIBRARY_PREFIXES, seed_generators
from tuner.store.keys import META
from tuner.store.storage import same_question


def model_identity(
    workload: trainers.Workload, name: str, model_args: dict[str, str]
) -> dict[str, str]:
    """`architecture`: a digest of the module tree and every parameter's name, shape and dtype;
    `code`: a digest of the source files of the factory, of the loss and of the model's own
    module classes outside the installed libraries (a user's `forward` in another file than
    the factory: a change to it had resumed the old study with its verdicts), and of the files
    a model argument names (`config=my.json`: a changed `rope_theta` gave the same digest);
    `digest`: of both."""
    architecture = trainers.architecture_digest(workload.model)
    files = {
        _source_file(trainers.resolve_factory(name, model_args)),
        _source_file(workload.loss_fn),
        *(_source_file(kind) for kind in {type(m) for m in workload.model.modules()}),
    }
    sources = []
    for path in sorted(f for f in files if f is not None and not _installed(f)):
        with open(path, "rb") as handle:
            sources.append(handle.read().decode("utf-8", "replace"))
    code = digest(*sources, *named_files(model_args))
    if name in trainers.workloads.BUILTIN or name.partition(":")[0] in LIBRARY_PREFIXES:
        # Their data is made by the code digested above, from the seed.
        return {"architecture": architecture, "code": code, "digest": digest(architecture, code)}
    data = data_digest(workload)
    return {
        "architecture": architecture,
        "code": code,
        "data": data,
        "digest": digest(architecture, code, data),
    }


def data_digest(workload: trainers.Workload) -> str:
    """A user's first batch, by its tensors' dtypes, shapes and bytes, read with the global
    generators seeded (an augmentation draws the same numbers each time) and left as they were.
    A user's factory that loads its data from a file had resumed its study after the file
    changed, and every trial failed the stored reference at step 0 with a hint about workers
    (a user's probe, 2026-12-06)."""
    with torch.random.fork_rng(devices=[]):
        state = random.getstate()
        numpy_state = np.random.get_state()
        try:
            seed_generators(0)
            batch = trainers.workloads.first_batch(workload)
        finally:
            random.setstate(state)
            np.random.set_state(numpy_state)
    hashed = hashlib.sha256()
    for tensor in _tensors(batch):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        hashed.update(f"{tensor.dtype}{list(tensor.shape)}".encode())
        hashed.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return hashed.hexdigest()[:8]


def _tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch in order: a tensor, a dict's values, a tuple's items; what else
    it holds (a list of strings gathered by the loader) as its text."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):  # a dict, or transformers' BatchEncoding (a UserDict)
        return [t for value in batch.values() for t in _tensors(value)]
    if isinstance(batch, tuple | list):
        return [t for item in batch for t in _tensors(item)]
    return [torch.tensor(list(repr(batch).encode()), dtype=torch.uint8)]


def program_identity(program: Program) -> dict[str, str]:
    """A program's identity, as `model_identity` is a model's: `architecture` digests its
    registry entry (command, folder, variables, presets, settings), `code` the files its command
    names (`plain_loop.py`, a built binary), read from its folder. Without it an edited program
    resumed its old study, the old program's trials and verdicts taken for its own. A module the
    named file imports is not read: the program's code is not this process's to import."""
    entry = {
        "command": list(program.command),
        "cwd": str(program.cwd),
        "env": dict(sorted(program.env.items())),
        "presets": list(program.presets),
        "settings": list(program.settings),
    }
    architecture = digest(json.dumps(entry, sort_keys=True))
    files = []
    for part in program.command:
        named = program.cwd / Path(part).expanduser()  # an absolute path stays itself
        if "{" not in part and named.is_file():
            files.append(f"{part}:{hashlib.sha256(named.read_bytes()).hexdigest()}")
    code = digest(*files)
    return {
        "program": program.name,
        "architecture": architecture,
        "code": code,
        "digest": digest(architecture, code),
    }


def named_files(model_args: dict[str, str]) -> list[str]:
    """`key=value:<sha256 of the file>` for each model argument naming a file (`config=my.json`)."""
    found = []
    for key, value in sorted(model_args.items()):
        named = Path(str(value)).expanduser()
        if named.is_file():
            found.append(f"{key}={value}:{hashlib.sha256(named.read_bytes()).hexdigest()}")
    return found


def _installed(path: str) -> bool:
    """A file of the standard library or an installed package (torch, transformers): their
    versions are the memo's inputs; reading them all would cost a second per model."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    resolved = str(Path(path).resolve())
    return any(resolved.startswith(str(Path(root).resolve()) + os.sep) for root in roots)


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
    changed = next(
        (key for key in ("architecture", "code") if stored.get(key) != model[key]), "data"
    )
    subject = "program" if "program" in model else "model"
    what = {"architecture": "registry entry", "code": "files"} if "program" in model else {}
    measured = "data" if changed == "data" else "code"
    return new, (
        f"the {subject}'s {what.get(changed, changed)} changed since study {name} was measured: "
        f"new study {new}, not mixed with it; to resume {name}, run again with the {subject} "
        f"and {measured} it measured (read it: python -m tuner best --study {shlex.quote(name)})"
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
