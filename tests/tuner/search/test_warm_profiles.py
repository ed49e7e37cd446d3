"""The profiles' child runs the leader beside its gate (`Children.warm_profiles`,
`ProfileProcess.warm`), so that the recommended config's profile compiles nothing: on the CPU here,
where the rule on cores and memory is given its inputs."""

from __future__ import annotations

import time
from typing import Any

import optuna
import pytest
import torch

import trainers
from trainers import LoopConfig
from tuner.search import children
from tuner.search.children import WARM_RESERVE_BYTES, Children, room_to_warm
from tuner.search.deciding.profile_child import ProfileProcess
from tuner.search.gating.gate import GateRun, InProcessGate
from tuner.search.gating.parity import ParityCache
from tuner.search.measuring.timing import Clock
from tuner.search.options import NoRetry
from tuner.store import keys

GB = 10**9
COMPILED = LoopConfig(compile="default")


def test_room_to_warm_counts_the_warm_up_and_twice_the_largest_trial() -> None:
    # At llama-1b on an H200: about 32 GB peaks, 130 GB free -> room.
    assert room_to_warm(130 * GB, 32 * GB, 33 * GB)
    # On an 80 GB GPU with the same model: 70 GB free is not room for three such runs.
    assert not room_to_warm(70 * GB, 32 * GB, 33 * GB)
    edge = 10 * GB + 2 * 20 * GB + WARM_RESERVE_BYTES
    assert room_to_warm(edge, 10 * GB, 20 * GB) and not room_to_warm(edge - 1, 10 * GB, 20 * GB)


def _children(profiles: ProfileProcess | None) -> Children:
    gate = InProcessGate("mlp", "tiny", trainers.RunArgs(steps=4, seed=0, device="cpu"))
    return Children(
        gate=gate, profiler=None if profiles is None else profiles.profile, _profiles=profiles
    )


@pytest.mark.slow
def test_no_warm_up_without_a_child_cores_a_compile_or_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profiles = ProfileProcess(
        "mlp", "tiny", steps=2, warmup=1, seed=0, device="cpu", matmul_precision="highest"
    )
    found = _children(profiles)
    try:
        assert not _children(None).warm_profiles(COMPILED, None, peak=GB, largest=GB)
        monkeypatch.setattr(children, "usable_cores", lambda: children.AHEAD_MIN_CORES - 1)
        assert not found.warm_profiles(COMPILED, None, peak=GB, largest=GB)
        monkeypatch.setattr(children, "usable_cores", lambda: children.AHEAD_MIN_CORES)
        # An eager config has nothing to compile ahead.
        assert not found.warm_profiles(LoopConfig(), None, peak=GB, largest=GB)
        assert found.warmed is None
        # A CPU has no GPU memory to share (0 bytes free): said, not started.
        assert not found.warm_profiles(COMPILED, None, peak=GB, largest=GB)
        assert found.warmed is not None and found.warmed.startswith("left to its profile")
        monkeypatch.setattr(children, "_free_bytes", lambda device: 100 * GB)
        assert not found.warm_profiles(COMPILED, None, peak=None, largest=GB)  # no peak known
        # Code the profile could not keep (a compiled optimizer step) is not compiled ahead.
        kept_not = LoopConfig(compile="default", optimizer="compiled")
        assert not found.warm_profiles(kept_not, None, peak=GB, largest=GB)
        assert found.warm_profiles(COMPILED, None, peak=GB, largest=GB)
        assert found.prepared and "beside the gate" in (found.warmed or "")
        found.settle_profiles()
    finally:
        found.close()


