"""The tuning side of `benchmarks/peers.py`: the tuning job whose recommendation the peers are
measured against (`tune`), or what stands in for one (`recommendation_of` a default job's record,
`given_config`), and the job's trials as the record keeps them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

import trainers
from trainers import LoopConfig
from tuner.evidence.unrun import pruned_reason
from tuner.search.measuring.measure import Protocol
from tuner.search.options import RunOptions
from tuner.search.study import run_study
from tuner.store import keys


class PhaseLog:
    """The tuning job's phases and trials in the log, each with the seconds since the job began:
    where a long job spends its time."""

    def __init__(self, log: Callable[[str], None], started: float) -> None:
        self.log, self.started = log, started

    def _say(self, text: str) -> None:
        self.log(f"  [{time.perf_counter() - self.started:6.1f} s] {text}")

    def start(self, study: str, total: int, resumed: bool) -> None:
        self._say(f"study {study}: {total} trials{' (resumed)' if resumed else ''}")

    def phase(self, text: str) -> None:
        self._say(text)

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        shown = "-" if best is None else f"{best:.1f}/s"
        self._say(f"trial {done}/{total} {state} (best {shown})")


def _job_options(
    protocol: Protocol | None,
    final_rounds: int | None,
    precisions: Sequence[str] | None,
    parity_steps: int | None,
    precision_parity_steps: int | None,
    precision_tolerance: float | None,
) -> dict[str, Any]:
    """The `RunOptions` a caller gave beside the job's defaults (those left None stay the
    tuner's)."""
    # A large model's default protocol (110 steps a measurement) leaves a 10-minute run no room
    # to search: `--protocol` and `--final-rounds` shorten the job the way a user would.
    shorter: dict[str, Any] = {}
    if protocol is not None:
        shorter["protocol"] = protocol
    if final_rounds is not None:
        shorter["final_rounds"] = final_rounds
    if precisions:
        shorter["precisions"] = tuple(precisions)
    if parity_steps is not None:
        shorter["parity_steps"] = parity_steps
    if precision_parity_steps is not None:
        shorter["precision_parity_steps"] = precision_parity_steps
    if precision_tolerance is not None:
        shorter["precision_tolerance"] = precision_tolerance
    return shorter


def tune(
    workload: str,
    preset: str,
    *,
    precision: str | None,
    storage: str,
    device: str,
    trials: int,
    timeout_s: float | None,
    model_args: Mapping[str, str],
    log: Callable[[str], None] = lambda text: None,
    protocol: Protocol | None = None,
    final_rounds: int | None = None,
    precisions: Sequence[str] | None = None,
    parity_steps: int | None = None,
    precision_parity_steps: int | None = None,
    precision_tolerance: float | None = None,
    profile: str = "none",
) -> dict[str, Any]:
    """The tuning job. `profile`: its profiles (`RunOptions.profile`; a default job's is
    `baselines`, "none" leaves them out of the tuning time). `precisions`: those it may choose
    among (`--precisions`; None: `precision`
    alone); `parity_steps`: the gate's run length (None: the tuner's default);
    `precision_parity_steps`: that of a config in another precision (None: `parity_steps`);
    `precision_tolerance`: the multiple of the seed-to-seed envelope such a config may deviate
    by (None: the tuner's, 3)."""
    started = time.perf_counter()
    shorter = _job_options(
        protocol,
        final_rounds,
        precisions,
        parity_steps,
        precision_parity_steps,
        precision_tolerance,
    )
    study = f"peers-{workload}-{preset}-{precision}".replace(":", "-")
    rec = run_study(
        RunOptions(
            workload=workload,
            preset=preset,
            storage=storage,
            study=study,
            space="auto",
            trials=trials,
            timeout_s=timeout_s,
            device=device,
            precision=precision,  # type: ignore[arg-type]
            model_args=dict(model_args),
            profile=profile,
            # As `python -m tuner run` without --window-steps: the scale space's shorter windows.
            auto_window_steps=protocol is None,
            **shorter,
        ),
        progress=PhaseLog(log, started),
    ).to_dict()
    failed, ran = _logged_trials(storage, study, log)
    return _tuning_entry(rec, failed, ran, precisions, timeout_s, trials) | {
        "wall_s": time.perf_counter() - started
    }


