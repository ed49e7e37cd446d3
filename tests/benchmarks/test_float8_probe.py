"""benchmarks/float8_probe.py on the CPU: the bf16 row is measured, the float8 row records the
one-line refusal (no GPU of compute capability 8.9 here), and the files say so."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import float8_probe


def test_the_probe_records_bf16_and_the_float8_refusal(tmp_path: Path) -> None:
    data = float8_probe.main(
        [
            "--workload", "transformer", "--preset", "tiny", "--device", "cpu",
            "--scopes", "eager", "--steps", "2", "--warmup", "1", "--windows", "1",
            "--out", str(tmp_path), "--tag", "t", "--commit", "abc1234",
        ]
    )  # fmt: skip
    (path,) = tmp_path.glob("float8-probe-cpu-*-t.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(data))
    assert data["meta"]["commit"] == "abc1234" and data["meta"]["gpu"] == "CPU"
    bf16, fp8 = data["rows"]["bf16-autocast+eager"], data["rows"]["float8+eager"]
    assert bf16["median_ms"] > 0 and len(bf16["losses"]) == 3 and bf16["converted"] is None
    assert fp8["error"] == (
        "UnsupportedOnDevice: precision='float8': float8 matmuls need a CUDA GPU of compute "
        "capability 8.9 or later (H100, H200, L4, RTX 40xx); this run's device is cpu"
    )
    assert data["speedups"] == {}
    markdown = path.with_suffix(".md").read_text()
    assert (
        "| bf16-autocast+eager |" in markdown and "| float8+eager | UnsupportedOnDevice" in markdown
    )