@pytest.mark.slow
def test_a_warm_up_still_running_when_the_gate_ends_is_ended_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Children.end_warm` at the gate's end: a warm-up that has ended is kept (its profile
    compiles nothing); one still running (here: still compiling) is ended at once, and
    the profile after it compiles the config in a new child."""
    monkeypatch.setattr(children, "usable_cores", lambda: children.AHEAD_MIN_CORES)
    monkeypatch.setattr(children, "_free_bytes", lambda device: 100 * GB)
    kwargs = dict(steps=2, warmup=1, seed=0, device="cpu", matmul_precision="highest")
    profiles = ProfileProcess("mlp", "tiny", **kwargs)  # type: ignore[arg-type]
    found = _children(profiles)
    try:
        assert not found.end_warm()  # nothing warmed: nothing to end
        assert found.warm_profiles(COMPILED, None, peak=GB, largest=GB)
        deadline = time.monotonic() + 300.0
        while profiles.running() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not profiles.running()
        assert not found.end_warm()  # it had ended (not yet waited for): kept
        assert found.warm_config == (COMPILED, None) and found.prepared
        assert profiles.profile(COMPILED).phases["compile"] == 0.0  # type: ignore[index]
        other = LoopConfig(compile="default", num_streams=2)
        assert found.warm_profiles(other, None, peak=GB, largest=GB)
        assert found.end_warm()
        assert found.warm_config is None and not found.prepared
        assert "ended unfinished when the gate ended" in (found.warmed or "")
        assert profiles.profile(other).phases["compile"] > 0.0  # type: ignore[index]
    finally:
        found.close()


@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=pytest.mark.gpu)],
)
def test_a_warmed_profile_child_compiles_nothing_for_the_config_it_ran(device: str) -> None:
    """The warm-up compiles the config in the child; its profile after keeps that code (compile
    0 s), where a child that was not warmed compiles it in its profile."""
    kwargs = dict(steps=2, warmup=1, seed=0, device=device, matmul_precision="highest")
    warmed = ProfileProcess("transformer", "tiny", **kwargs)  # type: ignore[arg-type]
    cold = ProfileProcess("transformer", "tiny", **kwargs)  # type: ignore[arg-type]
    try:
        took = warmed.warm(COMPILED)
        warmed.settle()
        assert took.done() and took.result() > 0.0
        kept = warmed.profile(COMPILED)
        compiled = cold.profile(COMPILED)
    finally:
        warmed.close()
        cold.close()
    assert kept.phases is not None and compiled.phases is not None
    assert kept.phases["compile"] == 0.0 < compiled.phases["compile"]
    # The same run was profiled: the warm-up put the model's weights back.
    assert kept.config == compiled.config and kept.steps == compiled.steps


class _Recording:
    """A gate that records what it was asked to check, and passes it."""

    runs_apart = True

    def __init__(self, real: InProcessGate, calls: list[str]) -> None:
        self.real, self.calls = real, calls

    def check(self, config: LoopConfig, envelope: Any, **extra: Any) -> GateRun:
        self.calls.append("gate")
        return self.real.check(config, envelope, **extra)

    def envelope(self, *, precision: str | None = None) -> GateRun:
        self.calls.append("envelope")
        return self.real.envelope(precision=precision)

    def close(self) -> None:
        self.real.close()


def test_before_check_runs_once_before_a_gate_that_runs_and_never_for_a_cached_verdict() -> None:
    calls: list[str] = []
    real = InProcessGate("mlp", "tiny", trainers.RunArgs(steps=4, seed=0, device="cpu"))
    study = optuna.create_study()
    cache = ParityCache(study, _Recording(real, calls), retry=NoRetry(), clock=Clock())  # type: ignore[arg-type]

    def before(config: LoopConfig, precision: str | None) -> None:
        calls.append(f"before {config.num_streams}")

    cache.before_check = before
    config = LoopConfig(num_streams=2)
    first = cache.verdict(config)
    assert first.passed and {"gate_reference", "gate_envelope", "gate_config"} <= set(first.time)
    # What the aim expects another check to cost at least: its twin and run, not the envelope.
    assert cache.largest_run_s == first.time.get("gate_twin", 0.0) + first.time["gate_config"]
    assert cache.verdict(config).passed  # cached on the study: no gate, so nothing before it
    # The envelope first and alone (its eager runs would shrink beside other work), then the
    # work beside the rest of the check.
    assert calls == ["envelope", "before 2", "gate"]
    # The same envelope and verdict as a check that measured everything itself.
    plain = ParityCache(optuna.create_study(), real, retry=NoRetry(), clock=Clock())
    assert plain.verdict(config).passed
    assert plain._attrs()[keys.ENVELOPE] == cache._attrs()[keys.ENVELOPE]


def test_a_hook_that_fails_leaves_the_gate_to_run_alone() -> None:
    told: list[str] = []
    real = InProcessGate("mlp", "tiny", trainers.RunArgs(steps=4, seed=0, device="cpu"))
    cache = ParityCache(
        optuna.create_study(), real, retry=NoRetry(), clock=Clock(), say=told.append
    )

    def broken(config: LoopConfig, precision: str | None) -> None:
        raise RuntimeError("no GPU to ask")

    cache.before_check = broken
    assert cache.verdict(LoopConfig(num_streams=2)).passed
    assert any("nothing runs beside it (RuntimeError: no GPU to ask)" in line for line in told)


class _OutOfMemoryOnce(_Recording):
    """A gate whose first check runs out of GPU memory, as one beside a warm-up might."""

    def check(self, config: LoopConfig, envelope: Any, **extra: Any) -> GateRun:
        self.calls.append("gate")
        if self.calls.count("gate") == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.real.check(config, envelope, **extra)


@pytest.mark.parametrize("warmed", [True, False])
def test_a_check_out_of_memory_beside_the_warm_up_waits_for_it_and_runs_again(
    warmed: bool,
) -> None:
    calls: list[str] = []
    told: list[str] = []
    real = InProcessGate("mlp", "tiny", trainers.RunArgs(steps=4, seed=0, device="cpu"))
    gate = _OutOfMemoryOnce(real, calls)
    cache = ParityCache(
        optuna.create_study(),
        gate,  # type: ignore[arg-type]  # a gate that checks only
        retry=NoRetry(),
        clock=Clock(),
        say=told.append,
    )
    settle = (lambda: calls.append("settled")) if warmed else None
    cache.before_check = lambda config, precision: settle
    verdict = cache.verdict(LoopConfig(num_streams=2))
    if warmed:
        # The warm-up's memory failed it: waited for, then checked again alone, and passed.
        assert calls == ["envelope", "gate", "settled", "gate"] and verdict.passed
        assert any("ran out of memory beside the profiles' warm-up" in line for line in told)
    else:
        # Nothing ran beside it: the config's own run ran out of memory, and that is its verdict.
        assert calls == ["envelope", "gate"] and not verdict.passed
        assert "out of memory" in verdict.reason