def _logged_trials(
    storage: str, study: str, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The job's failed trials and every finished one, each logged as the record keeps it."""
    failed = failed_trials(storage, study)
    for item in failed:
        log(f"  trial {item['trial']} failed: {item['reason']}")
    ran = trial_results(storage, study)
    for item in ran:
        log(f"  trial {item['trial']}: {trial_line(item)}")
    return failed, ran


def _tuning_entry(
    rec: Mapping[str, Any],
    failed: list[dict[str, Any]],
    ran: list[dict[str, Any]],
    precisions: Sequence[str] | None,
    timeout_s: float | None,
    trials: int,
) -> dict[str, Any]:
    """The record's `tuning` entry of a job that ran here (its `wall_s` comes from the caller)."""
    return {
        "config": rec.get("config"),
        "precision": rec.get("precision"),
        "precisions": list(precisions) if precisions else None,
        "source": rec.get("source"),
        "reason": rec.get("reason"),
        "parity": rec.get("parity"),
        "setup_s": rec.get("setup_s"),
        "n_trials": rec.get("trial_counts"),
        "failed_trials": failed,
        "trial_results": ran,
        "wall_s": None,
        "gpu_s": rec.get("gpu_seconds"),
        "search_timeout_s": timeout_s,
        "trials": trials,
        # Where the job's time went, phase by phase, and how its search spent its trials
        # (predicted, skipped, screened out, gated; how often the predictions were right).
        "time": rec.get("time"),
        "search": rec.get("search"),
    }


def recommendation_of(
    path: Path,
    workload: str,
    preset: str,
    model_args: Mapping[str, str],
    precision: str | None,
) -> dict[str, Any]:
    """The tuning entry of a job run elsewhere: the first run of a `benchmarks/default_job.py`
    record that recommended a config for this workload, preset and model options (so the peers
    are measured against what the default job, timed there, recommended), in the precision the
    job chose. Refuses a record that has none, naming what it holds."""
    data = json.loads(path.read_text(encoding="utf-8"))
    wanted = (workload, preset, dict(model_args))
    seen = []
    for run in data.get("runs", []):
        rec = run.get("recommendation") or {}
        ran = (rec.get("workload"), rec.get("preset"), rec.get("model_args") or {})
        has = "a config" if rec.get("config") else "no config"
        seen.append(f"{run.get('run')}: {ran[0]}:{ran[1]} {ran[2]}, {has}")
        if ran != wanted or not rec.get("config"):
            continue
        chosen = rec.get("precision")
        return {
            "config": rec["config"],
            "precision": None if chosen == precision else chosen,
            "precisions": None,
            "source": f"{path.name}, run {run.get('run')!r} (commit {data['meta'].get('commit')})",
            "reason": rec.get("reason"),
            "n_trials": rec.get("trial_counts"),
            "failed_trials": [],
            "wall_s": run.get("wall_s"),
            "gpu_s": rec.get("gpu_seconds"),
            "search_timeout_s": None,
            "trials": None,
            # Where the job's time went and how its search spent its trials, as a job run here
            # reports them (`_tuning_entry`): a row may be measured in a later machine start.
            "time": run.get("time"),
            "search": rec.get("search"),
        }
    raise SystemExit(
        f"--recommendation {path}: no run recommended a config for {workload}:{preset} "
        f"{dict(model_args)} {precision}; its runs: {'; '.join(seen) or 'none'}"
    )


def given_config(
    text: str, precision: str | None = None, base: str | None = None
) -> dict[str, Any]:
    """The tuning entry of a config given as JSON (`--config`): measured against the peers
    without a tuning job, labelled as given, not as a recommendation. For a config a job found
    but could not finish deciding (a machine that went back during its final round), or one a
    job could not reach in the time a machine is lent (`precision`: the one it runs in, when not
    the preset's: `--config-precision`). `base` (`--config-base`): a search space whose fixed
    settings the JSON is laid over. Without it the JSON is the whole config and what it leaves
    out is the loop's default: on 2026-11-29 two rows that named only their levers ran on the
    default feed (batches made on the loop's thread, the loss read every step) and were 8-10 %
    slower than the job's own pick, so that comparison with the peers was void."""
    try:
        settings = json.loads(text)
        if not isinstance(settings, dict):
            raise TypeError(f"a JSON object of settings, not {type(settings).__name__}")
        fixed = {} if base is None else _space_fixed(base)
        config = LoopConfig.from_dict(fixed | settings).to_dict()
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--config: {exc}") from None
    try:
        trainers.parse_precision(precision, "config_precision")
    except trainers.ConfigError as exc:
        raise SystemExit(f"--config-precision: {exc}") from None
    return {
        "config": config,
        "precision": precision,
        "precisions": None,
        "source": "given by --config (not a finished job's recommendation)"
        + ("" if base is None else f", over the {base} space's fixed settings"),
        "reason": None,
        "n_trials": None,
        "failed_trials": [],
        "wall_s": None,
        "gpu_s": None,
        "search_timeout_s": None,
        "trials": None,
    }


def _space_fixed(name: str) -> dict[str, Any]:
    from tuner.errors import TunerError
    from tuner.search.spaces.named import load_space

    try:
        return dict(load_space(name).fixed)
    except (TunerError, ValueError, OSError) as exc:
        raise SystemExit(f"--config-base: {exc}") from None


def failed_trials(storage: str, study: str) -> list[dict[str, Any]]:
    """The tuning job's failed trials: number, config and the harness's reason (a config the
    gate or a capture refused is a result too, e.g. an eager whole-step graph of a model that
    syncs the host)."""
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(
        deepcopy=False, states=(TrialState.FAIL,)
    )
    return [
        {
            "trial": t.number,
            "config": t.user_attrs.get(keys.CONFIG),
            "reason": t.user_attrs.get(keys.FAILURE_REASON),
        }
        for t in trials
    ]


GATE_FIELDS = ("passed", "test", "steps", "exact_steps", "ratio", "multiple", "reason", "seconds")
"""What `trial_results` keeps of each trial's gate verdict (the losses stay in the study)."""


def trial_results(storage: str, study: str) -> list[dict[str, Any]]:
    """Every finished trial of the tuning job, in order: its state, precision (None: the
    study's), config, throughput, the gate's verdict in brief and, for a trial screened out or
    skipped on its prediction, why (`why`). What a job that may choose
    among precisions measured of each (a record then shows whether float8 paid, and how the
    gate judged it, even where the recommendation is in another precision)."""
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    )
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        verdict = t.user_attrs.get(keys.PARITY) or {}
        out.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "precision": t.user_attrs.get(keys.PRECISION),
                "config": t.user_attrs.get(keys.CONFIG),
                "samples_per_s": t.values[0] if t.values else None,
                "failure_reason": t.user_attrs.get(keys.FAILURE_REASON),
                "gate": {k: verdict[k] for k in GATE_FIELDS if k in verdict} or None,
                # A pruned trial's figure against the incumbent's, or its prediction's skip: what
                # says why a precision or lever lost.
                "why": pruned_reason(t.user_attrs),
            }
        )
    return out


def trial_line(item: Mapping[str, Any]) -> str:
    speed = item["samples_per_s"]
    gate = item["gate"] or {}
    text = f"{item['state']}, {item['precision'] or 'the study precision'}"
    if speed is not None:
        text += f", {speed:.1f} samples/s"
    if gate.get("ratio") is not None:
        verdict = "passed" if gate.get("passed") else "rejected"
        text += f", gate {verdict} at ratio {gate['ratio']:.2f}"
    if item.get("why"):  # records made before the key was added have none
        text += f": {item['why']}"
    return text
