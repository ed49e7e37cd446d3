"""benchmarks/peers.py and its parts (`peers_loops`, `peers_tuning`, `peers_compare`,
`peers_record`) on the CPU: a user's own loop trains, the comparison's arithmetic, the outputs.
The measurements themselves are GPU evidence (docs/benchmarks/peers-*)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState

import trainers
from benchmarks import peers, peers_compare, peers_loops, peers_record, peers_tuning
from trainers import LoopConfig
from trainers.levers import Lever, ranked, registered
from tuner.search.measuring.measure import Measurer, Protocol
from tuner.search.proposing.screen import Incumbent, screen_record
from tuner.search.spaces.named import load_space
from tuner.store import keys


def test_a_users_loop_trains_and_reads_the_loss_every_ten_steps() -> None:
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    before = [p.detach().clone() for p in workload.model.parameters()]
    run = peers_loops.user_loop(
        workload,
        device=torch.device("cpu"),
        precision="fp32",
        fused=True,
        compile_mode=None,
        warmup=5,
        windows=3,
        window_steps=5,
    )
    assert len(run.windows_ms) == 3 and all(w > 0 for w in run.windows_ms)
    assert len(run.losses) == 2  # 20 steps, read at steps 10 and 20
    assert all(math.isfinite(x) for x in run.losses) and run.setup_s >= 0
    after = list(workload.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_compare_measures_every_setting_and_ranks_against_the_fastest_peer() -> None:
    measurer = Measurer(
        "mlp", "tiny", device="cpu", protocol=Protocol(warmup=2, windows=2, window_steps=5)
    )
    recommended = LoopConfig(optimizer="fused", sync_mode="event", sync_interval=10)
    log: list[str] = []
    out = peers_compare.compare(
        measurer,
        recommended,
        precision="fp32",
        rounds=2,
        log=log.append,
        peers=("pytorch-idiom", "fused-optimizer", "compile-reduce-overhead"),
    )
    assert set(out["peers"]) == {"pytorch-idiom", "fused-optimizer", "compile-reduce-overhead"}
    assert out["peers"]["compile-reduce-overhead"] == {"error": "reduce-overhead needs CUDA"}
    for name in ("pytorch-idiom", "fused-optimizer"):
        entry = out["peers"][name]
        assert len(entry["windows_ms"]) == 4 and len(entry["setup_s_rounds"]) == 2
        low, high = entry["ci95"]
        assert low <= entry["median_ms"] <= high
    assert out["harness"]["recommended"]["config"] == recommended.to_dict()
    measured = {
        n: e["median_ms"]
        for group in ("peers", "harness")
        for n, e in out[group].items()
        if "median_ms" in e
    }
    assert out["floor"]["median_ms"] == min(measured.values())
    best = out["ratio_vs_best_peer"]["best_peer"]
    assert best == min(("pytorch-idiom", "fused-optimizer"), key=measured.__getitem__)
    expected = measured[best] / measured["recommended"]
    assert out["ratio_vs_best_peer"]["ratio"] == pytest.approx(expected, rel=1e-9)
    low, high = out["ratio_vs_best_peer"]["ci95"]
    assert low <= out["ratio_vs_best_peer"]["ratio"] <= high
    # Interleaved: every round visits every setting before the next round starts.
    order = [line.split()[2] for line in log if line.startswith("round")]
    assert order[:4] == ["pytorch-idiom", "fused-optimizer", "recommended", "seed-baseline"]
    assert order[4:] == order[:4]


@contextlib.contextmanager
def _pause(value: object) -> Iterator[None]:
    if value == "on":
        time.sleep(0.005)  # far more than a tiny MLP's forward: the lever costs what it adds
    yield


PAUSE = Lever(
    name="pause_probe",
    label="a pause before each forward (a test's own lever)",
    kind="str",
    default="off",
    added=99,
    options=ranked(("off", "none", "exact", 0), ("on", "none", "equivalence", 0)),
    around_forward=_pause,
)


def test_the_ablation_measures_the_recommendation_without_each_lever_it_set() -> None:
    """Each lever module's lever the recommendation sets, set back to its default and measured
    interleaved: here a lever that only adds time, so the recommendation is slower with it."""
    measurer = Measurer(
        "mlp", "tiny", device="cpu", protocol=Protocol(warmup=1, windows=2, window_steps=4)
    )
    log: list[str] = []
    with registered(PAUSE):
        recommended = LoopConfig.from_dict({"optimizer": "fused", "pause_probe": "on"})
        assert peers_compare.ablations(recommended) == {
            "without-pause_probe": LoopConfig(optimizer="fused")
        }
        out = peers_compare.compare(
            measurer, recommended, precision="fp32", rounds=2, log=log.append, peers=()
        )
        text = peers_record._ablation(out)
    assert out["harness"]["without-pause_probe"]["config"]["pause_probe"] == "off"
    row = out["ablation"]["pause_probe"]
    assert (row["value"], row["default"]) == ("on", "off")
    low, high = row["ci95"]
    assert low <= row["ratio"] <= high < 1.0  # the lever cost time: the ablation is faster
    without = out["harness"]["without-pause_probe"]["median_ms"]
    assert row["ratio"] == pytest.approx(without / out["harness"]["recommended"]["median_ms"])
    assert text.startswith("pause_probe=on over off 0.")
    order = [line.split()[2] for line in log if line.startswith("round")]
    assert order[:3] == ["recommended", "without-pause_probe", "seed-baseline"] == order[3:]
    # A recommendation that sets no lever module's lever has nothing to ablate.
    assert peers_compare.ablations(LoopConfig(optimizer="fused")) == {}


def entry(ratio_low: float, speedup: float) -> dict[str, object]:
    return {
        "ratio_vs_best_peer": {"best_peer": "x", "ratio": 1.0, "ci95": [ratio_low, 1.1]},
        "speedup_vs_seed_baseline": {"ratio": speedup, "ci95": [speedup, speedup]},
    }


def test_the_aims_follow_the_issue() -> None:
    met = peers_compare.aims("transformer:small", "tf32", entry(0.99, 6.5))
    assert met == {
        "ratio_lower_bound_at_least_0.98": True,
        "speedup_vs_seed_baseline_at_least_6.0": True,
    }
    missed = peers_compare.aims("transformer:medium", "tf32", entry(0.97, 2.4))
    assert not any(missed.values()) and len(missed) == 2
    # The speedup aims are for TF32 transformers only.
    assert list(peers_compare.aims("transformer:large", "bf16-autocast", entry(1.0, 1.0))) == [
        "ratio_lower_bound_at_least_0.98"
    ]


def test_the_markdown_has_a_row_per_preset_and_names_failures() -> None:
    windows = [2.0, 2.1, 1.9]
    measured = {
        "median_ms": statistics.median(windows),
        "ci95": [1.9, 2.1],
        "setup_s": 0.5,
        "windows_ms": windows,
    }
    item = {
        "workload": "transformer",
        "preset": "small",
        "precision": "tf32",
        "peers": {"pytorch-idiom": measured, "compile-default": {"error": "boom"}},
        "harness": {"recommended": measured},
        "tuning": {
            "wall_s": 100.0,
            "gpu_s": 80.0,
            "failed_trials": [
                {"trial": 0, "config": LoopConfig(cuda_graph=True).to_dict(), "reason": "no sync"}
            ],
        },
        "recommended": {"config": LoopConfig(compile="default").to_dict(), "compile_s": 12.0},
        "aims": {},
        "ratio_vs_best_peer": {"best_peer": "pytorch-idiom", "ratio": 1.0, "ci95": [0.95, 1.05]},
    }
    meta = {
        "gpu": "GPU",
        "driver": "1",
        "cuda": "13",
        "torch": "2",
        "commit": "abc",
        "date": "d",
        "file": "f.json",
        "command": "c",
    }
    text = peers_record.to_markdown({"meta": meta, "presets": [item]})
    # A table: the delimiter row has as many cells as the header (else Markdown shows text).
    header, delimiter = [row for row in text.splitlines() if row.startswith("|")][:2]
    assert header.count("|") == delimiter.count("|")
    row = next(line for line in text.splitlines() if line.startswith("| transformer:small"))
    assert "2.00 (1.90-2.10)" in row and "failed" in row and "1.00 (0.95-1.05)" in row
    assert "compile-default failed: boom" in text and "compile=default" in text
    assert "tuning trial 0 (`cuda_graph=True`) failed: no sync" in text


def test_runs_merge_into_one_document_and_the_readme_table(tmp_path: Path) -> None:
    meta = {
        "gpu": "G",
        "driver": "1",
        "cuda": "13",
        "torch": "2",
        "date": "d",
        "file": "a.json",
        "commit": "c1",
        "command": "x",
    }
    item = {
        "workload": "transformer",
        "preset": "small",
        "precision": "tf32",
        "peers": {},
        "harness": {},
        "tuning": {"wall_s": 1.0, "gpu_s": None},
        "recommended": {"config": None},
        "aims": {},
    }
    runs = [
        {"meta": meta, "presets": [item]},
        {
            "meta": meta | {"file": "b.json", "commit": "c2"},
            "presets": [item | {"preset": "large"}],
        },
    ]
    data = peers_record.merge(runs)
    assert [p["preset"] for p in data["presets"]] == ["small", "large"]
    assert [p["run"] for p in data["presets"]] == ["a.json", "b.json"]
    assert data["meta"]["commit"] == "c1, c2"
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{peers_record.README_BEGIN}\nold\n{peers_record.README_END}\nend\n")
    peers_record.update_readme(readme, data)
    text = readme.read_text()
    assert "old" not in text and text.startswith("top\n") and text.endswith("end\n")
    assert "| transformer:large | tf32 |" in text and "commit `c1, c2`" in text
    with pytest.raises(SystemExit, match="different machines"):
        peers_record.merge([runs[0], {"meta": meta | {"gpu": "H"}, "presets": []}])
    # A merged document merges again as the runs it was made of; rows group by precision.
    later = {
        "meta": meta | {"file": "c.json", "commit": "c3", "date": "e"},
        "presets": [item | {"precision": "bf16-autocast"}, item | {"preset": "medium"}],
    }
    again = peers_record.merge([data, later])
    assert [(p["preset"], p["precision"], p["run"]) for p in again["presets"]] == [
        ("small", "tf32", "a.json"),
        ("large", "tf32", "b.json"),
        ("medium", "tf32", "c.json"),
        ("small", "bf16-autocast", "c.json"),
    ]
    assert again["meta"]["commit"] == "c1, c2, c3" and again["meta"]["date"] == "d, e"
    assert [m["file"] for m in again["meta"]["runs"]] == ["a.json", "b.json", "c.json"]


def test_the_command_line_merges_runs_and_regenerates_the_markdown(tmp_path: Path) -> None:
    """`--merge A B --readme R` and `--from-json`: records rewritten without measuring."""
    meta = dict.fromkeys(("gpu", "driver", "cuda", "torch", "date", "command"), "x")
    item = {
        "workload": "transformer",
        "preset": "small",
        "precision": "tf32",
        "peers": {},
        "harness": {},
        "tuning": {"wall_s": 1.0, "gpu_s": None},
        "recommended": {"config": None},
        "aims": {},
    }
    paths = []
    for name, preset, commit in (("a", "small", "c1"), ("b", "large", "c2")):
        run = {
            "meta": meta | {"file": f"{name}.json", "commit": commit},
            "presets": [item | {"preset": preset}],
        }
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run))
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{peers_record.README_BEGIN}\nold\n{peers_record.README_END}\n")
    out = tmp_path / "out"
    out.mkdir()
    peers.main(["--merge", *map(str, paths), "--out", str(out), "--readme", str(readme)])
    merged = out / "a-merged.json"
    data = json.loads(merged.read_text())
    assert data["meta"]["file"] == "a-merged.json" and data["meta"]["commit"] == "c1, c2"
    assert merged.with_suffix(".md").read_text() == peers_record.to_markdown(data)
    assert "| transformer:large | tf32 |" in readme.read_text() and "old" not in readme.read_text()
    merged.with_suffix(".md").unlink()
    peers.main(["--from-json", str(merged)])
    assert merged.with_suffix(".md").read_text() == peers_record.to_markdown(data)


def _out_of_memory_above(workload: trainers.Workload, samples: int) -> trainers.Workload:
    """The workload as on a device where a forward of more than `samples` samples runs out of
    memory."""
    loss_fn = workload.loss_fn

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        if batch[0].shape[0] > samples:
            raise torch.cuda.OutOfMemoryError(f"{batch[0].shape[0]} samples do not fit")
        return loss_fn(model, batch)

    return dataclasses.replace(workload, loss_fn=loss)


def test_the_accumulating_peer_halves_its_micro_batch_until_a_step_fits() -> None:
    """`accumulate-halves`: a step that runs out of memory is tried again in twice the
    micro-batches, as a user reruns it; one where a single sample does not fit is refused."""
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    assert workload.samples_per_batch == 16
    spec = peers_loops.PEERS["accumulate-halves"]
    common: dict[str, Any] = {
        "device": torch.device("cpu"),
        "precision": "fp32",
        "fused": spec["fused"],
        "compile_mode": None,
        "warmup": 2,
        "windows": 2,
        "window_steps": 5,
        "spec": spec | {"compile": None},  # uncompiled on a CPU: the halving is under test
    }
    run = peers_loops.user_loop(_out_of_memory_above(workload, 4), **common)
    assert run.micro_batches == 4 and len(run.windows_ms) == 2 and len(run.losses) == 1
    assert all(math.isfinite(x) for x in run.losses)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="one sample per micro-batch"):
        peers_loops.user_loop(_out_of_memory_above(workload, 0), **common)


def test_failed_tuning_trials_keep_their_config_and_reason(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'peers.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    graph = LoopConfig(cuda_graph=True).to_dict()
    for config, reason in ((graph, "capture failed: operation not permitted"), (None, None)):
        trial = study.ask()
        if config is None:  # a complete trial is not listed
            study.tell(trial, 1.0)
            continue
        trial.set_user_attr(keys.CONFIG, config)
        trial.set_user_attr(keys.FAILURE_REASON, reason)
        study.tell(trial, state=TrialState.FAIL)
    failed = peers_tuning.failed_trials(storage, "s")
    assert failed == [
        {"trial": 0, "config": graph, "reason": "capture failed: operation not permitted"}
    ]
    # Every finished trial, failed or complete, in order, with what the gate said.
    ran = peers_tuning.trial_results(storage, "s")
    assert [(r["trial"], r["state"], r["samples_per_s"]) for r in ran] == [
        (0, "fail", None),
        (1, "complete", 1.0),
    ]
    assert ran[0]["failure_reason"] == "capture failed: operation not permitted"
    assert ran[0]["config"] == graph and ran[1]["gate"] is None


def test_a_pruned_tuning_trial_says_why_in_the_record(tmp_path: Path) -> None:
    """A trial screened out keeps its screen's figure against the incumbent's, one skipped its
    prediction's reason, in the record and in its Markdown line; a complete one says nothing."""
    storage = f"sqlite:///{tmp_path / 'peers.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.tell(study.ask(), 36.4)
    screened, skipped = study.ask(), study.ask()
    screened.set_user_attr(
        keys.SCREEN,
        screen_record("measured", [33.0, 33.2], Incumbent(trial=0, throughput=36.4), 0.01),
    )
    skipped.set_user_attr(keys.PREDICTION, {"skip": "slower", "reason": "predicted 30 samples/s"})
    for trial in (screened, skipped):
        trial.set_user_attr(keys.PRECISION, "float8")
        study.tell(trial, state=TrialState.PRUNED)
    ran = peers_tuning.trial_results(storage, "s")
    assert ran[0]["why"] is None
    assert ran[1]["why"] == (
        "33.1 samples/s over 2 windows, more than 1% below trial 0's 36.4: not gated"
    )
    assert ran[2]["why"] == "not run: predicted 30 samples/s"
    assert peers_tuning.trial_line(ran[2]) == "pruned, float8: not run: predicted 30 samples/s"


