"""Parity checks and profiles in child processes (what the tuner does on a GPU), run here on the
CPU."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from trainers import Envelope, LoopConfig, RunArgs
from trainers.gate import PERTURBATIONS, envelope_seeds
from tuner.evidence.trace import CPU_NOTE
from tuner.search.children import seeds_ahead
from tuner.search.deciding.profile_child import ProfileProcess
from tuner.search.gating import isolated
from tuner.search.gating.child import ChildProcess
from tuner.search.gating.isolated import ParityProcess
from tuner.search.options import RunOptions

T = TypeVar("T")


@pytest.mark.slow
def test_parity_in_a_child_process_passes_and_fails_like_in_process() -> None:
    checker = ParityProcess(
        "tests.trainers.helpers:worker_dependent",
        "x",
        RunArgs(steps=6, seed=0, device="cpu"),
        matmul_precision="highest",
    )
    try:
        first = checker.check(LoopConfig(num_streams=3, sync_interval=2, sync_mode="query"))
        same, envelope = first.verdict, first.envelope
        assert same.passed and same.max_abs_deviation == 0.0 and same.test == "exact"
        # The envelope measured the first time comes back whole, to be stored and passed again.
        assert Envelope.from_dict(envelope).to_dict() == envelope
        # The reference and envelope ran this time (timed), no twin: the test is exact.
        assert set(first.time) == {"gate_reference", "gate_envelope", "gate_config"}
        assert all(seconds > 0.0 for seconds in first.time.values())
        # This workload's data depends on the DataLoader worker: the child must catch it too.
        second = checker.check(LoopConfig(num_workers=1), envelope)
        assert second.envelope == envelope
        assert set(second.time) == {"gate_config"}  # given the envelope, nothing else ran
        assert not second.verdict.passed
        assert second.verdict.first_diverging_step == 0
    finally:
        checker.close()


@pytest.mark.slow
def test_profiles_in_a_child_process_come_back_whole() -> None:
    profiler = ProfileProcess(
        "mlp", "tiny", steps=3, warmup=1, seed=0, device="cpu", matmul_precision="highest"
    )
    try:
        first = profiler.profile(LoopConfig())
        second = profiler.profile(LoopConfig(num_streams=2, sync_interval=3))
    finally:
        profiler.close()
    assert first.config == LoopConfig().to_dict()
    assert second.config["sync_interval"] == 3
    for prof in (first, second):
        assert not prof.cuda_activity and prof.note == CPU_NOTE
        assert prof.steps == 3 and prof.step_ms > 0.0
        # The trace travels back with the figures, compressed.
        assert any(e.get("ph") == "X" for e in prof.trace()["traceEvents"])


@pytest.mark.slow
def test_a_prepared_profile_child_has_its_workload_built_before_the_first_profile() -> None:
    """`prepare` builds the workload in the child while this process goes on; the profile after
    it builds nothing, and says where its seconds went."""
    prepared = ProfileProcess(
        "transformer", "tiny", steps=2, warmup=1, seed=0, device="cpu", matmul_precision="highest"
    )
    cold = ProfileProcess(
        "transformer", "tiny", steps=2, warmup=1, seed=0, device="cpu", matmul_precision="highest"
    )
    try:
        build = prepared.prepare()
        first = prepared.profile(LoopConfig())
        unprepared = cold.profile(LoopConfig())
    finally:
        prepared.close()
        cold.close()
    assert build.done() and build.result() > 0.0
    assert first.phases is not None and unprepared.phases is not None
    assert first.phases["build"] == 0.0 < unprepared.phases["build"]
    assert set(first.phases) == {"build", "compile", "run", "trace"}
    assert first.phases["compile"] == 0.0 and first.phases["run"] > 0.0
    # The parts add up to the profile's own seconds (each rounded to the millisecond or 10 ms).
    assert sum(unprepared.phases.values()) == pytest.approx(unprepared.seconds, abs=0.05)


@pytest.mark.slow
def test_a_gate_child_prepared_ahead_gives_the_verdict_of_one_that_was_not() -> None:
    """`prepare` builds the reference's workload in the child before the first check; the
    check's runs then start from copies of that build, and must give what builds would have:
    the same envelope and verdict, bit for bit."""
    args = RunArgs(steps=6, seed=0, device="cpu")
    config = LoopConfig(num_streams=2, optimizer="foreach")  # an exact test, so a twin runs
    prepared = ParityProcess("transformer", "tiny", args, matmul_precision="highest")
    plain = ParityProcess("transformer", "tiny", args, matmul_precision="highest")
    try:
        built = prepared.prepare()
        ahead = prepared.check(config, None)
        alone = plain.check(config, None)
    finally:
        prepared.close()
        plain.close()
    assert built.done() and built.result() > 0.0
    assert ahead.envelope == alone.envelope
    assert ahead.verdict == alone.verdict and ahead.verdict is not None and ahead.verdict.passed


def _builds_here() -> tuple[int, list[tuple[str, int]]]:
    """In the gate's child: its builds so far and the (preset, seed) it keeps."""
    (builds,) = isolated._BUILDS.values()
    return builds.builds, builds.kept


