"""Data parallelism: the levers' rules, each rank's shard, and real 2-process gloo runs under
torchrun on the CPU (DDP and FSDP2 against the single-process reference, a killed rank, a hung
rank). Each torchrun launch starts three Python processes (~5 s on the 2-core CI machine)."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
import torch

import trainers
from trainers import ConfigError, LoopConfig, RunArgs, canonical, invalid_reason, parity_losses
from trainers.distributed import agreement
from trainers.flops import count_step_flops
from trainers.parallel import shard_batch
from trainers.program import ProgramFailed, check_nproc, run_distributed
from trainers.program.torchrun import rank_failure
from trainers.workloads import load_workload

# ---------------------------------------------------------------------------- the levers' rules


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("parallel", "deepspeed", "none, ddp, fsdp2"),
        ("bucket_cap_mb", 0, "1..1024"),
        ("bucket_cap_mb", 2000, "1..1024"),
        ("bucket_cap_mb", 2.5, "1..1024"),
        ("gradient_as_bucket_view", "yes", "true or false"),
        ("static_graph", 1, "true or false"),
        ("reshard_after_forward", None, "true or false"),
        ("fsdp_prefetch", "on", "true or false"),
    ],
)
def test_each_lever_refuses_a_bad_value_naming_it(field: str, value: object, allowed: str) -> None:
    parallel = "fsdp2" if field in ("reshard_after_forward", "fsdp_prefetch") else "ddp"
    settings = {"parallel": parallel, field: value} if field != "parallel" else {field: value}
    with pytest.raises(ConfigError) as info:
        LoopConfig(**settings)  # type: ignore[arg-type]
    assert info.value.field == field
    assert allowed in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("settings", "field", "allowed"),
    [
        ({"bucket_cap_mb": 5}, "bucket_cap_mb", "25 with parallel='none'"),
        ({"parallel": "fsdp2", "static_graph": True}, "static_graph", "parallel='ddp' only"),
        (
            {"parallel": "fsdp2", "gradient_as_bucket_view": True},
            "gradient_as_bucket_view",
            "parallel='ddp' only",
        ),
        ({"parallel": "ddp", "fsdp_prefetch": True}, "fsdp_prefetch", "parallel='fsdp2' only"),
        (
            {"reshard_after_forward": False},
            "reshard_after_forward",
            "True with parallel='none'",
        ),
        ({"parallel": "ddp", "cuda_graph": True}, "cuda_graph", "false with parallel='ddp'"),
        ({"parallel": "fsdp2", "cuda_graph": True}, "cuda_graph", "cannot replay"),
        (
            {"parallel": "ddp", "compile": "reduce-overhead"},
            "compile",
            "splits the compiled graph at the gradient buckets",
        ),
        ({"parallel": "fsdp2", "compile": "reduce-overhead"}, "compile", "not proven"),
    ],
)
def test_each_refused_combination_names_the_field_and_the_reason(
    settings: dict[str, object], field: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        LoopConfig(**settings)  # type: ignore[arg-type]
    assert info.value.field == field
    assert allowed in str(info.value)
    reason = invalid_reason(settings)
    assert reason is not None and allowed in reason


def test_the_valid_combinations_build() -> None:
    for compile_mode in ("none", "default", "max-autotune-no-cudagraphs"):
        for parallel in ("ddp", "fsdp2"):
            assert invalid_reason({"parallel": parallel, "compile": compile_mode}) is None
    assert (
        LoopConfig(
            parallel="ddp", bucket_cap_mb=1, gradient_as_bucket_view=True, static_graph=True
        ).bucket_cap_mb
        == 1
    )
    assert not LoopConfig(parallel="fsdp2", reshard_after_forward=False).reshard_after_forward


def test_a_lever_inert_under_the_other_parallel_is_reset_so_no_duplicate_trial() -> None:
    sampled = {"parallel": "fsdp2", "bucket_cap_mb": 5, "static_graph": True, "fsdp_prefetch": True}
    assert canonical(sampled) == {
        "parallel": "fsdp2",
        "bucket_cap_mb": 25,
        "static_graph": False,
        "fsdp_prefetch": True,
    }
    ddp = canonical({"parallel": "ddp", "reshard_after_forward": False, "bucket_cap_mb": 5})
    assert ddp == {"parallel": "ddp", "reshard_after_forward": True, "bucket_cap_mb": 5}
    # Without parallel, every data-parallel setting is inert: one config, the default.
    none = canonical({"bucket_cap_mb": 100, "fsdp_prefetch": True})
    assert LoopConfig(**none) == LoopConfig()


def test_the_default_keeps_every_existing_config() -> None:
    assert trainers.REFERENCE.parallel == "none"
    assert (
        LoopConfig(num_streams=2).to_dict() | {"parallel": "none"}
        == LoopConfig(num_streams=2).to_dict()
    )


def test_nproc_outside_its_range_names_the_field() -> None:
    for bad in (0, 9, True, "2"):
        with pytest.raises(ConfigError, match=r"nproc_per_node=.* allowed an integer in 1\.\.8"):
            check_nproc(bad)
    assert check_nproc(2) == 2


# ------------------------------------------------------------------ shards, outside torchrun


def test_each_rank_gets_its_contiguous_shard_of_the_global_batch() -> None:
    x = torch.arange(12).reshape(6, 2)
    y = torch.arange(6)
    first, second, third = (shard_batch((x, y), rank, 3) for rank in range(3))
    assert torch.equal(first[1], torch.tensor([0, 1])) and torch.equal(
        third[1], torch.tensor([4, 5])
    )
    assert torch.equal(torch.cat([first[0], second[0], third[0]]), x)
    with pytest.raises(ConfigError, match="nproc_per_node=4 is invalid: allowed a divisor"):
        shard_batch((x, y), 0, 4)


def test_data_parallel_outside_a_torchrun_launch_is_refused_naming_parallel() -> None:
    workload = trainers.load_workload("mlp", "tiny")
    with pytest.raises(ConfigError) as info:
        trainers.run(
            workload,
            LoopConfig(parallel="ddp"),
            RunArgs(steps=2, warmup=0, windows=1, device="cpu"),
        )
    assert info.value.field == "parallel"
    assert "--nproc-per-node" in str(info.value)


def test_ranks_disagreeing_are_named() -> None:
    same = {"losses": [1.0, 2.0], "digest": [0.5, 1.5]}
    losses, why = agreement(
        [same, {"losses": [3.0, 4.0], "digest": [0.5, 1.5]}], LoopConfig(parallel="ddp")
    )
    assert why is None and losses == [2.0, 3.0]
    _, why = agreement(
        [same, {"losses": [1.0, 2.0], "digest": [0.5, 1.25]}], LoopConfig(parallel="ddp")
    )
    assert (
        why is not None
        and "rank 1's parameters differ from rank 0's" in why
        and "parameter 1" in why
    )
    _, why = agreement(
        [same, {"losses": [1.0], "digest": [0.5, 1.5]}], LoopConfig(parallel="fsdp2")
    )
    assert why == "rank 1 trained 1 steps, rank 0 2"


# ---------------------------------------------------------------------------- 2 processes, gloo

STEPS = 5  # the gate's trajectory: 1 untimed step + 4 timed


def _distributed(config: LoopConfig, workload: str = "mlp", **kwargs: object) -> trainers.RunResult:
    return run_distributed(
        workload,
        "tiny",
        config,
        trainers.RunArgs(steps=STEPS - 1, warmup=1, windows=2, device="cpu"),
        nproc=2,
        gate=True,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_data_parallel_losses_equal_the_single_process_reference_on_the_cpu(
    parallel: str,
) -> None:
    result = _distributed(LoopConfig(parallel=parallel))
    assert result.effective["world_size"] == 2 and result.effective["backend"] == "gloo"
    assert result.effective["replicas"] == ("identical" if parallel == "ddp" else "sharded")
    ranks = result.effective["rank_losses"]
    assert len(ranks) == 2 and ranks[0] != ranks[1]  # each rank trained on its own shard
    # The reported loss is the global batch's: the mean of the shards' (equal sizes).
    assert result.losses == pytest.approx([(a + b) / 2 for a, b in zip(*ranks, strict=True)])
    # One process accumulating the two shards as micro-batches is the same computation, bit for
    # bit here; the plain reference on the same global batch differs by rounding (mlp's loss is
    # a per-sample mean).
    accumulated = parity_losses(
        "mlp", "tiny", LoopConfig(micro_batches=2), RunArgs(steps=STEPS, device="cpu")
    )
    plain = parity_losses("mlp", "tiny", trainers.REFERENCE, RunArgs(steps=STEPS, device="cpu"))
    assert result.losses == pytest.approx(accumulated, abs=1e-6)
    assert result.losses == pytest.approx(plain, rel=1e-5)
    assert result.losses != pytest.approx([plain[0]] * STEPS)  # it trains
    # Each rank reports its own share of the step's model FLOPs (for its GPU's MFU): the global
    # batch's count over the two ranks.
    global_flops = count_step_flops(load_workload("mlp", "tiny", seed=0), torch.device("cpu"))
    assert global_flops > 0 and result.flops_per_step == global_flops // 2


def test_every_ddp_lever_trains_the_same_model() -> None:
    base = _distributed(LoopConfig(parallel="ddp"))
    levers = LoopConfig(
        parallel="ddp", bucket_cap_mb=1, gradient_as_bucket_view=True, static_graph=True
    )
    # Bucket size, gradient views and static graph change when the all-reduces run, not what
    # they sum: the same losses.
    assert _distributed(levers).losses == pytest.approx(base.losses, abs=1e-6)


def _ours(token: str) -> list[int]:
    """Live processes started under this test (they inherited its token)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if f"STREAMTUNE_TEST_TOKEN={token}".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_a_killed_rank_fails_the_run_with_its_stderr_and_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = uuid.uuid4().hex
    monkeypatch.setenv("STREAMTUNE_TEST_TOKEN", token)
    monkeypatch.setenv("STREAMTUNE_DIST_FAULT", "kill:1:0")
    with pytest.raises(ProgramFailed) as info:
        _distributed(LoopConfig(parallel="ddp"), timeout_s=120)
    message = str(info.value)
    assert "rank 1 of 2 failed (killed by SIGKILL)" in message
    assert "rank 1's stderr" in message
    assert _ours(token) == []