def test_mfu_added_afterwards_counts_the_models_flops_over_the_recorded_step() -> None:
    entry = {"median_ms": 10.0, "ci95": [9.0, 11.0]}
    data = {
        "meta": {"gpu": "NVIDIA H100 80GB HBM3"},
        "presets": [
            {
                "workload": "transformer",
                "preset": "tiny",
                "precision": "bf16-autocast",
                "peers": {"compile-default": dict(entry), "failed-one": {"error": "x"}},
                "harness": {"recommended": dict(entry, median_ms=5.0)},
            },
            {"workload": "x", "preset": "y", "precision": "tf32", "error": "failed"},
        ],
    }
    out = peers_record.add_mfu(data)
    flops = trainers.flops.count_step_flops(
        trainers.load_workload("transformer", "tiny", seed=0), torch.device("cpu")
    )
    peer = out["presets"][0]["peers"]["compile-default"]
    assert peer["flops_per_step"] == flops > 0
    assert peer["mfu"] == pytest.approx(flops / 0.010 / 1e12 / 989.4)
    # Half the time, twice the utilisation; the entry without a time is left as it was.
    assert out["presets"][0]["harness"]["recommended"]["mfu"] == pytest.approx(2 * peer["mfu"])
    assert out["presets"][0]["peers"]["failed-one"] == {"error": "x"}
    assert "peak memory was not recorded" in out["meta"]["mfu_added"]
    assert "mfu" not in data["presets"][0]["peers"]["compile-default"]  # the input is kept
    # A record with peak memory (a recount after the attention fix) does not say it lacks it;
    # one where only some runs have it says so.
    data["presets"][0]["peers"]["compile-default"]["peak_memory_bytes"] = 10**9
    some = peers_record.add_mfu(data)["meta"]["mfu_added"]
    assert "recorded only by the runs that show it" in some
    data["presets"][0]["harness"]["recommended"]["peak_memory_bytes"] = 2 * 10**9
    recounted = peers_record.add_mfu(data)
    assert "peak memory" not in recounted["meta"]["mfu_added"]
    assert recounted["presets"][0]["peers"]["compile-default"]["peak_memory_bytes"] == 10**9


