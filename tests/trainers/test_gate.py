"""The gate on the CPU: which test a config is owed, exactness where owed, equivalence where the
arithmetic may change, and a planted wrong op caught by the statistical test."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable

import pytest
import torch
from torch import nn

from trainers import (
    REFERENCE,
    Envelope,
    LoopConfig,
    ParityVerdict,
    RunArgs,
    Twin,
    Workload,
    check_parity,
    core,
    gate,
    load_workload,
    required_test,
)
from trainers.config import OptimizerChoice
from trainers.feed import DeviceFeed
from trainers.gate.faults import FAULTS, MissingWaitFeed, WrongOpEagerStep, planted
from trainers.gate.parity import parity_losses, twin_of
from trainers.workloads import WorkloadFactory

STEPS = 10
CPU_ARGS = RunArgs(steps=STEPS, device="cpu")  # every gate run of these tests


@pytest.fixture(scope="module")
def mlp_env() -> Envelope:
    return Envelope.measure("mlp", "tiny", RunArgs(steps=STEPS, seed=0, device="cpu"))


def test_required_test_follows_what_the_config_changes() -> None:
    loop_only = LoopConfig(
        num_streams=4,
        sync_interval=6,
        sync_mode="query",
        prefetch_depth=2,
        pin_memory=True,
        non_blocking=True,
        num_workers=2,
    )
    assert required_test(REFERENCE) == "exact"
    assert required_test(loop_only) == "exact"
    assert required_test(LoopConfig(cuda_graph=True, num_streams=3)) == "exact+equivalence"
    assert required_test(LoopConfig(optimizer="fused")) == "equivalence"
    assert required_test(LoopConfig(optimizer="foreach")) == "equivalence"
    assert required_test(LoopConfig(compile="default")) == "equivalence"
    # The scale levers change the arithmetic on a GPU (another order of sums, other kernels).
    assert required_test(LoopConfig(micro_batches=2)) == "equivalence"
    assert required_test(LoopConfig(activation_checkpointing="blocks")) == "equivalence"
    assert required_test(LoopConfig(activation_checkpointing="selective")) == "equivalence"
    assert required_test(LoopConfig(optimizer="fused", num_streams=2)) == "exact+equivalence"
    # The eager twin keeps the arithmetic settings and takes the reference's loop settings.
    assert twin_of(LoopConfig(cuda_graph=True, num_streams=3, sync_interval=5)) == (REFERENCE, True)
    graph_fused = LoopConfig(cuda_graph=True, optimizer="fused", compile="default")
    assert twin_of(graph_fused) == (REFERENCE.replace(optimizer="fused", compile="default"), True)
    assert twin_of(LoopConfig(optimizer="foreach", num_streams=2)) == (
        REFERENCE.replace(optimizer="foreach"),
        False,
    )


def test_a_loop_only_config_is_judged_bit_for_bit(mlp_env: Envelope) -> None:
    config = LoopConfig(num_streams=2, sync_interval=4, sync_mode="event", prefetch_depth=1)
    verdict = gate("mlp", config, CPU_ARGS, preset="tiny", envelope=mlp_env)
    assert verdict.passed, verdict.reason
    assert verdict.test == "exact" and verdict.exact_against == "reference"
    assert verdict.exact_required and verdict.tolerance == 0.0
    assert verdict.reason == "identical losses"
    assert verdict.ratio is None and verdict.envelope is None and verdict.window_deviations == ()


@pytest.mark.parametrize("implementation", ["foreach", "fused"])
def test_other_optimizer_implementations_pass_equivalence(
    implementation: OptimizerChoice,
) -> None:
    steps = 20  # fused Adam's first differing loss comes after step 10 here
    envs = {
        name: Envelope.measure(name, "tiny", RunArgs(steps=steps, device="cpu"))
        for name in ("mlp", "transformer")
    }
    verdicts = [
        gate(
            name,
            LoopConfig(optimizer=implementation),
            RunArgs(steps=steps, device="cpu"),
            preset="tiny",
            envelope=env,
        )
        for name, env in envs.items()
    ]
    for verdict in verdicts:
        assert verdict.passed, verdict.reason
        assert verdict.test == "equivalence" and not verdict.exact_required
        assert verdict.exact_against is None
        assert verdict.ratio is not None and verdict.ratio <= 1.0
        assert verdict.multiple == 3.0 and verdict.window == 5 and verdict.steps == steps
        assert verdict.bound == pytest.approx(3.0 * max(verdict.envelope or 0, verdict.floor or 0))
        assert re.fullmatch(
            r"deviation from the reference \S+ within 3x the (envelope|floor) \S+ "
            r"\(steps \d+-\d+\), drift \S+ within 3x the (envelope|floor) \S+",
            verdict.reason,
        )
        assert verdict.drift_ratio is not None and verdict.drift_ratio <= 1.0
        assert len(verdict.losses) == steps
    if implementation == "fused":
        # Fused Adam rounds differently from the for-loop one: not exact, and not owed to be.
        assert any(v.max_abs_deviation > 0 for v in verdicts)


def adam_factory(*, foreach: bool) -> WorkloadFactory:
    """mlp tiny with Adam forced to the for-loop or the foreach implementation."""

    def build(preset: str, *, seed: int) -> Workload:
        workload = load_workload("mlp", preset, seed=seed)

        def make(params: Iterable[nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
            return torch.optim.Adam(params, lr=1e-3, foreach=foreach, capturable=capturable)

        workload.make_optimizer = make
        return workload

    return build


def test_a_factory_swapped_optimizer_is_judged_by_equivalence(mlp_env: Envelope) -> None:
    for foreach in (False, True):
        verdict = gate(
            adam_factory(foreach=foreach),
            REFERENCE,
            CPU_ARGS,
            preset="tiny",
            envelope=mlp_env,
            test="equivalence",
        )
        assert verdict.passed, verdict.reason
        assert verdict.test == "equivalence" and not verdict.exact_required


def test_an_arithmetic_config_with_loop_settings_matches_its_twin(mlp_env: Envelope) -> None:
    config = LoopConfig(num_streams=2, sync_interval=3, optimizer="fused")
    twin = Twin.measure("mlp", config, CPU_ARGS, preset="tiny")
    assert twin.reproducible and twin.first_difference is None and not twin.capturable
    assert twin.config == REFERENCE.replace(optimizer="fused").to_dict()
    assert Twin.from_dict(json.loads(json.dumps(twin.to_dict()))) == twin
    verdict = gate(
        "mlp",
        config,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
        twin=twin,
    )
    assert verdict.passed, verdict.reason
    assert verdict.test == "exact+equivalence" and verdict.exact_against == "eager twin"
    assert verdict.exact_required
    assert verdict.twin_max_abs_deviation == 0.0 and verdict.twin_first_diverging_step is None
    assert verdict.reason.startswith(
        "config replays its eager twin bit for bit; deviation from the reference "
    )
    measured_here = gate("mlp", config, CPU_ARGS, preset="tiny", envelope=mlp_env)
    assert measured_here == verdict

    # A twin that differs in one step by one ulp: the exact test fails, equivalence would not.
    losses = list(twin.losses)
    losses[5] = float(torch.nextafter(torch.tensor(losses[5]), torch.tensor(0.0)))
    tampered = dataclasses.replace(twin, losses=tuple(losses))
    failed = gate(
        "mlp",
        config,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
        twin=tampered,
    )
    assert not failed.passed and failed.ratio is not None and failed.ratio <= 1.0
    assert failed.twin_first_diverging_step == 5
    assert "does not replay its eager twin bit for bit: first differs at step 5" in failed.reason

    # A twin whose two runs differed: the exact test cannot apply, and the verdict says so.
    unsteady = dataclasses.replace(twin, reproducible=False, first_difference=3)
    fallback = gate(
        "mlp",
        config,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
        twin=unsteady,
    )
    assert fallback.passed and fallback.test == "equivalence" and not fallback.exact_required
    assert fallback.exact_skipped is not None and "differ from step 3" in fallback.exact_skipped
    assert fallback.reason.startswith("eager twin is not bitwise reproducible")

    with pytest.raises(ValueError, match="not of this config"):
        gate(
            "mlp",
            config.replace(optimizer="foreach"),
            CPU_ARGS,
            preset="tiny",
            envelope=mlp_env,
            twin=twin,
        )


@pytest.mark.parametrize("workload", ["mlp", "transformer"])
def test_a_wrong_op_is_rejected_by_the_equivalence_test(workload: str) -> None:
    fault = FAULTS["wrong-op"]
    detected = controls_passed = 0
    seeds = range(5)
    for seed in seeds:
        env = Envelope.measure(workload, "tiny", RunArgs(steps=STEPS, seed=seed, device="cpu"))
        with planted("wrong-op"):
            faulty = gate(
                workload,
                fault.config,
                RunArgs(steps=STEPS, seed=seed, device="cpu"),
                preset="tiny",
                envelope=env,
                test=fault.test,
            )
        with planted("wrong-op", lr_factor=1.0):
            control = gate(
                workload,
                fault.config,
                RunArgs(steps=STEPS, seed=seed, device="cpu"),
                preset="tiny",
                envelope=env,
                test=fault.test,
            )
        detected += not faulty.passed
        controls_passed += control.passed and control.ratio == 0.0
        assert faulty.test == "equivalence"
    assert detected >= 4, f"{detected}/5 detected"
    assert controls_passed == len(seeds)


def test_planted_installs_and_restores_our_own_classes() -> None:
    original = core.DeviceFeed
    with planted("missing-wait") as fault:
        assert core.DeviceFeed is MissingWaitFeed and fault.cuda_only
    assert core.DeviceFeed is original is DeviceFeed
    with planted("wrong-op", lr_factor=0.5):
        assert issubclass(core.EagerStep, WrongOpEagerStep)
        assert core.EagerStep.lr_factor == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="no magnitude"), planted("wrong-op", delay_us=1.0):
        pass
    with pytest.raises(ValueError, match="kind="), planted("bogus"):  # type: ignore[arg-type]
        pass


def test_verdict_round_trips_and_check_parity_takes_the_new_inputs(mlp_env: Envelope) -> None:
    verdict = check_parity(
        "mlp",
        LoopConfig(optimizer="fused"),
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
    )
    assert verdict.test == "equivalence" and verdict.passed
    values = json.loads(json.dumps(verdict.to_dict()))
    assert {"test", "envelope", "deviation", "multiple", "window", "reason", "passed"} <= set(
        values
    )
    assert ParityVerdict.from_dict(values) == verdict
    with pytest.raises(ValueError, match="test='bogus'"):
        gate("mlp", REFERENCE, CPU_ARGS, preset="tiny", test="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="envelope measured for"):
        gate("mlp", REFERENCE, RunArgs(steps=8, device="cpu"), preset="tiny", envelope=mlp_env)
    # The precision reaches every run, the envelope's included (measured here: none given).
    fp32 = check_parity(
        "mlp",
        LoopConfig(optimizer="fused"),
        RunArgs(steps=6, device="cpu", precision="fp32"),
        preset="tiny",
    )
    assert fp32.passed and fp32.test == "equivalence"
    with pytest.raises(ValueError, match="'precision': 'fp32'"):
        gate(
            "mlp",
            REFERENCE,
            RunArgs(steps=STEPS, device="cpu", precision="fp32"),
            preset="tiny",
            envelope=mlp_env,
            test="equivalence",
        )
    with pytest.raises(ValueError, match="'seed': 1"):
        gate(
            "mlp",
            REFERENCE,
            RunArgs(steps=STEPS, seed=1, device="cpu"),
            preset="tiny",
            envelope=mlp_env,
        )


def test_a_config_run_measured_elsewhere_is_judged_as_one_run_here(mlp_env: Envelope) -> None:
    """`gate(losses=...)`: the config's own run given (another process ran it while this one ran
    the twin) gives the verdict a run here gives; a run with a wrong step is caught by the same
    exact test; a run of another length is refused, not judged."""
    config = LoopConfig(num_streams=2, sync_interval=3, optimizer="fused")
    twin = Twin.measure("mlp", config, CPU_ARGS, preset="tiny")
    given = parity_losses("mlp", "tiny", config, CPU_ARGS)
    kwargs = {"preset": "tiny", "envelope": mlp_env, "twin": twin}
    here = gate("mlp", config, CPU_ARGS, **kwargs)
    assert gate("mlp", config, CPU_ARGS, losses=given, **kwargs) == here and here.passed
    wrong = list(given)
    wrong[2] = float(torch.nextafter(torch.tensor(wrong[2]), torch.tensor(0.0)))
    failed = gate("mlp", config, CPU_ARGS, losses=wrong, **kwargs)
    assert not failed.passed and failed.twin_first_diverging_step == 2
    with pytest.raises(ValueError, match=f"losses of {STEPS - 1} steps given, the gate runs"):
        gate("mlp", config, CPU_ARGS, losses=given[:-1], **kwargs)


@pytest.mark.parametrize(
    ("config", "steps", "allowed"),
    [
        (LoopConfig(cuda_graph=True), 3, "allowed 5 or more"),  # 3 eager steps, the capture
        (LoopConfig(cuda_graph=True, compile="default"), 4, "allowed 5 or more"),
    ],
)
def test_steps_a_configs_warm_up_outnumbers_are_refused_before_any_run(
    config: LoopConfig, steps: int, allowed: str
) -> None:
    """Its losses had outnumbered the reference's and every test failed at "inf" (a whole-step
    graph at 3 steps on an H200, 2026-12-05); refused before a run, so on a CPU too."""
    with pytest.raises(ValueError, match=rf"^steps={steps} is invalid for this config: {allowed}"):
        gate("mlp", config, RunArgs(steps=steps, device="cpu"), preset="tiny")
