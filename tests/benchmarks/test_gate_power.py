"""benchmarks/gate_power.py and benchmarks/diagnose_graph_parity.py on the CPU: a smoke run of
each, with their outputs checked. Their GPU figures come from an H100 (not from here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import diagnose_graph_parity, gate_power, gate_power_report


def test_gate_power_cpu_smoke_run(tmp_path: Path) -> None:
    result = gate_power.main(
        [
            "--device",
            "cpu",
            "--runs",
            "2",
            "--models",
            "mlp,nosuch:model",
            "--steps",
            "10",
            "--out",
            str(tmp_path),
        ]
    )
    written = json.loads((tmp_path / "gate_power.json").read_text())
    assert written == json.loads(json.dumps(result, default=str))
    assert {"faults", "equivalent", "envelope", "fingerprint", "commit", "models"} <= set(written)
    assert written["fingerprint"]["device_type"] == "cpu"
    assert written["models"]["mlp@tiny"]["status"] == "ok"
    skipped = written["models"]["nosuch:model@tiny"]
    assert skipped["status"] == "skipped" and "nosuch" in skipped["reason"]

    faults = written["faults"]
    assert set(faults) == {"missing-wait", "missing-record-stream", "stale-graph-input", "wrong-op"}
    for kind in ("missing-wait", "missing-record-stream", "stale-graph-input"):
        assert faults[kind]["skipped"] and faults[kind]["runs"] == 0
    wrong = faults["wrong-op"]
    assert wrong["runs"] == 2 and 0 <= wrong["detected"] <= 2
    per = wrong["per_model"]["mlp@tiny"]
    assert per["runs"] == 2 and per["detected"] == wrong["detected"]
    assert per["caught_by_exact"] == 0  # the equivalence test alone was run
    assert per["caught_by_window"] + per["caught_by_drift"] >= per["detected"]
    assert per["detected_without_drift"] == per["caught_by_window"]
    assert len(per["window_ratios"]) == len(per["drift_ratios"]) == 2
    assert wrong["detected"] == 2  # a 1 % learning-rate error on mlp tiny

    # The shape: one entry per "<workload>/<config>".
    configs = {
        key.split("/", 1)[1]: entry
        for key, entry in written["equivalent"].items()
        if key.startswith("mlp@tiny/")
    }
    assert set(configs) == {"2-stream-event", "foreach-optimizer", "fused-optimizer"}
    for entry in configs.values():
        assert entry["runs"] == 2 and 0 <= entry["passed"] <= entry["passed_without_drift"] <= 2
        assert entry["passed"] + len(entry["failures"]) == entry["runs"]
    assert configs["2-stream-event"]["passed"] == 2

    env = written["envelope"]["mlp@tiny"]
    assert len(env["floor"]) == len(env["windows"]) == 2
    assert len(env["loo_window_ratios"]) == len(env["loo_drift_ratios"]) == 8  # 2 seeds x 4
    assert env["example"]["format"] == 1
    kept = written["trajectories"]["mlp@tiny"]
    assert set(kept) == {"0", "1"} and len(kept["0"]["perturbed"]) == 4
    assert set(kept["0"]["configs"]) == {"fault:wrong-op", *configs}
    assert all(len(losses) == 10 for losses in kept["0"]["configs"].values())
    table = (tmp_path / "gate_power.md").read_text()
    assert "| wrong-op | learning rate x 0.99 | 2 | 2 | 100% | mlp@tiny | 0 |" in table
    assert "skipped: CUDA only" in table


def test_diagnose_graph_parity_cpu_part(tmp_path: Path) -> None:
    report = diagnose_graph_parity.main(
        [
            "convnet",
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--steps",
            "6",
            "--perturbations",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert set(report["losses"]) == {"a"} and len(report["losses"]["a"]) == 6
    assert len(report["perturbed"]) == 2 and len(report["leave_one_out_ratios"]) == 2
    assert set(report["state_differences"]) == {"a vs p0", "a vs p1"}
    assert all(d["batchnorm_where"] != "-" for d in report["state_differences"].values())
    saved = json.loads((tmp_path / "diagnose_graph_parity.json").read_text())
    assert saved["losses"]["a"] == report["losses"]["a"]


def test_runs_of_disjoint_seeds_merge_into_one_result(tmp_path: Path) -> None:
    def part(seed: int) -> dict:
        args = ["--device", "cpu", "--runs", "1", "--models", "mlp", "--steps", "10"]
        args += ["--seed", str(seed), "--out", str(tmp_path / str(seed))]
        return gate_power.main(args)

    first, second = part(0), part(1)
    merged = gate_power_report.merge([first, second])
    wrong = merged["faults"]["wrong-op"]
    assert wrong["runs"] == 2 and wrong["per_model"]["mlp@tiny"]["runs"] == 2
    assert wrong["detected"] == (
        first["faults"]["wrong-op"]["detected"] + second["faults"]["wrong-op"]["detected"]
    )
    assert wrong["rate"] == wrong["detected"] / 2
    entry = merged["equivalent"]["mlp@tiny/2-stream-event"]
    assert entry["runs"] == 2 and len(entry["window_ratios"]) == 2
    assert entry["config"] == first["equivalent"]["mlp@tiny/2-stream-event"]["config"]
    assert set(merged["trajectories"]["mlp@tiny"]) == {"0", "1"}
    assert len(merged["envelope"]["mlp@tiny"]["floor"]) == 2
    assert merged["models"]["mlp@tiny"]["runs"] == 2 and merged["seed"] == 0
    assert "2 parts merged" in merged["notes"][0]
    # The parts are left as they were.
    assert first["faults"]["wrong-op"]["runs"] == 1

    with pytest.raises(ValueError, match="seed 0 of mlp@tiny is in two parts"):
        gate_power_report.merge([first, first])
    other = dict(second, steps=20)
    with pytest.raises(ValueError, match="'steps'"):
        gate_power_report.merge([first, other])

    gate_power_report.main(
        [str(tmp_path / s / "gate_power.json") for s in ("0", "1")]
        + ["--out", str(tmp_path / "m"), "--name", "merged"]
    )
    written = json.loads((tmp_path / "m" / "merged.json").read_text())
    assert written["faults"]["wrong-op"]["runs"] == 2
    assert "| wrong-op |" in (tmp_path / "m" / "merged.md").read_text()
