"""Typed gate verdicts (`tuner.search.gating.gate`): one JSON round trip, old stored dicts still
read, and the built-in gate's parts run and timed on the CPU."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import trainers
from trainers import LoopConfig
from trainers.gate import ParityVerdict, gate
from tuner.search.gating import gate as gate_module
from tuner.search.gating.gate import InProcessGate, run_config, run_parts
from tuner.search.gating.verdict import GateVerdict
from tuner.store.phases import GATE_CONFIG, GATE_ENVELOPE, GATE_REFERENCE, GATE_TWIN


def _verdict(**changes: object) -> ParityVerdict:
    base = ParityVerdict(
        passed=True,
        exact_required=True,
        tolerance=0.0,
        steps=4,
        max_abs_deviation=0.0,
        max_rel_deviation=0.0,
        first_diverging_step=None,
        reason="identical losses",
        losses=(1.0, 0.9, 0.8, 0.7),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_verdict_survives_its_json_round_trip_whole() -> None:
    verdict = GateVerdict(
        verdict=_verdict(exact_skipped="eager twin differs from step 3", decisive_steps=(0, 2)),
        config=LoopConfig(num_streams=2).to_dict(),
        seconds=1.5,
        time={GATE_CONFIG: 1.25},
    )
    stored = json.loads(json.dumps(verdict.to_dict()))
    assert GateVerdict.from_dict(stored) == verdict
    # Flat, as before verdicts were typed: readers of `parity/<key>` keep working.
    assert stored["passed"] is True and stored["seconds"] == 1.5
    assert stored["exact_skipped"] == "eager twin differs from step 3"
    assert "config" not in verdict.public() and verdict.public()["test"] == "exact"


def test_an_infinite_deviation_comes_back_infinite() -> None:
    failed = GateVerdict(verdict=_verdict(passed=False, max_rel_deviation=math.inf, reason="x"))
    stored = json.loads(json.dumps(failed.to_dict()))
    assert stored["max_rel_deviation"] is None  # JSON has no Infinity
    assert GateVerdict.from_dict(stored).verdict.max_rel_deviation == math.inf
    assert failed.failure_reason() == "parity: x (test exact; max relative deviation inf)"


def test_verdicts_stored_by_earlier_versions_still_read() -> None:
    # A config whose check raised, as `Search.parity` stored it before.
    crashed = GateVerdict.from_dict(
        {
            "passed": False,
            "reason": "parity run failed: boom",
            "max_rel_deviation": None,
            "seconds": 0.5,
            "config": {"num_streams": 2},
        }
    )
    assert not crashed.passed and crashed.reason == "parity run failed: boom"
    assert crashed.verdict.max_rel_deviation == math.inf and crashed.seconds == 0.5
    assert crashed.config == {"num_streams": 2}
    # A program's verdict, with the equivalence test nested.
    program = GateVerdict.from_dict(
        {
            "passed": True,
            "test": "equivalence",
            "reason": "within the envelope",
            "max_rel_deviation": 0.4,
            "equivalence": {"passed": True, "ratio": 0.4, "bound": 0.01, "window": 5},
        }
    )
    assert program.passed and program.verdict.test == "equivalence"
    assert program.verdict.ratio == 0.4 and program.verdict.window == 5
    assert program.verdict.tolerance == 0.01


def test_a_failed_check_is_a_failing_verdict_naming_why() -> None:
    verdict = GateVerdict.failed("parity run failed: out of memory", config=LoopConfig())
    assert not verdict.passed
    assert verdict.config == LoopConfig().to_dict()
    assert GateVerdict.from_dict(verdict.to_dict()) == verdict


@pytest.mark.slow
def test_the_gates_parts_run_once_each_and_are_timed() -> None:
    """The reference and envelope run only without a stored envelope; the twin only for a test
    that needs it; the verdict is the one `trainers.gate.gate` gives with nothing reused."""
    args = trainers.RunArgs(steps=4, seed=0, device="cpu")
    config = LoopConfig(num_streams=2, optimizer="foreach")
    first = run_parts("mlp", "tiny", config, args, envelope=None)
    assert trainers.required_test(config) == "exact+equivalence"
    assert set(first.time) == {GATE_REFERENCE, GATE_ENVELOPE, GATE_TWIN, GATE_CONFIG}
    assert all(seconds > 0.0 for seconds in first.time.values())
    alone = gate("mlp", config, args, preset="tiny")
    assert first.verdict.passed == alone.passed and first.verdict.losses == alone.losses
    assert first.verdict.test == alone.test
    local = InProcessGate("mlp", "tiny", trainers.RunArgs(steps=4, seed=0, device="cpu"))
    again = local.check(LoopConfig(num_streams=2), first.envelope)
    assert set(again.time) == {GATE_CONFIG}  # the envelope given, an exact test: nothing else
    assert again.envelope == first.envelope and again.verdict.passed


@pytest.mark.slow
def test_the_search_gate_runs_a_loop_twin_where_asked() -> None:
    """`twin_kind="loop"`: the check runs the config's loop twin (beside the stored envelope's
    strict reference, or the reference strict itself beside a seed envelope), and a config run
    made apart (`run_config`) computes what the check's own run computes, so either verdict is
    the one `trainers.gate.gate` gives."""
    args = trainers.RunArgs(steps=4, seed=0, device="cpu")
    config = LoopConfig(num_streams=2, optimizer="foreach")
    first = run_parts("mlp", "tiny", config, args, envelope=None, twin_kind="loop")
    assert first.verdict is not None and first.verdict.passed, first.verdict
    assert first.verdict.exact_against == "loop twin" and GATE_TWIN in first.time
    alone = gate("mlp", config, args, preset="tiny", twin_kind="loop")
    assert first.verdict.losses == alone.losses and first.verdict.test == alone.test
    # In another precision, against the reference's seed envelope: the config runs as the
    # reference does, here and apart alike.
    kwargs: dict[str, object] = {"config_precision": "bf16-autocast", "twin_kind": "loop"}
    args = args.replace(precision="fp32")  # the study's, named as a study names it
    cross = run_parts("mlp", "tiny", config, args, envelope=None, **kwargs)  # type: ignore[arg-type]
    apart = run_config("mlp", "tiny", config, args, **kwargs)  # type: ignore[arg-type]
    assert cross.verdict is not None and cross.verdict.exact_against == "loop twin"
    assert cross.verdict.determinism == "off"  # owed no bits: as the seed envelope ran
    assert tuple(apart.losses) == cross.verdict.losses
    given = run_parts(
        "mlp",
        "tiny",
        config,
        args,
        envelope=cross.envelope,
        run=lambda: apart.losses,
        **kwargs,  # type: ignore[arg-type]
    )
    assert given.verdict == cross.verdict and set(given.time) == {GATE_TWIN, GATE_CONFIG}


def test_a_config_run_made_apart_computes_as_the_gate_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run_config` asks for the config's own run in the mode `trainers.gate.gate` records for
    it (`config_determinism`): owed bits through the eager twin, strict; through a loop twin
    against a seed envelope, as that envelope ran."""
    asked: list[object] = []

    def recording(*args: object, **kwargs: object) -> list[float]:
        asked.append(kwargs.get("determinism"))
        return trainers.parity_losses(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gate_module, "parity_losses", recording)
    args = trainers.RunArgs(steps=3, seed=0, device="cpu", precision="fp32")
    config = LoopConfig(num_streams=2, optimizer="foreach")
    for kind in ("eager", "loop"):
        run_config("mlp", "tiny", config, args, config_precision="bf16-autocast", twin_kind=kind)  # type: ignore[arg-type]
    run_config("mlp", "tiny", config, args, twin_kind="loop")  # the study's precision: strict
    assert asked == ["strict", "off", "strict"]


