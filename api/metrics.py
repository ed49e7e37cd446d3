"""The Prometheus text exposition of the service (format 0.0.4), read from the job tables.

What it counts depends on who asks: an owner's token, that owner's jobs and trials only (another
owner's counts are its business, as its jobs are); an admin token, or the operator's scrape port
(`TUNER_METRICS_PORT`, no token), every job's. Workers alive are the node's, shown to all (as
`/healthz` shows them without a token).
"""

from __future__ import annotations

import math

from tuner.service.owners import Owner
from tuner.service.submissions import Submissions

DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value)) if value % 1 else str(int(value))


def render(store: Submissions, *, lease_s: float, by: Owner | None = None) -> str:
    """The metrics `by` may see: its own jobs' (a non-admin owner), or all (an admin, `None`)."""
    scope = "all jobs" if by is None or by.admin else f"the jobs of {by.name}"
    lines = [
        f"# streamtune metrics of {scope}",
        "# HELP streamtune_jobs Jobs by state.",
        "# TYPE streamtune_jobs gauge",
    ]
    lines += [
        f'streamtune_jobs{{state="{state}"}} {count}'
        for state, count in store.counts_by_status(by=by).items()
    ]
    lines += [
        "# HELP streamtune_workers_alive Workers that heartbeat within the lease.",
        "# TYPE streamtune_workers_alive gauge",
        f"streamtune_workers_alive {store.workers_alive(lease_s)}",
    ]
    stats = store.trial_stats(DURATION_BUCKETS, by=by)
    lines += [
        "# HELP streamtune_trials_total Finished trials of jobs, by state.",
        "# TYPE streamtune_trials_total counter",
    ]
    lines += [
        f'streamtune_trials_total{{state="{state}"}} {count}'
        for state, count in stats.by_state.items()
    ]
    name = "streamtune_trial_duration_seconds"
    lines += [
        f"# HELP {name} Wall time of the finished trials of jobs.",
        f"# TYPE {name} histogram",
    ]
    lines += [f'{name}_bucket{{le="{_number(bound)}"}} {count}' for bound, count in stats.buckets]
    lines += [f"{name}_sum {stats.seconds_sum!r}", f"{name}_count {stats.buckets[-1][1]}"]
    return "\n".join(lines) + "\n"
