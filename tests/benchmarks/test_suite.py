"""benchmarks/suite.py's logic (with `suite_grid` and `suite_record`) on the CPU: the grid, the
replayed tuning cost, the outputs. The suite's measurements themselves are GPU evidence
(docs/benchmarks/suite-*)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import suite, suite_grid, suite_record
from trainers import LoopConfig


def test_the_grid_is_every_combination_once_and_valid() -> None:
    gpu = suite_grid.grid_configs(cuda=True)
    cpu = suite_grid.grid_configs(cuda=False)
    assert len(gpu) == 3 * 3 * 2 * 2 * 2 == 72
    assert len(cpu) == 36 and not any(c.cuda_graph for c in cpu)
    assert len({json.dumps(c.to_dict(), sort_keys=True) for c in gpu}) == 72
    assert all(isinstance(c, LoopConfig) and c.non_blocking for c in gpu)
    # Every config maps back to its parameters, the feed included.
    params = [suite_grid.grid_params(c) for c in gpu]
    assert {p["feed"] for p in params} == {0, 1}
    assert len({json.dumps(p, sort_keys=True) for p in params}) == 72


def synthetic_grid(best_index: int, *, seconds: float = 1.0) -> list[dict[str, Any]]:
    """A measured grid where one config is twice as fast as every other."""
    entries = []
    for i, config in enumerate(suite_grid.grid_configs(cuda=True)):
        ms = 5.0 if i == best_index else 10.0 + (i % 7)
        entries.append(
            {
                "config": config.to_dict(),
                "params": suite_grid.grid_params(config),
                "windows_ms": [ms * 0.99, ms, ms * 1.01],
                "step_ms": ms,
                "seconds": seconds,
            }
        )
    return entries


@pytest.mark.parametrize("sampler", suite_grid.SAMPLERS)
def test_replayed_search_stops_at_the_best_and_charges_what_it_evaluated(sampler: str) -> None:
    entries = synthetic_grid(best_index=41, seconds=2.0)
    result = suite_grid.replay_search(entries, sampler, seed=3)
    assert result["reached"]
    assert result["config"] == entries[41]["config"]
    assert result["gpu_seconds"] == pytest.approx(2.0 * result["evaluations"])
    assert 1 <= result["evaluations"] <= (72 if sampler == "grid" else 144)
    assert suite_grid.replay_search(entries, sampler, seed=3) == result  # seeded


def test_grid_search_never_needs_more_than_the_whole_grid() -> None:
    entries = synthetic_grid(best_index=71)
    runs = [suite_grid.replay_search(entries, "grid", seed=s) for s in range(5)]
    assert all(r["reached"] and r["evaluations"] <= 72 for r in runs)
    assert len({r["evaluations"] for r in runs}) > 1  # the seed shuffles the order


def test_a_config_within_the_target_counts_as_reaching_it() -> None:
    entries = synthetic_grid(best_index=0)
    # Every other config is within 3 % of the best: the first evaluation reaches the target.
    for e in entries[1:]:
        e["step_ms"] = 5.1
        e["windows_ms"] = [5.1]
    assert suite_grid.replay_search(entries, "random", seed=0)["evaluations"] == 1
    cost = suite_grid.tuning_cost(entries, seeds=(0, 1))
    assert cost["grid_gpu_seconds"] == 72.0
    assert cost["samplers"]["tpe"]["fraction_of_grid_median"] == pytest.approx(1 / 72)


def test_failed_grid_configs_cost_time_but_never_win() -> None:
    entries = synthetic_grid(best_index=10)
    for e in entries[:10]:
        del e["step_ms"], e["windows_ms"]
        e["error"] = "oom: out of memory"
    result = suite_grid.replay_search(entries, "grid", seed=0)
    assert result["config"] == entries[10]["config"]
    assert suite_grid.grid_best(entries) is entries[10]


def preset_data(rec_ms: float, seed_ms: float, floor_ms: float) -> dict[str, Any]:
    def setting(ms: float) -> dict[str, Any]:
        return {
            "config": LoopConfig().to_dict(),
            "step_ms_median": ms,
            "ci95": [ms, ms],
            "floor_ratio": floor_ms / ms,
            "speedup_vs_seed_baseline": seed_ms / ms,
            "speedup_ci95": [seed_ms / ms, seed_ms / ms],
            "peak_memory_bytes": 2**20,
        }

    entries = synthetic_grid(best_index=5)
    return {
        "settings": {
            "seed-baseline": setting(seed_ms),
            "recommended": setting(rec_ms),
            "graph-floor": setting(floor_ms),
        },
        "tuning_cost": suite_grid.tuning_cost(entries, seeds=(0,)),
        "reproducibility": {"within_3pct": True, "throughput_ratio": 1.01, "ci95": [1.0, 1.02]},
        "grid": {
            "discretisation": suite_grid.GRID_NOTE,
            "size": 72,
            "gpu_seconds": 72.0,
            "protocol": {"warmup": 10, "windows": 2, "window_steps": 10},
            "best": entries[5],
            "best_parity": {"passed": True},
        },
        "jobs": [],
    }


def test_targets_say_met_or_not_from_the_figures() -> None:
    presets = {
        "transformer:small": preset_data(rec_ms=3.0, seed_ms=18.0, floor_ms=2.9),
        "transformer:large": preset_data(rec_ms=40.0, seed_ms=41.0, floor_ms=33.0),
    }
    t = suite_record.targets(presets)
    assert t["transformer:small"]["floor_ratio_met"] and t["transformer:small"]["speedup_met"]
    assert not t["transformer:large"]["floor_ratio_met"]
    assert not t["transformer:large"]["speedup_met"]
    assert t["transformer:large"]["speedup_wanted"] == 1.2


def test_the_readme_table_is_generated_from_the_json(tmp_path: Path) -> None:
    meta = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "driver": "580",
        "cuda": "13.0",
        "torch": "2.11",
        "commit": "abc1234",
        "date": "2026-11-22",
        "matmul_precision": "high",
        "file": "suite-h100-2026-11-22.json",
        "command": "python benchmarks/suite.py",
    }
    data = suite_record.to_json(meta, {"transformer:small": preset_data(3.0, 18.0, 2.9)})
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# x\n\n{suite_record.BEGIN}\nold table\n{suite_record.END}\n\nrest\n", encoding="utf-8"
    )
    suite_record.update_readme(readme, data)
    text = readme.read_text(encoding="utf-8")
    assert "old table" not in text and text.endswith("\nrest\n")
    assert (
        "| transformer:small | - | 18.00 | - | - | 3.00 | 2.90 | 6.00x (6.00-6.00) | 0.97 |" in text
    )
    assert "suite-h100-2026-11-22.json" in text and "abc1234" in text
    assert "## Against the aims" in suite_record.to_markdown(data)
    readme.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(ValueError, match="suite:begin"):
        suite_record.update_readme(readme, data)


def test_the_command_line_merges_runs_and_rewrites_the_readme(tmp_path: Path) -> None:
    """`--merge PART --readme R` and `--from-json`: records rewritten without measuring."""
    meta = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "driver": "580",
        "cuda": "13.0",
        "torch": "2.11",
        "commit": "abc1234",
        "date": "2026-11-22",
        "matmul_precision": "high",
        "file": "part.json",
        "command": "python benchmarks/suite.py --presets transformer:small",
    }
    part = tmp_path / "part.json"
    part.write_text(
        json.dumps(suite_record.to_json(meta, {"transformer:small": preset_data(3.0, 18.0, 2.9)}))
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"{suite_record.BEGIN}\nold\n{suite_record.END}\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    suite.main(["--merge", str(part), "--out", str(out), "--readme", str(readme)])
    merged = out / "suite-h100-2026-11-22.json"
    data = json.loads(merged.read_text(encoding="utf-8"))
    assert data["presets"]["transformer:small"]["run"]["file"] == "part.json"
    assert data["meta"]["command"] == "python benchmarks/suite.py --merge part.json"
    assert merged.with_suffix(".md").read_text(encoding="utf-8") == suite_record.to_markdown(data)
    assert "| transformer:small |" in readme.read_text(encoding="utf-8")
    merged.with_suffix(".md").unlink()
    suite.main(["--from-json", str(merged)])
    assert merged.with_suffix(".md").read_text(encoding="utf-8") == suite_record.to_markdown(data)


@pytest.mark.slow
def test_the_suite_runs_end_to_end_on_a_cpu(tmp_path: Path) -> None:
    suite.main(
        [
            "--presets",
            "mlp:tiny",
            "--device",
            "cpu",
            "--rounds",
            "1",
            "--grid-warmup",
            "1",
            "--grid-window-steps",
            "2",
            "--search-timeout",
            "mlp:tiny=2",
            "--repro",
            "",
            "--out",
            str(tmp_path),
            "--tag",
            "t",
            "--storage-dir",
            str(tmp_path / "db"),
        ]
    )
    (path,) = tmp_path.glob("suite-*-t.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    preset = data["presets"]["mlp:tiny"]
    assert preset["grid"]["size"] == 36
    assert set(preset["settings"]) >= {
        "pytorch-default",
        "seed-baseline",
        "seed-event10",
        "seed-4streams",
        "grid-best",
        "recommended",
    }
    assert "graph-floor" not in preset["settings"]  # no CUDA graphs on a CPU
    for entry in preset["settings"].values():
        assert entry["step_ms_median"] > 0 and entry["ci95"][0] <= entry["step_ms_median"]
    assert preset["reproducibility"] is None
    assert set(preset["tuning_cost"]["samplers"]) == {"tpe", "random", "grid"}
    assert path.with_suffix(".md").read_text(encoding="utf-8").startswith("# Benchmark suite")