# -- float8 peers --------------------------------------------------------------------------------


class Decoder(torch.nn.Module):
    """Two layers found where `_layers` looks (`.layers`), and an output head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
            for _ in range(2)
        )
        self.odd = torch.nn.Linear(32, 20)  # 20 features: not a multiple of 16
        self.head = torch.nn.Linear(20, 48)  # the last linear: the output head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(self.odd(x))


def test_the_float8_peer_converts_as_torchaos_readme_and_puts_the_model_back() -> None:
    pytest.importorskip("torchao.float8")
    model = Decoder()
    before = dict(model.named_modules())
    params = {name: id(p) for name, p in model.named_parameters()}
    forward, undo = peers_loops._prepare_model(model, peers_loops.PEERS["float8-per-layer"])
    assert forward is model  # per-layer: the model itself, its layers compiled in place
    converted = {
        name.replace("_orig_mod.", "")  # the compiled layer's wrapper in the path
        for name, m in model.named_modules()
        if type(m).__name__ == "Float8Linear"
    }
    assert converted == {f"layers.{i}.{j}" for i in range(2) for j in (0, 2)}
    assert type(model.head) is torch.nn.Linear and type(model.odd) is torch.nn.Linear
    assert all(type(layer).__name__ == "OptimizedModule" for layer in model.layers)
    # torchao's modules hold the very same Parameters: the optimizer built before still trains.
    assert {name.replace("_orig_mod.", ""): id(p) for name, p in model.named_parameters()} == (
        params
    )
    undo()
    assert dict(model.named_modules()) == before  # the same module objects, back in place


def test_the_float8_whole_model_peer_compiles_the_converted_model() -> None:
    pytest.importorskip("torchao.float8")
    model = Decoder()
    forward, undo = peers_loops._prepare_model(model, peers_loops.PEERS["float8-compile"])
    assert type(forward).__name__ == "OptimizedModule" and forward._orig_mod is model
    assert type(model.layers[0][0]).__name__ == "Float8Linear"
    undo()
    assert type(model.layers[0][0]) is torch.nn.Linear


def test_a_failed_preparation_leaves_the_shared_model_as_it_was() -> None:
    """hf-checkpointing on a model that is not Hugging Face's fails; a float8 conversion made
    before that must not stay behind for the next peer."""
    pytest.importorskip("torchao.float8")
    model = Decoder()
    before = dict(model.named_modules())
    spec = {"fused": True, "compile": "default", "float8": True, "checkpointing": "hf"}
    with pytest.raises(ValueError, match="not a Hugging Face model"):
        peers_loops._prepare_model(model, spec)
    assert dict(model.named_modules()) == before


def test_float8_peers_name_what_they_need_on_a_cpu() -> None:
    cpu = torch.device("cpu")
    assert "bf16-autocast" in (peers_loops.float8_peer_error(cpu, "tf32") or "")
    why = peers_loops.float8_peer_error(cpu, "bf16-autocast") or ""
    assert "compute capability 8.9" in why
    measurer = Measurer(
        "mlp", "tiny", device="cpu", protocol=Protocol(warmup=1, windows=2, window_steps=3)
    )
    out = peers_compare.compare(
        measurer,
        LoopConfig(),
        precision="bf16-autocast",
        rounds=1,
        log=lambda text: None,
        peers=("fused-optimizer", "float8-compile"),
    )
    assert out["peers"]["float8-compile"] == {"error": why}
    # Only a peer without float8 was measured: the float8 group has nothing to compare against.
    assert out["ratio_vs_best_bf16_peer"] == out["ratio_vs_best_peer"]
    assert out["ratio_vs_best_bf16_peer"]["best_peer"] == "fused-optimizer"
    assert "ratio_vs_best_float8_peer" not in out


def test_float8_peers_join_where_the_job_may_choose_float8() -> None:
    assert peers_compare.peers_for("hf:causal-lm:llama-1b", None) == peers_loops.SCALE_PEERS
    both = peers_compare.peers_for("hf:causal-lm:llama-1b", None, ("bf16-autocast", "float8"))
    assert both == peers_loops.SCALE_PEERS + peers_loops.FLOAT8_PEERS
    assert (
        peers_compare.peers_for("transformer:small", None, ("bf16-autocast",))
        == peers_loops.SMALL_PEERS
    )
    assert peers_compare.allowed_precisions("bf16-autocast", "float8") == (
        "bf16-autocast",
        "float8",
    )
    assert peers_compare.allowed_precisions("bf16-autocast", "float8,bf16-autocast") == (
        "bf16-autocast",
        "float8",
    )
    assert peers_compare.allowed_precisions("bf16-autocast", None) is None


def test_the_float8_aims_follow_the_issue() -> None:
    def ratio(low: float) -> dict[str, object]:
        return {"best_peer": "x", "ratio": low + 0.01, "ci95": [low, low + 0.02]}

    met = {
        "tuning": {"precisions": ["bf16-autocast", "float8"]},
        "recommended": {"precision": "float8"},
        "ratio_vs_best_peer": ratio(1.0),
        "ratio_vs_best_bf16_peer": ratio(1.13),
        "ratio_vs_best_float8_peer": ratio(0.99),
    }
    assert peers_compare.aims("hf:causal-lm:llama-1b", "bf16-autocast", met) == {
        "ratio_lower_bound_at_least_0.98": True,
        "recommends_float8": True,
        "ratio_vs_best_bf16_peer_low_at_least_1.12": True,
        "ratio_vs_best_float8_peer_low_at_least_0.98": True,
    }
    missed = met | {
        "recommended": {"precision": "bf16-autocast"},
        "ratio_vs_best_bf16_peer": ratio(1.05),
        "ratio_vs_best_float8_peer": ratio(0.9),
    }
    aims = peers_compare.aims("hf:causal-lm:llama-1b", "bf16-autocast", missed)
    assert [k for k, v in aims.items() if not v] == [
        "recommends_float8",
        "ratio_vs_best_bf16_peer_low_at_least_1.12",
        "ratio_vs_best_float8_peer_low_at_least_0.98",
    ]
    # Every float8 peer failed: nothing was beaten, and the record must not read as if it was.
    unmeasured = {k: v for k, v in met.items() if k != "ratio_vs_best_float8_peer"}
    assert (
        peers_compare.aims("hf:causal-lm:llama-1b", "bf16-autocast", unmeasured)[
            "ratio_vs_best_float8_peer_low_at_least_0.98"
        ]
        is False
    )
    # A job that could not choose float8 has no float8 aims.
    assert "recommends_float8" not in peers_compare.aims("x:y", "bf16-autocast", {"tuning": {}})


def test_a_preset_whose_job_may_choose_a_precision_is_measured_in_the_chosen_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--allow-precisions`: the tuning job searches the preset's precision and the allowed ones;
    the recommendation is then measured, beside the peers, in the precision it chose."""
    import argparse

    args = argparse.Namespace(
        model_arg=[],
        device="cpu",
        trials=4,
        search_timeout=None,
        protocol=Protocol(warmup=1, windows=2, window_steps=3),
        final_rounds=1,
        rounds=1,
        peers="fused-optimizer",
        allow_precisions="bf16-autocast",
        parity_steps=4,
        precision_tolerance=5.0,
    )
    log: list[str] = []
    # What the recommendation was measured in: the precision each measurement of the comparison
    # (after the tuning job) asked for.
    asked: list[str | None] = []
    comparing: list[bool] = []
    measure, compare = Measurer.measure, peers.compare

    def spy(self: Measurer, config: LoopConfig, **kwargs: object) -> object:
        if comparing:
            asked.append(kwargs.get("precision"))  # type: ignore[arg-type]
        return measure(self, config, **kwargs)  # type: ignore[arg-type]

    def comparison(*args: object, **kwargs: object) -> object:
        comparing.append(True)
        return compare(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Measurer, "measure", spy)
    monkeypatch.setattr(peers, "compare", comparison)
    entry = peers.run_preset("mlp:tiny", "fp32", args, f"sqlite:///{tmp_path / 'p.db'}", log.append)
    assert entry["tuning"]["precisions"] == ["fp32", "bf16-autocast"]
    assert entry["vocab_size"] is None  # an MLP has no vocabulary
    chosen = entry["tuning"]["precision"]
    assert chosen in ("fp32", "bf16-autocast")
    assert entry["recommended"]["precision"] == chosen
    assert entry["harness"]["recommended"]["precision"] == chosen
    # The recommendation in its own (a precision other than the study's then measures again
    # through a Measurer of that precision, asking for none); the seed baseline in the study's.
    assert asked[0] == chosen and asked[-1] is None and len(asked) == (2 if chosen == "fp32" else 3)
    assert "may choose fp32,bf16-autocast" in log[0]
    # No float8 allowed: no float8 aims, no float8 ratios.
    assert "recommends_float8" not in entry["aims"] and "ratio_vs_best_float8_peer" not in entry
    # Each trial of each precision, with its speed and the gate's verdict, in the record.
    ran = entry["tuning"]["trial_results"]
    assert {r["precision"] for r in ran} == {"fp32", "bf16-autocast"}
    gated = [r for r in ran if r["gate"] is not None]
    assert gated and all(r["gate"]["passed"] == (r["state"] == "complete") for r in gated)
    # --precision-tolerance reaches the job: the bf16 trials are judged within 5x, not 3x.
    other = [r for r in gated if r["precision"] == "bf16-autocast"]
    assert other and all(r["gate"]["multiple"] == 5.0 for r in other)
    assert any(line.startswith("  trial ") and "samples/s" in line for line in log)
    meta = dict.fromkeys(
        ("gpu", "driver", "cuda", "torch", "commit", "date", "file", "command"), "x"
    )
    table = peers_record.to_markdown({"meta": meta, "presets": [entry]})
    assert f"  - tuning trial {gated[0]['trial']}: {gated[0]['state']}" in table


