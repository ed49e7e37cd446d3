"""A study from start to end: `run_study` (what `python -m tuner run` calls) and `open_search`
(what it and the service's workers open a `Search` with), with the defaults they apply on a GPU:
the search budget, the patience and the measurement protocol of each space, the first trials,
the compile cache folder and the artefacts loaded into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import optuna

import trainers
from tuner.errors import Interrupted, Stopped, TunerError
from tuner.evidence.recommendation import Recommendation
from tuner.search import earlier
from tuner.search.gating.memo import open_memo
from tuner.search.identity import model_identity, program_identity, study_for_model
from tuner.search.measuring import artifacts
from tuner.search.measuring.baselines import now
from tuner.search.measuring.measure import Measurer, Protocol, set_matmul_precision
from tuner.search.measuring.timing import Clock
from tuner.search.options import (
    LocalSlots,
    Progress,
    Quiet,
    Retry,
    RunOptions,
    directions,
    make_pruner,
    make_sampler,
    resume_command,
    unmeasured_here,
)
from tuner.search.proposing.defaults import (
    AUTO_PATIENCE,
    AUTO_SCALE_BUDGET_S,
    AUTO_SEARCH_BUDGET_S,
    SCALE_WINDOW_STEPS,
)
from tuner.search.proposing.held import hold
from tuner.search.proposing.stages import first_trials
from tuner.search.search import Search
from tuner.search.spaces.data import for_data
from tuner.search.spaces.named import (
    AUTO_GPU_SPACE,
    SCALE_SPACE,
    load_space,
    program_space,
    user_fixed,
    without_block_levers,
    without_inert_levers,
    without_model_refusals,
    without_precision_refusals,
)
from tuner.search.spaces.own import noted_pins
from tuner.search.spaces.pinned import check_left, check_pins, live_for_pins
from tuner.search.spaces.processes import for_processes
from tuner.search.spaces.resume import as_stored
from tuner.search.spaces.space import SearchSpace
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.running import fail_killed_runs, fail_this_process


def run_study(
    options: RunOptions,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    started: float | None = None,
) -> Recommendation:
    """Search, decide, store the recommendation on the study and return it. `should_stop`
    (optional) is polled between trials and after each window; see the module doc. `started`:
    when the job began (`open_search`)."""
    progress = progress or Quiet()
    search = open_search(options, progress=progress, should_stop=should_stop, started=started)
    apply_gpu_defaults(search, progress)
    try:
        search.measure_baselines("start")
        search.run_trials(LocalSlots(max(0, options.trials - search.copied)))
        if search.stopped:
            raise Stopped(
                f"stopped on request: {search.done} trials of this run are stored in "
                f"study {search.study.study_name!r}"
            )
        return search.decide()
    except trainers.WorkloadError:
        if search.made:  # refused before any trial: a fixed workload starts anew
            studies.drop_unmeasured(search.study)
        raise
    except KeyboardInterrupt as exc:
        name = search.study.study_name
        with contextlib.suppress(Exception):  # a database away: the interrupt is said anyway
            fail_this_process(search.study._storage, name)  # a trial it left RUNNING
        raise Interrupted(
            f"interrupted: {search.done} trials of this run are stored in study {name!r}; "
            f"to resume it: {resume_command(options, name, search.done)}"
        ) from exc
    finally:
        search.close()


# The search budget of each space the default space means on a GPU, given no --timeout.
DEFAULT_BUDGETS = {AUTO_GPU_SPACE: AUTO_SEARCH_BUDGET_S, SCALE_SPACE: AUTO_SCALE_BUDGET_S}


def search_budget(timeout_s: float | None, space_name: str, workers: int = 1) -> float | None:
    """Seconds after which no trial starts: `timeout_s` when given; else, for what the default space
    means on a GPU, its budget (`DEFAULT_BUDGETS`): compiled trials cost 3-85 s each on an H100 at
    125M (docs/benchmarks/peers-h100-*), 80-205 s at 1.1B. The default budget is one GPU's time: a
    job whose trials run on `workers` GPUs at once (`run --gpus N`) gets it over N, so it searches
    as much as the one-GPU job, sooner. Without that, the 4-GPU job on transformer:medium ran all 40
    trials, 3.6 times the one-GPU job's GPU time, and ended only 6 % sooner
    (docs/benchmarks/node-h100-2026-11-27-medium.md). A `timeout_s` given is the user's wall clock
    and is kept as it is."""
    if timeout_s is not None:
        return timeout_s
    budget = DEFAULT_BUDGETS.get(space_name)
    return None if budget is None else budget / max(1, workers)


def apply_gpu_defaults(
    search: Search,
    progress: Progress,
    *,
    workers: int = 1,
    job_timeout_s: float | None = None,
    job: bool = False,
    on_gpu: bool | None = None,
) -> float | None:
    """The search budget (`search_budget`) and the patience (`search_patience`) a job on the
    default space gets on a GPU when the request leaves them unset, each said in a line; returns
    the budget (None: none). `run_study` (one GPU) sets both on `search.options`. A worker of a
    service job (`job`) sets the patience alone, which counts the job's trials, every worker's:
    the job's slots keep its deadline for every member, the budget returned from the request's
    `job_timeout_s` or the default over `workers`, the GPUs that run its trials at once.
    `on_gpu` (None: the measurer's device says): off a GPU, neither is set, the request's returned.
    """
    # search.options, not the request's: open_search adapts them (profiles off for a program);
    # the budget undoing that failed a program's GPU job at its profiles.
    asked = job_timeout_s if job else search.options.timeout_s
    if not (search.measurer.device.type == "cuda" if on_gpu is None else on_gpu):
        return asked  # a CPU scale job had stopped at 5 of 40 trials on the GPU's patience
    budget = search_budget(asked, search.space.name, workers)
    if budget is not None and budget != asked:
        if not job:
            search.options = dataclasses.replace(search.options, timeout_s=budget)
        shared = "" if workers == 1 else f", one GPU's {budget * workers:.0f} s over {workers}"
        progress.phase(
            f"search budget {budget:.0f} s (the default on a GPU{shared}; --timeout sets another)"
        )
    patience = search_patience(search.options, search.space.name)
    if patience != search.options.patience:
        search.options = dataclasses.replace(search.options, patience=patience)
        progress.phase(
            f"patience {patience} trials (the default on a GPU; --patience sets another, "
            "0 turns it off)"
        )
    return budget


def search_patience(options: RunOptions, space_name: str) -> int | None:
    """`options.patience` when given; else AUTO_PATIENCE for a single-objective job on what the
    default space means on a GPU, whose trials cost a compile each; else None (off)."""
    if options.patience is not None or space_name not in DEFAULT_BUDGETS:
        return options.patience
    if options.multi_objective:
        return options.patience
    return AUTO_PATIENCE


def measurement_protocol(options: RunOptions, space_name: str) -> Protocol:
    """The protocol the job measures with: `options.protocol`, except on the scale space where
    the user left the window length to the job (`options.auto_window_steps`): windows of
    SCALE_WINDOW_STEPS steps there, since a step of a 0.3-8B model takes long enough that the
    default window costs tens of seconds per measurement for no gain in precision."""
    if not options.auto_window_steps or space_name != SCALE_SPACE:
        return options.protocol
    return dataclasses.replace(options.protocol, window_steps=SCALE_WINDOW_STEPS)


def _with_protocol(
    options: RunOptions, measurer: Measurer, space_name: str, progress: Progress
) -> RunOptions:
    """`options` with the protocol the job measures with (`measurement_protocol`), given to the
    measurer too, and said where it is not the one asked for."""
    protocol = measurement_protocol(options, space_name)
    if protocol == options.protocol:
        return options
    progress.phase(
        f"windows of {protocol.window_steps} steps (the default on the {space_name} space; "
        "--window-steps sets another)"
    )
    measurer.protocol = protocol
    return dataclasses.replace(options, protocol=protocol)


def open_search(
    options: RunOptions,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    owner: str | None = None,
    retry: Retry | None = None,
    storage: optuna.storages.BaseStorage | None = None,
    started: float | None = None,
) -> Search:
    """Open (or resume) the study of `options` and everything needed to measure its trials.
    `started`: a `time.monotonic()` reading from when the job began, its clock's start (None: now).

    `owner` (a worker's id) is written on every trial this process runs (`OWNER_ATTR`), so that
    a trial whose worker died can be told from one still being measured. `retry` wraps the
    calls that write results to the storage (a worker waits out a database that is away);
    `storage`, when given, is used instead of opening `options.storage` again.
    """
    clock = Clock(started)  # opening the study is part of the session's wall time
    progress = progress or Quiet()
    building = time.perf_counter()
    measurer = _measurer(options)
    _check_precisions_here(options, measurer)
    for said in unmeasured_here(options, measurer.device):
        progress.phase(said)
    space, options = _space_for(options, measurer, progress)
    # Said with its seconds: at 0.5B on an H200 25 s went by unsaid (2026-12-02, 2c9259f).
    progress.phase(_built(measurer, time.perf_counter() - building))
    url = studies.storage_url(options.storage)
    on = storage if storage is not None else studies.open_storage(url)
    owned = None if on is storage else on  # opened here: closed with the search
    before = artifacts.cache_setting()  # the job points Inductor's cache at its study's folder
    try:
        search = _search_on(
            on, options, measurer, space, progress, should_stop, owner, retry, clock
        )
    except BaseException:
        studies.close_storage(owned)  # a study refused or a database error: nothing holds it
        artifacts.restore_cache_setting(before)
        raise
    search.owned_storage, search.cache_setting_before = owned, before
    return search


def _search_on(
    storage: optuna.storages.BaseStorage,
    options: RunOptions,
    measurer: Measurer,
    space: SearchSpace,
    progress: Progress,
    should_stop: Callable[[], bool] | None,
    owner: str | None,
    retry: Retry | None,
    clock: Clock,
) -> Search:
    name, info = _study_info(options, measurer, space)
    # A study stored before a lever was offered resumes with the space it stored, unless this
    # model's study is another one (then a new study, which searches the lever).
    stored, added = as_stored(storage, name, info, space)
    info["space"] = stored.to_dict()
    moved = _for_model(storage, name, info, measurer, options, progress, owner)
    if added and moved == name:
        space = stored
        progress.phase(
            f"study {name} was stored before {', '.join(added)} was offered as now: resumed "
            "with the space it stored, each as its trials ran it (another --study searches them)"
        )
    info["space"], name = space.to_dict(), moved
    loaded = artifacts.load_said(info["compile_cache"], progress.phase)
    study, resumed = studies.open_study(
        storage,
        name,
        info=info,
        directions=directions(options),
        sampler=make_sampler(options.sampler, options.seed, options.trials, space),
        pruner=make_pruner(options),
        same_timing=owner is None,  # `python -m tuner run`'s, not a service job's workers
    )
    if resumed and owner is None:  # a run killed (SIGKILL, out of memory) left its trial RUNNING
        fail_killed_runs(storage, name, progress.phase)
    own = measurer.program is None  # a program is measured elsewhere: not this process's code
    memo = open_memo(storage, options, info["fingerprint"]) if own else None
    copied = None if resumed else _begin(storage, study, memo, info, space, options, measurer)
    progress.start(name, options.trials, resumed)
    if copied is not None:
        progress.phase(copied.line())
    search = Search(
        study,
        measurer,
        space,
        options,
        progress,
        should_stop,
        owner=owner,
        retry=retry,
        clock=clock,
        memo=memo,
    )
    search.compile_cache, search.artifacts_loaded = info["compile_cache"], loaded
    search.made = not resumed
    if copied is not None:  # they count toward its patience as its own (tuner.search.earlier)
        search.joined = search.joined - copied.numbers
        search.copied = len(copied.numbers)
    return search


def _begin(
    storage: optuna.storages.BaseStorage,
    study: optuna.Study,
    memo: optuna.Study | None,
    info: dict[str, Any],
    space: SearchSpace,
    options: RunOptions,
    measurer: Measurer,
) -> earlier.Copied | None:
    """A new study's first trials: an earlier study's of the same inputs where there is one
    (`tuner.search.earlier`, with the memo), then the lever corners not among them."""
    copied = None
    if memo is not None:
        inputs = earlier.search_inputs(memo.study_name, info)
        copied = earlier.copy_earlier(storage, study, inputs, limit=options.trials)
    # The lever corners (tuner/search/proposing/stages.py); a resumed study already holds them,
    # and skip_if_exists keeps a second creator from adding them twice, and leaves out those an
    # earlier study's copies ran. The float8 corner of the whole model waits for the probes
    # (tuner/search/proposing/held.py), unless an earlier study's copies ran it.
    precisions = options.allowed_precisions if options.multi_precision else ()
    first = first_trials(space, measurer.device.type, options.precision, precisions)
    probes = measurer.program is None and options.nproc_per_node == 1
    now, held = hold(first, space, precisions, probes=probes, ran=study.get_trials(deepcopy=False))
    for params in now:
        study.enqueue_trial(params, skip_if_exists=True)
    if held:
        study.set_user_attr(keys.HELD_CORNERS, held)
    return copied


def _for_model(
    storage: optuna.storages.BaseStorage,
    name: str,
    info: dict[str, Any],
    measurer: Measurer,
    options: RunOptions,
    progress: Progress,
    owner: str | None,
) -> str:
    """Record the model the study measures in `info`; the study's name, another one where the
    study `name` measured another model (`tuner.search.identity`)."""
    info["model"] = (
        model_identity(measurer.workload, options.workload, dict(options.model_args))
        if measurer.program is None
        else program_identity(measurer.program)
    )
    if owner is not None:
        # A service job's study is the job's own (its row names it): only the CLI and the
        # library move to a new study when the model changed.
        return name
    name, changed = study_for_model(storage, name, info)
    if changed is not None:
        progress.phase(changed)
    return name


def _measurer(options: RunOptions) -> Measurer:
    """The study's measurer, its workload built: a bad --workload or --preset must fail before
    a study is stored."""
    set_matmul_precision(options.matmul_precision)
    measurer = Measurer(
        options.workload,
        options.preset,
        device=options.device,
        protocol=options.protocol,
        model_args=options.model_args,
        precision=options.precision,
        nproc=options.nproc_per_node,
    )
    measurer.check()
    return measurer


def _built(measurer: Measurer, seconds: float) -> str:
    """The line that says the workload was built, its space chosen, in `seconds`."""
    parameters = measurer.parameters()
    size = "" if parameters is None else f", {parameters:,} trainable parameters"
    what = "the program's preset checked" if measurer.program is not None else "workload built"
    return f"{what} and its search space chosen in {seconds:.1f} s{size}"


def _space_for(
    options: RunOptions, measurer: Measurer, progress: Progress
) -> tuple[SearchSpace, RunOptions]:
    """The space this model, device and launch search (`options.space` with what the model
    cannot take pinned off), and the options with the protocol that space measures with."""
    space = load_space(
        options.space,
        fix=options.fix,
        cuda=measurer.device.type == "cuda",
        parameters=measurer.parameters(),
        train_steps=options.train_steps,
    )
    asked, said = sorted(space.params), len(space.notes)
    space = noted_pins(space, options.space, options.fix)  # said below, kept in the notes
    if not measurer.has_blocks():
        space = without_block_levers(space)
    # A study without a precision runs in float32: fp32's rules. Before the model's refusals: a
    # lever no precision of the study runs leaves unnoted, where the model's refusal would note
    # it (a bf16 study's stored space then names float8_linears).
    precisions = options.allowed_precisions or ("fp32",)
    space = without_precision_refusals(space, precisions)
    # A program's model is built elsewhere, and checked there.
    model = None if measurer.program is not None else measurer.workload.model
    if model is not None:
        space = for_data(without_model_refusals(space, model), measurer.workload.dataset)
    space = without_inert_levers(space)
    options = _with_protocol(options, measurer, space.name, progress)
    # N processes per trial: the data-parallel levers join the space (one: they stay off).
    space = for_processes(
        space, options.nproc_per_node, has_blocks=measurer.has_blocks(), precision=options.precision
    )
    space, options = _for_program(space, options, measurer, progress)
    # A pin no draw could run fails here, not as each trial's refusal; draws it is inert in: cut.
    check_pins(space, precisions, model)
    live = live_for_pins(space)
    if not options.multi_precision:  # else precision is searched: the trials differ
        live = check_left(asked, live, said)
    for note in live.notes[said:]:
        progress.phase(note)
    return live, options


def _check_precisions_here(options: RunOptions, measurer: Measurer) -> None:
    """A precision this device (float8 off an sm89+ GPU, or without torchao) or the model (fp16
    with float16 parameters) cannot run fails here, in one line naming the flag, not as every
    trial's failure (tf32: `tf32_unused`)."""
    flag = "--precisions" if options.precisions is not None else "--precision"
    model = None if measurer.program is not None else measurer.workload.model
    for precision in options.allowed_precisions or (None,):
        try:
            trainers.check_precision_here(precision, measurer.device, model)
        except (trainers.UnsupportedOnDevice, trainers.ConfigError) as exc:
            raise TunerError(f"{flag}: {exc}") from None


def _for_program(
    space: SearchSpace, options: RunOptions, measurer: Measurer, progress: Progress
) -> tuple[SearchSpace, RunOptions]:
    """A program searches only the settings it implements; it is profiled by nobody (its
    kernels run in another process)."""
    if measurer.program is None:
        return space, options
    space = program_space(space, measurer.program, user_fixed(options.space, options.fix))
    if options.profile != "none":
        progress.phase(f"profiles off: program {measurer.program.name!r} runs elsewhere")
        options = dataclasses.replace(options, profile="none")
    return space, options


def _study_info(
    options: RunOptions, measurer: Measurer, space: SearchSpace
) -> tuple[str, dict[str, Any]]:
    """The study's name and its metadata (`keys.META`)."""
    fingerprint = trainers.fingerprint(measurer.device)
    hardware = trainers.fingerprint_key(fingerprint)
    if options.nproc_per_node > 1:
        # N processes on N devices never share a study with one process on one.
        hardware = f"{hardware}-x{options.nproc_per_node}"
    compile_cache = artifacts.share_compile_cache(options)
    # Two shapes, or precisions searched or fixed, never share a study's name.
    shape = trainers.workload_key(options.workload, options.preset, options.model_args)
    label = (
        "precisions-" + "-".join(options.allowed_precisions)
        if options.multi_precision
        else options.study_precision
    )
    name = options.study or studies.default_study_name(shape, hardware, space.name, precision=label)
    info = {
        "workload": options.workload,
        "preset": options.preset,
        "seed": options.seed,
        "parity_steps": options.parity_steps,
        "precision_parity_steps": options.precision_parity_steps,
        "model_args": dict(options.model_args),
        "shape": shape,
        "precision": options.study_precision,
        "precisions": list(options.allowed_precisions) if options.multi_precision else None,
        "space": space.to_dict(),
        "objectives": list(options.objectives),
        "max_memory_bytes": options.max_memory_bytes,
        "protocol": options.protocol.to_dict(),
        "device": str(measurer.device),
        "hardware": hardware,
        "fingerprint": fingerprint,
        "matmul_precision": options.matmul_precision,
        "compile_cache": compile_cache,
        "nproc_per_node": options.nproc_per_node,
        "created": now(),
    }
    return name, info
