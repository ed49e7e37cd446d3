"""The record of `benchmarks/peers.py`: its Markdown twin (`to_markdown`), several runs joined
into one document (`merge`), the README's table (`update_readme`), and MFU added afterwards to
a record made before it was measured (`add_mfu`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import trainers
from benchmarks.peers_loops import PEER_LABELS, PEERS, SMALL_PEERS
from benchmarks.peers_tuning import trial_line
from trainers import LoopConfig
from tuner.evidence.render import phase_times, search_text


def _cell(entry: Mapping[str, Any] | None) -> str:
    """ms/step (95 % CI), then MFU and peak memory where they were recorded."""
    if not entry or "median_ms" not in entry:
        return "-" if not entry else "failed"
    low, high = entry["ci95"]
    text = f"{entry['median_ms']:.2f} ({low:.2f}-{high:.2f})"
    if entry.get("mfu") is not None:
        text += f", MFU {100 * entry['mfu']:.1f} %"
    if entry.get("peak_memory_bytes") is not None:
        text += f", {entry['peak_memory_bytes'] / 1e9:.1f} GB"
    return text


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def short(config: Mapping[str, Any] | None) -> str:
    if not config:
        return "-"
    default = LoopConfig().to_dict()
    return ", ".join(f"{k}={v}" for k, v in config.items() if default.get(k) != v) or "defaults"


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# The recommendation against a user's own loop on {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, commit "
        f"`{meta['commit']}`, {meta['date']}. Generated from `{meta['file']}`; "
        f"command: `{meta['command']}`.",
        "",
        "Median ms/step (95 % CI) over every window of every round, interleaved in one process. "
        "Peers are plain loops (pinned 2-worker DataLoader, `loss.item()` every 10 steps); "
        "ratio = recommendation's throughput over the fastest peer's.",
        "",
    ]
    if meta.get("mfu_added"):
        lines += [meta["mfu_added"] + ".", ""]
    lines += _table(data["presets"])
    lines += ["", "Setup (s, first round; compile included) and the recommended configs:", ""]
    for item in data["presets"]:
        if "peers" in item:
            lines += _details(item)
    return "\n".join(lines) + "\n"


def _table(presets: Sequence[Mapping[str, Any]]) -> list[str]:
    """A row per preset: each peer present in any, the harness, the ratios and the job's time."""
    present = [
        name for name in PEERS if any(name in item.get("peers", {}) for item in presets)
    ] or list(SMALL_PEERS)
    lines = [
        "| preset | precision | "
        + " | ".join(PEER_LABELS.get(n, n) for n in present)
        + " | seed-baseline | recommended | ratio vs best peer (95 % CI) "
        "| vs seed-baseline | tuning wall s / GPU-s |",
        "|" + "---|" * (len(present) + 7),
    ]
    for item in presets:
        if "peers" not in item:  # failed before any round: a cut run keeps its rounds
            lines.append(
                f"| {item['workload']}:{item['preset']} | {item['precision']} "
                f"| failed: {item['error']} |"
            )
            continue
        peers = item["peers"]
        ratio = item.get("ratio_vs_best_peer")
        ratio_text = (
            "-"
            if ratio is None
            else f"{ratio['ratio']:.2f} ({ratio['ci95'][0]:.2f}-{ratio['ci95'][1]:.2f})"
        )
        speed = item.get("speedup_vs_seed_baseline")
        speed_text = "-" if speed is None else f"{speed['ratio']:.2f}x"
        tuning = item["tuning"]
        gpu_s = tuning.get("gpu_s")
        cells = " | ".join(_cell(peers.get(name)) for name in present)
        cut = (
            f" (rounds {item['rounds_done']} of {item['rounds']}: cut short"
            + (f", {item['error']}" if "error" in item else "")
            + ")"
            if "rounds_done" in item
            else ""
        )
        lines.append(
            f"| {item['workload']}:{item['preset']}{cut} | {item['precision']} | {cells} "
            f"| {_cell(item['harness'].get('seed-baseline'))} "
            f"| {_cell(item['harness'].get('recommended'))} | {ratio_text} | {speed_text} "
            f"| {_seconds(tuning.get('wall_s'))} / {_seconds(gpu_s)} |"
        )
    return lines


