"""The record of `benchmarks/suite.py`: its JSON (`to_json`, with where each preset stands against
the benchmark issue's aims, `targets`), its Markdown twin (`to_markdown`), the README's headline
table (`headline`, `update_readme`), and several runs joined into one file (`merge`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainers import fingerprint_key

SETTING_ORDER = (
    "pytorch-default",
    "seed-baseline",
    "seed-event10",
    "seed-4streams",
    "grid-best",
    "recommended",
    "recommended-seed1",
    "graph-floor",
)


def to_json(meta: Mapping[str, Any], presets: Mapping[str, Any]) -> dict[str, Any]:
    """{"meta": {gpu, driver, cuda, torch, commit, date, matmul_precision, command},
    "presets": {"transformer:small": {"settings": {name: {step_ms_median, ci95, floor_ratio,
    speedup_vs_seed_baseline, peak_memory_bytes, config}}, "tuning_cost": {...},
    "reproducibility": {...} | null, "grid": {...}, "jobs": [...]}}, "targets": {...}}."""
    return {"meta": dict(meta), "presets": dict(presets), "targets": targets(presets)}


def targets(presets: Mapping[str, Any]) -> dict[str, Any]:
    """Where the suite stands against each aim of the benchmark issue, met or not."""
    wanted_speedup = {"transformer:small": 6.0, "transformer:medium": 2.5, "transformer:large": 1.2}
    out: dict[str, Any] = {}
    for spec, data in presets.items():
        rec = data["settings"].get("recommended", {})
        ratio = rec.get("floor_ratio")
        entry: dict[str, Any] = {
            "floor_ratio": ratio,
            "floor_ratio_met": ratio is not None and ratio >= 0.95,
        }
        if spec in wanted_speedup:
            speedup = rec.get("speedup_vs_seed_baseline")
            entry |= {
                "speedup_wanted": wanted_speedup[spec],
                "speedup": speedup,
                "speedup_met": speedup is not None and speedup >= wanted_speedup[spec],
            }
        tpe = data["tuning_cost"]["samplers"]["tpe"]
        entry |= {
            "tpe_fraction_of_grid": tpe["fraction_of_grid_median"],
            "tpe_cost_met": tpe["all_reached"] and tpe["fraction_of_grid_median"] <= 0.25,
        }
        repro = data.get("reproducibility")
        if repro is not None:
            entry["reproducibility_met"] = repro["within_3pct"]
        out[spec] = entry
    return out


def _ms(entry: Mapping[str, Any]) -> str:
    if "step_ms_median" not in entry:
        return f"failed: {entry.get('error', '?')[:60]}"
    low, high = entry["ci95"]
    return f"{entry['step_ms_median']:.2f} ({low:.2f}-{high:.2f})"


def _short(config: Mapping[str, Any] | None) -> str:
    if not config:
        return ""
    graph = ", graph" if config["cuda_graph"] else ""
    memory = "pinned" if config["pin_memory"] else "pageable"
    feed = f", prefetch {config['prefetch_depth']}, {memory}, {config['num_workers']} workers"
    return (
        f"{config['num_streams']} str, {config['sync_mode']}/{config['sync_interval']}{graph}{feed}"
    )


def headline(data: Mapping[str, Any]) -> str:
    """The README's table: per preset, step time of each setting and the recommended config's
    speedup, floor ratio and where it stands."""
    lines = [
        "| preset | PyTorch idiom ms | seed-baseline ms | seed 4 streams ms | grid-best ms "
        "| recommended ms | graph floor ms | recommended vs seed-baseline "
        "| floor/recommended |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec, preset in data["presets"].items():
        s = preset["settings"]
        rec = s.get("recommended", {})

        def cell(name: str, s: Mapping[str, Any] = s) -> str:
            entry = s.get(name)
            return (
                "-"
                if entry is None or "step_ms_median" not in entry
                else f"{entry['step_ms_median']:.2f}"
            )

        speed = rec.get("speedup_vs_seed_baseline")
        ci = rec.get("speedup_ci95") or [float("nan")] * 2
        ratio = rec.get("floor_ratio")
        lines.append(
            f"| {spec} | {cell('pytorch-default')} | {cell('seed-baseline')} "
            f"| {cell('seed-4streams')} | {cell('grid-best')} | {cell('recommended')} "
            f"| {cell('graph-floor')} | "
            + ("-" if speed is None else f"{speed:.2f}x ({ci[0]:.2f}-{ci[1]:.2f})")
            + " | "
            + ("-" if ratio is None else f"{ratio:.2f}")
            + " |"
        )
    meta = data["meta"]
    lines += [
        "",
        f"Measured by `benchmarks/suite.py` on {meta['gpu']} (driver {meta['driver']}, "
        f"CUDA {meta['cuda']}, torch {meta['torch']}), commit `{meta['commit']}`, "
        f"{meta['date']}, float32 matmul precision `{meta['matmul_precision']}`; median "
        "ms/step of interleaved runs, speedup with its 95 % bootstrap CI. Generated from "
        f"`{meta['file']}`.",
    ]
    return "\n".join(lines)


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    out = [
        f"# Benchmark suite on {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}; commit "
        f"`{meta['commit']}`; {meta['date']}; float32 matmul precision "
        f"`{meta['matmul_precision']}`; `{meta['command']}`.",
        "",
        "## Headline",
        "",
        headline(data),
        "",
    ]
    for spec, preset in data["presets"].items():
        run = preset.get("run")
        out += (
            [f"## {spec}", ""]
            + ([f"Run: commit `{run['commit']}`, `{run['command']}`.", ""] if run else [])
            + _settings_table(preset["settings"])
            + _grid_and_cost(preset["grid"], preset["tuning_cost"])
            + _jobs(preset)
        )
        out.append("")
    return "\n".join(out + _aims_table(data["targets"])) + "\n"


def _settings_table(settings: Mapping[str, Any]) -> list[str]:
    """A preset's settings in SETTING_ORDER: step time, floor ratio, speedup, memory, config."""
    out = [
        "| setting | ms/step (95 % CI) | floor/step | vs seed-baseline (95 % CI) "
        "| peak memory MiB | config |",
        "|---|---|---|---|---|---|",
    ]
    for name in SETTING_ORDER:
        entry = settings.get(name)
        if entry is None:
            continue
        speed = entry.get("speedup_vs_seed_baseline")
        ci = entry.get("speedup_ci95")
        peak = entry.get("peak_memory_bytes")
        out.append(
            f"| {name} | {_ms(entry)} | "
            + ("-" if entry.get("floor_ratio") is None else f"{entry['floor_ratio']:.2f}")
            + " | "
            + (
                "-"
                if speed is None
                else f"{speed:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
            )
            + " | "
            + ("-" if peak is None else f"{peak / 2**20:.0f}")
            + f" | {_short(entry.get('config'))} |"
        )
    return out