@pytest.mark.slow
def test_an_envelope_measured_elsewhere_is_waited_for_after_the_twin() -> None:
    """A worker helping a `--gpus N` job measures the envelope alone (`Gate.envelope`); a check
    given it as `pending` runs the config's twin first, then waits for it, and measures no
    reference of its own; its verdict is the one a check with the envelope stored gives."""
    args = trainers.RunArgs(steps=4, seed=0, device="cpu")
    local = InProcessGate("mlp", "tiny", args)
    alone = local.envelope()
    assert alone.verdict is None and set(alone.time) == {GATE_REFERENCE, GATE_ENVELOPE}
    config = LoopConfig(num_streams=2, optimizer="foreach")  # an exact test: it has a twin
    asked: list[str] = []

    def pending() -> dict[str, object]:
        asked.append("envelope")
        return alone.envelope

    waited = local.check(config, None, pending=pending)
    assert asked == ["envelope"]
    assert set(waited.time) == {GATE_TWIN, GATE_CONFIG}  # no reference or envelope run here
    stored = local.check(config, alone.envelope)
    assert (
        waited.envelope
        == alone.envelope
        == run_parts("mlp", "tiny", config, args, envelope=None).envelope
    )
    assert waited.verdict == stored.verdict and waited.verdict.passed
    # Nobody measures it after all (`pending` gives None): this check measures it itself.
    itself = local.check(config, None, pending=lambda: None)
    assert set(itself.time) == {GATE_REFERENCE, GATE_ENVELOPE, GATE_TWIN, GATE_CONFIG}
    assert itself.envelope == alone.envelope


