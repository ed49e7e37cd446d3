"""torch.compile in the loop, on the CPU through Inductor's C++ backend: it trains the same model,
and the run reports what compiling cost (seconds, graphs, graph breaks, cache hits)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from trainers import (
    ConfigError,
    LoopConfig,
    RunArgs,
    RunResult,
    UnsupportedOnDevice,
    Workload,
    compile_cache_dir,
    load_workload,
    min_warmup,
    run,
)
from trainers.blocks import find_blocks
from trainers.compilation import (
    CACHE_DIR_VARIABLE,
    NOTHING_COMPILED,
    RECOMPILE_LIMIT_HIT,
    CompileStats,
    CompileWatch,
    keeps_code,
    reuse_key,
)
from trainers.kept_code import ReuseKey, forget_compiled, keeping_compiled
from trainers.workloads import SyntheticBatches, disable_dropout
from trainers.workloads.mlp import classification_loss


def mlp_run(
    config: LoopConfig,
    *,
    dropout: bool = False,
    steps: int = 6,
    warmup: int = 2,
    precision: str | None = None,
) -> tuple[RunResult, nn.Module]:
    workload = load_workload("mlp", "tiny", seed=0)
    if not dropout:
        # Inductor draws dropout's random numbers its own way: without dropout, eager and
        # compiled runs can be compared loss for loss.
        disable_dropout(workload.model)
    result = run(
        workload,
        config,
        RunArgs(steps=steps, warmup=warmup, windows=2, device="cpu", precision=precision),
    )  # type: ignore[arg-type]
    return result, workload.model


def test_compiled_configs_need_warmup_steps() -> None:
    assert min_warmup(LoopConfig()) == 0
    assert min_warmup(LoopConfig(compile="default")) == 1
    assert min_warmup(LoopConfig(optimizer="compiled")) == 1
    assert min_warmup(LoopConfig(compile="reduce-overhead")) == 2
    assert min_warmup(LoopConfig(cuda_graph=True, compile="default")) == 4
    with pytest.raises(ConfigError) as info:
        run(
            load_workload("mlp", "tiny"),
            LoopConfig(compile="default"),
            RunArgs(steps=4, warmup=0, windows=1, device="cpu"),
        )
    assert info.value.field == "warmup"
    assert "an integer >= 1 with compile='default'" in str(info.value)


def test_reduce_overhead_needs_cuda() -> None:
    with pytest.raises(UnsupportedOnDevice, match="compile='reduce-overhead' needs a CUDA"):
        run(
            load_workload("mlp", "tiny"),
            LoopConfig(compile="reduce-overhead"),
            RunArgs(steps=4, warmup=2, windows=1, device="cpu"),
        )


def test_compile_cache_dir_sets_and_restores_inductors_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_DIR_VARIABLE, raising=False)
    with compile_cache_dir(tmp_path / "a") as folder:
        assert os.environ[CACHE_DIR_VARIABLE] == str(folder) == str((tmp_path / "a").resolve())
        assert folder.is_dir()
    assert CACHE_DIR_VARIABLE not in os.environ
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path / "shared"))
    with compile_cache_dir(tmp_path / "b"):
        assert os.environ[CACHE_DIR_VARIABLE] == str((tmp_path / "b").resolve())
    assert os.environ[CACHE_DIR_VARIABLE] == str(tmp_path / "shared")


@pytest.mark.slow
def test_compile_default_trains_the_mlp_and_reports_its_cost(tmp_path: Path) -> None:
    eager, _ = mlp_run(LoopConfig())
    assert eager.compile_s == 0.0 and eager.compile_cache_hits is None
    with compile_cache_dir(tmp_path / "inductor"):
        cold, model = mlp_run(LoopConfig(compile="default"))
        forget_compiled()  # as a new process: it would not keep the cold run's code
        warm, _ = mlp_run(LoopConfig(compile="default"))
    assert type(model) is nn.Sequential  # the workload's own module stays eager
    for result in (cold, warm):
        assert all(math.isfinite(x) for x in result.losses)
        # Inductor's fused kernels round differently; the training is the same.
        assert result.losses == pytest.approx(eager.losses, rel=1e-4)
        assert result.compile_s > 0
        assert result.graph_breaks == 0 and result.recompiles == 0
        assert not result.compile_unstable and result.compile_notes == []
    # A cold cache folder compiles; a second run in the same folder reads the graphs back.
    assert cold.compile_cache_misses and cold.compile_cache_misses > 0
    assert cold.compile_cache_hits == 0
    assert warm.compile_cache_hits and warm.compile_cache_hits > 0
    assert warm.compile_cache_misses == 0
    data = warm.to_dict()
    assert data["config"]["compile"] == "default" and data["compile_s"] == warm.compile_s


@pytest.mark.slow
def test_a_run_of_what_was_just_compiled_keeps_its_code(tmp_path: Path) -> None:
    """A run of the same model build and arithmetic as the last compiling run (the tuner's final
    round after the trial; the gate's config after its twin) keeps Dynamo's entries: nothing
    compiles. Other arithmetic, or another model, starts fresh."""
    workload = load_workload("mlp", "tiny", seed=0)
    args = RunArgs(steps=6, warmup=2, windows=2, device="cpu")

    def again(config: LoopConfig, on: Workload = workload) -> RunResult:
        return run(on, config, args)  # type: ignore[arg-type]

    def compiled_nothing(result: RunResult) -> bool:
        hits, misses = result.compile_cache_hits, result.compile_cache_misses
        return (hits, misses) == (0, 0) and result.compile_s == 0.0 and result.recompiles == 0

    compiled = LoopConfig(compile="default")
    with compile_cache_dir(tmp_path / "inductor"):
        first = again(compiled)
        second = again(compiled)
        loop_only = again(compiled.replace(sync_interval=2, num_streams=2))
        copy = again(compiled, load_workload("mlp", "tiny", seed=1))
        other = again(compiled.replace(optimizer="foreach"))
        back = again(compiled)
        # A compiled optimizer step holds its parameters and state until Dynamo is reset.
        stepped = [again(compiled.replace(optimizer="compiled")) for _ in range(2)]
        torch.compile(lambda x: x * 2)(torch.ones(3))  # something else compiles in between
        after_another = again(compiled)
        larger = again(compiled, load_workload("mlp", "small", seed=0))
    assert first.compile_cache_misses and first.compile_s > 0
    # Kept: no graph compiled, not even from the disk cache, and no compile time.
    for kept in (second, loop_only, copy):
        assert compiled_nothing(kept)
        assert all(math.isfinite(x) for x in kept.losses)
        # What a fresh process would pay is still said: the compile whose code it kept.
        assert kept.compile_kept_s == pytest.approx(first.compile_s)
    assert first.compile_kept_s == other.compile_kept_s == 0.0
    # Other arithmetic resets Dynamo: its graph comes back from the disk cache.
    assert other.compile_cache_hits and other.compile_s > 0
    # After that run, the first config compiles again: only the last run's code is kept.
    assert back.compile_cache_hits
    assert all(run.compile_kept_s == 0.0 and run.compile_cache_hits for run in stepped)
    assert after_another.compile_cache_hits  # what compiled in between is not the run's code
    assert not compiled_nothing(larger)  # another model's shapes start fresh too


@pytest.mark.slow
def test_configs_taking_turns_keep_their_code_side_by_side(tmp_path: Path) -> None:
    """`keeping_compiled`: the final round's entries take turns (A, B, A, B) between configs of
    other arithmetic; each compiles once and its later turns compile nothing, each through its
    own entries. A key past the limit starts fresh, and after the block a run of a kept key
    keeps, as one of another key starts fresh."""
    compiled = LoopConfig(compile="default")
    a, b = None, "bf16-autocast"  # other arithmetic, other graphs: two reuse keys

    def turn(precision: str | None, size: str = "tiny") -> RunResult:
        # A fresh copy of the build each turn, as the tuner's runs take: the same weights.
        args = RunArgs(steps=6, warmup=2, windows=2, device="cpu", precision=precision)
        return run(load_workload("mlp", size, seed=0), compiled, args)  # type: ignore[arg-type]

    with compile_cache_dir(tmp_path / "inductor"):
        with keeping_compiled(2):
            first_a, first_b, again_a, again_b = (turn(precision) for precision in (a, b, a, b))
            third = turn(a, "small")  # a third key: past the limit
            after_third = turn(a)
        turn(b)  # the only key kept now, and its code
        kept_after = turn(b)
        reset_after = turn(a)
    assert first_a.compile_s > 0 and first_b.compile_s > 0
    assert first_b.compile_kept_s == 0.0  # it compiled beside A's entries: nothing kept for it
    for first, again in ((first_a, again_a), (first_b, again_b)):
        assert (again.compile_cache_hits, again.compile_cache_misses) == (0, 0)
        assert again.compile_s == 0.0 and again.recompiles == 0
        assert again.compile_kept_s == pytest.approx(first.compile_s)
        assert again.losses == first.losses  # its own graphs: the same arithmetic, bit for bit
        # Its notes are its own: no guard failure of the other's first turn, and not "eager".
        assert not any(note.startswith("recompile") for note in again.compile_notes)
        assert NOTHING_COMPILED not in again.compile_notes
    assert third.compile_kept_s == 0.0 and third.compile_s > 0
    assert after_third.compile_kept_s == 0.0 and after_third.compile_s > 0
    assert kept_after.compile_kept_s > 0 and kept_after.compile_s == 0.0
    assert reset_after.compile_kept_s == 0.0 and reset_after.compile_s > 0


def test_what_keeps_code_side_by_side_is_what_the_guards_tell_apart() -> None:
    """`reuse_key`: the SDPA backend (no guard checks it) and the shapes the graphs take (the
    micro-batches, another model: a guard fails on a size, and Dynamo compiles dynamic sizes)
    are `unguarded`; float8's modules and the optimizer differ only where guards look."""
    model = load_workload("mlp", "tiny", seed=0).model
    cpu = torch.device("cpu")

    def key(settings: dict[str, object], on: nn.Module = model) -> ReuseKey:
        config = LoopConfig.from_dict({"compile": "default", **settings})
        made = reuse_key(on, config, None, cpu)
        assert made is not None
        return made

    base = key({})
    for apart in ({"attention": "flash"}, {"micro_batches": 2}):
        assert key(apart).unguarded != base.unguarded
    assert key({}, load_workload("mlp", "small", seed=0).model).unguarded != base.unguarded
    for beside in ({"float8_head": "float8"}, {"optimizer": "foreach"}):
        other = key(beside)
        assert other.unguarded == base.unguarded and other.guarded != base.guarded


def test_a_whole_step_graph_keeps_the_code_of_the_step_without_it() -> None:
    """A whole-step CUDA graph records the compiled model's kernels as the step launches them:
    its run shares the key of the same step without it (the scale space's graph trial runs right
    after its leader, and the final round takes turns between them), while a compile that
    records Inductor's own graphs, a compiled optimizer or a data-parallel wrapper keeps none."""
    model = load_workload("mlp", "tiny", seed=0).model
    cpu = torch.device("cpu")
    plain = LoopConfig(compile="default", num_streams=2)
    key = reuse_key(model, plain, "float8", cpu)
    assert key is not None and keeps_code(plain.replace(cuda_graph=True))
    assert reuse_key(model, plain.replace(cuda_graph=True, num_streams=1), "float8", cpu) == key
    assert reuse_key(model, plain.replace(cuda_graph=True), "bf16-autocast", cpu) != key
    for none in (
        {"compile": "reduce-overhead"},
        {"optimizer": "compiled"},
        {"parallel": "ddp"},
    ):
        config = plain.replace(**none)  # type: ignore[arg-type]
        assert not keeps_code(config) and reuse_key(model, config, "float8", cpu) is None, none


def test_keys_that_differ_where_no_guard_looks_never_share_dynamo() -> None:
    """`ReuseKey.unguarded`: two configs that differ in the SDPA backend (a context around the
    forward, which Inductor bakes into the graph and no guard of Dynamo checks) must not keep
    their code side by side, or the second would run the first's kernels. Keys that differ
    only where Dynamo's guards look (here the input's dtype) do."""
    double = torch.compile(lambda x: x * 2, backend="eager")

    def turn(key: ReuseKey, dtype: torch.dtype) -> CompileStats:
        return _watched(double, key, dtype)

    a = ReuseKey(guarded=("float32",), unguarded=(("attention", "default"),))
    b = ReuseKey(guarded=("float64",), unguarded=(("attention", "default"),))
    c = ReuseKey(guarded=("float64",), unguarded=(("attention", "flash"),))
    with keeping_compiled(3):
        first_a, first_b = turn(a, torch.float32), turn(b, torch.float64)
        again_a = turn(a, torch.float32)
        other_backend = turn(c, torch.float64)
        after = turn(a, torch.float32)
    assert first_a.compile_s > 0 and first_b.compile_s > 0 and first_b.kept_s == 0.0
    assert again_a.compile_s == 0.0 and again_a.kept_s == pytest.approx(first_a.compile_s)
    # A fresh Dynamo for the other backend (it compiled), and so for the run after it.
    assert other_backend.compile_s > 0 and other_backend.kept_s == 0.0
    assert after.compile_s > 0 and after.kept_s == 0.0


@pytest.mark.slow
def test_a_model_of_torch_nn_layers_compiles_per_block() -> None:
    """Dynamo skips the frames of torch.nn's own layers (`nn.TransformerEncoderLayer` here), so
    `nn.Module.compile` of each compiled nothing; each block is compiled from a frame of ours
    instead (`trainers.recompute`), and its losses are the eager run's within float tolerance."""
    per_block, model = _transformer_run(LoopConfig(compile="default", compile_scope="blocks"))
    eager, _ = _transformer_run(LoopConfig())
    blocks = find_blocks(model)
    assert blocks and all(type(b).__module__.startswith("torch.nn") for b in blocks)
    assert NOTHING_COMPILED not in per_block.compile_notes and per_block.compile_s > 0
    assert per_block.losses == pytest.approx(eager.losses, rel=1e-4)
    # Undone after the run: the blocks' own forward again.
    assert all("forward" not in vars(b) for b in blocks)


class _OwnLayer(nn.TransformerEncoderLayer):
    """A user's block: a class of their own module whose forward is torch.nn's."""


@pytest.mark.slow
def test_a_subclass_that_keeps_torch_nn_s_forward_compiles_per_block() -> None:
    def build(seed: int) -> Workload:
        torch.manual_seed(seed)
        layers = [_OwnLayer(16, 2, 32, dropout=0.0, batch_first=True) for _ in range(2)]
        model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * 4, 3))
        batches = SyntheticBatches((torch.randn(2, 4, 4, 16), torch.randint(0, 3, (2, 4))))
        return Workload(
            name="own-layers", preset="x", model=model, dataset=batches,
            loss_fn=classification_loss, samples_per_batch=4,
        )  # fmt: skip

    args = RunArgs(steps=3, warmup=2, windows=1, device="cpu")
    workload = build(0)
    assert [type(b) for b in find_blocks(workload.model)] == [_OwnLayer, _OwnLayer]
    per_block = run(workload, LoopConfig(compile="default", compile_scope="blocks"), args)
    eager = run(build(0), LoopConfig(), args)
    assert NOTHING_COMPILED not in per_block.compile_notes and per_block.compile_s > 0
    assert per_block.losses == pytest.approx(eager.losses, rel=1e-4)