def _ablation(item: Mapping[str, Any]) -> str:
    parts = []
    for lever, row in item["ablation"].items():
        if "ratio" in row:
            low, high = row["ci95"]
            parts.append(
                f"{lever}={row.get('value')} over {row['default']} "
                f"{row['ratio']:.3f}x ({low:.3f}-{high:.3f})"
            )
        else:
            parts.append(f"{lever}: {row.get('error')}")
    return "; ".join(parts)


def _details(item: Mapping[str, Any]) -> list[str]:
    """A measured preset's setup times, recommendation and aims, then what the table leaves
    out: its size, the job's time and search, the float8 ratios, what failed."""
    setups = ", ".join(
        f"{name} {entry['setup_s']:.1f}"
        for name, entry in item["peers"].items()
        if "setup_s" in entry
    )
    rec = item["recommended"]
    chosen = rec.get("precision")
    in_chosen = f" in {chosen}" if chosen and chosen != item["precision"] else ""
    lines = [
        f"- {item['workload']}:{item['preset']} {item['precision']}: {setups}; "
        f"recommended `{short(rec['config'])}`{in_chosen} (compile "
        f"{rec.get('compile_s') or 0:.1f} s); aims {item['aims']}"
    ]
    tuning = item["tuning"]
    if item.get("parameters"):
        args_text = ", ".join(f"{k}={v}" for k, v in (item.get("model_args") or {}).items())
        lines.append(
            f"  - {item['parameters'] / 1e9:.2f}B parameters"
            + (f", vocabulary {item['vocab_size']:,}" if item.get("vocab_size") else "")
            + (f" ({args_text})" if args_text else "")
        )
    spent = phase_times(tuning.get("time"))
    if spent is not None:
        lines.append(f"  - tuning time: {spent}")
    searched = search_text(tuning.get("search"))
    if searched is not None:
        lines.append(f"  - search: {searched}")
    if item.get("ablation"):
        lines.append(
            f"  - ablation (the recommendation over it without the lever): {_ablation(item)}"
        )
    for key, label in (
        ("ratio_vs_best_bf16_peer", "without float8"),
        ("ratio_vs_best_float8_peer", "with float8"),
    ):
        if key in item:
            r = item[key]
            lines.append(
                f"  - vs the fastest peer {label} ({r['best_peer']}): {r['ratio']:.2f} "
                f"({r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})"
            )
    return lines + _failures(item)


def _failures(item: Mapping[str, Any]) -> list[str]:
    """What failed in a preset (settings, tuning trials), and where the job chose among
    precisions, what it measured of each and the gate's word."""
    lines = []
    for name, entry in {**item["peers"], **item["harness"]}.items():
        if "error" in entry:
            lines.append(f"  - {name} failed: {entry['error'][:300]}")
    for failed in item["tuning"].get("failed_trials", []):
        lines.append(
            f"  - tuning trial {failed['trial']} (`{short(failed['config'])}`) failed: "
            f"{(failed['reason'] or '')[:300]}"
        )
    if any(r["precision"] for r in item["tuning"].get("trial_results", [])):
        # A job choosing among precisions: what it measured of each, and the gate's word.
        for ran in item["tuning"]["trial_results"]:
            lines.append(f"  - tuning trial {ran['trial']}: {trial_line(ran)}")
    return lines