@pytest.mark.models
@pytest.mark.parametrize(("model_args", "expected"), [({}, None), ({"vocab": "1000"}, 1000)])
def test_the_record_names_the_vocabulary_the_models_config_has(
    model_args: dict[str, str], expected: int | None
) -> None:
    """A row's `vocab_size` is the Hugging Face config's, read through the workload's wrapper,
    whatever the preset or `--model-arg vocab=` made it; a model without one has none."""
    pytest.importorskip("transformers")
    workload = trainers.load_workload("hf:causal-lm", "tiny", seed=0, model_args=model_args)
    configs = [m.config for m in workload.model.modules() if hasattr(m, "config")]
    assert configs, "a Hugging Face model carries its config"
    size = peers.vocab_size(workload.model)
    assert size == configs[0].vocab_size
    assert expected is None or size == expected
    assert peers.vocab_size(trainers.load_workload("mlp", "tiny", seed=0).model) is None
    meta = dict.fromkeys(
        ("gpu", "driver", "cuda", "torch", "commit", "date", "file", "command"), "x"
    )
    entry = {
        "workload": "hf:causal-lm",
        "preset": "tiny",
        "precision": "fp32",
        "parameters": 10**6,
        "vocab_size": size,
        "model_args": model_args,
        "tuning": {"config": None},
        "recommended": {"config": {}, "precision": "fp32"},
        "aims": {},
        "peers": {},
        "harness": {},
    }
    table = peers_record.to_markdown({"meta": meta, "presets": [entry]})
    assert f"0.00B parameters, vocabulary {size:,}" in table