@pytest.mark.slow
def test_a_key_that_runs_on_code_kept_beside_it_is_not_called_eager(tmp_path: Path) -> None:
    """Another optimizer is another key, but its graphs are the first's: beside it, it compiles
    nothing and ran compiled code, so it carries no `NOTHING_COMPILED` note."""
    args = RunArgs(steps=4, warmup=2, windows=1, device="cpu")
    compiled = LoopConfig(compile="default")
    with compile_cache_dir(tmp_path / "inductor"), keeping_compiled(2):
        first = run(load_workload("mlp", "tiny", seed=0), compiled, args)  # type: ignore[arg-type]
        other = compiled.replace(optimizer="foreach")
        beside = run(load_workload("mlp", "tiny", seed=0), other, args)  # type: ignore[arg-type]
    assert first.compile_s > 0 and NOTHING_COMPILED not in first.compile_notes
    assert beside.compile_s == 0.0 and beside.compile_kept_s == 0.0
    assert NOTHING_COMPILED not in beside.compile_notes


def _transformer_run(config: LoopConfig) -> tuple[RunResult, nn.Module]:
    workload = load_workload("transformer", "tiny", seed=0)
    disable_dropout(workload.model)
    args = RunArgs(steps=3, warmup=2, windows=1, device="cpu")
    return run(workload, config, args), workload.model  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_kept_run_that_compiled_again_is_not_kept_from(tmp_path: Path) -> None:
    """Half the batch: the same build and arithmetic (the same key), but Dynamo's guards fail
    and it compiles again beside the kept entries. The run after it starts fresh, or entries
    would pile up toward the recompile limit one run at a time."""
    import dataclasses

    from trainers.workloads import SyntheticBatches

    args = RunArgs(steps=4, warmup=2, windows=1, device="cpu")
    compiled = LoopConfig(compile="default")
    full = load_workload("mlp", "tiny", seed=0)
    batches = full.dataset
    assert isinstance(batches, SyntheticBatches)
    half = dataclasses.replace(
        load_workload("mlp", "tiny", seed=0),
        dataset=SyntheticBatches(tuple(t[:, : t.shape[1] // 2] for t in batches.tensors)),
        samples_per_batch=full.samples_per_batch // 2,
    )
    with compile_cache_dir(tmp_path / "inductor"):
        run(full, compiled, args)  # type: ignore[arg-type]
        smaller = run(half, compiled, args)  # type: ignore[arg-type]
        after = run(half, compiled, args)  # type: ignore[arg-type]
    # Kept, but its guards failed: it compiled (from the cache or not) and says what was kept.
    assert smaller.compile_kept_s > 0 and smaller.compile_s > 0
    assert after.compile_kept_s == 0.0 and after.compile_s > 0  # a fresh Dynamo


@pytest.mark.slow
def test_kept_code_does_not_keep_the_earlier_model(tmp_path: Path) -> None:
    """What Dynamo keeps between two runs of one build must not hold the first model: at 1B on
    a GPU that would be its weights, gradients and optimizer state."""
    import gc
    import weakref

    args = RunArgs(steps=4, warmup=2, windows=1, device="cpu")
    compiled = LoopConfig(compile="default")
    with compile_cache_dir(tmp_path / "inductor"):
        earlier = load_workload("mlp", "tiny", seed=0)
        run(earlier, compiled, args)  # type: ignore[arg-type]
        gone = weakref.ref(earlier.model)
        del earlier
        later = run(load_workload("mlp", "tiny", seed=1), compiled, args)  # type: ignore[arg-type]
    assert later.compile_cache_hits == 0 and later.compile_cache_misses == 0  # it was kept
    gc.collect()
    assert gone() is None


@pytest.mark.slow
def test_compiled_optimizer_trains_like_the_eager_one(tmp_path: Path) -> None:
    eager, _ = mlp_run(LoopConfig(), dropout=True)
    with compile_cache_dir(tmp_path / "inductor"):
        compiled, _ = mlp_run(LoopConfig(optimizer="compiled"), dropout=True)
    # Only the optimizer is compiled: the model's dropout draws stay eager, the losses match.
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5)
    assert compiled.compile_s > 0
    assert compiled.recompiles == 0 and not compiled.compile_unstable
    # torch.optim graph-breaks around the update on purpose; whatever it is, it is reported.
    assert compiled.graph_breaks == sum(n.startswith("graph break") for n in compiled.compile_notes)


@pytest.mark.slow
def test_bf16_autocast_under_compile(tmp_path: Path) -> None:
    with compile_cache_dir(tmp_path / "inductor"):
        fp32, _ = mlp_run(LoopConfig(compile="default"), precision="fp32")
        bf16, _ = mlp_run(LoopConfig(compile="default"), precision="bf16-autocast")
    assert bf16.precision == "bf16-autocast"
    assert all(math.isfinite(x) for x in bf16.losses)
    assert bf16.losses != fp32.losses
    assert bf16.losses == pytest.approx(fp32.losses, rel=0.05)
    assert bf16.graph_breaks == 0 and not bf16.compile_unstable


class GrowingBatches(Dataset[tuple[torch.Tensor, ...]]):
    """Batches of 4 samples, then of 6 from batch `grow_at` on: a new shape mid-run."""

    def __init__(self, grow_at: int) -> None:
        self.grow_at = grow_at

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(index)
        n = 4 if index < self.grow_at else 6
        return torch.randn(n, 8, generator=generator), torch.randint(
            0, 3, (n,), generator=generator
        )


@pytest.mark.slow
def test_a_recompile_during_the_timed_windows_is_flagged(tmp_path: Path) -> None:
    torch.manual_seed(0)
    workload = Workload(
        name="growing",
        preset="x",
        model=nn.Linear(8, 3),
        dataset=GrowingBatches(grow_at=4),
        loss_fn=classification_loss,
        samples_per_batch=4,
    )
    with compile_cache_dir(tmp_path / "inductor"):
        result = run(
            workload,
            LoopConfig(compile="default"),
            RunArgs(steps=6, warmup=2, windows=2, device="cpu"),
        )
    assert all(math.isfinite(x) for x in result.losses)
    assert result.recompiles >= 1
    assert result.compile_unstable
    assert "during the timed windows" in result.compile_notes[0]
    assert any(note.startswith("recompile:") for note in result.compile_notes)


def test_keys_kept_side_by_side_each_compile_within_dynamos_recompile_limit() -> None:
    """Each kept key adds entries to the same code objects: beside kept keys a run's recompile
    limit is Dynamo's own plus the graphs they compiled, so a second key compiles where the
    limit would have left its frame eager. A key alone keeps Dynamo's own limit (a config that
    hits it alone, hits it here), and the limit is restored after."""
    double = torch.compile(lambda x: x * 2, backend="eager")
    a = ReuseKey(guarded=("float32",), unguarded=())
    b = ReuseKey(guarded=("float64",), unguarded=())

    def turn(key: ReuseKey, *dtypes: torch.dtype) -> CompileStats:
        return _watched(double, key, *dtypes)

    with torch._dynamo.config.patch(recompile_limit=1):
        with keeping_compiled(3):
            first_a, first_b = turn(a, torch.float32), turn(b, torch.float64)
            again_a = turn(a, torch.float32)
            forget_compiled()
            alone = turn(a, torch.float32, torch.float64)  # two entries of one key: past 1
            after = turn(b, torch.float64)  # nothing kept from a run past the limit
        assert torch._dynamo.config.recompile_limit == 1
    assert first_a.compile_s > 0 and first_b.compile_s > 0  # b compiled beside a's entry
    assert RECOMPILE_LIMIT_HIT not in first_b.notes
    assert again_a.compile_s == 0.0 and again_a.kept_s == pytest.approx(first_a.compile_s)
    assert RECOMPILE_LIMIT_HIT in alone.notes
    assert after.compile_s > 0 and after.kept_s == 0.0 and RECOMPILE_LIMIT_HIT not in after.notes


def test_a_run_past_dynamos_recompile_limit_says_part_of_it_ran_eagerly() -> None:
    """Past Dynamo's recompile limit a function runs eagerly without an error; the run says so.
    A run within the limit does not."""
    double = torch.compile(lambda x: x * 2, backend="eager")

    def run_with(dtypes: tuple[torch.dtype, ...]) -> CompileStats:
        return _watched(double, None, *dtypes)

    with torch._dynamo.config.patch(recompile_limit=1):
        past = run_with((torch.float32, torch.float64))
        within = run_with((torch.float32,))
    assert RECOMPILE_LIMIT_HIT in past.notes
    assert RECOMPILE_LIMIT_HIT not in within.notes and within.compile_s > 0


def test_a_limit_hit_between_runs_starts_the_next_run_fresh() -> None:
    """A call past the recompile limit outside any watched run compiles no graph, so the graph
    count does not move, yet Dynamo compiles that function no more: the next run starts fresh
    instead of running on kept code."""
    double = torch.compile(lambda x: x * 2, backend="eager")
    a = ReuseKey(guarded=("float32",), unguarded=())

    def turn() -> CompileStats:
        return _watched(double, a, torch.float32)

    with torch._dynamo.config.patch(recompile_limit=1), keeping_compiled(2):
        first = turn()
        kept = turn()
        double(torch.ones(3, dtype=torch.float16))  # a second entry: past the limit of 1
        after = turn()
    assert first.compile_s > 0 and kept.compile_s == 0.0 and kept.kept_s > 0
    assert after.compile_s > 0 and after.kept_s == 0.0


def _watched(
    fn: Callable[[torch.Tensor], torch.Tensor], key: ReuseKey | None, *dtypes: torch.dtype
) -> CompileStats:
    """One run watched as `trainers.run` watches a compiling config's (`key` its reuse key):
    `fn` called on a small tensor of each of `dtypes` in one warm-up step."""
    watch = CompileWatch(torch.device("cpu"), active=True, reuse=key)
    with watch.warmup_step():
        for dtype in dtypes:
            fn(torch.ones(3, dtype=dtype))
    watch.end_warmup()
    return watch.finish([0.0])
