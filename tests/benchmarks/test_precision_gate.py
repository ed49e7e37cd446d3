"""`benchmarks/precision_gate.py` on the CPU: one config in another precision than the study's,
judged as a tuning job judges it, recorded with its verdict, envelope and seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import precision_gate


def test_a_config_in_another_precision_is_judged_and_recorded(tmp_path: Path) -> None:
    config = {"num_streams": 2, "sync_interval": 3}
    precision_gate.main(
        [
            *("--workload", "mlp", "--preset", "tiny", "--device", "cpu"),
            *("--precision", "bf16-autocast", "--config-precision", "fp32"),
            *("--config", json.dumps(config), "--parity-steps", "3"),
            *("--precision-parity-steps", "8", "--precision-tolerance", "4"),
            *("--commit", "abc1234", "--tag", "t", "--out", str(tmp_path)),
        ]
    )
    (path,) = tmp_path.glob("precision-gate-*-t.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    verdict = data["verdict"]
    assert verdict["passed"], verdict["reason"]
    assert (verdict["precision"], verdict["reference_precision"]) == ("fp32", "bf16-autocast")
    # 8 steps judged against the seed-to-seed envelope, the twin's bits over the first 3.
    assert (verdict["steps"], verdict["exact_steps"], verdict["multiple"]) == (8, 3, 4.0)
    assert data["envelope"]["spread"] == "seeds" and data["envelope"]["steps"] == 8
    assert set(data["time"]) >= {"gate_reference", "gate_envelope", "gate_twin", "gate_config"}
    assert data["config"]["num_streams"] == 2 and data["meta"]["commit"] == "abc1234"
    table = path.with_suffix(".md").read_text(encoding="utf-8")
    assert "| exact_steps | 3 |" in table and "seeds, 4 runs around the reference" in table


def test_a_bad_config_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--config: sync_mode='sometimes'"):
        precision_gate.main(
            [
                *("--workload", "mlp", "--preset", "tiny", "--device", "cpu"),
                *("--precision", "bf16-autocast", "--config-precision", "fp32"),
                *("--config", json.dumps({"sync_mode": "sometimes"}), "--out", str(tmp_path)),
            ]
        )