def test_a_float8_peer_of_a_model_without_a_qualifying_linear_fails_rather_than_run_bf16() -> None:
    """GPT-2's layers are Conv1D, its only nn.Linear the head: a float8 peer there would be a
    bf16 loop under a float8 name."""
    pytest.importorskip("torchao.float8")
    model = torch.nn.Sequential(
        torch.nn.Conv1d(4, 32, 1), torch.nn.Flatten(), torch.nn.Linear(32, 48)
    )
    with pytest.raises(ValueError, match=r"no plain nn\.Linear of this model qualifies"):
        peers_loops._prepare_model(model, peers_loops.PEERS["float8-compile"])
    assert type(model[2]) is torch.nn.Linear
    # nn.MultiheadAttention's out_proj is an nn.Linear subclass that torchao converts, but the
    # attention reads its weight directly: nothing would run in float8 there either.
    attention = torch.nn.ModuleDict(
        {"attn": torch.nn.MultiheadAttention(32, 2), "head": torch.nn.Linear(32, 48)}
    )
    out_proj = attention["attn"].out_proj
    with pytest.raises(ValueError, match="subclasses whose owners read the weight"):
        peers_loops._prepare_model(attention, peers_loops.PEERS["float8-compile"])
    assert attention["attn"].out_proj is out_proj  # put back


