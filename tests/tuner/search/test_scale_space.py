"""The scale space: which models `auto` gives it to, and its first stage of corners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

import trainers
from tests.tuner.tiny import load, options, run_json, sqlite_url
from trainers import LoopConfig
from tuner.errors import SpaceError
from tuner.search.deciding import aim as aim_module
from tuner.search.deciding import profiling
from tuner.search.measuring.timing import Clock
from tuner.search.options import LocalSlots, NoRetry, make_sampler
from tuner.search.proposing.stages import SCALE_CORNERS, first_stage
from tuner.search.spaces.named import SCALE_PARAMS, load_space, scale_space
from tuner.search.spaces.space import candidate_key
from tuner.search.study import open_search
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.phases import COMPILE, GATE_ENVELOPE, MEASURE


@pytest.mark.parametrize(
    ("cuda", "parameters", "name"),
    [
        (True, SCALE_PARAMS, "scale"),
        (True, 1_100_000_000, "scale"),
        (True, SCALE_PARAMS - 1, "auto"),
        (True, None, "auto"),  # a program: its model is elsewhere
        (False, 1_100_000_000, "full"),  # a CPU: no compile levers at all
    ],
)
def test_auto_picks_the_scale_space_for_large_models_on_a_gpu(
    cuda: bool, parameters: int | None, name: str
) -> None:
    assert load_space("auto", cuda=cuda, parameters=parameters).name == name


def test_the_scale_space_by_name_and_its_pins() -> None:
    space = load_space("scale", fix=["micro_batches=2"])
    assert space.fixed["micro_batches"] == 2 and "micro_batches" not in space.params
    searched = {"compile_scope", "activation_checkpointing", "checkpoint_share", "loss"}
    searched |= {"float8_head", "float8_linears", "cuda_graph"}
    assert set(space.params) == searched
    with pytest.raises(SpaceError, match="scale"):
        load_space("scales")


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_the_first_stage_enqueues_every_scale_corner_once_and_valid(device_type: str) -> None:
    space = scale_space()
    corners = first_stage(space, device_type=device_type, precision="bf16-autocast")
    assert len(corners) == len(SCALE_CORNERS)
    # Each block first (the cheaper compile), then the whole model (stages.py says why).
    assert [c["compile_scope"] for c in corners[:2]] == ["blocks", "model"]
    assert corners[0]["activation_checkpointing"] == "none" and corners[0]["micro_batches"] == 1
    seen = set()
    for params in corners:
        values = space.fixed | params
        assert set(params) == set(space.params)
        assert trainers.invalid_reason(values, device_type=device_type) is None
        # Batches are made in DataLoader workers, never on the loop's own thread (spaces.py).
        assert trainers.LoopConfig.from_dict(values).num_workers >= 1
        seen.add(tuple(sorted(values.items())))
    assert len(seen) == len(corners)


def test_a_pinned_lever_collapses_corners_that_become_the_same() -> None:
    space = load_space("scale", fix=["compile_scope=model", "micro_batches=1"])
    corners = first_stage(space, device_type="cuda")
    # Left: none, selective, blocks at 0.5: the rest became the first corner.
    assert [c["activation_checkpointing"] for c in corners] == ["none", "selective", "blocks"]


def test_a_sampled_share_without_checkpointing_becomes_the_canonical_config() -> None:
    import optuna

    space = scale_space()
    # The study's own sampler: it never draws the whole-step graph, which only the second stage
    # tries (`tuner.search.spaces.staged`), so no draw is a refused combination with it.
    study = optuna.create_study(sampler=make_sampler("random", 0, 40, space))
    configs = []
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        study.tell(trial, 1.0)
        configs.append((trial.params, config))
    inert = [c for p, c in configs if p["activation_checkpointing"] == "none"]
    assert inert and all(c.checkpoint_share == 1.0 for c in inert)
    shared = [c for p, c in configs if p["activation_checkpointing"] != "none"]
    assert {c.checkpoint_share for c in shared} == {0.25, 0.5, 1.0}
    for params, config in configs:
        assert space.config_from_params(params) == config
    assert not any(config.cuda_graph for _, config in configs)


def test_canonical_leaves_meaningful_settings_alone() -> None:
    assert trainers.canonical({"activation_checkpointing": "blocks", "checkpoint_share": 0.5}) == {
        "activation_checkpointing": "blocks",
        "checkpoint_share": 0.5,
    }
    assert trainers.canonical({"checkpoint_share": 0.25}) == {"checkpoint_share": 1.0}


def test_a_float_setting_is_read_as_a_number_from_pins_and_the_environment() -> None:
    from tuner.search.spaces.pins import parse_fix

    assert parse_fix(["checkpoint_share=0.5"]) == {"checkpoint_share": 0.5}
    with pytest.raises(SpaceError, match="checkpoint_share"):
        parse_fix(["checkpoint_share=half"])
    config = trainers.LoopConfig(activation_checkpointing="blocks", checkpoint_share=0.25)
    env = {f"STREAMTUNE_{k.upper()}": str(v) for k, v in config.to_dict().items()}
    assert trainers.config_from_env(env) == config


def _baseline_phases(storage: str, study: str) -> list[str]:
    entries = studies.entries(load(storage, study), keys.BASELINE_PREFIX)
    return sorted(str(e.get("phase")) for e in entries.values())


def test_a_scale_job_measures_its_baselines_in_the_final_round_only(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    # num_workers pinned: the scale space feeds from worker processes, slow to start on a CPU.
    fix = ("num_workers=0", "compile=none", "compile_scope=model")
    # A drift measurement every trial: it has no start measurement to drift from, so none.
    rec = run_json(options(storage, "scale", trials=2, space="scale", fix=fix, baseline_every=1))
    assert _baseline_phases(storage, "scale") == []
    # Still measured, interleaved with the finalists: the speedups over both come from there.
    assert {"pytorch-default", "seed-baseline"} <= set(rec["speedup"])
    run_json(options(storage, "full", trials=2, baseline_every=1))
    assert _baseline_phases(storage, "full") == ["drift", "drift", "start", "start"]


def test_late_profiles_on_the_scale_space_are_left_out_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = sqlite_url(tmp_path)
    fix = ("num_workers=0", "compile=none", "compile_scope=model")
    # A job always past the cut: not one profile starts, and each says why.
    monkeypatch.setattr(aim_module, "SCALE_JOB_AIM_S", 0.0)
    late = run_json(
        options(
            storage, "late", trials=2, space="scale", fix=fix, profile="baselines", final_rounds=3
        )
    )
    assert set(late["profile_errors"]) == {"recommended", "pytorch-default", "seed-baseline"}
    # The final round keeps the same aim: one round of the three asked (the first may also
    # have decided as the search did), and a recommendation that passed its gate.
    final = studies.entries(load(storage, "late"), keys.FINAL_PREFIX)
    (record,) = final.values()
    assert 1 in (record["settled_after"], record["cut_after"]) and late["parity"]["passed"]
    assert all("not profiled: the job had run" in e for e in late["profile_errors"].values())
    assert not late["verdicts"]
    # --profile all takes every one whatever the time; so does a job inside the cut.
    every = run_json(options(storage, "all", trials=2, space="scale", fix=fix, profile="all"))
    assert not every.get("profile_errors")
    assert {"recommended", "pytorch-default", "seed-baseline"} <= set(every["verdicts"])
    monkeypatch.setattr(aim_module, "SCALE_JOB_AIM_S", 1e9)
    early = run_json(
        options(storage, "early", trials=2, space="scale", fix=fix, profile="baselines")
    )
    assert not early.get("profile_errors") and len(early["verdicts"]) == 3


def test_a_profile_starts_only_where_its_expected_cost_ends_the_job_inside_the_aim() -> None:
    now = [720.0]
    cut = profiling.time_cut(lambda: now[0], 900.0, child_s=40.0, eager_s=20.0, compiled_s=150.0)
    eager, compiled = LoopConfig(), LoopConfig(compile="default")
    # The first profile also starts the child: 720 + 40 + 20 fits, 720 + 40 + 150 does not.
    assert cut(eager, None, False) is None
    refused = cut(compiled, None, False)
    assert refused is not None and "720 s" in refused and "190 s" in refused
    # With the child running, the compiled one fits until 750 s of the job.
    assert cut(compiled, None, True) is None
    now[0] = 750.5
    assert cut(compiled, None, True) is not None and cut(eager, None, True) is None
    # The config the profiles' child already ran beside the gate compiles nothing more there,
    # in the precision it ran in; in another one it compiles again.
    warm = profiling.time_cut(
        lambda: now[0],
        900.0,
        child_s=40.0,
        eager_s=20.0,
        compiled_s=150.0,
        warmed=(compiled, "float8"),
    )
    assert warm(compiled, "float8", True) is None
    assert warm(compiled, "bf16-autocast", True) is not None
    assert warm(LoopConfig(compile="default", optimizer="fused"), "float8", True) is not None
    # A margin keeps the expected end clear of the aim: the job's own end is not in its clock.
    kept = profiling.time_cut(
        lambda: now[0], 900.0, child_s=40.0, eager_s=20.0, compiled_s=150.0, margin_s=10.0
    )
    now[0] = 875.0
    assert cut(eager, None, True) is None
    refused = kept(eager, None, True)
    assert refused is not None and "875 s" in refused
    now[0] = 870.0
    assert kept(eager, None, True) is None


def test_a_compiled_profile_is_expected_to_take_its_trials_compile_again(tmp_path: Path) -> None:
    """The profiles' child compiles the config again: where its trials compiled longer than the
    floor (`compiled_s`), that compile and an eager profile's seconds are what it expects; the
    trials are read from the study by config and precision."""
    study = optuna.create_study(storage=sqlite_url(tmp_path), study_name="compiles")
    compiled = LoopConfig(compile="default")
    fused = compiled.replace(optimizer="fused")
    for config, precision, seconds in (
        (compiled, None, 80.0),
        (compiled, None, 120.0),
        (compiled, "float8", 300.0),
        (fused, None, 10.0),
    ):
        study.add_trial(
            optuna.trial.create_trial(
                value=1.0,
                user_attrs={
                    keys.CONFIG_KEY: candidate_key(config, precision, "bf16-autocast"),
                    keys.TIME: {COMPILE: seconds, MEASURE: 5.0},
                },
            )
        )
    took = aim_module.trial_compile(study, "bf16-autocast", NoRetry())
    assert took(compiled, None) == 120.0 and took(compiled, "bf16-autocast") == 120.0
    assert took(compiled, "float8") == 300.0 and took(fused, None) == 10.0
    assert took(LoopConfig(), None) == 0.0
    now = [300.0]
    cut = profiling.time_cut(
        lambda: now[0], 600.0, child_s=40.0, eager_s=20.0, compiled_s=90.0, compiled_for=took
    )
    # 300 + 120 + 20 fits; float8's 300 + 300 + 20 does not, and the floor holds a short one.
    assert cut(compiled, None, True) is None
    refused = cut(compiled, "float8", True)
    assert refused is not None and "takes about 320 s" in refused
    now[0] = 520.0  # 520 + 90 is past 600; its trial's 10 + 20 s would not be
    refused = cut(fused, None, True)
    assert refused is not None and "takes about 90 s" in refused
    assert cut(LoopConfig(), None, True) is None  # eager: its trials' compile is not asked


def test_a_repeat_jobs_profiles_aim_at_its_own_minutes() -> None:
    """A job that started from an earlier study's trials profiles inside `REPEAT_JOB_AIM_S`;
    another inside `SCALE_JOB_AIM_S`; other spaces and `--profile all` keep no cut."""

    class After(Clock):
        @property
        def wall_s(self) -> float:
            return 170.0  # a repeat job after its final round

    clock = After()
    compiled = LoopConfig(compile="default")
    kwargs: dict[str, Any] = {"prepared": True, "warmed": None}
    first = aim_module.profile_cut("scale", "baselines", clock, **kwargs)
    repeat = aim_module.profile_cut("scale", "baselines", clock, repeat=True, **kwargs)
    assert first is not None and repeat is not None
    assert first(compiled, None, True) is None
    refused = repeat(compiled, None, True)
    assert refused is not None and f"inside {aim_module.REPEAT_JOB_AIM_S:.0f} s" in refused
    assert repeat(LoopConfig(), None, True) is None  # 170 + 25 + 10 s fit in 240 s
    assert aim_module.profile_cut("scale", "all", clock, repeat=True, **kwargs) is None
    assert aim_module.profile_cut("default", "baselines", clock, repeat=True, **kwargs) is None


def test_the_final_rounds_aim_costs_a_gate_by_its_trial_and_nothing_once_known(
    tmp_path: Path,
) -> None:
    """On the scale space the final round keeps the job's time aim (`aim.final_aim`), a repeat
    job's own: a config's gate is expected to cost its slowest trial's seconds, a config no trial
    ran nothing, and a config whose verdict the study holds nothing; other spaces keep no aim."""
    storage = sqlite_url(tmp_path)
    fix = ("num_workers=0", "compile=none", "compile_scope=model")
    search = open_search(options(storage, "aim", trials=2, space="scale", fix=fix))
    try:
        search.run_trials(LocalSlots(2))
        aim = aim_module.final_aim(
            search.space.name, search.study, search.parity_cache, search.clock, search.retry
        )
        assert aim is not None and aim.aim_s == aim_module.SCALE_JOB_AIM_S
        trials = [t for t in search.study.trials if keys.SECONDS in t.user_attrs]
        assert trials
        ran = trials[0]
        config = LoopConfig.from_dict(ran.user_attrs[keys.CONFIG])
        same = [
            t.user_attrs[keys.SECONDS]
            for t in trials
            if t.user_attrs[keys.CONFIG_KEY] == ran.user_attrs[keys.CONFIG_KEY]
        ]
        # Until the envelope is measured (the first check), what it took so far is added.
        search.clock.seconds[GATE_ENVELOPE] += 5.0
        assert aim.gate_cost(config, None) == max(same) + 5.0
        never = LoopConfig(num_streams=3, sync_interval=7, num_workers=0)
        assert aim.gate_cost(never, None) == 5.0
        assert search.parity(config).passed
        assert aim.gate_cost(config, None) is None
        assert aim.gate_cost(never, None) == 0.0
        # A job that started from an earlier study's trials aims at a repeat job's minutes.
        search.study.set_user_attr(keys.TRIALS_COPIED, {"from": "earlier", "trials": 1})
        again = aim_module.final_aim(
            search.space.name, search.study, search.parity_cache, search.clock, search.retry
        )
        assert again is not None and again.aim_s == aim_module.REPEAT_JOB_AIM_S
        assert again.over(aim_module.REPEAT_JOB_AIM_S, "a gate") is not None
        assert aim.over(aim_module.REPEAT_JOB_AIM_S, "a gate") is None
    finally:
        search.close()
    other = open_search(options(storage, "full", trials=1))
    try:
        space, study, cache = other.space.name, other.study, other.parity_cache
        assert aim_module.final_aim(space, study, cache, other.clock, other.retry) is None
    finally:
        other.close()


class _WhereTrained:
    """The one question the aim asks a gate (`ParityProcess.runs_here`); a check never runs."""

    def __init__(self, here: bool) -> None:
        self.here = here

    def runs_here(self, config: LoopConfig, precision: str | None = None) -> bool:
        return self.here


def test_a_gate_that_runs_the_config_where_its_trial_compiled_is_expected_without_the_compile(
    tmp_path: Path,
) -> None:
    """Where the gate makes the config's own run in the trials' process, the aim expects its
    trial's seconds less its compile, or the most this job's checks spent on a twin and a run
    (the larger); another gate still costs the whole trial (a compile, as its twin's is)."""
    import optuna

    from tuner.search.gating.parity import ParityCache
    from tuner.search.options import NoRetry
    from tuner.store.phases import COMPILE, MEASURE

    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    config = LoopConfig(compile="default", optimizer="fused")

    def expected(here: bool, largest: float = 0.0) -> float | None:
        cache = ParityCache(study, _WhereTrained(here), retry=NoRetry(), clock=Clock())  # type: ignore[arg-type]
        cache.largest_run_s = largest
        key = cache.key(config).removeprefix(keys.PARITY_PREFIX)
        if not study.trials:
            attrs = {keys.CONFIG_KEY: key, keys.SECONDS: 147.0, keys.TIME: {COMPILE: 134.0}}
            study.add_trial(optuna.trial.create_trial(value=71.0, user_attrs=attrs))
            attrs = {keys.CONFIG_KEY: key, keys.SECONDS: 20.0, keys.TIME: {MEASURE: 11.0}}
            study.add_trial(optuna.trial.create_trial(value=71.2, user_attrs=attrs))
        aim = aim_module.final_aim("scale", study, cache, cache.clock, cache.retry)
        assert aim is not None
        return aim.gate_cost(config, None)

    assert expected(False) == 147.0  # the slowest trial, its compile included
    assert expected(True) == 20.0  # 147 - 134 = 13 s, and 20 s for the trial that compiled nothing
    assert expected(True, largest=45.0) == 45.0  # what this job's checks took is the floor
