"""The Markdown twin of `benchmarks/gate_power.py`'s JSON, and writing both (atomically, so a run
killed mid-write keeps the previous complete pair)."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _fmt(values: Sequence[float | None], pick: Callable[[list[float]], float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    infinite = any(v is not None and not math.isfinite(v) for v in values)
    if not finite:
        return "inf" if infinite else "-"
    return f"{pick(finite):.3g}"


def _header(result: dict[str, Any]) -> list[str]:
    meta = result["meta"]
    stat = result["statistic"]
    return [
        "# Parity gate: detection power",
        "",
        f"{meta['gpu']}, driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, "
        f"commit {meta['commit']}, {meta['date']}; {result['steps']} steps per run, precision "
        f"{result['precision'] or 'process default'} unless the model says; window "
        f"{stat['window']} steps, multiple {stat['multiple']:g}, floor {stat['floor_ulps']} ulps, "
        f"{stat['perturbations']} perturbations; gate determinism {result['determinism']}.",
        "",
        f"Command: `{meta['command']}` ({result['seconds']:.0f} s"
        + (", stopped early: see the notes" if result["stopped_early"] else "")
        + ").",
    ]


def _faults(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "| fault | magnitude | runs | detected | rate | workloads | by exact | by window | "
        "by drift | exact skipped | detected without the drift test |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, f in result["faults"].items():
        if f["skipped"]:
            lines.append(
                f"| {kind} | {f['magnitude']} | - | - | skipped: {f['skipped']} | | | | | | |"
            )
            continue
        per = f["per_model"].values()
        by = {
            key: sum(p[key] for p in per)
            for key in (
                "caught_by_exact",
                "caught_by_window",
                "caught_by_drift",
                "exact_skipped",
                "detected_without_drift",
            )
        }
        rate = "-" if f["rate"] is None else f"{f['rate']:.0%}"
        lines.append(
            f"| {kind} | {f['magnitude']} | {f['runs']} | {f['detected']} | {rate} | "
            f"{', '.join(f['per_model'])} | {by['caught_by_exact']} | {by['caught_by_window']} | "
            f"{by['caught_by_drift']} | {by['exact_skipped']} | {by['detected_without_drift']} |"
        )
    return lines


def _equivalent(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "| workload/config (must pass) | runs | passed | exact skipped | "
        "passed without the drift test | max window ratio | max drift ratio | first failure |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, e in result["equivalent"].items():
        if e["skipped"]:
            lines.append(f"| {key} | - | - | - | skipped: {e['skipped'][:80]} | | | |")
            continue
        failure = e["failures"][0][:120].replace("|", "/") if e["failures"] else ""
        lines.append(
            f"| {key} | {e['runs']} | {e['passed']} | {e['exact_skipped']} | "
            f"{e['passed_without_drift']} | {_fmt(e['window_ratios'], max)} | "
            f"{_fmt(e['drift_ratios'], max)} | {failure} |"
        )
    return lines


def _probes(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Eager reproducibility (the reference loop run twice; `trainers.gate.reproducibility`) "
        "and the cost of deterministic algorithms:",
        "",
        "| workload | precision | determinism | reproducible | first differing step | "
        "max abs diff | strict held | one-stream graph replays its eager twin | eager ms/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, by_precision in result["probes"].items():
        for precision, by_mode in by_precision.items():
            for mode, p in by_mode.items():
                if "error" in p:
                    lines.append(
                        f"| {label} | {precision} | {mode} | error: {p['error'][:80]} ||||||"
                    )
                    continue
                ms = "-" if p["step_ms"] is None else f"{p['step_ms']:.3f}"
                lines.append(
                    f"| {label} | {precision} | {mode} | {'yes' if p['reproducible'] else 'no'} | "
                    f"{'-' if p['first_difference'] is None else p['first_difference']} | "
                    f"{p['max_abs_difference']:.2g} | {'yes' if p['strict'] else 'no'} | "
                    f"{_graph(p)} | {ms} |"
                )
    return lines


def _graph(probe: dict[str, Any]) -> str:
    if probe.get("graph_error"):
        return f"error: {probe['graph_error'][:60]}"
    if probe.get("graph_replays_twin") is None:
        return "-"
    if probe["graph_replays_twin"]:
        return "yes"
    return (
        f"no: from step {probe['graph_first_difference']} "
        f"(max {probe['graph_max_abs_difference']:.2g})"
    )


def _envelopes(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "| workload | status | median floor | median last-window envelope | "
        "max leave-one-out window ratio | max leave-one-out drift ratio |",
        "|---|---|---|---|---|---|",
    ]
    for label, m in result["models"].items():
        env = result["envelope"].get(label)
        if m["status"] != "ok" or env is None:
            lines.append(f"| {label} | {m['status']}: {m.get('reason', '')[:80]} | | | | |")
            continue
        last = [w[-1] for w in env["windows"] if w]
        lines.append(
            f"| {label} | ok | {_fmt(env['floor'], statistics.median)} | "
            f"{_fmt(last, statistics.median)} | {_fmt(env['loo_window_ratios'], max)} | "
            f"{_fmt(env['loo_drift_ratios'], max)} |"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    lines = [
        *_header(result),
        *_faults(result),
        *_equivalent(result),
        *_probes(result),
        *_envelopes(result),
    ]
    if result["notes"]:
        lines += ["", *[f"- {note}" for note in result["notes"]]]
    return "\n".join(lines) + "\n"


def _replace(path: Path, text: str) -> None:
    # Write beside, then rename: a run killed here leaves the previous complete file.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def write(result: dict[str, Any], out: Path, name: str) -> None:
    """`<name>.json` and `<name>.md` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    _replace(out / f"{name}.json", json.dumps(result, indent=1, default=str) + "\n")
    _replace(out / f"{name}.md", markdown(result))