def _summary(failures: list[tuple[int, int]], root: tuple[int, int]) -> str:
    """torchrun's error summary (torch.distributed.elastic) for these (rank, exit code)s."""

    def entry(rank: int, code: int) -> str:
        return (
            f"[{rank}]:\n  time      : 2026-11-28_20:40:00\n  host      : localhost\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {100 + rank})\n"
            f"  error_file: <N/A>\n  traceback : Signal {-code} received by PID {100 + rank}\n"
        )

    listed = "".join(entry(*f) for f in failures) or "  <NO_OTHER_FAILURES>\n"
    bar = "-" * 60
    return (
        f"{'=' * 60}\ntrainers.distributed FAILED\n{bar}\nFailures:\n{listed}{bar}\n"
        f"Root Cause (first observed failure):\n{entry(*root)}{'=' * 60}\n"
    )


@pytest.mark.parametrize(
    ("failures", "root", "named", "after"),
    [
        # A rank killed, its peer's collective aborted, and torchrun saw the abort first.
        ([(1, -9)], (0, -6), "rank 1 of 2 failed (killed by SIGKILL)", "rank 0 then stopped"),
        ([], (1, -9), "rank 1 of 2 failed (killed by SIGKILL)", None),
        ([], (0, -6), "rank 0 of 2 failed (killed by SIGABRT)", None),  # an abort of its own
        ([(1, -15)], (0, 3), "rank 0 of 2 failed (exit code 3)", None),
    ],
)
def test_the_rank_named_is_the_one_that_failed_first_not_one_that_followed_a_peer(
    tmp_path: Path,
    failures: list[tuple[int, int]],
    root: tuple[int, int],
    named: str,
    after: str | None,
) -> None:
    (tmp_path / "stderr.txt").write_text(_summary(failures, root))
    (tmp_path / "ranks").mkdir()
    for rank in (0, 1):
        (tmp_path / "ranks" / f"rank{rank}.stderr").write_text(f"the stderr of rank {rank}")
    message = rank_failure("exit code 1", tmp_path, 2)
    assert message.startswith(named), message
    rank = named.split()[1]
    assert f"rank {rank}'s stderr: the stderr of rank {rank}" in message
    assert (after is None and "then stopped" not in message) or (
        after is not None and after in message
    )


