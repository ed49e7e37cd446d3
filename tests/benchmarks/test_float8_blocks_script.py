"""benchmarks/float8_blocks.py on the CPU: a Hugging Face decoder's linears grouped by the input
they read (q/k/v, gate/up) and alone, each counted over the model's depth from a cut model, and
the record it writes (float8 is refused on a CPU in one line; the bf16 figures mean nothing
here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.models
def test_the_script_groups_a_decoders_linears_and_scales_the_cut_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    args = {"arch": "llama", "hidden": "64", "layers": "4", "heads": "4", "kv_heads": "2"}
    args |= {"ffn": "128", "vocab": "256", "seq": "16", "batch": "2", "batches": "1"}
    flags = [f"--model-arg={k}={v}" for k, v in args.items()]
    flags += ["--layers", "1", "--device", "cpu", "--iters", "1", "--commit", "abc"]
    script = [sys.executable, "benchmarks/float8_blocks.py", "--presets", "hf:causal-lm:small"]
    done = subprocess.run(
        [*script, *flags, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("float8-blocks-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    (entry,) = data["presets"]
    assert entry["scale"] == 4 and entry["rows"] == 32  # one layer standing for four
    groups = {tuple(map(tuple, g["group"])): g["times"] for g in entry["siblings"]}
    # q/k/v read one input, gate/up another; o and down stand alone; each once a layer.
    assert groups == {
        ((64, 64, False), (64, 32, False), (64, 32, False)): 4,
        ((64, 64, False),): 4,
        ((64, 128, False), (64, 128, False)): 4,
        ((128, 64, False),): 4,
    }
    alone = {tuple(g["group"][0]): g["times"] for g in entry["per_linear"]}
    assert all(len(g["group"]) == 1 for g in entry["per_linear"])
    assert alone == {
        (64, 64, False): 8,
        (64, 32, False): 8,
        (64, 128, False): 8,
        (128, 64, False): 4,
    }
    for g in entry["siblings"] + entry["per_linear"]:
        assert g["bf16"] > 0 and "compute capability" in g["float8"]
    assert entry["block"]["bf16"] > 0 and "compute capability" in entry["block"]["float8"]
    assert "compute capability" in entry["siblings_ms"]
    table = path.with_suffix(".md").read_text()
    assert "| hf:causal-lm:small arch=llama" in table and "(4) |" in table