@pytest.mark.slow
def test_a_gate_child_builds_a_seed_envelope_ahead_and_nothing_after() -> None:
    """With the seed envelope's seeds given to `prepare`, the child builds them and the
    reference's before the first check, and a check of a config in another precision (owed that
    envelope, then its twin and its own run) builds nothing more; its verdict and envelope are
    those of a child that built as it went."""
    args = RunArgs(steps=6, seed=0, device="cpu", precision="fp32")
    config = LoopConfig(num_streams=2)
    prepared = ParityProcess("mlp", "tiny", args, matmul_precision="highest")
    plain = ParityProcess("mlp", "tiny", args, matmul_precision="highest")
    try:
        prepared.prepare(envelope_seeds(0)).result()
        ahead = _call(prepared, _builds_here)
        checked = prepared.check(config, None, precision="bf16-autocast")
        after = _call(prepared, _builds_here)
        alone = plain.check(config, None, precision="bf16-autocast")
    finally:
        prepared.close()
        plain.close()
    assert ahead[0] == 1 + PERTURBATIONS
    assert sorted(seed for _, seed in ahead[1]) == [0, *envelope_seeds(0)]
    assert after[0] == ahead[0]
    assert checked.envelope == alone.envelope and checked.envelope["spread"] == "seeds"
    assert checked.verdict == alone.verdict and checked.verdict is not None


def _call(process: ParityProcess, fn: Callable[[], T]) -> T:
    return process._child.call(fn)


def test_seed_envelope_seeds_are_built_ahead_only_where_one_will_be_measured() -> None:
    both = RunOptions(workload="mlp", preset="tiny", precisions=("fp32", "bf16-autocast"))
    assert seeds_ahead(both, lambda precision: False) == envelope_seeds(0) == (1, 2, 3, 4)
    assert seeds_ahead(both, lambda precision: precision == "bf16-autocast") == ()
    one = RunOptions(workload="mlp", preset="tiny")
    assert seeds_ahead(one, lambda precision: False) == ()


def _pid() -> int:
    return os.getpid()


def _fail() -> None:
    raise RuntimeError("CUDA out of memory (planted)")


def test_a_child_whose_call_raised_is_replaced_by_a_new_one() -> None:
    """What a failed call leaves (allocator blocks, pushed hooks) must not reach the next call:
    the child is ended, the next call starts another; a call that succeeds keeps its child."""
    child = ChildProcess()
    try:
        first = child.call(_pid)
        assert child.call(_pid) == first
        with pytest.raises(RuntimeError, match="planted"):
            child.call(_fail)
        second = child.call(_pid)
        assert second != first and child.call(_pid) == second
    finally:
        child.close()


def _die() -> None:
    os._exit(3)  # the child killed (out of host memory, say), not an exception


