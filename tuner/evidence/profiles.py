"""Storing profiles on a study: figures and verdict as user attributes, the trace as an Optuna
artifact; and reading them back (`reread` derives verdicts and explanation anew)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.trial import FrozenTrial

from tuner.errors import NoRecommendation, TunerError
from tuner.evidence.recommendation import Recommendation
from tuner.evidence.trace import Profile
from tuner.evidence.verdicts import Verdict, explain, verdict
from tuner.store import keys
from tuner.store.counting import count_trials
from tuner.store.keys import PROFILE as TRIAL_ATTR
from tuner.store.keys import PROFILE_PREFIX as STUDY_PREFIX
from tuner.store.storage import masked

ARTIFACTS_ENV = "TUNER_ARTIFACTS"


def artifact_dir(storage_url: str, explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where traces go: `explicit`, else $TUNER_ARTIFACTS, else beside an SQLite database file
    (`sqlite:///tuner.db` -> `tuner-artifacts/`). Another storage needs one of the first two."""
    chosen = explicit or os.environ.get(ARTIFACTS_ENV)
    if chosen:
        return Path(chosen)
    try:
        url = sqlalchemy.engine.make_url(storage_url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise TunerError(f"--storage: {masked(storage_url)!r} is not a database URL") from exc
    database = url.database
    if (
        url.get_backend_name() != "sqlite"
        or not database
        or database == ":memory:"
        or (database.startswith("file:"))
    ):
        raise TunerError(
            f"--artifacts: traces of {url.get_backend_name()} storage "
            f"{masked(storage_url)!r} need a directory: pass --artifacts DIR or set {ARTIFACTS_ENV}"
        )
    path = Path(database)
    return path.with_name(f"{path.stem}-artifacts")


def trace_dir(storage_url: str, explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """`artifact_dir`, or None where it cannot be placed (another storage and no --artifacts nor
    $TUNER_ARTIFACTS): the figures are stored then, the traces are not."""
    try:
        return artifact_dir(storage_url, explicit)
    except TunerError:
        return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "profile"


def store_profile(
    study_or_trial: optuna.Study | optuna.Trial | optuna.trial.FrozenTrial,
    prof: Profile,
    artifact_dir: str | os.PathLike[str] | None,
    *,
    name: str | None = None,
) -> str | None:
    """Store `prof`: its trace as an artifact, its figures and verdict as a user attribute.

    On a Study: attribute `profile/<name>` (`name` required: a baseline's name or "recommended").
    On a running Trial: attribute `profile`. A FrozenTrial cannot take an artifact once it has
    finished (Optuna 5.0), so it is refused. The trace goes to a `FileSystemArtifactStore` in
    `artifact_dir`; with `artifact_dir=None` only the figures are stored. Returns the artifact id
    (None when no trace was stored).
    """
    if isinstance(study_or_trial, optuna.trial.FrozenTrial):
        raise TypeError(
            "store_profile needs the running optuna.Trial or the Study: a finished "
            "(frozen) trial cannot take artifacts"
        )
    if isinstance(study_or_trial, optuna.Study):
        if not name:
            raise ValueError("store_profile on a Study needs name= (a baseline or 'recommended')")
        key = f"{STUDY_PREFIX}{name}"
    else:
        name = name or f"trial-{study_or_trial.number}"
        key = TRIAL_ATTR
    attrs = profile_attrs(study_or_trial, prof, artifact_dir, name=name)
    study_or_trial.set_user_attr(key, attrs)
    artifact_id: str | None = attrs["artifact_id"]
    return artifact_id


def profile_attrs(
    study_or_trial: optuna.Study | optuna.Trial,
    prof: Profile,
    artifact_dir: str | os.PathLike[str] | None,
    *,
    name: str,
) -> dict[str, Any]:
    """What `store_profile` stores, its trace uploaded as an artifact of `study_or_trial` (named
    after `name`), without setting any attribute: a profile taken ahead of the decision is kept
    by its config (`tuner.search.deciding.profiling.SharedProfiles`) until the decision names it.
    """
    attrs = prof.to_attrs() | {
        "verdict": verdict(prof).to_dict(),
        "artifact_id": None,
        "artifact_file": None,
    }
    if prof.trace_gz is not None and artifact_dir is not None:
        directory = Path(artifact_dir)
        directory.mkdir(parents=True, exist_ok=True)
        store = optuna.artifacts.FileSystemArtifactStore(str(directory))
        filename = f"{_safe(name)}.trace.json.gz"
        with tempfile.TemporaryDirectory(prefix="streamtune-trace-") as tmp:
            path = os.path.join(tmp, filename)
            with open(path, "wb") as f:
                f.write(prof.trace_gz)
            attrs["artifact_id"] = optuna.artifacts.upload_artifact(
                artifact_store=store,
                file_path=path,
                study_or_trial=study_or_trial,
                mimetype="application/json",
                encoding="gzip",
            )
        attrs["artifact_file"] = filename
    return attrs


def load_trace(artifact_dir: str | os.PathLike[str], artifact_id: str) -> dict[str, Any]:
    """A stored trace, downloaded, decompressed and parsed."""
    store = optuna.artifacts.FileSystemArtifactStore(str(artifact_dir))
    with tempfile.TemporaryDirectory(prefix="streamtune-trace-") as tmp:
        path = os.path.join(tmp, "trace.json.gz")
        optuna.artifacts.download_artifact(
            artifact_store=store, file_path=path, artifact_id=artifact_id
        )
        with gzip.open(path, "rb") as f:
            return dict(json.loads(f.read()))


def study_profiles(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """`profile/<name>` attributes of the study, by name (those that hold figures)."""
    return profiles_in(study.user_attrs)


def profiles_in(user_attrs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`profile/<name>` entries of a study's user attributes that hold figures, by name."""
    return {
        k[len(STUDY_PREFIX) :]: v
        for k, v in user_attrs.items()
        if k.startswith(STUDY_PREFIX) and isinstance(v, dict) and "step_ms" in v
    }


def stored_verdicts(profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, Verdict]:
    return {name: verdict(attrs) for name, attrs in profiles.items()}


def reread(recommendation: Recommendation, user_attrs: Mapping[str, Any]) -> Recommendation:
    """The recommendation with its verdicts and explanation derived again from the profile
    figures stored in the study, under this code's rules.

    The figures are the measurement; the verdicts and the sentence are their reading, which the
    code may improve (it did twice: GPU time over the unprofiled step, and what a gpu-bound
    baseline credits). A study without stored profiles is returned as it was.
    """
    profiles = profiles_in(user_attrs)
    if not profiles or recommendation.config is None:
        return recommendation
    verdicts = stored_verdicts(profiles)
    return recommendation.with_evidence(
        verdicts={name: v.to_dict() for name, v in verdicts.items()},
        explanation=explain(recommendation.to_dict(), verdicts),
    )


def read_recommendation(
    attrs: Mapping[str, Any], trials: Sequence[FrozenTrial], name: str
) -> Recommendation:
    """The study's stored recommendation, its counts and verdicts derived again."""
    found = attrs.get(keys.RECOMMENDATION)
    if not isinstance(found, dict):
        raise NoRecommendation(
            f"study {name!r} has no recommendation yet (its run stopped before or in its final "
            "round): to finish it, run the command it printed when it stopped ('to resume it: "
            f"...'), or `python -m tuner run --study {shlex.quote(name)}` with the workload, "
            "preset and settings it was made with (it names any that differ)"
        )
    rec = Recommendation.from_dict({"study": name} | found).with_counts(count_trials(trials))
    return reread(rec, attrs)
