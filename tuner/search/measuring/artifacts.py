"""Compile artefacts that travel to another machine: a job's compiled graphs in one file.

Every trial, child process and worker of a study shares one Inductor cache folder
(`share_compile_cache`), so on one machine a config compiles cold once and a
later trial or job of the same graph finds it there. A machine that has not compiled it (a new
GPU node, a fresh container, a lent machine that starts bare) compiles everything cold again: at
1.1B parameters 60-110 s for the whole model, most of a trial. torch's portable cache
(`torch.compiler.save_cache_artifacts`, "Mega-Cache" in PyTorch's compile-time caching guide)
packs what this process compiled (Inductor's graphs and kernels, AOTAutograd's, autotuning
results) into bytes that `torch.compiler.load_cache_artifacts` puts back into the caches of
another process, on a machine with the same software.

A job saves them at its end to ARTIFACTS_FILE in its compile cache folder, and a job that starts
with that file present loads it first. So copying the folder (or mounting it, as `docker/` does
with the artifacts volume) to another machine gives its first job warm compiles. Loading is
best effort: bytes from another torch version are refused by torch, and the job then compiles
cold with one line saying why. What was loaded and saved is in the recommendation's `search`
record (`compile_artifacts`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import trainers
from tuner.errors import TunerError
from tuner.evidence import profiles
from tuner.search.options import RunOptions
from tuner.store import storage as studies

ARTIFACTS_FILE = "streamtune-compile-artifacts.bin"


def _count(info: Any) -> int:
    """Entries in a `torch.compiler._cache.CacheInfo` (0 for None)."""
    if info is None:
        return 0
    return sum(len(keys) for keys in getattr(info, "artifacts", {}).values())


def load(folder: str | os.PathLike[str] | None) -> tuple[int, str | None]:
    """Load the artefacts saved in `folder` by an earlier job: (entries loaded, why none were,
    if a file was there and could not be loaded). (0, None) without a folder or a file."""
    if folder is None:
        return 0, None
    path = Path(folder) / ARTIFACTS_FILE
    if not path.is_file():
        return 0, None
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - stale or foreign bytes: compile cold, say why
        return 0, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    if info is None:
        # torch logs why and returns None for bytes it cannot read (a damaged file, another
        # torch's format).
        return 0, f"torch could not read {path} (damaged, or written by another torch)"
    return _count(info), None


def load_said(folder: str | None, say: Callable[[str], None]) -> int:
    """`load`, before any compile, each outcome said in one line (`say`); the entries loaded."""
    loaded, refused = load(folder)
    if loaded:
        say(f"compile artefacts of an earlier job loaded: {loaded} entries")
    if refused:
        say(f"compile artefacts of an earlier job not loaded ({refused}): cold compiles")
    return loaded


def save(folder: str | os.PathLike[str] | None) -> tuple[int, str | None]:
    """Save what this process compiled to `folder`: (entries saved, why nothing was, if it
    failed). Written beside and then renamed over the old file, so a reader never sees half of
    it; a failure (a full disk, a folder gone) leaves the old file and costs the job nothing.
    The file holds what this process compiled: in the tuning service, the worker that ran the
    final round (its earlier jobs' graphs too)."""
    if folder is None:
        return 0, None
    path = Path(folder) / ARTIFACTS_FILE
    partial = path.with_suffix(f".part-{os.getpid()}")
    try:
        found = torch.compiler.save_cache_artifacts()
        if found is None or not found[0]:
            return 0, None
        data, info = found
        partial.write_bytes(data)
        partial.replace(path)
    except Exception as exc:  # noqa: BLE001 - the recommendation matters more than the cache
        partial.unlink(missing_ok=True)
        return 0, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return _count(info), None


COMPILE_CACHE_ENV = "TUNER_COMPILE_CACHE"


def cache_setting() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR as it is now, for `restore_cache_setting` when the job ends."""
    return os.environ.get(trainers.compilation.CACHE_DIR_VARIABLE)


def restore_cache_setting(before: str | None) -> None:
    """Put TORCHINDUCTOR_CACHE_DIR back as `cache_setting` read it: a job's folder, set for the
    whole process by `share_compile_cache`, had stayed for whatever the process did next, and
    looked like the user's choice to its next job (`trainers.compilation.user_cache_dir`), whose
    compiles and artefacts file then went to the first job's folder."""
    trainers.compilation.restore_cache_dir(before)


def share_compile_cache(options: RunOptions) -> str | None:
    """Point Inductor's on-disk caches at one folder for every trial, child process and worker of
    the study: $TUNER_COMPILE_CACHE, else `inductor-cache/` in the study's artifact folder (beside
    an SQLite file), else Inductor's own default. A cache the user set (TORCHINDUCTOR_CACHE_DIR)
    is left alone; Inductor's own default, which it writes into that variable on first use, is
    not the user's (`trainers.compilation.user_cache_dir`): until that was told apart, the study's
    folder lost to it whenever a float8 check had imported Inductor first, and the artefacts
    went to the default folder instead (H100, 2026-11-27: the folder named by
    $TUNER_COMPILE_CACHE stayed empty). Set for the whole process, so the children it spawns
    inherit it."""
    chosen = os.environ.get(COMPILE_CACHE_ENV)
    if not chosen:
        folder = profiles.trace_dir(studies.storage_url(options.storage), options.artifacts)
        chosen = None if folder is None else str(folder / "inductor-cache")
    users = trainers.compilation.user_cache_dir()
    if users is not None:
        return users
    if chosen is None:
        return os.environ.get(trainers.compilation.CACHE_DIR_VARIABLE)
    try:
        Path(chosen).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # One line naming where the folder came from, not a traceback (issue 29).
        source = COMPILE_CACHE_ENV if os.environ.get(COMPILE_CACHE_ENV) else "--artifacts"
        raise TunerError(
            f"{source}: cannot create the compile cache folder {chosen}: {exc.strerror}"
        ) from exc
    os.environ[trainers.compilation.CACHE_DIR_VARIABLE] = str(Path(chosen).resolve())
    return os.environ[trainers.compilation.CACHE_DIR_VARIABLE]