def _without_tuning(**given: Any) -> Any:
    """`run_preset`'s arguments for a tiny CPU comparison against one peer, with what stands in
    for the tuning job (`recommendation=` or `config=`)."""
    import argparse

    return argparse.Namespace(
        model_arg=[],
        device="cpu",
        protocol=Protocol(warmup=1, windows=2, window_steps=3),
        rounds=1,
        peers="fused-optimizer",
        allow_precisions=None,
        **({"recommendation": None, "config": None} | given),
    )


def test_the_peers_measure_a_default_jobs_recommendation_without_tuning_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--recommendation record.json`: the default job timed by `benchmarks/default_job.py` is
    the recommendation the peers are measured against; no second tuning job runs."""
    from benchmarks import default_job
    from tests.benchmarks.test_default_job import _passed

    default_job.main(
        ["--workload", "mlp", "--preset", "tiny", "--device", "cpu", "--runs", "cold",
         "--out", str(tmp_path), "--tag", "t", "--", *_passed(), "--trials", "2"]
    )  # fmt: skip
    [record] = tmp_path.glob("default-job-*-t.json")
    job = json.loads(record.read_text())["runs"][0]
    monkeypatch.setattr(peers, "tune", lambda *a, **k: pytest.fail("tuned again"))
    args = _without_tuning(recommendation=record)
    log: list[str] = []
    entry = peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    assert entry["recommended"]["config"] == job["recommendation"]["config"]
    assert entry["harness"]["recommended"]["config"] == job["recommendation"]["config"]
    assert entry["tuning"]["wall_s"] == job["wall_s"] and record.name in entry["tuning"]["source"]
    # The job's phases and search, for a row measured in a later machine start than its job.
    assert entry["tuning"]["time"] == job["time"] and job["time"]["phases"]
    assert entry["tuning"]["search"] == job["recommendation"]["search"] is not None
    assert "median_ms" in entry["peers"]["fused-optimizer"]
    with pytest.raises(SystemExit, match="no run recommended a config for mlp:small"):
        peers.run_preset("mlp:small", "fp32", args, "sqlite://", log.append)


def test_the_peers_measure_a_given_config_labelled_as_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config JSON`: a config a job found but could not finish deciding (its machine went
    back) is measured against the peers without a tuning job, and the record says it was given;
    a config that is not a LoopConfig is refused naming the flag and the field."""
    monkeypatch.setattr(peers, "tune", lambda *a, **k: pytest.fail("tuned"))
    given = {"optimizer": "fused", "sync_mode": "event", "sync_interval": 2}
    args = _without_tuning(config=json.dumps(given))
    log: list[str] = []
    entry = peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    expected = LoopConfig.from_dict(given).to_dict()
    assert entry["recommended"]["config"] == expected == entry["harness"]["recommended"]["config"]
    assert "median_ms" in entry["harness"]["recommended"]
    assert "given by --config" in entry["tuning"]["source"]
    meta = dict.fromkeys(
        ("gpu", "driver", "cuda", "torch", "commit", "date", "file", "command"), "x"
    )
    table = peers_record.to_markdown({"meta": meta, "presets": [entry]})
    assert "| - / - |" in table  # no tuning job: no wall time
    args.config = json.dumps({"sync_mode": "sometimes"})
    with pytest.raises(SystemExit, match="--config: sync_mode='sometimes'"):
        peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    # --config-precision: the given config runs in it, beside the preset's peers.
    args.config, args.config_precision = json.dumps(given), "bf16-autocast"
    entry = peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    assert entry["recommended"]["precision"] == "bf16-autocast"
    assert entry["harness"]["recommended"]["precision"] == "bf16-autocast"
    assert entry["precision"] == "fp32"  # the preset's, which the peers run in
    args.config_precision = "fp8"
    with pytest.raises(
        SystemExit,
        match="--config-precision: config_precision='fp8' is invalid: allowed one of fp32",
    ):
        peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    with pytest.raises(SystemExit, match="2"):
        peers.main(["--config-precision", "float8"])
    assert "--config-precision needs --config" in capsys.readouterr().err


def test_a_given_config_over_a_spaces_fixed_settings_keeps_the_spaces_feed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config-base scale`: a config that names only its levers runs on the scale space's feed
    (workers, prefetch, syncs) and its compile, not the loop's defaults; what the JSON names
    wins; an unknown space is one line naming the flag."""
    monkeypatch.setattr(peers, "tune", lambda *a, **k: pytest.fail("tuned"))
    args = _without_tuning(config=json.dumps({"compile": "none", "micro_batches": 2}))
    args.config_base = "scale"
    log: list[str] = []
    entry = peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    ran = entry["recommended"]["config"]
    fixed = load_space("scale").fixed
    assert ran["num_workers"] == fixed["num_workers"] and ran["num_workers"] > 0
    assert ran["prefetch_depth"] == fixed["prefetch_depth"] > LoopConfig().prefetch_depth
    assert ran["sync_interval"] == fixed["sync_interval"] > LoopConfig().sync_interval
    assert ran["compile"] == "none" and ran["micro_batches"] == 2  # the JSON over the space
    assert "over the scale space's fixed settings" in entry["tuning"]["source"]
    args.config_base = "roomy"
    with pytest.raises(SystemExit, match="--config-base: space='roomy' is invalid"):
        peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    args.config_base, args.config = None, "[1, 2]"
    with pytest.raises(SystemExit, match="--config: a JSON object of settings, not list"):
        peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", log.append)
    with pytest.raises(SystemExit, match="2"):
        peers.main(["--config-base", "scale"])
    assert "--config-base needs --config" in capsys.readouterr().err


