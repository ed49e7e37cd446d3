"""`python -m tuner run --gpus N`: one job's trials on N GPUs of this node, through the service.

No scheduler of its own: the run becomes a job in the storage's job table (`JobSpec`, with `gpus`
N), and N `python -m tuner worker --job ID` processes (`WorkerPool`), each pinned to one GPU
through `CUDA_VISIBLE_DEVICES` and holding that GPU's lease, share its study the way the service's
workers share one job (`tuner.service.slots`): the first measures the baselines, every one takes
trial slots under the job's slot lock, and the one that finds every slot finished runs the whole
final round on its own GPU, so no comparison of finalists crosses GPUs. This process only
watches: a line per finished trial naming its GPU, then the recommendation with the wall time and
the GPU-seconds the workers held.

CPU stand-ins: where the device is the CPU (`--device cpu`, or `auto` with no GPU),
`TUNER_CPU_STANDINS=K` lets K CPU worker processes stand in for GPUs (the tests' way to run this
code on a machine without one). Unset, a CPU has no GPU to give and `--gpus` above 1 is refused
there; on a GPU device the count is torch's alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial

import trainers
from trainers.workloads import lookup
from tuner.errors import Interrupted, TunerError
from tuner.evidence.progress import short_config
from tuner.evidence.recommendation import Recommendation
from tuner.search.options import RunOptions
from tuner.service.jobstore import FINISHED, JobStore
from tuner.service.pool import WorkerPool
from tuner.service.spec import GPUS_ALLOWED, JobSpec, WorkloadRegistry, check_spec
from tuner.service.tables import JobRow
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.retry import is_transient

STANDINS_VARIABLE = "TUNER_CPU_STANDINS"
WATCH_S = 0.5
"""How often the watching process reads the job row and the study."""
EXIT_GRACE_S = 30.0
"""How long the workers get to exit on their own once the job has ended."""
DATABASE_WAIT_S = 120.0
"""How long the watch of a `--gpus` run waits for its database to answer again."""
OWNER = "cli"


@dataclasses.dataclass(frozen=True)
class NodeDevices:
    """What `--gpus` may use here: `count` GPUs, or CPU stand-ins for them (module doc)."""

    count: int
    standins: bool

    def label(self, slot: int) -> str:
        return f"cpu stand-in {slot}" if self.standins else f"GPU {slot}"


def node_devices(device: str) -> NodeDevices:
    """The devices of this node for `--device device`: torch's visible GPUs, or on the CPU the
    stand-ins `TUNER_CPU_STANDINS` allows (0 when unset)."""
    if trainers.resolve_device(device).type != "cpu":
        return NodeDevices(torch.cuda.device_count(), standins=False)
    text = os.environ.get(STANDINS_VARIABLE, "0").strip() or "0"
    if not text.isdigit():
        raise TunerError(f"{STANDINS_VARIABLE}={text!r} is invalid: allowed a whole number from 0")
    return NodeDevices(int(text), standins=True)


def resolve_gpus(asked: str, device: str) -> tuple[int, NodeDevices | None]:
    """`--gpus` as a number of workers, and the devices it runs on (None for 1: the run in this
    one process, exactly as without the flag). One line naming the flag when the node has fewer
    than asked."""
    text = asked.strip().lower()
    if text != "all" and not (text.isdigit() and int(text) >= 1):
        raise TunerError(f"--gpus: {asked!r} is invalid: {GPUS_ALLOWED}")
    if text == "1":
        return 1, None
    if device.startswith("cuda:"):
        raise TunerError(
            f"--device: {device} names one GPU; with --gpus {asked} give auto or cuda "
            "(the workers take GPUs 0 to N-1 of those visible; CUDA_VISIBLE_DEVICES picks them)"
        )
    have = node_devices(device)
    wanted = have.count if text == "all" else int(text)
    if wanted > have.count or wanted == 0:
        raise TunerError(f"--gpus: {asked} asked, but {_what_exists(have)}")
    return wanted, (None if wanted == 1 else have)


def _what_exists(have: NodeDevices) -> str:
    if not have.standins:
        return f"this machine has {have.count} visible GPUs"
    return (
        f"the device is the CPU, with {have.count} stand-ins for GPUs ({STANDINS_VARIABLE}="
        f"{have.count}; it lets that many CPU worker processes stand in for GPUs)"
    )


# The `run` options that a job's workers take from their settings (`WorkerSettings`, read from
# `TUNER_*` variables): how the CLI passes its flags to the workers it starts.
def _worker_env(options: RunOptions, url: str) -> dict[str, str]:
    protocol = options.protocol
    values: dict[str, Any] = {
        "storage": url,
        "measure_warmup": protocol.warmup,
        "measure_windows": protocol.windows,
        "measure_window_steps": None if options.auto_window_steps else protocol.window_steps,
        "final_rounds": options.final_rounds,
        "top_k": options.top_k,
        "parity_steps": options.parity_steps,
        "precision_parity_steps": options.precision_parity_steps,
        "precision_tolerance": options.precision_tolerance,
        "baseline_every": options.baseline_every,
        "profile": options.profile,
        "sampler": options.sampler,
        "matmul_precision": options.matmul_precision,
    }
    env = {f"TUNER_{k.upper()}": str(v) for k, v in values.items() if v is not None}
    if _is_factory(options.workload):
        # A `package.module:factory` workload is a plug-in of these workers' registry, by its
        # own path as its name (the service never takes a path from a request; the CLI may).
        plugins = json.loads(os.environ.get("TUNER_WORKLOADS") or "{}")
        env["TUNER_WORKLOADS"] = json.dumps(plugins | {options.workload: options.workload})
    return env


def _is_factory(workload: str) -> bool:
    return (
        ":" in workload
        and workload not in trainers.BUILTIN
        and not workload.startswith("program:")
        and lookup(workload) is None
    )


# `run` flags whose value the workers cannot take (the service's jobs have no such setting):
# refused when given with --gpus above 1, never dropped without a word.
_NOT_CARRIED: dict[str, tuple[str, Any]] = {
    "tie_margin": ("--tie-margin", 0.01),
    "seed": ("--seed", 0),
    "train_steps": ("--train-steps", None),
    "profile_steps": ("--profile-steps", 10),
    "artifacts": ("--artifacts", None),
    "study": ("--study", None),
    "nproc_per_node": ("--nproc-per-node", 1),
}


def job_spec(spec: JobSpec, options: RunOptions, devices: NodeDevices) -> JobSpec:
    """The job the run becomes: the CLI's request (`spec`, with its `gpus`) on this node's
    devices, with the search budget the run settled on; one line naming a flag the workers
    cannot honour."""
    for field, (flag, default) in _NOT_CARRIED.items():
        if getattr(options, field) != default:
            raise TunerError(
                f"{flag}: not with --gpus {spec.gpus}: the workers of a several-GPU run share "
                f"the service's job settings, which have no {flag} (leave it at its default, or "
                "run on one GPU)"
            )
    return dataclasses.replace(
        spec, device="cpu" if devices.standins else "cuda", timeout_s=options.timeout_s
    )


@dataclasses.dataclass(frozen=True)
class NodeSummary:
    """What the run cost: its wall time, the GPU-seconds its workers held (each worker's life,
    summed), and how its trials and its final round spread over the devices."""

    gpus: int
    standins: bool
    wall_s: float
    gpu_seconds: float
    trial_seconds: float
    trials_by_device: dict[str, int]
    final_round_on: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        kind = "CPU stand-ins for GPUs" if self.standins else "GPUs"
        spread = ", ".join(f"{n} on {d}" for d, n in sorted(self.trials_by_device.items()))
        return (
            f"{self.gpus} {kind}: wall time {self.wall_s:.1f} s, {self.gpu_seconds:.1f} "
            f"GPU-seconds used ({self.trial_seconds:.1f} in trials); trials {spread or 'none'}; "
            f"final round on {self.final_round_on or 'none'}"
        )


class NodeRun:
    """The job of one `run --gpus N` and its N workers, watched from this process."""

    def __init__(
        self, spec: JobSpec, options: RunOptions, devices: NodeDevices, url: str, show: Any
    ) -> None:
        self.url = url
        self.show = show
        self.devices = devices
        self.spec = job_spec(spec, options, devices)
        self.env = _worker_env(options, url)
        registry = WorkloadRegistry(
            json.loads(self.env.get("TUNER_WORKLOADS", "{}")), os.environ.get("TUNER_PROGRAMS")
        )
        check_spec(self.spec, registry)  # the request's errors here, before a worker starts
        self.store = JobStore(url)
        try:
            self.storage = studies.open_storage(url)  # one engine for the watching, not one a read
        except BaseException:
            self.store.close()
            raise
        self.labels: dict[int, str] = {}  # worker pid -> its device's label
        self.ended: dict[int, float] = {}  # worker slot -> when its process was seen gone
        self.shown: set[int] = set()  # trial numbers already printed

    def run(self) -> tuple[Recommendation, NodeSummary]:
        started = time.monotonic()
        job = self.store.create(self.spec, owner=OWNER, dedicated=True)
        logs = Path(tempfile.mkdtemp(prefix=f"tuner-{job.id[:8]}-workers-"))
        count = int(self.spec.gpus)
        slots: list[int | None] = [None] * count if self.devices.standins else list(range(count))
        pool = WorkerPool(slots, self.url, job=job.id, logs=logs, env=self.env)
        self.show.line(
            f"job {job.id}: {count} workers, one per "
            f"{'CPU stand-in' if self.devices.standins else 'GPU'}, on study {job.study} "
            f"(worker logs in {logs})"
        )
        pool.start()
        for slot, proc in enumerate(pool.procs):
            if proc is not None:
                self.labels[proc.pid] = self.devices.label(slot)
        try:
            row = self._watch(job, pool, logs)
            self._wait_exit(pool, time.monotonic() + EXIT_GRACE_S)
        except KeyboardInterrupt:
            self.store.cancel(job.id)
            raise Interrupted("interrupted: the job is cancelled, its workers stopped") from None
        except BaseException:
            # The run failed (every worker gone, the database away): its job must not stay
            # queued for a later worker of this storage to run what the user was told had
            # failed (an operator's probe, 2026-12-05). Best effort: the database may be away.
            with contextlib.suppress(Exception):
                self.store.cancel(job.id)
            raise
        finally:
            pool.stop()
        summary = self._summary(row, pool, time.monotonic() - started)
        return self._result(row, logs), summary

    def _watch(self, job: JobRow, pool: WorkerPool, logs: Path) -> JobRow:
        stage: str | None = None
        away: float | None = None  # since when the database has not answered
        while True:
            try:
                row = self.store.get(job.id)
            except Exception as exc:
                # The workers wait out a database restart (their backoff); so does the watch,
                # which had printed SQLAlchemy's traceback and left the job to its workers.
                if not is_transient(exc):
                    raise
                away = time.monotonic() if away is None else away
                if time.monotonic() - away > DATABASE_WAIT_S:
                    raise TunerError(
                        f"--storage: the database did not answer for {DATABASE_WAIT_S:.0f} s: "
                        f"{' '.join(str(exc).split())[:200]}"
                    ) from exc
                time.sleep(WATCH_S)
                continue
            away = None
            self._show_trials(row)
            if row.stage != stage and row.stage is not None:
                stage = row.stage
                where = self._label_of(row.finalizer) if row.finalizer else None
                self.show.phase(f"job stage {stage}" + (f" on {where}" if where else ""))
            if row.status in FINISHED:
                return row
            self._note_exits(pool)
            if len(self.ended) == len(pool.procs):
                raise TunerError(
                    f"--gpus: every worker exited before the job ended; their logs: {logs}"
                    f"{_tail(logs)}"
                )
            time.sleep(WATCH_S)

    def _show_trials(self, row: JobRow) -> None:
        for trial in _trials(self.storage, row.study):
            if trial.number in self.shown or not trial.state.is_finished():
                continue
            self.shown.add(trial.number)
            self.show.line(self._trial_line(trial))

    def _trial_line(self, trial: FrozenTrial) -> str:
        where = self._label_of(trial.user_attrs.get(keys.OWNER))
        state = trial.state.name.lower()
        head = f"trial {trial.number} on {where} {state}"
        if trial.values:
            head += f": {trial.values[0]:,.1f} samples/s"
        elif trial.user_attrs.get(keys.FAILURE_REASON):
            head += f": {' '.join(str(trial.user_attrs[keys.FAILURE_REASON]).split())}"
        took = _seconds(trial)
        return f"{head} [{short_config(trial.user_attrs.get(keys.CONFIG))}] in {took:.1f} s"

    def _label_of(self, worker: object) -> str:
        """The device of a worker by its id (`<host>-<pid>-<random>`, `Worker.id`)."""
        try:
            return self.labels.get(int(str(worker).rsplit("-", 2)[1]), "another worker")
        except (IndexError, ValueError):
            return "no worker"

    def _note_exits(self, pool: WorkerPool) -> None:
        for slot, proc in enumerate(pool.procs):
            if proc is not None and proc.poll() is not None and slot not in self.ended:
                self.ended[slot] = time.monotonic()

    def _wait_exit(self, pool: WorkerPool, deadline: float) -> None:
        """The workers see the job has ended and exit on their own within their poll."""
        while len(self.ended) < len(pool.procs) and time.monotonic() < deadline:
            self._note_exits(pool)
            time.sleep(0.1)

    def _summary(self, row: JobRow, pool: WorkerPool, wall_s: float) -> NodeSummary:
        self._note_exits(pool)
        now = time.monotonic()
        held = sum(self.ended.get(i, now) - pool.spawned_at[i] for i in range(len(pool.procs)))
        found = _trials(self.storage, row.study)
        by_device: dict[str, int] = {}
        for trial in found:
            if trial.state.is_finished():
                where = self._label_of(trial.user_attrs.get(keys.OWNER))
                by_device[where] = by_device.get(where, 0) + 1
        attrs = _study_attrs(self.storage, row.study)
        finalizer = attrs.get(keys.FINALIZER)
        return NodeSummary(
            gpus=len(pool.procs),
            standins=self.devices.standins,
            wall_s=wall_s,
            gpu_seconds=held,
            trial_seconds=sum(_seconds(t) for t in found),
            trials_by_device=by_device,
            final_round_on=None if finalizer is None else self._label_of(finalizer),
        )

    def _result(self, row: JobRow, logs: Path) -> Recommendation:
        if row.status == "succeeded" and row.recommendation is not None:
            return Recommendation.from_dict(row.recommendation)
        if row.status == "cancelled":
            raise Interrupted(f"the job {row.id} was cancelled")
        raise TunerError(f"the job failed: {row.error or row.status} (worker logs in {logs})")


def _trials(storage: optuna.storages.BaseStorage, study: str) -> list[FrozenTrial]:
    try:
        return storage.get_all_trials(storage.get_study_id_from_name(study), deepcopy=False)
    except KeyError:
        return []  # no study until the first worker has opened it


def _study_attrs(storage: optuna.storages.BaseStorage, study: str) -> dict[str, Any]:
    try:
        return dict(storage.get_study_user_attrs(storage.get_study_id_from_name(study)))
    except KeyError:
        return {}


def _seconds(trial: FrozenTrial) -> float:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return 0.0
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def _tail(logs: Path) -> str:
    """The last lines of the first worker log that has any: why they stopped, in one line."""
    for path in sorted(logs.glob("worker-*.log")):
        lines = path.read_text(errors="replace").strip().splitlines()
        if lines:
            return f"; {path.name}: {lines[-1][:300]}"
    return ""


def run_on_node(
    spec: JobSpec, options: RunOptions, devices: NodeDevices, url: str, show: Any
) -> tuple[Recommendation, NodeSummary]:
    """The run of `python -m tuner run --gpus N` for N above 1 (module doc): `spec` is the run's
    request with `gpus` N, `options` how the CLI measures it (the workers take those settings
    through their environment, `_worker_env`)."""
    node = NodeRun(spec, options, devices, url, show)
    try:
        return node.run()
    finally:
        node.store.close()  # the connections back now: `tuner run` may be called in a loop
        studies.close_storage(node.storage)