def _grid_and_cost(grid: Mapping[str, Any], cost: Mapping[str, Any]) -> list[str]:
    """The grid's size, cost and best config, and what each sampler needed to reach the target."""
    out = [
        "",
        f"Grid: {grid['size']} configs ({grid['discretisation']}), "
        f"{grid['gpu_seconds']:.0f} GPU-s with warm-up {grid['protocol']['warmup']} + "
        f"{grid['protocol']['windows']} x {grid['protocol']['window_steps']} steps each; "
        f"best {grid['best']['step_ms']:.2f} ms ({_short(grid['best']['config'])}); "
        f"its parity: {(grid['best_parity'] or {}).get('passed', 'not checked')}.",
        "",
        f"Tuning cost to reach {cost['target']} ({cost['method']}):",
        "",
        "| sampler | GPU-s per seed | median fraction of the grid's GPU-s | all reached |",
        "|---|---|---|---|",
    ]
    for sampler, entry in cost["samplers"].items():
        per_seed = ", ".join(
            f"{r['gpu_seconds']:.1f}" + ("" if r["reached"] else " (not)") for r in entry["runs"]
        )
        out.append(
            f"| {sampler} | {per_seed} | {entry['fraction_of_grid_median']:.2f} "
            f"| {entry['all_reached']} |"
        )
    job = cost.get("default_job")
    if job is not None:
        reached = job["reached_at"]
        out += [
            "",
            "Real default job: "
            + (
                f"trial {reached['trial']} reached the target after "
                f"{reached['gpu_seconds']:.1f} GPU-s of trials"
                if reached
                else "no trial reached the target"
            )
            + f" ({job['trials_gpu_seconds']:.0f} GPU-s of trials in all).",
        ]
    return out


