"""Reading results back: a study's recommendation, its export formats, the list of studies."""

from __future__ import annotations

import json
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import LoopConfig
from tuner import profile as profiling
from tuner import study as studies
from tuner.errors import NoRecommendation, TunerError

EXPORT_FORMATS = ("json", "env", "python")
ENV_PREFIX = "STREAMTUNE_"


def recommendation(storage_url: str, name: str) -> dict[str, Any]:
    study = studies.load_study(studies.open_storage(storage_url), name)
    found = study.user_attrs.get(studies.RECOMMENDATION)
    if not isinstance(found, dict):
        raise NoRecommendation(
            f"study {name!r} has no recommendation yet (its run stopped before the final "
            f"round): run `python -m tuner run --study {name} ...` again to finish it"
        )
    return profiling.reread(found, study.user_attrs)


def export(rec: dict[str, Any], fmt: str) -> str:
    """The recommended config as JSON, as environment lines, or as Python building it."""
    if fmt not in EXPORT_FORMATS:
        raise TunerError(f"--format: {fmt!r} is invalid: allowed {', '.join(EXPORT_FORMATS)}")
    if rec.get("config") is None:
        raise NoRecommendation(f"study {rec.get('study')!r}: {rec.get('reason')}")
    config = LoopConfig.from_dict(rec["config"])
    if fmt == "json":
        return json.dumps(config.to_dict(), indent=2)
    if fmt == "env":
        return "\n".join(f"{ENV_PREFIX}{k.upper()}={_env_value(v)}"
                         for k, v in config.to_dict().items())
    args = ",\n".join(f"    {k}={v!r}" for k, v in config.to_dict().items())
    return (f"# streamtune recommendation for study {rec['study']!r} on {rec.get('hardware')}\n"
            f"from trainers import LoopConfig\n\nconfig = LoopConfig(\n{args},\n)")


def config_from_env(environ: dict[str, str]) -> LoopConfig:
    """The inverse of the `env` export: build a LoopConfig from STREAMTUNE_* variables."""
    values: dict[str, Any] = {}
    for field, default in LoopConfig().to_dict().items():
        raw = environ.get(f"{ENV_PREFIX}{field.upper()}")
        if raw is None:
            continue
        if isinstance(default, bool):
            values[field] = raw.lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            values[field] = int(raw)
        else:
            values[field] = raw
    return LoopConfig(**values)


def _env_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def list_studies(storage_url: str) -> list[dict[str, Any]]:
    storage = studies.open_storage(storage_url)
    rows = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        meta = study.user_attrs.get(studies.META, {})
        rec = study.user_attrs.get(studies.RECOMMENDATION)
        counts = {state.name.lower(): 0 for state in TrialState}
        for trial in study.get_trials(deepcopy=False):
            counts[trial.state.name.lower()] += 1
        best = None
        if isinstance(rec, dict) and rec.get("throughput"):
            best = rec["throughput"]["median"]
        else:
            values = [t.values[0] for t in study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
            best = max(values) if values else None
        rows.append({
            "study": summary.study_name,
            "workload": meta.get("workload"),
            "preset": meta.get("preset"),
            "hardware": meta.get("hardware"),
            "trials": counts,
            "best_throughput": best,
            "recommended": None if not isinstance(rec, dict) else rec.get("config"),
        })
    return rows