def merge(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One document from several runs on one GPU (a merged document counts as the runs it was
    made of): their presets grouped by precision in PRECISION_ORDER, in run order within one, each
    recording the run it came from; every run's meta kept, their commits and dates joined."""
    gpus = {(r["meta"]["gpu"], r["meta"]["driver"], r["meta"]["torch"]) for r in runs}
    if len(gpus) != 1:
        raise SystemExit(f"--merge: runs from different machines or stacks: {sorted(gpus)}")
    metas = [m for r in runs for m in r["meta"].get("runs", [r["meta"]])]
    presets = [
        p if "run" in p else p | {"run": r["meta"]["file"]} for r in runs for p in r["presets"]
    ]
    presets.sort(key=lambda p: _precision_rank(p.get("precision")))
    meta = dict(runs[0]["meta"])
    for key in ("commit", "date"):
        meta[key] = ", ".join(dict.fromkeys(str(m[key]) for m in metas))
    meta["command"] = " ; ".join(m["command"] for m in metas)
    meta["runs"] = metas
    return {"meta": meta, "presets": presets}


PRECISION_ORDER = ("fp32", "tf32", "bf16-autocast", "fp16-autocast")


def _precision_rank(precision: str | None) -> int:
    return (
        PRECISION_ORDER.index(precision) if precision in PRECISION_ORDER else len(PRECISION_ORDER)
    )


README_BEGIN, README_END = "<!-- peers:begin -->", "<!-- peers:end -->"


def update_readme(readme: Path, data: Mapping[str, Any]) -> None:
    """Replace the table between the README's peers markers with this document's."""
    text = readme.read_text(encoding="utf-8")
    # The markers on lines of their own: prose may name them (docs/benchmarks/results.md does).
    head, sep, rest = text.partition(f"\n{README_BEGIN}\n")
    _, sep2, tail = rest.partition(f"\n{README_END}")
    head += "\n" if sep else ""
    if not sep or not sep2:
        raise SystemExit(f"{readme}: no {README_BEGIN} ... {README_END} markers")
    table = [line for line in to_markdown(data).splitlines() if line.startswith("|")]
    meta = data["meta"]
    note = (
        f"Measured by `benchmarks/peers.py` on {meta['gpu']} (driver {meta['driver']}, CUDA "
        f"{meta['cuda']}, torch {meta['torch']}), commit `{meta['commit']}`, {meta['date']}; "
        f"generated from `docs/benchmarks/{meta['file']}`."
    )
    body = "\n".join(table) + "\n\n" + note
    readme.write_text(f"{head}{README_BEGIN}\n{body}\n{README_END}{tail}", encoding="utf-8")


def add_mfu(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` (a peers JSON) with TFLOP/s and MFU on every timed entry, recounted: the model's
    FLOPs counted here on a CPU (`trainers.flops`, the count a GPU run makes; it does not depend
    on the device), over the recorded median ms/step, against the dense peak of the GPU named in
    `meta`. For the runs recorded before MFU was, and for those whose CPU count left attention
    out (before 2026-11-26's fix in `trainers.flops`). Peak memory is what the run recorded."""
    from trainers.flops import count_step_flops, utilisation

    out = json.loads(json.dumps(data))
    gpu = out["meta"].get("gpu")
    cpu = torch.device("cpu")
    for item in out["presets"]:
        if "peers" not in item:
            continue
        precision = item.get("precision")
        workload = trainers.load_workload(
            item["workload"], item["preset"], seed=0, model_args=item.get("model_args") or {}
        )
        flops = count_step_flops(workload, cpu)
        entries = [*item.get("peers", {}).values(), *item.get("harness", {}).values()]
        for entry in entries:
            if not isinstance(entry, dict) or "median_ms" not in entry:
                continue
            use = utilisation(
                flops,
                entry["median_ms"],
                gpu_name=gpu,
                precision=precision,  # "tf32" and the autocasts pick their peak column
                matmul_precision="highest",
            )
            entry |= {"flops_per_step": flops, "tflops": use.tflops, "mfu": use.mfu}
            entry["mfu_note"] = f"{use.note}; FLOPs counted afterwards on a CPU"
    memory = [
        entry.get("peak_memory_bytes") is not None
        for item in out["presets"]
        for entry in [*item.get("peers", {}).values(), *item.get("harness", {}).values()]
        if isinstance(entry, dict) and "median_ms" in entry
    ]
    if all(memory):
        said = ""
    elif any(memory):
        said = "; peak memory was recorded only by the runs that show it"
    else:
        said = "; peak memory was not recorded by these runs"
    out["meta"]["mfu_added"] = (
        "MFU added afterwards by `benchmarks/peers.py --add-mfu`: FLOPs counted on a CPU over "
        "the recorded median ms/step" + said
    )
    return out