@pytest.mark.parametrize("ahead", [_fail, _die])
def test_a_call_after_what_failed_ahead_runs_in_a_new_child(ahead: Callable[[], None]) -> None:
    """What was started ahead (`submit`: a workload's build beside the trials) may fail or kill
    its child; the gate's first call must not inherit that: it gets a new child."""
    child = ChildProcess()
    try:
        first = child.call(_pid)
        child.submit(ahead)
        second = child.call(_pid)
        assert second != first and child.call(_pid) == second
    finally:
        child.close()


@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=pytest.mark.gpu)],
)
def test_a_child_gives_the_same_verdict_with_the_envelope_measured_apart(device: str) -> None:
    """What a `--gpus N` job does (`tuner.service.gatehelp`): one worker's child measures the
    envelope alone, another's runs the config's twin first and is given that envelope after it.
    Its verdict is the one a child that measured everything itself gives, bit for bit."""
    args = RunArgs(steps=6, seed=0, device=device)
    config = LoopConfig(num_streams=2, optimizer="foreach")  # an exact test, so a twin runs
    whole = ParityProcess("transformer", "tiny", args, matmul_precision="highest")
    helper = ParityProcess("transformer", "tiny", args, matmul_precision="highest")
    apart = ParityProcess("transformer", "tiny", args, matmul_precision="highest")
    try:
        measured = helper.envelope()
        alone = whole.check(config, None)
        asked: list[bool] = []
        waited = apart.check(config, None, pending=lambda: asked.append(True) or measured.envelope)
    finally:
        for child in (whole, helper, apart):
            child.close()
    assert asked == [True] and measured.verdict is None
    assert measured.envelope == alone.envelope == waited.envelope
    assert set(waited.time) == {"gate_twin", "gate_config"}
    assert waited.verdict == alone.verdict and waited.verdict.passed


def test_a_failure_ahead_is_seen_when_a_later_submission_succeeded() -> None:
    """Two things started ahead (a build, then a warm-up): the first failing leaves its state in
    the child even where the second succeeded, so the next call still gets a new child."""
    child = ChildProcess()
    try:
        first = child.call(_pid)
        child.submit(_fail)
        later = child.submit(_pid)
        child.settle()
        assert later.done() and later.result() == first  # it ran, in the same child
        second = child.call(_pid)
        assert second != first and child.call(_pid) == second
    finally:
        child.close()