def test_a_parameter_the_loss_never_uses_is_named_as_the_cause_under_ddp() -> None:
    """DDP's reducer stops the second step; the failure had been 30 lines of the ranks' torch
    traceback, advising a `find_unused_parameters` that no setting gives (a probe, 2026-12-06)."""
    with pytest.raises(trainers.TrainerError) as info:
        _distributed(LoopConfig(parallel="ddp"), "tests.trainers.own_workloads:unused_layer")
    first, _, rest = str(info.value).partition("\n")
    assert re.fullmatch(
        r"parallel=ddp: some of the model's parameters get no gradient \(rank \d: indices 2 3 "
        r"of model\.parameters\(\)\): DDP needs every parameter .* requires_grad=False on "
        r"those it leaves out",
        first,
    ), first
    assert rest.startswith("rank ") and "Expected to have finished reduction" in rest


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_a_hung_rank_fails_the_run_at_the_timeout_and_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = uuid.uuid4().hex
    monkeypatch.setenv("STREAMTUNE_TEST_TOKEN", token)
    monkeypatch.setenv("STREAMTUNE_DIST_FAULT", "hang:1:0")
    with pytest.raises(ProgramFailed) as info:
        _distributed(LoopConfig(parallel="ddp"), timeout_s=20)
    message = str(info.value)
    # Either the run's own timeout stopped every rank, or rank 0's collective timed out waiting
    # for rank 1 and torchrun stopped the rest: both name what happened.
    assert "timed out" in message or "rank 0 of 2 failed" in message, message
    assert _ours(token) == []


def test_float8_with_fsdp2_is_refused_naming_the_fields_and_what_is_allowed() -> None:
    why = invalid_reason({"parallel": "fsdp2"}, precision="float8")
    assert why is not None
    assert why.startswith("precision='float8' is invalid")
    assert "parallel='fsdp2'" in why and "float8 with parallel='ddp' or 'none'" in why
    assert "bf16-autocast" in why and "enable_fsdp_float8_all_gather" in why
    assert invalid_reason({"parallel": "ddp"}, precision="float8") is None
    assert invalid_reason({"parallel": "fsdp2"}, precision="bf16-autocast") is None
    # The refusal names torchao's real setting (the one a GPU test would turn on).
    config = pytest.importorskip("torchao.float8").Float8LinearConfig
    assert config(enable_fsdp_float8_all_gather=True).enable_fsdp_float8_all_gather