def _add_counts(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Numbers add up, lists join; anything else keeps `into`'s value (the same in every part)."""
    for key, value in part.items():
        if key not in into:
            into[key] = value
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int | float | list) and type(value) is type(into[key]):
            into[key] = into[key] + value


def _merge_part(merged: dict[str, Any], part: dict[str, Any]) -> None:
    """One more part's counts, lists, trajectories and probes into `merged`."""
    for kind, fault in part["faults"].items():
        if kind not in merged["faults"]:
            merged["faults"][kind] = fault
            continue
        entry = merged["faults"][kind]
        if entry["skipped"]:
            continue
        entry["runs"] += fault["runs"]
        entry["detected"] += fault["detected"]
        for label, per in fault["per_model"].items():
            if label in entry["per_model"]:
                _add_counts(entry["per_model"][label], per)
            else:
                entry["per_model"][label] = per
    for key, eq in part["equivalent"].items():
        if key not in merged["equivalent"]:
            merged["equivalent"][key] = eq
            continue
        _add_counts(merged["equivalent"][key], {k: v for k, v in eq.items() if k != "config"})
    for label, model in part["models"].items():
        if label in merged["models"]:
            merged["models"][label]["runs"] += model.get("runs", 0)
        else:
            merged["models"][label] = model
    for label, env in part["envelope"].items():
        if label not in merged["envelope"]:
            merged["envelope"][label] = env
            continue
        mine = merged["envelope"][label]
        for key in ("floor", "windows", "loo_window_ratios", "loo_drift_ratios"):
            mine[key] = mine[key] + env[key]
    for label, runs in part["trajectories"].items():
        merged["trajectories"].setdefault(label, {}).update(runs)
    for label, probe in part["probes"].items():
        merged["probes"].setdefault(label, probe)


def merge(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result from runs of one commit and plan over disjoint seeds (the evidence split over
    processes that share a GPU, or over calls): counts add up, per-seed lists and trajectories
    join; the probes are the first part's. ValueError where the parts are not comparable."""
    if not parts:
        raise ValueError("nothing to merge")
    parts = json.loads(json.dumps(list(parts), default=str))  # the callers' dicts stay as they are
    first = parts[0]
    for key in ("commit", "steps", "statistic", "determinism", "precision", "format"):
        differing = {json.dumps(p.get(key), sort_keys=True) for p in parts}
        if len(differing) > 1:
            raise ValueError(f"the parts differ in {key!r}: {sorted(differing)}")
    seeds: dict[str, set[str]] = {}
    for part in parts:
        for label, runs in part["trajectories"].items():
            clash = seeds.setdefault(label, set()) & set(runs)
            if clash:
                raise ValueError(f"seed {sorted(clash)[0]} of {label} is in two parts")
            seeds[label] |= set(runs)
    merged = first
    for part in parts[1:]:
        _merge_part(merged, part)
    for fault in merged["faults"].values():
        fault["rate"] = fault["detected"] / fault["runs"] if fault["runs"] else None
    merged["seconds"] = max(p["seconds"] for p in parts)
    merged["stopped_early"] = any(p["stopped_early"] for p in parts)
    merged["seed"] = min(p["seed"] for p in parts)
    merged["notes"] = [
        f"{len(parts)} parts merged, seeds from {merged['seed']}: "
        + "; ".join(f"`{p['meta']['command']}`" for p in parts),
        *(f"part {i + 1}: {note}" for i, p in enumerate(parts) for note in p["notes"]),
    ]
    return merged


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="merge gate_power.py results of disjoint seeds")
    parser.add_argument("parts", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--name", required=True, help="output file stem")
    args = parser.parse_args(argv)
    merged = merge([json.loads(p.read_text()) for p in args.parts])
    write(merged, args.out, args.name)
    print(markdown(merged), flush=True)


if __name__ == "__main__":
    main()
