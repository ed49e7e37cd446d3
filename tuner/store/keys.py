"""Every name under which streamtune stores something on an Optuna study or trial.

Study user attributes:
- `META` ("streamtune"): workload, preset, space, protocol, objectives, device, fingerprint;
- `BASELINE_PREFIX` + `<name>/<id>`: one baseline measurement each (one key per entry, so that
  concurrent writers never overwrite each other's);
- `PARITY_PREFIX` + `<config key>`: the correctness gate's verdict for a config (its cache);
- `PARITY_RUN_PREFIX` + `<config key>`: a config's own gate run, run by another worker of the job
  than the one checking it (`tuner.search.gating.parity`): its losses and seconds;
- `FINAL_PREFIX` + `<id>`: the seconds and entries of one final round;
- `PROFILE_PREFIX` + `<name>`: a baseline's or the recommended config's profile;
- `RECOMMENDATION`: the latest recommendation (`tuner.evidence.recommendation`);
- `ENVELOPE`: the correctness gate's noise envelope of the workload (`trainers.Envelope`);
- `TIME_PREFIX` + `<id>`: one session's wall time and phase times (`tuner.store.phases`).

Trial user attributes are the `TRIAL_*` names below; a job's study is `JOB_STUDY_PREFIX` + its id.
A study named `MEMO_PREFIX` + a digest holds no trials: the gate's verdicts and envelope shared
between studies of the same inputs (`tuner.search.gating.memo`), under the same keys, and profiles
of configs under `MEMO_PROFILE_PREFIX` + `<candidate key>/<profile settings>`.
"""

from __future__ import annotations

META = "streamtune"
BASELINE_PREFIX = "baseline/"
PARITY_PREFIX = "parity/"
PARITY_RUN_PREFIX = "parity-run/"
MEMO_PREFIX = "streamtune-gate-memo/"
FINAL_PREFIX = "final/"
PROFILE_PREFIX = "profile/"
MEMO_PROFILE_PREFIX = "profile-of/"
RECOMMENDATION = "recommendation"
FINALIZER = "finalizer"
"""The id of the worker that ran the final round (set where the study has owners: a service job,
`python -m tuner run --gpus N`), so that a reader can tell on which device every finalist ran."""
ENVELOPE = "envelope"
TIME_PREFIX = "time/"
"""One session per process that worked on the study: `{"started", "wall_s", "phases"}`
(`tuner.store.phases` adds them up)."""
"""The workload's numerical noise envelope (`trainers.Envelope.to_dict()`): measured once per
study (its workload, preset, precision and device are fixed), read by every parity check."""
PRECISION_ENVELOPE = "precision-envelope"
"""The reference trained from other seeds (`trainers.Envelope`, spread "seeds"): what a config in
another precision than the study's is judged against (`tuner.search.gating.parity`)."""
PROFILE_RECOMMENDED = "recommended"
"""The name of the recommended config's profile (`PROFILE_PREFIX` + this)."""

JOB_STUDY_PREFIX = "job-"
JOB_BEGUN = "job-begun"
"""The trials a job's study had begun when the job was opened for trials (this attempt): every
worker's patience counts the trials begun after these (`JobRun`), so a worker that joins the job
again does not start its count afresh."""

SEARCH_INPUTS = "search-inputs"
"""What a study's measurements depend on, hashed (`tuner.search.earlier.search_inputs`): a new
study copies the finished trials of an earlier study with the same value."""
TRIALS_COPIED = "trials-copied"
"""On a study that began with an earlier study's trials: `{"from": name, "trials": count}`."""
HELD_CORNERS = "held-corners"
"""The first stage's float8 corners of the whole model, held until the probes pick their float8
levers (`tuner.search.proposing.held`): their params; `{"corners", "by", "at"}` while a worker
releases them; empty once enqueued."""

# -- trial attributes ----------------------------------------------------------------------
CONFIG = "config"
CONFIG_KEY = "config_key"
"""The trial's config's key (`tuner.search.spaces.space.config_key`); in a study searching
precisions, of the config and its precision (`tuner.search.spaces.space.candidate_key`)."""
PRECISION = "precision"
"""The precision a trial of a study searching precisions ran in (absent: the study's). Also the
name of that trial's Optuna param."""
WINDOWS = "windows"
CI95 = "ci95"
SECONDS = "seconds"
PEAK_MEMORY = "peak_memory_bytes"
PARITY = "parity"
DUPLICATE_OF = "duplicate_of"
SAME_AS = "same_as"
"""A sampled trial not run in a screening study: the number of the trial copied from an earlier
study that measured its config (`tuner.search.proposing.screen.measured_before`)."""
POOLED_WINDOWS = "pooled_windows"
FAILURE_REASON = "failure_reason"
FAILURE_KIND = "failure_kind"
PROFILE = "profile"
PROFILE_ERROR = "profile_error"
TIME = "time"
"""A trial's phase times (`tuner.store.phases`): compile, measure, its gate parts, profile."""
OWNER = "worker"
"""A trial run by a worker of the tuning service: that worker's id."""
PROCESS = "process"
"""A trial run by `python -m tuner run`: its process, `host:pid:start` (`tuner.store.running`), so
that a resume can fail a trial whose process was killed."""
SCREEN = "screen"
"""A screening study's trial: what its screen showed against the incumbent
(`tuner.search.proposing.screen.screen_record`); a trial whose outcome is `lost` was pruned, never
gated."""
PRUNED_AT = "pruned_at"
"""A trial Optuna's pruner stopped: the window it stopped at and that window's throughput (the
pruner keeps the fastest quarter of earlier trials at each window)."""
PREDICTION = "prediction"
"""A screening study's trial: its predicted peak memory and throughput before it ran, and whether
the prediction skipped it (`tuner.search.proposing.predict.Prediction`)."""
PREDICTION_CHECK = "prediction_check"
"""Whether that prediction was right about fit and order, once the trial ran
(`tuner.search.proposing.predict.check`)."""
GATE_DEFERRED = "gate_deferred"
"""True on a complete trial of a screening study: its gate runs in the final round, if at all."""
STOPPED = "stopped"
"""True on a trial cut short by `should_stop` (a cancel, a shutdown); its windows are kept."""
COPIED_FROM = "copied_from"
"""A trial copied from an earlier study of the same inputs (`tuner.search.earlier`): `{"study":
name, "trial": number}`; its measurement was taken there, not by this job."""

INTERRUPTED_PREFIX = "interrupted"
"""`FAILURE_REASON` of a trial the service or Ctrl-C cut short: it is run again, never counted."""
