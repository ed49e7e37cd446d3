"""Compiles that leave the kept code alone (`trainers.kept_code.compile_apart`): a lever's probe
between two runs of a kept config. On an H200 (2026-12-02, Qwen1.5-0.5B, float8) the
`float8_linears` probe after the leader's trial reset Dynamo, and the leader compiled again in
the gate (166 s) and in the final round (47 s): these tests fail on that code."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainers.test_compile import _watched
from tests.tuner.workloads_for_tests import own_loss_function
from trainers import LoopConfig, RunArgs, probe_levers, run
from trainers.compilation import holds_compiled, why_not_held
from trainers.dynamo_state import DROPPED, counters, graphs, limit_hit
from trainers.kept_code import ReuseKey, compile_apart, forget_compiled, keeping_compiled

A = ReuseKey(guarded=("float32",), unguarded=(object, (), (), None))


def test_a_compile_apart_between_two_runs_of_a_kept_key_keeps_its_code() -> None:
    forget_compiled()
    double = torch.compile(lambda x: x * 2, backend="eager")
    head = nn.Linear(4, 6)
    with keeping_compiled(2):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        before = graphs()
        out = compile_apart(head)(torch.ones(5, 4))
        assert graphs() == before + 1  # it compiled, on a code object of its own
        again = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    torch.testing.assert_close(out, head(torch.ones(5, 4)))
    assert again.compile_s == 0.0 and again.kept_s > 0, again
    assert not [note for note in again.notes if note.startswith(DROPPED)], again.notes


def test_each_compile_apart_has_its_own_code_object_and_no_limit_to_share() -> None:
    """Each holder compiles on a code object of its own, so many shapes never reach Dynamo's
    recompile limit (past it a frame runs eagerly without an error): with the limit at 1, three
    compile, each once, and none falls back."""
    forget_compiled()
    torch.manual_seed(0)
    holders = [nn.Sequential(nn.Linear(n, n + 1)) for n in (3, 5, 7)]
    with torch._dynamo.config.patch(recompile_limit=1):
        counters().clear()
        for holder in holders:
            x = torch.randn(2, holder[0].in_features)
            torch.testing.assert_close(compile_apart(holder)(x), holder(x))
        assert graphs() == 3
        assert not any(limit_hit(reason) for reason in counters()["unimplemented"])


@pytest.mark.slow
def test_the_loss_probe_between_two_runs_leaves_the_first_runs_code_kept() -> None:
    """Through `trainers.run` and `trainers.probe_levers`, as the search stages a lever between
    two trials: the second run of the first config compiles nothing, and the gate may run it
    where its trial ran (`holds_compiled`)."""
    forget_compiled()
    workload = own_loss_function("tiny", seed=0)
    config = LoopConfig.from_dict({"compile": "default", "num_workers": 0})
    args = RunArgs(steps=4, windows=1, warmup=2)
    cpu = torch.device("cpu")
    with keeping_compiled(2):
        first = run(workload, config, args)
        probed = probe_levers(workload, ["loss"], device=cpu, precision=None)
        assert isinstance(probed["loss"]["compiled"], float), probed  # the probe compiled
        assert holds_compiled(workload.model, config, None, cpu)
        again = run(workload, config, args)
    assert first.compile_s > 0
    assert again.compile_s == 0.0 and again.compile_kept_s > 0, again.compile_notes


def test_a_graph_break_inside_leaves_the_next_run_to_start_fresh() -> None:
    """Past a graph break Dynamo compiles the frames the function calls on their own code
    objects, which a run may compile too: the kept code is then no longer known to be alone,
    and the next run starts fresh and says so."""
    forget_compiled()
    double = torch.compile(lambda x: x * 2, backend="eager")

    def breaks(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x + 1

    with keeping_compiled(2):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        compile_apart(breaks)(torch.ones(3))
        again = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    assert again.compile_s > 0
    assert [note for note in again.notes if note.startswith(DROPPED)], again.notes


def test_what_a_compile_apart_made_goes_when_it_does() -> None:
    """Its compiled graphs live in globals of its own: nothing is left in a module's."""
    import trainers.kept_code as kept_code

    before = {name for name in vars(kept_code) if name.startswith("__compiled_fn")}
    compile_apart(nn.Linear(3, 3))(torch.ones(2, 3))
    after = {name for name in vars(kept_code) if name.startswith("__compiled_fn")}
    assert after == before


@pytest.mark.slow
def test_why_the_code_is_not_held_is_said_part_by_part() -> None:
    """The gate's line said only "compiled over since" where the kept twin ran in the child
    (the Qwen2-style row at aaed237): the reason is now the one that holds."""
    forget_compiled()
    workload = own_loss_function("tiny", seed=0)
    config = LoopConfig.from_dict({"compile": "default", "num_workers": 0})
    cpu = torch.device("cpu")
    assert why_not_held(workload.model, config, None, cpu) == "no code is kept"
    run(workload, config, RunArgs(steps=4, windows=1, warmup=2))
    assert why_not_held(workload.model, config, None, cpu) is None
    other = why_not_held(workload.model, config, "bf16-autocast", cpu)
    assert other is not None and "differs in the precision" in other, other
    eager = LoopConfig.from_dict({"num_workers": 0})
    assert why_not_held(workload.model, eager, None, cpu) == "the config compiles nothing"
    torch.compile(lambda x: x * 3)(torch.ones(3))  # another compile, on Dynamo's shared state
    since = why_not_held(workload.model, config, None, cpu)
    assert since is not None and since.startswith("something compiled since"), since
