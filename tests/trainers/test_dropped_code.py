"""Why a compiling run started Dynamo afresh although code was kept for reuse
(`trainers.dynamo_state.why_dropped`, first among the run's compile notes), and the warning of a
run that ran kept code and compiled anyway. On an H200 every final-round turn of a float8 job
compiled again (45-60 s each) and the record could not say why; these notes are what says it."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.trainers.test_compile import _watched
from trainers.compilation import CompileStats
from trainers.dynamo_state import DROPPED, UNGUARDED_FIELDS, why_dropped
from trainers.kept_code import ReuseKey, forget_compiled, keeping_compiled

A = ReuseKey(guarded=("float32",), unguarded=(object, (), (("attention", "default"),), None))
B = ReuseKey(guarded=("float64",), unguarded=A.unguarded)
FLASH = ReuseKey(guarded=("float64",), unguarded=(object, (), (("attention", "flash"),), None))


def _dropped(stats: CompileStats) -> list[str]:
    return [note for note in stats.notes if note.startswith(DROPPED)]


@pytest.fixture
def double() -> object:
    forget_compiled()  # nothing of an earlier test's kept
    return torch.compile(lambda x: x * 2, backend="eager")


def test_a_run_beside_kept_code_that_fits_drops_nothing_and_says_nothing(double: object) -> None:
    with keeping_compiled(2):
        first = _watched(double, A, torch.float32)  # type: ignore[arg-type]
        beside = _watched(double, B, torch.float64)  # type: ignore[arg-type]
        again = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    assert not _dropped(first) and not _dropped(beside) and not _dropped(again)
    assert again.compile_s == 0.0 and again.kept_s > 0


def test_a_run_past_the_room_says_so(double: object) -> None:
    with keeping_compiled(1):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        other = _watched(double, B, torch.float64)  # type: ignore[arg-type]
    (note,) = _dropped(other)
    assert "no room beside the 1 kept (at most 1 side by side here)" in note


def test_a_run_that_differs_where_no_guard_looks_names_the_field(double: object) -> None:
    with keeping_compiled(3):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        other = _watched(double, FLASH, torch.float64)  # type: ignore[arg-type]
    (note,) = _dropped(other)
    assert UNGUARDED_FIELDS[2] in note and "no guard of Dynamo checks" in note


def test_something_compiled_in_between_is_named(double: object) -> None:
    with keeping_compiled(2):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))  # a probe, say
        after = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    (note,) = _dropped(after)
    assert "something else compiled in this process since the last run" in note
    assert after.compile_s > 0 and after.kept_s == 0.0


def test_a_kept_run_that_compiled_again_warns_and_the_next_says_why_it_starts_fresh(
    double: object, caplog: pytest.LogCaptureFixture
) -> None:
    with keeping_compiled(2), caplog.at_level(logging.WARNING, "trainers.compilation"):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        # The same key, but an input its guards fail on: it compiles beside the kept entry.
        anyway = _watched(double, A, torch.float16)  # type: ignore[arg-type]
        after = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    assert anyway.kept_s > 0 and anyway.compile_s > 0 and not _dropped(anyway)
    (warning,) = [r for r in caplog.records if "compiled again" in r.getMessage()]
    assert "dtype" in warning.getMessage() or "float" in warning.getMessage()  # the guard
    (note,) = _dropped(after)
    assert "the last compiling run here kept nothing" in note


def test_each_rule_of_why_dropped_in_its_order() -> None:
    common = dict(room=2, kept_here=False, unguarded=None, last_kept=True)
    assert "keeps no code" in why_dropped(1, keeps=False, limit_was_hit=True, **common)  # type: ignore[arg-type]
    assert "recompile limit" in why_dropped(1, keeps=True, limit_was_hit=True, **common)  # type: ignore[arg-type]
    differing = ((object, (), ("a",), None), (object, (), ("a",), "/elsewhere"))
    with_field = dict(common, unguarded=differing, room=1)
    assert UNGUARDED_FIELDS[3] in why_dropped(2, keeps=True, limit_was_hit=False, **with_field)  # type: ignore[arg-type]
    full = why_dropped(2, keeps=True, limit_was_hit=False, **dict(common, room=2))  # type: ignore[arg-type]
    assert full.startswith(f"{DROPPED} (2 config(s)): no room")
    here = dict(common, kept_here=True, last_kept=False)
    assert "kept nothing" in why_dropped(2, keeps=True, limit_was_hit=False, **here)  # type: ignore[arg-type]


def test_a_key_dropped_by_a_run_before_says_so_when_it_runs_again(double: object) -> None:
    """A run that keeps no code (Inductor's CUDA graphs, a compiled optimizer) drops the kept
    code and says so; the next run of a dropped key finds nothing kept, and says why it compiles
    again."""
    with keeping_compiled(2):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        graphs = _watched(double, None, torch.float32)  # type: ignore[arg-type]
        again = _watched(double, A, torch.float32)  # type: ignore[arg-type]
        later = _watched(double, B, torch.float64)  # type: ignore[arg-type]
    (note,) = _dropped(graphs)
    assert "keeps no code" in note
    assert again.compile_s > 0 and _dropped(again) == [f"{note} (at an earlier run's start)"]
    assert not _dropped(later)  # beside A's fresh code: nothing dropped, nothing said


def test_a_limit_hit_that_dropped_the_kept_code_is_said_by_the_next_run_of_a_key() -> None:
    forget_compiled()
    double = torch.compile(lambda x: x * 2, backend="eager")
    with torch._dynamo.config.patch(recompile_limit=1), keeping_compiled(2):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        _watched(double, A, torch.float32, torch.float64)  # type: ignore[arg-type]  # past 1
        after = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    (note,) = _dropped(after)
    assert "recompile limit was hit" in note


def test_a_dropped_key_that_compiles_again_beside_the_kept_ones_says_why() -> None:
    """A probe compiles in between (not `compile_apart`), so the next key starts fresh and drops
    A; A then fits beside it, compiles again, and says why its code was gone."""
    forget_compiled()
    double = torch.compile(lambda x: x * 2, backend="eager")
    with keeping_compiled(3):
        _watched(double, A, torch.float32)  # type: ignore[arg-type]
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))  # a probe, say
        fresh = _watched(double, B, torch.float64)  # type: ignore[arg-type]
        again = _watched(double, A, torch.float32)  # type: ignore[arg-type]
        once_more = _watched(double, A, torch.float32)  # type: ignore[arg-type]
    (note,) = _dropped(fresh)
    assert "something else compiled" in note
    assert again.compile_s > 0 and _dropped(again) == [f"{note} (at an earlier run's start)"]
    assert once_more.compile_s == 0.0 and not _dropped(once_more)  # said once, then kept
