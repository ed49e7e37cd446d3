"""Studies of N > 1 processes per trial: the flag, the space, a killed rank, and a 2-process gloo
study of transformer tiny tuned end to end through the CLI.

Each trial is a torchrun launch (three Python processes: 4-6 s each on the 2-core CI machine),
so the study is as small as a study gets: one trial, one final round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest
import torch

import trainers
from tests.tuner.test_cli_run import run_main
from tests.tuner.tiny import sqlite_url
from trainers import ConfigError, LoopConfig
from tuner.errors import SpaceError
from tuner.search.deciding.dpprofile import DataParallelProfiler
from tuner.search.measuring.measure import Failure, Measurer, Protocol
from tuner.search.options import BASELINES, RunOptions, baselines_for
from tuner.search.proposing.screen import screening
from tuner.search.proposing.stages import FEED, first_stage
from tuner.search.spaces.named import load_space
from tuner.search.spaces.processes import DATA_PARALLEL_LEVERS, for_processes
from tuner.search.spaces.space import config_key
from tuner.store import keys

REPO = Path(__file__).resolve().parents[2]
TINY_DP_FLAGS = (
    "--workload",
    "transformer",
    "--preset",
    "tiny",
    "--device",
    "cpu",
    "--warmup",
    "1",
    "--windows",
    "2",
    "--window-steps",
    "2",
    "--final-rounds",
    "1",
    "--top-k",
    "1",
    "--parity-steps",
    "4",
    "--sampler",
    "random",
    "--profile",
    "none",
    "--fix",
    "num_workers=0",
    "--nproc-per-node",
    "2",
)

# ---------------------------------------------------------------------------- options and space


def test_nproc_per_node_is_checked_naming_the_field() -> None:
    for bad in (0, 9):
        with pytest.raises(ConfigError, match=r"nproc_per_node=.*allowed an integer in 1\.\.8"):
            RunOptions(workload="mlp", preset="tiny", nproc_per_node=bad)
    with pytest.raises(ConfigError, match="nproc_per_node=2 is invalid: allowed 1 for a program"):
        RunOptions(workload="program:x", preset="tiny", nproc_per_node=2)


def test_the_baselines_of_n_processes_are_ddp_with_its_defaults() -> None:
    assert baselines_for(1) == BASELINES
    ddp = baselines_for(2)
    assert set(ddp) == set(BASELINES)
    assert all(c.parallel == "ddp" and c.bucket_cap_mb == 25 for c in ddp.values())
    assert ddp["seed-baseline"] == BASELINES["seed-baseline"].replace(parallel="ddp")
    # The single-process baselines keep the keys stored studies know them by.
    assert config_key(BASELINES["pytorch-default"]) == config_key(trainers.REFERENCE)


def test_the_space_of_n_processes_searches_the_data_parallel_levers() -> None:
    one = load_space("compile", cuda=True)
    assert for_processes(one, 1) == one
    space = for_processes(one, 2)
    for field, spec in DATA_PARALLEL_LEVERS.items():
        assert space.params[field] == spec
    assert space.fixed["cuda_graph"] is False and "cuda_graph" not in space.params
    assert "reduce-overhead" not in space.params["compile"].values  # type: ignore[union-attr]
    assert any("not proven with DDP or FSDP2" in note for note in space.notes)
    no_blocks = for_processes(load_space("full", cuda=False), 2, has_blocks=False)
    assert no_blocks.fixed["fsdp_prefetch"] is False and "fsdp_prefetch" not in no_blocks.params
    # Every config the space builds is valid: inert levers are reset (no duplicate trials).
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        config = space.suggest(study.ask())
        assert config.parallel in ("ddp", "fsdp2")
        if config.parallel == "fsdp2":
            assert config.bucket_cap_mb == 25 and not config.static_graph
        else:
            assert config.reshard_after_forward and not config.fsdp_prefetch


@pytest.mark.parametrize(
    ("fix", "nproc", "field", "allowed"),
    [
        (("parallel=ddp",), 1, "parallel", "'none' with nproc_per_node=1"),
        (("parallel=none",), 2, "parallel", "'ddp' or 'fsdp2' with nproc_per_node > 1"),
        (("cuda_graph=true",), 2, "cuda_graph", "false with nproc_per_node > 1"),
        (("compile=reduce-overhead",), 2, "compile", "with nproc_per_node > 1"),
    ],
)
def test_a_pin_the_processes_refuse_names_the_setting(
    fix: tuple[str, ...], nproc: int, field: str, allowed: str
) -> None:
    with pytest.raises(SpaceError) as info:
        for_processes(load_space("full", fix=fix, cuda=True), nproc)
    assert info.value.field == field and allowed in str(info.value)
    pinned = load_space("full", fix=fix, cuda=True).fixed[field]
    # A pin is echoed as its one value, not a list (a service client's probe).
    assert str(info.value).startswith(f"{field}={pinned!r} is invalid"), str(info.value)


def test_a_pin_of_a_lever_is_kept() -> None:
    space = for_processes(
        load_space("full", fix=("parallel=ddp", "bucket_cap_mb=5"), cuda=False), 2
    )
    assert space.fixed["parallel"] == "ddp" and space.fixed["bucket_cap_mb"] == 5
    assert "parallel" not in space.params and "static_graph" in space.params


@pytest.mark.parametrize(
    ("pin", "owner"), [("bucket_cap_mb=5", "ddp"), ("reshard_after_forward=false", "fsdp2")]
)
def test_a_pinned_setting_of_one_wrapper_fixes_parallel_to_it(pin: str, owner: str) -> None:
    """Under the other wrapper each draw reset the pin to its default (`trainers.canonical`),
    so no such trial kept it and none could be recommended."""
    space = for_processes(load_space("full", fix=(pin,), cuda=True), 2)
    assert space.fixed["parallel"] == owner and "parallel" not in space.params
    assert any(f"parallel fixed to {owner}: {pin.split('=')[0]}" in n for n in space.notes)
    plain = for_processes(load_space("full", cuda=True), 2)
    assert "parallel" in plain.params  # nothing pinned: both searched, as before


@pytest.mark.parametrize(
    ("fix", "precision", "why"),
    [
        (("bucket_cap_mb=5", "fsdp_prefetch=true"), None, "DDP's own are pinned too"),
        (("reshard_after_forward=false",), "float8", "float8 runs under DDP"),
    ],
)
def test_pins_of_both_wrappers_or_fsdp2_under_float8_are_refused(
    fix: tuple[str, ...], precision: str | None, why: str
) -> None:
    with pytest.raises(SpaceError) as info:
        for_processes(load_space("full", fix=fix, cuda=True), 2, precision=precision)
    assert info.value.field in ("fsdp_prefetch", "reshard_after_forward") and why in str(info.value)


# ---------------------------------------------------------------------------- a killed rank


def _ours(token: str) -> list[int]:
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
def test_a_killed_rank_fails_the_trial_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    token = uuid.uuid4().hex
    monkeypatch.setenv("STREAMTUNE_TEST_TOKEN", token)
    monkeypatch.setenv("STREAMTUNE_DIST_FAULT", "kill:1:0")
    measurer = Measurer(
        "transformer",
        "tiny",
        device="cpu",
        protocol=Protocol(warmup=1, windows=2, window_steps=2),
        nproc=2,
    )
    measurer.check()
    outcome = measurer.measure(LoopConfig(parallel="ddp"))
    assert isinstance(outcome, Failure)
    assert "rank 1 of 2 failed (killed by SIGKILL)" in outcome.reason
    assert "rank 1's stderr" in outcome.reason
    assert _ours(token) == []


def test_a_global_batch_that_does_not_split_is_refused_before_a_study() -> None:
    measurer = Measurer("transformer", "tiny", device="cpu", protocol=Protocol(), nproc=3)
    with pytest.raises(ConfigError, match="nproc_per_node=3 is invalid: allowed a divisor"):
        measurer.check()


# ---------------------------------------------------------------------------- end to end, CLI


def test_a_two_process_study_tunes_end_to_end_through_the_cli(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "run", *TINY_DP_FLAGS, "--trials", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "TUNER_STORAGE": storage},
    )
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["study"] == "transformer-tiny-cpu-x2"
    assert LoopConfig.from_dict(rec["config"]).parallel in ("ddp", "fsdp2")
    final = {entry["name"]: entry["config"] for entry in rec["final_round"]}
    assert final["pytorch-default"] == LoopConfig(parallel="ddp").to_dict()
    assert set(rec["speedup"]) == {"pytorch-default", "seed-baseline"}
    assert rec["trial_counts"]["complete"] + rec["trial_counts"]["failed"] == 1
    study = optuna.load_study(study_name=rec["study"], storage=storage)
    trial = study.trials[0]
    assert trial.user_attrs["config"]["parallel"] in ("ddp", "fsdp2")
    # The trial, and each final-round entry that could tie with the fastest (a baseline that
    # cannot is not gated: `recommend._eligible`), went through the data-parallel gate: the ranks
    # agreed and the losses stayed inside the single-process envelope.
    verdicts = [v for k, v in study.user_attrs.items() if k.startswith(keys.PARITY_PREFIX)]
    assert 1 <= len(verdicts) <= 3
    for verdict in verdicts:
        assert "the ranks agree (world size 2, gloo" in verdict["reason"], verdict["reason"]
        assert verdict["test"] == "equivalence"
    assert rec["parity"]["passed"] is True
    assert study.user_attrs[keys.META]["nproc_per_node"] == 2


def test_the_cli_flag_names_itself_when_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    code, _, err = run_main(
        capsys, "run", *TINY_DP_FLAGS[:-1], "9", "--trials", "1", "--storage", storage
    )
    assert code != 0
    assert "--nproc-per-node: nproc_per_node=9 is invalid: allowed an integer in 1..8" in " ".join(
        err.split()
    )


# ---------------------------------------------------------------------------- profiles


def test_rank_zero_profiles_a_data_parallel_config() -> None:
    profiler = DataParallelProfiler(
        "mlp",
        "tiny",
        nproc=2,
        steps=2,
        warmup=1,
        seed=0,
        device=torch.device("cpu"),
        matmul_precision="highest",
    )
    prof = profiler(LoopConfig(parallel="ddp"))
    assert prof.config["parallel"] == "ddp" and prof.steps == 2
    assert prof.step_ms > 0 and prof.unprofiled_step_ms is not None
    # The recorded window is rank 0's third: its ProfilerStep annotation and DDP's own ops.
    names = {str(e.get("name", "")) for e in prof.trace()["traceEvents"]}
    assert any(name.startswith("ProfilerStep#") for name in names)
    assert any("DistributedDataParallel" in name or "c10d" in name for name in names), sorted(
        names
    )[:50]
    # No CUDA here: no kernels, so no communication figures, and the CPU's note.
    assert prof.comm_exposed_fraction is None and not prof.cuda_activity


# ---------------------------------------------------------------------------- the levers reached


def test_the_data_parallel_space_reaches_the_compiler_and_recomputation() -> None:
    space = for_processes(load_space("auto", cuda=True), 2)
    values = {f: set(s.values) for f, s in space.params.items() if hasattr(s, "values")}
    assert {"default", "none"} <= values["compile"]
    assert values["compile_scope"] == {"model", "blocks"}
    assert "fused" in values["optimizer"]
    assert {"selective", "blocks"} <= values["activation_checkpointing"]
    assert values["parallel"] == {"ddp", "fsdp2"}
    for field in ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph"):
        assert field in space.params  # DDP's
    for field in ("reshard_after_forward", "fsdp_prefetch"):
        assert field in space.params  # FSDP2's
    # Without repeated blocks there is nothing to compile or recompute block by block.
    plain = for_processes(load_space("auto", cuda=True), 2, has_blocks=False)
    assert "compile_scope" not in plain.params and "compile" in plain.params
    # One process: the single-GPU space, untouched.
    assert for_processes(load_space("auto", cuda=True), 1) == load_space("auto", cuda=True)


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_a_data_parallel_study_starts_from_valid_compiled_corners(device_type: str) -> None:
    space = for_processes(load_space("compile", cuda=device_type == "cuda"), 2)
    corners = [space.fixed | p for p in first_stage(space, device_type=device_type)]
    for corner in corners:
        assert trainers.invalid_reason(corner, device_type=device_type) is None
    found = [(c["parallel"], c["compile"], c["compile_scope"], c["optimizer"]) for c in corners]
    idiom = BASELINES["pytorch-default"].to_dict()
    feed = ("num_streams", "sync_mode", "sync_interval", "prefetch_depth", "pin_memory")
    assert space.params["num_streams"].low == 1  # type: ignore[union-attr]  # the peers' one
    # First the torchrun peers exactly as users write them, on the PyTorch idiom's feed (the
    # search measures what it is compared with): DDP around the whole compiled model, FSDP2
    # with each block compiled. Then, on the prefetching feed, the cheapest compile first.
    assert found[:5] == [
        ("ddp", "default", "model", "fused"),
        ("fsdp2", "default", "blocks", "fused"),
        ("ddp", "default", "blocks", "fused"),
        ("fsdp2", "default", "blocks", "fused"),
        ("ddp", "default", "model", "fused"),
    ]
    for corner in corners[:2]:
        assert {f: corner[f] for f in feed} == {f: idiom[f] for f in feed}
    for corner in corners[2:]:
        assert {f: corner[f] for f in feed} == {f: FEED[f] for f in feed}
    assert all(c["compile"] != "none" and not c["cuda_graph"] for c in corners)
    assert any(c["parallel"] == "fsdp2" and not c["reshard_after_forward"] for c in corners)


def test_float8_keeps_a_data_parallel_study_on_ddp() -> None:
    space = for_processes(load_space("auto", cuda=True), 2, precision="float8")
    assert space.fixed["parallel"] == "ddp" and "parallel" not in space.params
    assert "reshard_after_forward" not in space.params  # FSDP2's levers are inert under DDP
    assert any("float8 with FSDP2 is refused" in note for note in space.notes)
    corners = [space.fixed | p for p in first_stage(space, device_type="cuda", precision="float8")]
    # The peers' corners on the idiom's feed (FSDP2's becomes DDP's each block compiled), then
    # the prefetching feed's.
    assert [(c["compile_scope"], c["parallel"], c["num_streams"]) for c in corners] == [
        ("model", "ddp", 1),
        ("blocks", "ddp", 1),
        ("blocks", "ddp", FEED["num_streams"]),
        ("model", "ddp", FEED["num_streams"]),
    ]
    for corner in corners:
        assert trainers.invalid_reason(corner, precision="float8", device_type="cuda") is None
    with pytest.raises(SpaceError) as info:
        for_processes(load_space("auto", fix=("parallel=fsdp2",)), 2, precision="float8")
    assert info.value.field == "parallel" and "ddp with precision float8" in str(info.value)


def test_a_data_parallel_study_screens_by_default() -> None:
    assert screening("auto", "auto", multi_objective=False, nproc=2)
    assert not screening("auto", "auto", multi_objective=False, nproc=1)  # one GPU: as before
    assert not screening("off", "auto", multi_objective=False, nproc=2)
    assert not screening("auto", "auto", multi_objective=True, nproc=2)


def test_a_cancel_stops_a_data_parallel_gates_launch() -> None:
    """The gate's torchrun launch polled no stop: a cancel in a data-parallel trial's gate
    waited for the ranks to train the config and the baselines beside it. Stopped, it is not
    tried again alone (as a baseline's failure is), and no verdict comes of it."""
    import time

    from trainers.program import ProgramStopped
    from tuner.search.gating.dpgate import DataParallelGate

    args = trainers.RunArgs(steps=4, warmup=0, windows=1, device="cpu", seed=0)
    asked: list[float] = []

    def stop() -> bool:
        asked.append(time.perf_counter())
        return True

    gate = DataParallelGate(
        "mlp",
        "tiny",
        args,
        nproc=2,
        matmul_precision="highest",
        batch=list(baselines_for(2).values()),
        should_stop=stop,
    )
    started = time.perf_counter()
    with pytest.raises(ProgramStopped):
        gate.check(LoopConfig(parallel="ddp", bucket_cap_mb=1), envelope={"unused": True})
    assert asked and time.perf_counter() - started < 60
    gate.close()


def test_one_process_leaves_a_wrappers_settings_out_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bucket_cap_mb` searched with one process ran inert in every trial, unsaid (a probe,
    2026-12-06): it is left out with a note, and a space of nothing else is refused."""
    space = load_space(
        {"bucket_cap_mb": [25, 50], "static_graph": [False, True], "num_streams": [1, 2]}
    )
    one = for_processes(space, 1)
    assert list(one.params) == ["num_streams"]
    assert one.notes[-1].startswith("bucket_cap_mb, static_graph left out")
    assert for_processes(space, 2).params["bucket_cap_mb"] == space.params["bucket_cap_mb"]
    only = tmp_path / "space.json"
    only.write_text('{"bucket_cap_mb": [25, 50]}')
    args = ("run", "--workload", "mlp", "--preset", "tiny", "--device", "cpu", "--trials", "2")
    code, _, err = run_main(capsys, *args, "--space", str(only), "--storage", sqlite_url(tmp_path))
    assert code == 2 and "space=['bucket_cap_mb'] is invalid" in err, err
    assert "inert with nproc_per_node 1" in err and "baseline" not in err