@pytest.mark.slow
def test_a_compiled_run_owed_no_bits_runs_here_and_is_judged_in_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where its trial's compiled code is (this process, after a trial of it), a config's own
    run owed no bits runs here (`runs_where_trained`); the child judges those losses as its own
    run's. Without that code here, a run owed bits, and every run of a gate told not to, stay in
    the child."""
    import trainers
    from trainers.kept_code import forget_compiled

    ran_here: list[tuple[str, tuple[float, ...], float]] = []

    def recording(*args: object, **kwargs: object) -> object:
        run = isolated_run_config(*args, **kwargs)
        seconds = run.time["gate_config"]  # type: ignore[attr-defined]
        ran_here.append((args[2].compile, tuple(run.losses), seconds))  # type: ignore[attr-defined]
        return run

    isolated_run_config = isolated.run_config
    monkeypatch.setattr(isolated, "run_config", recording)
    args = RunArgs(steps=3, seed=0, device="cpu", precision="fp32")
    compiled, other = LoopConfig(compile="default"), "bf16-autocast"
    # convnet: no dropout for the gate to turn off, so its graphs are its trial's.
    here = ParityProcess("convnet", "tiny", args, matmul_precision="highest")
    apart = ParityProcess("convnet", "tiny", args, matmul_precision="highest", where_trained=False)
    try:
        forget_compiled()  # nothing of an earlier test's: no code of it here, so the child runs it
        cold = here.check(compiled, precision=other)
        assert cold.verdict is not None and cold.verdict.passed and ran_here == []
        assert not cold.config_here
        # Its trial, here: Dynamo keeps the code the gate's run then reuses.
        trial = trainers.resolve_factory("convnet", {})("tiny", seed=0)
        trainers.run(trial, compiled, args.replace(precision=other, steps=2, warmup=1, windows=1))
        first = here.check(compiled, cold.envelope, precision=other)
        assert first.verdict is not None and first.verdict.passed, first.verdict
        assert [each for each, _, _ in ran_here] == ["default"]
        assert first.verdict.losses == ran_here[0][1]  # judged on the run made here
        assert first.config_here  # and says so (the gate's progress line)
        assert first.time["gate_config"] > ran_here[0][2]  # its run's seconds and the judgement's
        alone = apart.check(compiled, first.envelope, precision=other)
        assert alone.verdict is not None and alone.verdict.passed
        assert len(ran_here) == 1 and not alone.config_here  # told not to: the child ran it
        # Owed bits in the study's precision (strict): the child runs it.
        same = here.check(LoopConfig(num_streams=2, compile="default"))
        assert same.verdict is not None and same.verdict.passed, same.verdict
        assert len(ran_here) == 1
        # A model with dropout, which the gate turns off: other graphs than its trial's.
        with_dropout = ParityProcess("mlp", "tiny", args, matmul_precision="highest")
        try:
            trial = trainers.resolve_factory("mlp", {})("tiny", seed=0)
            trainers.run(
                trial, compiled, args.replace(precision=other, steps=2, warmup=1, windows=1)
            )
            checked = with_dropout.check(compiled, precision=other)
            assert checked.verdict is not None and checked.verdict.passed
            assert len(ran_here) == 1
        finally:
            with_dropout.close()
    finally:
        here.close()
        apart.close()


@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=pytest.mark.gpu)],
)
def test_a_config_owed_its_eager_twins_bits_runs_with_it_where_its_trial_compiled(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs_kept`: after its trial here, a compiled config owed its eager twin's bits runs with
    that twin in this process, both with its own kernels, and the child only judges (the
    verdict says "off"). Where the kept runs differ (a fault planted into the config's alone),
    the child checks it again, strict, and its verdict stands. On a GPU the config is a
    whole-step graph, as the search's; on a CPU, which has none, loop settings through the
    eager twin stand in for it."""
    import trainers
    from trainers.gate import parity_losses
    from trainers.gate.faults import planted
    from trainers.kept_code import forget_compiled
    from tuner.search.gating import kept

    made: list[object] = []

    def recording(*args: object, **kwargs: object) -> object:
        run = isolated_run_kept(*args, **kwargs)
        made.append(run)
        return run

    isolated_run_kept = isolated.run_kept
    monkeypatch.setattr(isolated, "run_kept", recording)
    if device == "cuda":
        config, kind = LoopConfig(compile="default", cuda_graph=True), "loop"  # the search's
    else:
        config, kind = LoopConfig(compile="default", sync_interval=2), "eager"
    # Past the warm-up: a graph's 4 steps outnumbered the reference's 3 losses (H200, 2026-12-05).
    steps = max(3, trainers.min_warmup(config) + 2)
    args = RunArgs(steps=steps, seed=0, device=device, precision="fp32")
    other = "bf16-autocast"
    here = ParityProcess("convnet", "tiny", args, matmul_precision="highest", twin_kind=kind)  # type: ignore[arg-type]
    try:
        assert here.runs_here(config, other)
        forget_compiled()  # no code of an earlier test's: nothing to keep, the child runs both
        cold = here.check(config, precision=other)
        assert cold.verdict is not None and cold.verdict.passed, cold.verdict
        assert made == [] and not cold.twin_here and cold.verdict.determinism == "strict"
        assert cold.twin_apart == "Dynamo does not hold its trial's code here: no code is kept"
        trial = trainers.resolve_factory("convnet", {})("tiny", seed=0)
        warmup = trainers.min_warmup(config)  # a graph's capture: 4 on a GPU
        trainers.run(
            trial, config, args.replace(precision=other, steps=2, warmup=warmup, windows=1)
        )
        first = here.check(config, cold.envelope, precision=other)
        assert first.verdict is not None and first.verdict.passed, first.verdict
        assert first.twin_here and first.config_here and len(made) == 1
        assert first.verdict.determinism == "off" and first.twin_apart is None
        assert list(first.verdict.losses) == made[0].losses  # type: ignore[attr-defined]
        assert "replays its eager twin bit for bit" in first.verdict.reason
        assert {"gate_twin", "gate_config"} <= set(first.time)

        def faulty(*args: object, **kwargs: object) -> object:
            with planted("wrong-op"):
                return parity_losses(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(kept, "parity_losses", faulty)
        again = here.check(config, cold.envelope, precision=other)
        assert len(made) == 2 and made[1].twin is None  # type: ignore[attr-defined]
        assert again.verdict is not None and again.verdict.passed, again.verdict
        assert not again.twin_here and not again.config_here
        assert again.twin_apart is not None and again.twin_apart.startswith(
            "its kept run left its twin "
        )
        if device == "cpu":
            # The CPU's kernels reproduce: the twin's second run says so, and no noise applies.
            assert again.twin_apart.endswith(", and the twin reproduced itself")
        assert again.verdict.determinism == "strict"  # the child's, as cold
        assert again.verdict.losses == cold.verdict.losses
        # The kept runs' seconds are the job's too: more twin time than the child's alone.
        assert again.time["gate_twin"] > made[1].time["gate_twin"]  # type: ignore[attr-defined]
    finally:
        here.close()


def test_the_gates_line_says_where_the_config_run_was_made() -> None:
    from tuner.search.gating.parity import _parts
    from tuner.store.phases import GATE_CONFIG

    spent = {GATE_CONFIG: 54.0, "gate_twin": 0.2}
    assert _parts(spent) == " (config run 54 s)"
    assert (
        _parts(spent, here=True) == " (config run 54 s, config run made where its trial compiled)"
    )
    assert _parts(spent, here="twin").endswith(
        ", twin and config run made where its trial compiled)"
    )
    assert _parts(spent, False, "its kept runs differed") == (
        " (config run 54 s); twin in the child: its kept runs differed"
    )


def test_why_a_twin_owed_runs_in_the_child_is_said() -> None:
    """`why_not_kept`: a graph config in the study's precision is judged against a strict
    rounding envelope, so its twin's bits are strict ones, made in the child; one whose compile
    keeps no code has nothing to share with its twin here."""
    from tuner.search.gating.kept import runs_kept, why_not_kept

    args = RunArgs(steps=20, seed=0, device="cuda", precision="bf16-autocast")
    graph = LoopConfig(compile="default", cuda_graph=True)
    assert runs_kept(graph, args, config_precision="float8")
    assert why_not_kept(graph, args, config_precision="float8") is None
    strict = why_not_kept(graph, args)
    assert strict is not None and "rounding envelope" in strict and not runs_kept(graph, args)
    recorded = LoopConfig(compile="reduce-overhead", num_streams=2)
    assert "not kept" in (why_not_kept(recorded, args, config_precision="float8") or "")
    assert why_not_kept(LoopConfig(), args, config_precision="float8") is None  # owes no twin


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_work_ahead_still_running_is_ended_and_the_next_call_gets_a_new_child() -> None:
    """The profiles' warm-up beside the gate, still compiling when the gate ends, is ended
    rather than waited for (`ChildProcess.end_unfinished`); work ahead that has ended is kept."""
    child = ChildProcess()
    try:
        first = child.call(_pid)
        child.submit(_sleep, 0.0).result()
        assert not child.end_unfinished()  # ended: the child stays
        assert child.call(_pid) == first
        child.submit(_sleep, 300.0)
        started = time.monotonic()
        assert child.end_unfinished()
        assert time.monotonic() - started < 60.0  # not the 300 s of the call
        second = child.call(_pid)
        assert second != first and child.call(_pid) == second
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # the first child is gone
    finally:
        child.close()
