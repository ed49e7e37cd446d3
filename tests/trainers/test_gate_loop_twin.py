"""The loop twin on the CPU: a config that changes the arithmetic and the loop settings has its
loop settings checked on the reference's arithmetic, bit for bit against the reference, and its
own run judged for equivalence alone; a loop bug is caught there; graphs keep the eager twin."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainers import REFERENCE, Envelope, LoopConfig, RunArgs, Twin, core, gate
from trainers.feed import DeviceFeed
from trainers.gate import (
    config_determinism,
    eager_reproducibility,
    loop_twin_of,
    parity_losses,
    twin_kind,
)
from trainers.gate import parity as parity_module
from trainers.workloads.base import Batch

STEPS = 10
CPU_ARGS = RunArgs(steps=STEPS, device="cpu")
LOOP_AND_NUMERICS = LoopConfig(sync_interval=3, prefetch_depth=1, optimizer="fused")


BF16_ARGS = RunArgs(steps=STEPS, device="cpu", precision="bf16-autocast")


@pytest.fixture(scope="module")
def mlp_env() -> Envelope:
    return Envelope.measure("mlp", "tiny", RunArgs(steps=STEPS, seed=0, device="cpu"))


@pytest.fixture(scope="module")
def seeds_env() -> Envelope:
    """The fp32 reference's seed envelope, measured as the gate measures one against another
    precision (`SEEDS_DETERMINISM`)."""
    return Envelope.measure(
        "mlp",
        "tiny",
        RunArgs(steps=STEPS, device="cpu", precision="fp32"),
        spread="seeds",
        determinism="off",
    )


class NewestFirstFeed(DeviceFeed):
    """A prefetch bug: with batches in flight, the step takes the newest instead of the
    oldest (one line differs from `DeviceFeed.next`). Harmless without prefetch."""

    def next(self) -> Batch:
        while len(self._in_flight) <= self._depth:
            self._issue()
        item = self._in_flight.pop()  # FAULT: popleft()
        return item.batch


def test_graphs_keep_the_eager_twin_and_the_rest_may_take_the_loop_twin() -> None:
    assert twin_kind(LOOP_AND_NUMERICS, "loop") == "loop"
    assert twin_kind(LoopConfig(compile="default", num_streams=2), "loop") == "loop"
    assert twin_kind(LOOP_AND_NUMERICS) == "eager"  # the eager twin unless asked
    assert twin_kind(LoopConfig(cuda_graph=True, optimizer="fused"), "loop") == "eager"
    assert twin_kind(LoopConfig(compile="reduce-overhead", prefetch_depth=1), "loop") == "eager"
    compiled = LoopConfig(compile="default", compile_scope="blocks", prefetch_depth=2)
    assert loop_twin_of(compiled) == LoopConfig(prefetch_depth=2)
    assert loop_twin_of(LOOP_AND_NUMERICS) == LoopConfig(sync_interval=3, prefetch_depth=1)


def test_the_config_runs_strict_only_where_it_owes_bits() -> None:
    compiled = LoopConfig(compile="default", prefetch_depth=1)
    assert config_determinism(LoopConfig(prefetch_depth=1), "exact", reference="off") == "strict"
    assert config_determinism(compiled, "exact+equivalence", reference="off") == "strict"
    loop = config_determinism(compiled, "exact+equivalence", twin="loop", reference="off")
    assert loop == "off"
    assert config_determinism(compiled, "exact+equivalence", twin="loop") == "strict"
    graph = LoopConfig(cuda_graph=True, prefetch_depth=1)
    assert config_determinism(graph, "exact+equivalence", twin="loop", reference="off") == "strict"
    assert (
        config_determinism(LoopConfig(compile="default"), "equivalence", reference="off") == "off"
    )


def test_a_loop_twin_holds_the_loop_settings_to_the_reference_bits(mlp_env: Envelope) -> None:
    twin = Twin.measure("mlp", LOOP_AND_NUMERICS, CPU_ARGS, preset="tiny", runs=1, kind="loop")
    assert twin.kind == "loop" and twin.runs == 1 and not twin.capturable
    assert twin.config == LoopConfig(sync_interval=3, prefetch_depth=1).to_dict()
    assert twin.reference == tuple(parity_losses("mlp", "tiny", REFERENCE, CPU_ARGS))
    assert twin.losses == twin.reference
    assert Twin.from_dict(json.loads(json.dumps(twin.to_dict()))) == twin
    given = Twin.measure(
        "mlp",
        LOOP_AND_NUMERICS,
        CPU_ARGS,
        preset="tiny",
        kind="loop",
        reference=mlp_env.reference,
    )
    assert given == twin
    kwargs = {"preset": "tiny", "envelope": mlp_env, "twin_kind": "loop"}
    verdict = gate("mlp", LOOP_AND_NUMERICS, CPU_ARGS, twin=twin, **kwargs)  # type: ignore[arg-type]
    assert verdict.passed, verdict.reason
    assert verdict.test == "exact+equivalence" and verdict.exact_against == "loop twin"
    assert verdict.twin_first_diverging_step is None and verdict.twin_max_abs_deviation == 0.0
    assert verdict.reason.startswith(
        "its loop settings on the reference's arithmetic replay the reference bit for bit; "
    )
    assert gate("mlp", LOOP_AND_NUMERICS, CPU_ARGS, **kwargs) == verdict  # type: ignore[arg-type]
    # A twin of the other kind would hold the config to other bits.
    eager = Twin.measure("mlp", LOOP_AND_NUMERICS, CPU_ARGS, preset="tiny", runs=1)
    with pytest.raises(ValueError, match="twin is a eager twin, and this gate compares"):
        gate("mlp", LOOP_AND_NUMERICS, CPU_ARGS, twin=eager, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twin_kind='twins' is invalid: allowed eager or loop"):
        gate("mlp", LOOP_AND_NUMERICS, CPU_ARGS, preset="tiny", twin_kind="twins")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reference of 3 steps given, the loop twin runs 10"):
        Twin.measure(
            "mlp", LOOP_AND_NUMERICS, CPU_ARGS, preset="tiny", kind="loop", reference=[1.0] * 3
        )


def test_a_loop_bug_is_caught_on_the_reference_arithmetic(
    mlp_env: Envelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "DeviceFeed", NewestFirstFeed)
    caught = gate(
        "mlp", LOOP_AND_NUMERICS, CPU_ARGS, preset="tiny", envelope=mlp_env, twin_kind="loop"
    )
    assert not caught.passed
    assert caught.exact_against == "loop twin" and caught.twin_first_diverging_step is not None
    assert "do not replay the reference bit for bit" in caught.reason, caught.reason
    assert "a stream bug" in caught.reason
    assert caught.eager_reproducible is True  # the probe was asked: the step reproduces
    # The control: the same arithmetic without prefetch, where the fault cannot act.
    control = LOOP_AND_NUMERICS.replace(prefetch_depth=0)
    passed = gate("mlp", control, CPU_ARGS, preset="tiny", envelope=mlp_env, twin_kind="loop")
    assert passed.passed and passed.exact_against == "loop twin", passed.reason


def test_a_config_in_another_precision_has_its_loop_twin_in_the_reference_one(
    seeds_env: Envelope,
) -> None:
    verdict = gate(
        "mlp",
        LOOP_AND_NUMERICS,
        BF16_ARGS,
        preset="tiny",
        envelope=seeds_env,
        reference_precision="fp32",
        twin_kind="loop",
        multiple=100.0,
    )
    assert verdict.exact_against == "loop twin", verdict.reason
    assert verdict.twin_first_diverging_step is None
    assert verdict.precision == "bf16-autocast" and verdict.reference_precision == "fp32"
    # The config's own run computed as the reference did (with the process's own kernels).
    assert verdict.determinism == "off" and verdict.reference_determinism == "off"


def test_the_config_run_is_asked_in_the_mode_the_verdict_records(
    seeds_env: Envelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through a loop twin it owes no bits and runs as the seed envelope's reference did;
    # through the eager twin it owes bits and runs strict.
    asked: list[tuple[LoopConfig, object]] = []

    def recording(*args: object, **kwargs: object) -> list[float]:
        asked.append((args[2], kwargs.get("determinism")))  # type: ignore[arg-type]
        return parity_losses(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(parity_module, "parity_losses", recording)
    kwargs = {"preset": "tiny", "envelope": seeds_env, "reference_precision": "fp32"}
    loop = gate("mlp", LOOP_AND_NUMERICS, BF16_ARGS, twin_kind="loop", **kwargs)  # type: ignore[arg-type]
    eager = gate("mlp", LOOP_AND_NUMERICS, BF16_ARGS, **kwargs)  # type: ignore[arg-type]
    assert [mode for config, mode in asked if config == LOOP_AND_NUMERICS] == ["off", "strict"]
    assert (loop.determinism, eager.determinism) == ("off", "strict")
    assert (loop.exact_against, eager.exact_against) == ("loop twin", "eager twin")


def test_a_loop_only_config_still_asks_the_probe_under_a_loop_twin(mlp_env: Envelope) -> None:
    # Owed the reference's bits ("exact"), a config with loop settings alone asks the probe as
    # before, whatever twin a config with arithmetic would take.
    probe = eager_reproducibility("mlp", "tiny", CPU_ARGS)
    unreproducible = dataclasses.replace(
        probe, reproducible=False, first_difference=3, max_abs_difference=1e-6
    )
    loop_only = LoopConfig(sync_interval=3, prefetch_depth=1)
    for kind in ("eager", "loop"):
        verdict = gate(
            "mlp",
            loop_only,
            CPU_ARGS,
            preset="tiny",
            envelope=mlp_env,
            probe=unreproducible,
            twin_kind=kind,  # type: ignore[arg-type]
        )
        assert verdict.test == "equivalence" and verdict.exact_skipped is not None, kind
        assert verdict.eager_reproducible is False
