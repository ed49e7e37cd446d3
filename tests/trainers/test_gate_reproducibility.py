"""The gate asks whether the eager step is bit-reproducible before any exact test (issue 28).

`noisy_mlp` is mlp `tiny` whose step is made not reproducible on purpose, the way atomics in a
backward kernel make a GPU step: from its fourth forward on, each built model scales its logits by
(1 + k * 2^-18) with k alternating between consecutive builds, so two identical runs differ from
step 3 by a few float32 rounding steps, deterministically (one build after another always differ).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from trainers import (
    Envelope,
    LoopConfig,
    ParityVerdict,
    RunArgs,
    Twin,
    Workload,
    gate,
    load_workload,
)
from trainers.gate import (
    GATE_ARGS,
    Reproducibility,
    eager_reproducibility,
    forget,
    planted,
    remember,
)
from trainers.gate.reproducibility import device_key, measure, workload_key
from trainers.gate.trajectories import trajectory
from trainers.workloads import BUILTIN

STEPS = 20
CPU_ARGS = RunArgs(steps=STEPS, device="cpu")  # every gate run of these tests
NOISY_FROM_STEP = 3
LOOP_ONLY = LoopConfig(num_streams=2, sync_interval=3)
LOOP_AND_NUMERICS = LoopConfig(num_streams=2, sync_interval=3, optimizer="fused")

_BUILDS = itertools.count()


class RunDependentLogits(nn.Module):
    """The wrapped model's logits, scaled from the NOISY_FROM_STEP-th training step on by a factor
    that differs between consecutive builds: run-to-run noise of a few rounding steps."""

    def __init__(self, inner: nn.Module, build: int) -> None:
        super().__init__()
        self.inner = inner
        self.factor = 1.0 + 2.0**-18 * (1 + build % 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        if self.training:
            self.calls += 1
            if self.calls > NOISY_FROM_STEP:
                out = out * self.factor
        return out


def noisy_mlp(preset: str, *, seed: int) -> Workload:
    workload = load_workload("mlp", preset, seed=seed)
    workload.model = RunDependentLogits(workload.model, next(_BUILDS))
    return workload


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget()
    yield
    forget()


@pytest.fixture(scope="module")
def noisy_env() -> Envelope:
    return Envelope.measure(noisy_mlp, "tiny", CPU_ARGS)


@pytest.fixture(scope="module")
def mlp_env() -> Envelope:
    return Envelope.measure("mlp", "tiny", CPU_ARGS)


def test_the_probe_finds_the_first_step_two_identical_runs_differ_and_is_cached() -> None:
    probe = eager_reproducibility(noisy_mlp, "tiny", CPU_ARGS)
    assert not probe.reproducible
    assert probe.first_difference == NOISY_FROM_STEP
    assert 0.0 < probe.max_abs_difference < 1e-4
    assert probe.workload == f"{__name__}:noisy_mlp-tiny" and probe.device == device_key(
        torch.device("cpu")
    )
    assert probe.determinism == "strict" and probe.strict
    assert probe.graph_replays_twin is None and probe.graph_error is None  # no graph on a CPU
    # Cached per workload, device, precision and determinism: not measured again, at any seed.
    assert (
        eager_reproducibility(noisy_mlp, "tiny", GATE_ARGS.replace(seed=5, device="cpu")) is probe
    )
    assert (
        eager_reproducibility(noisy_mlp, "tiny", GATE_ARGS.replace(device="cpu", precision="fp32"))
        is not probe
    )

    steady = eager_reproducibility("mlp", "tiny", CPU_ARGS)
    assert steady.reproducible and steady.first_difference is None
    assert steady.max_abs_difference == 0.0


def test_a_non_reproducible_step_skips_exactness_and_equivalence_decides(
    noisy_env: Envelope,
) -> None:
    for config in (LOOP_ONLY, LOOP_AND_NUMERICS):
        verdict = gate(noisy_mlp, config, CPU_ARGS, preset="tiny", envelope=noisy_env)
        assert verdict.passed, verdict.reason
        assert verdict.test == "equivalence" and not verdict.exact_required
        assert verdict.exact_against is None and verdict.twin_first_diverging_step is None
        assert verdict.eager_reproducible is False
        assert verdict.eager_first_difference == NOISY_FROM_STEP
        assert verdict.eager_max_abs_difference is not None
        assert verdict.eager_max_abs_difference > 0
        assert verdict.exact_skipped is not None
        assert f"first differ at step {NOISY_FROM_STEP} (max |diff| " in verdict.exact_skipped
        assert verdict.reason.startswith("the eager step is not bitwise reproducible here")
        assert verdict.ratio is not None and verdict.ratio <= 1.0


def test_a_planted_fault_is_still_rejected_where_exactness_is_skipped(
    noisy_env: Envelope,
) -> None:
    # The probe refuses to measure broken loop parts: a fault is no irreproducibility.
    with planted("wrong-op"), pytest.raises(RuntimeError, match="while a fault is planted"):
        gate(
            noisy_mlp,
            LOOP_ONLY,
            CPU_ARGS,
            preset="tiny",
            envelope=noisy_env,
        )
    eager_reproducibility(noisy_mlp, "tiny", CPU_ARGS)  # before planting
    with planted("wrong-op"):
        verdict = gate(
            noisy_mlp,
            LOOP_ONLY,
            CPU_ARGS,
            preset="tiny",
            envelope=noisy_env,
        )
    assert verdict.exact_skipped is not None and verdict.test == "equivalence"
    assert not verdict.passed and verdict.ratio is not None and verdict.ratio > 1.0


def test_a_reproducible_step_still_takes_the_exact_test(mlp_env: Envelope) -> None:
    verdict = gate("mlp", LOOP_ONLY, CPU_ARGS, preset="tiny", envelope=mlp_env)
    assert verdict.passed and verdict.test == "exact" and verdict.exact_required
    assert verdict.eager_reproducible is True and verdict.eager_first_difference is None
    assert verdict.exact_skipped is None and verdict.determinism == "strict"
    twin_checked = gate(
        "mlp",
        LOOP_AND_NUMERICS,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
    )
    assert twin_checked.passed and twin_checked.exact_against == "eager twin"
    # It replayed its twin bit for bit: the probe was not needed, so not run.
    assert twin_checked.eager_reproducible is None
    assert "replays its eager twin bit for bit" in twin_checked.reason
    # The planted fault, judged by the exact test (the one the config is owed), fails it there
    # (the probe measured before the fault, as the reference and the envelope are).
    eager_reproducibility("mlp", "tiny", CPU_ARGS)
    with planted("wrong-op"):
        faulty = gate("mlp", LOOP_ONLY, CPU_ARGS, preset="tiny", envelope=mlp_env)
    assert not faulty.passed and faulty.test == "exact" and faulty.first_diverging_step == 1


def test_a_probe_handed_back_replaces_the_measurement_and_must_fit(mlp_env: Envelope) -> None:
    probe = measure("mlp", "tiny", CPU_ARGS, reference=mlp_env.reference)
    stored = json.loads(json.dumps(probe.to_dict()))
    assert Reproducibility.from_dict(stored) == probe
    # A probe persisted by the caller that says "not reproducible" is believed: exact skipped.
    unsteady = dataclasses.replace(
        probe, reproducible=False, first_difference=7, max_abs_difference=1e-6
    )
    verdict = gate(
        "mlp",
        LOOP_ONLY,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
        probe=unsteady,
    )
    assert verdict.test == "equivalence" and verdict.eager_first_difference == 7
    remember(unsteady)
    assert eager_reproducibility("mlp", "tiny", GATE_ARGS.replace(device="cpu")) is unsteady
    with pytest.raises(ValueError, match="'precision': 'fp32'"):
        gate(
            "mlp",
            LOOP_ONLY,
            RunArgs(steps=STEPS, device="cpu", precision="fp32"),
            preset="tiny",
            probe=probe,
        )
    with pytest.raises(ValueError, match="probe measured for"):
        gate("transformer", LOOP_ONLY, CPU_ARGS, preset="tiny", probe=probe)
    with pytest.raises(ValueError, match="format=None is invalid"):
        Reproducibility.from_dict({k: v for k, v in stored.items() if k != "format"})
    with pytest.raises(ValueError, match="determinism='sometimes' is invalid"):
        Reproducibility.from_dict({**stored, "determinism": "sometimes"})


def test_verdicts_round_trip_with_the_new_fields_and_old_dicts_still_load(
    noisy_env: Envelope,
) -> None:
    verdict = gate(noisy_mlp, LOOP_ONLY, CPU_ARGS, preset="tiny", envelope=noisy_env)
    values = json.loads(json.dumps(verdict.to_dict()))
    assert ParityVerdict.from_dict(values) == verdict
    new = {"eager_reproducible", "eager_first_difference", "eager_max_abs_difference"}
    old = {k: v for k, v in values.items() if k not in new | {"determinism"}}
    loaded = ParityVerdict.from_dict(old)
    assert loaded.eager_reproducible is None and loaded.determinism is None
    assert loaded.exact_skipped == verdict.exact_skipped and loaded.passed == verdict.passed


def test_determinism_off_runs_under_the_process_settings() -> None:
    probe = measure("mlp", "tiny", RunArgs(steps=8, device="cpu"), determinism="off")
    assert probe.determinism == "off" and not probe.strict
    assert probe.reproducible  # a CPU's mlp kernels are deterministic either way
    run = trajectory("mlp", "tiny", LoopConfig(), RunArgs(steps=8, device="cpu"), determinism="off")
    assert not run.strict and not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(ValueError, match="determinism='sometimes' is invalid"):
        trajectory(
            "mlp", "tiny", LoopConfig(), RunArgs(steps=4, device="cpu"), determinism="sometimes"
        )  # type: ignore[arg-type]


def test_workload_keys_name_the_same_shape_in_every_process() -> None:
    assert workload_key("mlp", "tiny") == "mlp-tiny"
    assert workload_key(BUILTIN["mlp"], "small") == "mlp-small"
    assert workload_key(noisy_mlp, "tiny") == f"{__name__}:noisy_mlp-tiny"

    def closure(preset: str, *, seed: int) -> Workload:
        return load_workload("mlp", preset, seed=seed)

    assert workload_key(closure, "tiny") is None  # not cached: the caller keeps the probe


def test_a_config_that_replays_its_twin_needs_no_probe_and_no_second_twin_run(
    mlp_env: Envelope,
) -> None:
    builds: list[int] = []

    def counted_mlp(preset: str, *, seed: int) -> Workload:
        builds.append(seed)  # one build per run of the loop
        return load_workload("mlp", preset, seed=seed)

    # The envelope's reference is given: the gate runs the config, then its twin once.
    matched = gate(
        counted_mlp,
        LOOP_AND_NUMERICS,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
    )
    assert matched.passed and matched.exact_against == "eager twin", matched.reason
    assert matched.eager_reproducible is None  # not asked: the two runs agreed bit for bit
    assert len(builds) == 2

    # A twin run once whose losses the config does not match: the probe (two runs) decides the
    # exact test applies, then the twin's second run shows the twin is not reproducible (its
    # first run was tampered with), so the exact test cannot apply.
    once = Twin.measure("mlp", LOOP_AND_NUMERICS, CPU_ARGS, preset="tiny", runs=1)
    assert once.runs == 1 and once.reproducible is None
    losses = list(once.losses)
    losses[5] = float(torch.nextafter(torch.tensor(losses[5]), torch.tensor(0.0)))
    builds.clear()
    tampered = dataclasses.replace(once, losses=tuple(losses))
    verdict = gate(
        counted_mlp,
        LOOP_AND_NUMERICS,
        CPU_ARGS,
        preset="tiny",
        envelope=mlp_env,
        twin=tampered,
    )
    assert len(builds) == 4  # the config, the probe's two runs, the twin's second
    assert verdict.eager_reproducible is True
    assert verdict.exact_skipped is not None and "differ from step 5" in verdict.exact_skipped
    assert verdict.test == "equivalence" and verdict.passed

    # A loop-only config that matches the reference is shown reproducible by the two runs.
    builds.clear()
    exact = gate(counted_mlp, LOOP_ONLY, CPU_ARGS, preset="tiny", envelope=mlp_env)
    assert exact.passed and exact.test == "exact" and len(builds) == 1
    assert exact.eager_reproducible is True and exact.eager_max_abs_difference == 0.0


def test_a_twin_runs_once_or_twice_and_confirms_only_once() -> None:
    with pytest.raises(ValueError, match="runs=3 is invalid: allowed 1 or 2"):
        Twin.measure(
            "mlp", LOOP_AND_NUMERICS, RunArgs(steps=4, device="cpu"), preset="tiny", runs=3
        )
    once = Twin.measure(
        "mlp", LOOP_AND_NUMERICS, RunArgs(steps=4, device="cpu"), preset="tiny", runs=1
    )
    both = once.confirmed("mlp", RunArgs(device="cpu"), preset="tiny")
    assert both.runs == 2 and both.reproducible is True and both.max_abs_difference == 0.0
    assert both.losses == once.losses and both.confirmed("mlp", preset="tiny") is both
    assert both == Twin.measure(
        "mlp", LOOP_AND_NUMERICS, RunArgs(steps=4, device="cpu"), preset="tiny"
    )
    # A twin stored before `runs` was recorded ran twice.
    old = {k: v for k, v in both.to_dict().items() if k != "runs"}
    assert Twin.from_dict(old) == both
