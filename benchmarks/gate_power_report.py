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
