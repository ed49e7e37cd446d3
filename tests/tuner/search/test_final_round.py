"""The final round spends its rounds only on configs that can still be recommended: a config that
no longer ties with the leader after a round is not measured again (`decide._still_tying`).

The measurements are scripted (a `Measurer` whose runs give fixed throughputs per config), so
that which config leads is certain; the study, its trials and the decision are real."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import optuna

from tests.tuner.tiny import PROTOCOL
from trainers import LoopConfig
from trainers.gate import ParityVerdict
from tuner.search.deciding.aim import Aim
from tuner.search.deciding.decide import final_round
from tuner.search.gating.verdict import GateVerdict
from tuner.search.measuring.measure import Failure, Measured, Measurer
from tuner.search.measuring.timing import Clock
from tuner.search.options import BASELINES, Quiet, RunOptions
from tuner.search.spaces.space import config_key
from tuner.store import keys

FAST = LoopConfig(num_streams=2, sync_interval=4)
SLOW = LoopConfig(num_streams=3, sync_interval=2)
THROUGHPUT = {
    config_key(BASELINES["pytorch-default"]): 100.0,
    config_key(BASELINES["seed-baseline"]): 101.0,
    config_key(FAST): 200.0,
    config_key(SLOW): 50.0,
}


class Scripted(Measurer):
    """Each run of a config gives its scripted throughput, +-1 across the windows."""

    def __init__(self) -> None:
        super().__init__("mlp", "tiny", device="cpu", protocol=PROTOCOL)
        self.runs: Counter[str] = Counter()

    @property
    def samples_per_batch(self) -> int:
        return 8

    def measure(self, config: LoopConfig, *, on_window: Any = None) -> Measured | Failure:
        key = config_key(config)
        self.runs[key] += 1
        base = THROUGHPUT[key]
        return Measured(
            throughputs=(base - 1.0, base, base + 1.0),
            step_ms=8e3 / base,
            peak_memory_bytes=None,
            n_syncs=0,
            sync_wait_ms=0.0,
            seconds=0.01,
            stopped_early=False,
        )


def _passed(config: LoopConfig) -> GateVerdict:
    verdict = ParityVerdict(
        passed=True,
        exact_required=True,
        tolerance=0.0,
        steps=4,
        max_abs_deviation=0.0,
        max_rel_deviation=0.0,
        first_diverging_step=None,
        reason="identical losses",
    )
    return GateVerdict(verdict=verdict, config=config.to_dict())


def _study(searched: dict[str, float] | None = None) -> optuna.Study:
    """Trials of FAST and SLOW whose windows read `searched` (by config key; default: their
    scripted throughput), as the search measured them."""
    study = optuna.create_study(study_name="final", direction="maximize")
    study.set_user_attr(keys.META, {"device": "cuda:0", "workload": "mlp", "preset": "tiny"})
    for config in (FAST, SLOW):
        windows = [(searched or THROUGHPUT)[config_key(config)]] * 3
        study.add_trial(
            optuna.trial.create_trial(
                value=windows[0],
                user_attrs={
                    keys.CONFIG: config.to_dict(),
                    keys.CONFIG_KEY: config_key(config),
                    keys.WINDOWS: windows,
                },
            )
        )
    return study


def _decide(
    searched: dict[str, float] | None = None,
    parity: Any = _passed,
    behind: float | None = None,
    **changes: Any,
) -> tuple[optuna.Study, Scripted, Any]:
    study = _study(searched)
    measurer = Scripted()
    options = RunOptions(workload="mlp", preset="tiny", top_k=2, final_rounds=3, **changes)
    clock = Clock()
    rec = final_round(
        study,
        measurer,
        options,
        progress=Quiet(),
        baselines=BASELINES,
        parity=parity,
        clock=clock,
        behind=behind,
    )
    # Every run's seconds, and the (here instant) graph floor.
    runs_s = 0.01 * sum(measurer.runs.values())
    assert runs_s <= clock.seconds["final_round"] < runs_s + 0.5
    return study, measurer, rec


def test_a_first_round_that_decides_as_the_search_did_is_the_last() -> None:
    study, measurer, rec = _decide()
    assert rec.source == "trial-0" and rec.config == FAST.to_dict()
    assert all(n == 1 for n in measurer.runs.values()) and len(measurer.runs) == 4
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert final["settled_after"] == 1


def test_a_config_that_no_longer_ties_is_not_measured_again() -> None:
    # The search saw the slow config as the fastest: the first round decides otherwise.
    study, measurer, rec = _decide({config_key(FAST): 200.0, config_key(SLOW): 300.0})
    assert rec.source == "trial-0" and rec.config == FAST.to_dict()
    # The slow config ran once; the leader and both baselines (the speedups) every round run,
    # and the second round left the decision as the first had it: the third was not run.
    assert measurer.runs[config_key(SLOW)] == 1
    assert measurer.runs[config_key(FAST)] == 2
    assert all(measurer.runs[config_key(c)] == 2 for c in BASELINES.values())
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert final["dropped"] == {"trial-1": 1} and final["settled_after"] == 2
    samples = {e.name: e.samples for e in rec.final_round}
    assert samples["trial-1"] == 3 and samples["trial-0"] == 6
    assert "trial-1" not in {t.name for t in rec.ties}


class Slowed(Scripted):
    """The fast config's first run is at half its speed (another job took part of the GPU):
    the first round does not decide as the search did."""

    def measure(self, config: LoopConfig, *, on_window: Any = None) -> Measured | Failure:
        measured = super().measure(config, on_window=on_window)
        key = config_key(config)
        if key != config_key(FAST) or self.runs[key] > 1 or isinstance(measured, Failure):
            return measured
        return dataclasses.replace(measured, throughputs=tuple(t / 2 for t in measured.throughputs))


def test_a_round_that_changes_the_decision_is_followed_by_the_next() -> None:
    study = _study()
    measurer = Slowed()
    options = RunOptions(workload="mlp", preset="tiny", top_k=2, final_rounds=3)
    final_round(study, measurer, options, progress=Quiet(), baselines=BASELINES, parity=_passed)
    # The first round changed the decision, so a second ran; it agreed with the first.
    assert measurer.runs[config_key(FAST)] == 2
    assert all(measurer.runs[config_key(c)] == 2 for c in BASELINES.values())
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert final["settled_after"] == 2


def test_with_a_planned_run_length_every_config_runs_every_round() -> None:
    """A config's setup cost can reverse the order over `train_steps`: nothing is dropped, and
    every round runs."""
    _, measurer, rec = _decide(train_steps=1000)
    assert measurer.runs[config_key(SLOW)] == 3
    assert measurer.runs[config_key(FAST)] == 3
    assert rec.source == "trial-0"


class Gates:
    """The gate as the final round calls it: every verdict passes, each call is counted."""

    def __init__(self, failing: LoopConfig | None = None) -> None:
        self.asked: Counter[str] = Counter()
        self.failing = failing

    def __call__(self, config: LoopConfig, precision: str | None = None) -> GateVerdict:
        self.asked[config_key(config)] += 1
        verdict = _passed(config)
        if config == self.failing:
            fields = dataclasses.replace(verdict.verdict, passed=False, reason="planted")
            return dataclasses.replace(verdict, verdict=fields)
        return verdict


def test_configs_that_cannot_tie_with_the_winner_are_not_gated() -> None:
    """The baselines (100 and 101 samples/s) and the slow config (50) cannot tie with the fast
    one (200): only its gate runs; where the fastest fails the gate, the next fastest are gated;
    with a planned run length every config is."""
    gates = Gates()
    _, _, rec = _decide(parity=gates)
    assert rec.source == "trial-0" and set(gates.asked) == {config_key(FAST)}
    gates = Gates(failing=FAST)
    _, _, rec = _decide(parity=gates)
    # The seed baseline (101) leads once FAST is out; the PyTorch default (100) ties with it.
    assert rec.config == BASELINES["pytorch-default"].to_dict() or rec.config == (
        BASELINES["seed-baseline"].to_dict()
    )
    assert {config_key(c) for c in BASELINES.values()} <= set(gates.asked)
    gates = Gates()
    _decide(parity=gates, train_steps=1000)
    assert set(gates.asked) == {config_key(c) for c in (FAST, SLOW, *BASELINES.values())}


def test_a_screening_study_leaves_out_trials_too_far_behind_to_tie() -> None:
    """SLOW (50 samples/s) is 75 % behind FAST (200): with `behind` (a screening study's tie
    margin and spare) it is never measured in the final round; within it, it is."""
    study, measurer, rec = _decide(behind=0.03)
    assert config_key(SLOW) not in measurer.runs and rec.config == FAST.to_dict()
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert "trial-1" not in final["entries"] and "trial-0" in final["entries"]
    _, measurer, _ = _decide(behind=0.8)
    assert measurer.runs[config_key(SLOW)] == 1


# -- the job's time aim (`tuner.search.deciding.aim`) ------------------------------------------

NEAR = LoopConfig(num_streams=2, sync_interval=8)
"""Ties with FAST: 199 samples/s against 200, within the 1 % tie margin."""


class Tied(Scripted):
    """FAST and NEAR tie; the baselines and SLOW cannot."""

    def measure(self, config: LoopConfig, *, on_window: Any = None) -> Measured | Failure:
        if config != NEAR:
            return super().measure(config, on_window=on_window)
        self.runs[config_key(config)] += 1
        return Measured(
            throughputs=(198.0, 199.0, 200.0),
            step_ms=8e3 / 199.0,
            peak_memory_bytes=None,
            n_syncs=0,
            sync_wait_ms=0.0,
            seconds=0.01,
            stopped_early=False,
        )


def _tied_study(near_s: float = 70.0, fast_s: float = 140.0) -> optuna.Study:
    """FAST and NEAR as the search ran them, each trial taking the seconds given (a compile)."""
    study = optuna.create_study(study_name="aim", direction="maximize")
    study.set_user_attr(keys.META, {"device": "cuda:0", "workload": "mlp", "preset": "tiny"})
    for config, windows, seconds in ((FAST, 200.0, fast_s), (NEAR, 199.0, near_s)):
        study.add_trial(
            optuna.trial.create_trial(
                value=windows,
                user_attrs={
                    keys.CONFIG: config.to_dict(),
                    keys.CONFIG_KEY: config_key(config),
                    keys.WINDOWS: [windows] * 3,
                    keys.SECONDS: seconds,
                },
            )
        )
    return study


def _aimed(
    study: optuna.Study, gates: Gates, wall_s: float, known: set[str], rounds: int = 1
) -> tuple[Any, Aim, Tied]:
    """The final round with a job clock standing at `wall_s` of a 900 s aim; a verdict is known
    for the configs whose keys are in `known` (the rest cost their trial's seconds)."""

    def cost(config: LoopConfig, precision: str | None) -> float | None:
        if config_key(config) in known:
            return None
        return max(
            (
                float(t.user_attrs[keys.SECONDS])
                for t in study.trials
                if t.user_attrs.get(keys.CONFIG_KEY) == config_key(config)
            ),
            default=0.0,
        )

    aim = Aim(wall=lambda: wall_s, aim_s=900.0, gate_cost=cost, margin_s=10.0)
    measurer = Tied()
    options = RunOptions(workload="mlp", preset="tiny", top_k=2, final_rounds=rounds)
    rec = final_round(
        study, measurer, options, progress=Quiet(), baselines=BASELINES, parity=gates, aim=aim
    )
    return rec, aim, measurer


def test_a_tied_config_whose_gate_would_pass_the_aim_is_left_out_for_the_gated_one() -> None:
    """FAST leads NEAR by 0.5 % (a tie); NEAR's verdict is known, FAST's gate would take its
    trial's 140 s at 786 s of a 900 s job: NEAR is recommended without gating FAST, and the
    reason says so. With time left, FAST is gated and the tie rule chooses as before."""
    gates = Gates()
    rec, aim, _ = _aimed(_tied_study(), gates, 786.0, known={config_key(NEAR)})
    assert rec.config == NEAR.to_dict()
    assert config_key(FAST) not in gates.asked
    assert set(aim.left_out) == {"trial-0"}
    assert rec.reason.startswith("among the configs gated, ")
    assert "trial-0 tied with trial-1 and not gated" in rec.reason
    assert "its gate takes about 140 s" in rec.reason and "786 s" in rec.reason
    gates = Gates()
    rec, aim, _ = _aimed(_tied_study(), gates, 300.0, known={config_key(NEAR)})
    assert config_key(FAST) in gates.asked and not aim.left_out
    assert "not gated" not in (rec.reason or "")


def test_a_config_ahead_of_every_gated_one_is_gated_whatever_the_time() -> None:
    """At 880 s of 900 neither candidate's gate fits and neither verdict is known: FAST (200)
    leads, nothing gated could stand in for it, and its gate runs past the aim; NEAR (199) ties
    with FAST once FAST holds, and is left out, never gated."""
    gates = Gates()
    rec, aim, _ = _aimed(_tied_study(), gates, 880.0, known=set())
    assert rec.config == FAST.to_dict() and config_key(FAST) in gates.asked
    assert config_key(NEAR) not in gates.asked and set(aim.left_out) == {"trial-1"}
    # The baselines tie with neither candidate: not gated, as without the aim.
    assert not {config_key(c) for c in BASELINES.values()} & set(gates.asked)
    # Where FAST fails its gate, NEAR is the fastest left, ahead of every gated one: gated.
    gates = Gates(failing=FAST)
    rec, aim, _ = _aimed(_tied_study(), gates, 880.0, known=set())
    assert rec.config == NEAR.to_dict() and config_key(NEAR) in gates.asked
    assert not aim.left_out


def test_a_round_that_would_pass_the_aim_is_not_run() -> None:
    """Three rounds asked; after the first, the next would end past the aim (the runs' seconds
    count: each took 0.01 s, the clock stands at 889.99 s, the margin 10 s): one round, and
    the record says the aim cut it. With time left, the rounds go on as before."""
    study = _study({config_key(FAST): 200.0, config_key(SLOW): 300.0})
    gates = Gates()
    measurer = Scripted()
    aim = Aim(wall=lambda: 889.995, aim_s=900.0, gate_cost=lambda *_: None, margin_s=10.0)
    options = RunOptions(workload="mlp", preset="tiny", top_k=2, final_rounds=3)
    final_round(
        study, measurer, options, progress=Quiet(), baselines=BASELINES, parity=gates, aim=aim
    )
    assert measurer.runs[config_key(FAST)] == 1
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert final["cut_after"] == 1 and final["settled_after"] is None
    study = _study({config_key(FAST): 200.0, config_key(SLOW): 300.0})
    measurer = Scripted()
    aim = Aim(wall=lambda: 100.0, aim_s=900.0, gate_cost=lambda *_: None, margin_s=10.0)
    final_round(
        study, measurer, options, progress=Quiet(), baselines=BASELINES, parity=gates, aim=aim
    )
    assert measurer.runs[config_key(FAST)] == 2
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert final["cut_after"] is None and final["settled_after"] == 2


def test_a_config_left_out_for_the_aim_is_not_dropped_and_the_record_says_why() -> None:
    """A second round fits (the clock at 760 s, each run 0.01 s); FAST's gate (140 s) does not:
    after the first round it is left out, yet it still ties, so it is not recorded as dropped
    (the first round decided as the search did: no second). The record names it and why; the
    baselines, tying with neither, are never gated."""
    study = _tied_study()
    gates = Gates()
    rec, _, measurer = _aimed(study, gates, 760.0, known={config_key(NEAR)}, rounds=2)
    assert rec.config == NEAR.to_dict() and config_key(FAST) not in gates.asked
    assert measurer.runs[config_key(FAST)] == 1
    final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
    assert final["settled_after"] == 1
    assert final["dropped"] == {} and set(final["left_out"]) == {"trial-0"}
    assert "its gate takes about 140 s" in final["left_out"]["trial-0"]
    assert not {config_key(c) for c in BASELINES.values()} & set(gates.asked)


def test_a_left_out_config_whose_verdict_arrives_is_chosen_by_the_tie_rule() -> None:
    """Another worker of the job gated FAST meanwhile (its verdict is known when the final round
    asks): nothing is left out, and the tie rule chooses among both as without the aim."""
    gates = Gates()
    rec, aim, _ = _aimed(
        _tied_study(), gates, 886.0, known={config_key(NEAR), config_key(FAST)}, rounds=2
    )
    assert not aim.left_out and {config_key(FAST), config_key(NEAR)} <= set(gates.asked)
    assert {t.name for t in rec.ties} == {"trial-0", "trial-1"}


def test_a_finalist_that_compiled_says_how_long_and_why_its_code_was_not_kept() -> None:
    """`decide._say_compiled`: a turn that compiled a second or more gets a line with the
    seconds and the note that says why (`trainers.dynamo_state.why_dropped`, or the guard that
    failed); a turn on kept code, an eager config and a failed run get none."""
    from tests.tuner.search.test_earlier import Said
    from tuner.search.deciding.decide import _say_compiled

    said = Said()

    def run(compile_info: dict[str, Any] | None) -> Measured:
        return Measured(
            throughputs=(1.0,),
            step_ms=1.0,
            peak_memory_bytes=None,
            n_syncs=0,
            sync_wait_ms=0.0,
            seconds=1.0,
            stopped_early=False,
            compile=compile_info,
        )

    why = "kept code dropped (2 config(s)): no room beside the 2 kept (at most 2 side by side here)"
    _say_compiled(said, "final round 1/3: trial-11", run({"compile_s": 47.2, "notes": [why]}))
    _say_compiled(said, "final round 1/3: trial-12", run({"compile_s": 12.0, "notes": ["x"]}))
    _say_compiled(said, "final round 2/3: trial-11", run({"compile_s": 0.0, "kept_s": 47.2}))
    _say_compiled(said, "final round 2/3: pytorch-default", run(None))
    _say_compiled(said, "final round 2/3: trial-12", Failure(reason="oom", kind="oom", seconds=1.0))
    assert said.lines == [
        f"final round 1/3: trial-11 compiled 47 s: {why}",
        "final round 1/3: trial-12 compiled 12 s",
    ]


class Behind(Scripted):
    """NEAR, tied with FAST in the search's own samples, runs at 150 in the final round: no
    longer a tie."""

    def measure(self, config: LoopConfig, *, on_window: Any = None) -> Measured | Failure:
        if config != NEAR:
            return super().measure(config, on_window=on_window)
        self.runs[config_key(config)] += 1
        return dataclasses.replace(Scripted().measure(FAST), throughputs=(149.0, 150.0, 151.0))


def test_where_no_further_round_fits_a_tie_of_the_search_is_not_gated_for_it() -> None:
    """The decision on the search's own samples, asked after the first round to see whether a
    round settled it, gates the configs that tie there (NEAR, with FAST). Where no second round
    fits the job's aim even with one config beside the baselines, that decision would decide
    nothing: NEAR, behind by a third in the round, is not gated. With time left, it is."""
    for wall_s, gated in ((889.995, False), (100.0, True)):
        gates = Gates()
        aim = Aim(wall=lambda w=wall_s: w, aim_s=900.0, gate_cost=lambda *_: None, margin_s=10.0)
        options = RunOptions(workload="mlp", preset="tiny", top_k=2, final_rounds=3)
        study = _tied_study()
        rec = final_round(
            study, Behind(), options, progress=Quiet(), baselines=BASELINES, parity=gates, aim=aim
        )
        assert rec.config == FAST.to_dict()
        assert (config_key(NEAR) in gates.asked) is gated, (wall_s, gates.asked)
        final = next(v for k, v in study.user_attrs.items() if k.startswith(keys.FINAL_PREFIX))
        assert (final["cut_after"] == 1) is not gated
