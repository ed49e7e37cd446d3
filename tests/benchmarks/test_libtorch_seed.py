"""benchmarks/libtorch_seed.py on the CPU (tiny preset): it builds the C++ trainer, tunes it,
runs every seed config in C++ and in Python, and finds the C++ losses inside the Python
envelope. The figures are CPU timings of a smoke run; the GPU run is in docs/benchmarks/."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from benchmarks import libtorch_seed

pytestmark = pytest.mark.slow


def test_the_seed_configs_run_in_both_languages_and_agree(tmp_path: Path) -> None:
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        if os.environ.get("STREAMTUNE_REQUIRE_LIBTORCH") == "1":
            pytest.fail("cmake and a C++ compiler are needed to build examples/libtorch")
        pytest.skip("cmake or a C++ compiler is missing")
    libtorch_seed.main(
        [
            "--device", "cpu", "--precision", "fp32", "--presets", "tiny", "--rounds", "2",
            "--steps", "4", "--warmup", "1", "--windows", "2", "--tune-trials", "2",
            "--parity-steps", "8", "--tag", "t", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    (path,) = tmp_path.glob("libtorch-seed-*-t.json")
    (entry,) = json.loads(path.read_text())["presets"]
    # The CPU has no graphs; every other seed config, and the tuned one, ran in both languages.
    expected = {n for n, c in libtorch_seed.SEED_CONFIGS.items() if not c.cuda_graph}
    assert set(entry["cpp"]) == set(entry["python"]) == expected | {"cpp-recommended"}
    assert all(len(s["windows_ms"]) == 4 for s in entry["cpp"].values())
    # LibTorch's stock forward, for the seed's two sync settings; nothing failed.
    assert set(entry["cpp_stock"]) == {libtorch_seed.BASELINE, "seed-events-every-10"}
    assert entry["failures"] == {}
    assert entry["rounds_done"] == 2
    baseline = entry["gain_vs_seed_baseline"]["cpp"][libtorch_seed.BASELINE]
    assert baseline[0] == pytest.approx(1.0)
    assert entry["tuning"]["n_trials"]["complete"] == 2
    assert entry["agreement"]["passed"], entry["agreement"]["reason"]
    assert len(entry["agreement"]["cpp_losses"]) == 8
    assert "| seed-events-every-10 |" in path.with_suffix(".md").read_text()