def test_a_run_cut_after_its_first_round_keeps_that_round_in_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lent machine taken back in round 2 lost a whole row (2026-12-07: the record was written
    only when a preset ended): the record is written after each round, marked `rounds_done`."""
    monkeypatch.setattr(peers, "tune", lambda *a, **k: pytest.fail("tuned"))
    args = _without_tuning(config=json.dumps({"optimizer": "fused"}))
    args.rounds = 2
    saved: list[dict[str, Any]] = []
    entry = peers.run_preset("mlp:tiny", "fp32", args, "sqlite://", lambda _: None, saved.append)
    [first] = saved  # after round 1, not after the last
    assert first["rounds_done"] == 1 and "rounds_done" not in entry
    assert len(first["harness"]["recommended"]["windows_ms"]) == 2
    assert len(entry["harness"]["recommended"]["windows_ms"]) == 4
    assert "median_ms" in first["peers"]["fused-optimizer"] and "ratio_vs_best_peer" in first
    # The command line writes it: a run stopped during round 2 leaves round 1's record.
    cut = RuntimeError("machine taken back")

    def stop_in_round_two(*a: Any, **k: Any) -> None:
        if k["round_index"] == 1:
            raise cut
        return real(*a, **k)

    real = peers_compare.measure_in_round
    monkeypatch.setattr(peers_compare, "measure_in_round", stop_in_round_two)
    out = tmp_path / "out"
    # One preset's failure is caught and recorded, with the rounds it measured.
    peers.main(["--presets", "mlp:tiny", "--precisions", "fp32", "--device", "cpu",
                "--rounds", "2", "--peers", "fused-optimizer", "--protocol", "1,2,3",
                "--config", json.dumps({"optimizer": "fused"}), "--out", str(out)])  # fmt: skip
    [record] = out.glob("peers-*.json")
    [kept] = json.loads(record.read_text())["presets"]
    assert kept["rounds_done"] == 1 and len(kept["harness"]["recommended"]["windows_ms"]) == 2
    assert kept["error"] == "RuntimeError: machine taken back"
    assert "rounds 1 of 2" in record.with_suffix(".md").read_text()