def test_only_a_compiled_run_owed_no_bits_runs_where_its_trial_compiled() -> None:
    """`runs_where_trained`: a config's own gate run moves into the trials' process only where
    it computes under that process's settings ("off": against a seed envelope, owed no bits)
    and has compiled code to reuse; a strict run would leave deterministic mode behind there."""
    from tuner.search.gating.kept import runs_where_trained

    study = trainers.RunArgs(steps=4, seed=0, device="cpu", precision="fp32")
    compiled = LoopConfig(compile="default")
    looped = compiled.replace(num_streams=2, sync_interval=4)
    other = {"config_precision": "bf16-autocast"}
    # Another precision, arithmetic alone: owed equivalence against the seed envelope.
    assert runs_where_trained(compiled, study, **other)  # type: ignore[arg-type]
    # Loop settings too: through a loop twin owed no bits, through the eager twin owed them.
    assert runs_where_trained(looped, study, twin_kind="loop", **other)  # type: ignore[arg-type]
    assert not runs_where_trained(looped, study, twin_kind="eager", **other)  # type: ignore[arg-type]
    # The study's own precision: the rounding envelope's runs are strict.
    assert not runs_where_trained(compiled, study, twin_kind="loop")
    # Nothing compiled, nothing to reuse; CUDA graphs recorded by the compile keep no code.
    assert not runs_where_trained(LoopConfig(optimizer="foreach"), study, **other)  # type: ignore[arg-type]
    graphs = LoopConfig(compile="reduce-overhead")
    assert not runs_where_trained(graphs, study, twin_kind="loop", **other)  # type: ignore[arg-type]


def test_only_a_compiled_config_owed_its_eager_twin_runs_kept_against_a_seed_envelope() -> None:
    """`runs_kept`: a config owed its eager twin's bits runs with that twin where its trial
    compiled, both with the process's own kernels, only where the check judges it against a seed
    envelope (another precision) and it compiles and keeps its code."""
    from tuner.search.gating.kept import runs_kept, runs_where_trained

    study = trainers.RunArgs(steps=4, seed=0, device="cpu", precision="fp32")
    looped = LoopConfig(compile="default", num_streams=2, sync_interval=4)
    other = {"config_precision": "bf16-autocast"}
    # Through the eager twin: kept, and not the run owed no bits; through a loop twin the reverse.
    assert runs_kept(looped, study, twin_kind="eager", **other)  # type: ignore[arg-type]
    assert not runs_where_trained(looped, study, twin_kind="eager", **other)  # type: ignore[arg-type]
    assert not runs_kept(looped, study, twin_kind="loop", **other)  # type: ignore[arg-type]
    # The study's own precision: the rounding envelope is strict.
    assert not runs_kept(looped, study, twin_kind="eager")
    # Owed no twin (arithmetic alone), nothing compiled, or code not kept: not kept.
    assert not runs_kept(LoopConfig(compile="default"), study, twin_kind="eager", **other)  # type: ignore[arg-type]
    eager = LoopConfig(num_streams=2, optimizer="foreach")
    assert not runs_kept(eager, study, twin_kind="eager", **other)  # type: ignore[arg-type]
    graphs = LoopConfig(compile="reduce-overhead", sync_interval=4)
    assert not runs_kept(graphs, study, **other)  # type: ignore[arg-type]
    # A compiled optimizer keeps no code either.
    compiled_optimizer = looped.replace(optimizer="compiled")
    assert not runs_kept(compiled_optimizer, study, twin_kind="eager", **other)  # type: ignore[arg-type]
