"""benchmarks/float8_shapes.py on the CPU: the shapes a float8 run converts, counted as its plan
converts them (the head and a linear float8 cannot take left out, Conv1D counted), and the
record it writes (float8 is refused on a CPU in one line; the bf16 figures mean nothing here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.float8_shapes import shapes, tokens

ROOT = Path(__file__).resolve().parents[2]


class _Decoder(nn.Module):
    """Two blocks of a q/k/v/o attention's projections and an MLP, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "q": nn.Linear(64, 64, bias=False),
                    "k": nn.Linear(64, 16, bias=False),
                    "v": nn.Linear(64, 16, bias=False),
                    "up": nn.Linear(64, 256),
                    "odd": nn.Linear(64, 10),  # not a multiple of 16: float8 cannot take it
                }
            )
            for _ in range(2)
        )
        self.lm_head = nn.Linear(64, 96, bias=False)


def test_shapes_counts_what_the_float8_plan_converts_by_in_out_and_bias() -> None:
    found = shapes(_Decoder())
    assert found == {(64, 64, False): 2, (64, 16, False): 4, (64, 256, True): 2}


@pytest.mark.models
def test_shapes_counts_hugging_face_conv1d_by_its_in_and_out_features() -> None:
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    model = nn.Module()
    model.c_attn = Conv1D(96, 32)  # nf (out) first, nx (in) second: weight is in x out
    model.c_proj = Conv1D(32, 32)
    model.lm_head = nn.Linear(32, 64, bias=False)
    assert shapes(model) == {(32, 96, True): 1, (32, 32, True): 1}


def test_tokens_are_the_first_tensors_elements() -> None:
    assert tokens((torch.zeros(8, 2048, dtype=torch.long), torch.zeros(8, 2048))) == 16384
    assert tokens(("a name", torch.zeros(4, 3))) == 12


def test_the_script_records_each_shape_with_bf16_timed_and_float8_refused_on_a_cpu(
    tmp_path: Path,
) -> None:
    flags = ["--presets", "transformer:tiny", "--device", "cpu", "--iters", "1", "--launched"]
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/float8_shapes.py",
            *flags,
            "--commit",
            "abc",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("float8-shapes-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    (entry,) = data["presets"]
    assert entry["rows"] > 0 and entry["shapes"]
    for shape in entry["shapes"]:
        assert shape["count"] >= 1 and shape["ms"]["bf16"] > 0
        assert "compute capability" in shape["ms"]["float8"]
        launched = shape["ms_launched"]  # beside the graphed figures, with --launched
        assert launched["bf16"] > 0 and "compute capability" in launched["float8"]
        assert shape["speedup"] is None and shape["step_ms_saved"] is None
    # Largest first: the order a reader scans for what pays.
    sizes = [s["in"] * s["out"] for s in entry["shapes"]]
    assert sizes == sorted(sizes, reverse=True)
    table = path.with_suffix(".md").read_text()
    assert "| transformer:tiny | " in table and "| bf16 ms as launched |" in table