def _jobs(preset: Mapping[str, Any]) -> list[str]:
    """Each default job's recommendation and trials, and the two jobs' agreement."""
    out = []
    for j in preset["jobs"]:
        n = j.get("n_trials") or {}
        out.append(
            f"- job seed {j['seed']}: {_short(j['config'])}; trials "
            f"{n.get('complete', 0)}/{n.get('failed', 0)}/{n.get('pruned', 0)} "
            f"(complete/failed/pruned), {j['wall_s']:.0f} s wall"
            + (
                f", search capped at {j['search_timeout_s']:.0f} s"
                if j.get("search_timeout_s")
                else ""
            )
            + (f"; {j['explanation']}" if j.get("explanation") else "")
        )
    repro = preset.get("reproducibility")
    if repro is not None:
        out.append(
            f"- reproducibility: seed 0's recommendation runs at "
            f"{repro['throughput_ratio']:.3f}x seed 1's throughput "
            f"(95 % CI {repro['ci95'][0]:.3f}-{repro['ci95'][1]:.3f}; within 3 %: "
            f"{repro['within_3pct']})"
        )
    return out


def _aims_table(targets: Mapping[str, Any]) -> list[str]:
    """Where each preset stands against the benchmark issue's aims."""
    out = [
        "## Against the aims",
        "",
        "| preset | floor/recommended >= 0.95 | speedup aim "
        "| TPE fraction of grid GPU-s <= 0.25 | two jobs within 3 % |",
        "|---|---|---|---|---|",
    ]
    for spec, t in targets.items():
        speed = (
            "-"
            if "speedup_wanted" not in t
            else f"{(t['speedup'] or 0):.2f}x vs {t['speedup_wanted']}x: "
            f"{'met' if t['speedup_met'] else 'not met'}"
        )
        ratio = "-" if t["floor_ratio"] is None else f"{t['floor_ratio']:.2f}"
        out.append(
            f"| {spec} | {ratio}: {'met' if t['floor_ratio_met'] else 'not met'} "
            f"| {speed} | {t['tpe_fraction_of_grid']:.2f}: "
            f"{'met' if t['tpe_cost_met'] else 'not met'} | "
            + (
                "-"
                if "reproducibility_met" not in t
                else ("met" if t["reproducibility_met"] else "not met")
            )
            + " |"
        )
    return out


def merge(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """One suite file from several runs on the same GPU and software (one run per 10-minute
    command): each preset keeps its run's commit, command and file under `run`."""
    first = runs[0]["meta"]
    keys = ("gpu", "driver", "cuda", "torch", "matmul_precision")
    presets: dict[str, Any] = {}
    for data, name in zip(runs, names, strict=True):
        meta = data["meta"]
        if any(meta[k] != first[k] for k in keys):
            raise ValueError(
                f"{name}: measured on {[meta[k] for k in keys]}, not on "
                f"{[first[k] for k in keys]}: runs on other hardware or software "
                "cannot be merged"
            )
        for spec, preset in data["presets"].items():
            presets[spec] = dict(preset) | {
                "run": {"commit": meta["commit"], "file": name, "command": meta["command"]}
            }
    commits = sorted({p["run"]["commit"] for p in presets.values()})
    meta = {k: first[k] for k in (*keys, "fingerprint", "date") if k in first} | {
        "commit": ", ".join(commits),
        "file": f"suite-{gpu_key(first.get('fingerprint') or first)}-{first['date']}.json",
        "command": "python benchmarks/suite.py --merge " + " ".join(names),
    }
    return to_json(meta, presets)


BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"


def update_readme(readme: Path, data: Mapping[str, Any]) -> None:
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: no {BEGIN} ... {END} block to rewrite")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{headline(data)}\n{END}{tail}", encoding="utf-8")


def gpu_key(fp: Mapping[str, Any]) -> str:
    """'h100' for an NVIDIA H100 80GB HBM3, else the fingerprint's key, lower case."""
    found = re.search(r"\b([A-Z]\d{2,4})\b", fp.get("gpu") or "")
    return found.group(1).lower() if found else fingerprint_key(dict(fp)).lower()
