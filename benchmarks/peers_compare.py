"""The measurement runner of `benchmarks/peers.py`: the peers and the harness's settings (the
recommendation, the seed design's baseline) `rounds` times, interleaved, from the same initial
weights (`compare`); their summaries, the recommendation's ratio to the fastest peer, and where
a preset stands against the issues' aims (`aims`).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from benchmarks.interleaved import measure_in_round, ratio_vs_fastest, windows_ms
from benchmarks.peers_loops import (
    FLOAT8_PEERS,
    PEERS,
    SCALE_PEERS,
    SMALL_PEERS,
    Run,
    float8_peer_error,
    user_loop,
)
from trainers import LEVERS, ConfigError, LoopConfig, Workload, matmul_precision_for
from tuner.search.measuring.measure import Measurer
from tuner.search.measuring.stats import bootstrap_ci, ratio_ci
from tuner.search.options import BASELINES
from tuner.search.spaces.staged import STAGED_ONLY

HARNESS = ("recommended", "seed-baseline")
"""The settings the harness runs (`trainers.run`, the tuner's protocol) beside the peers."""
WITHOUT = "without-"
"""The ablation's settings: `without-<lever>` is the recommendation with that lever set back to
its default (`ablations`)."""
AIMS_TF32 = {"transformer:small": 6.0, "transformer:medium": 2.5, "transformer:large": 1.2}
RATIO_AIM = 0.98
FLOAT8_OVER_BF16_AIM = 1.12
"""The float8 issue's aim: a job allowing float8, at least 1.12x the fastest bf16 peer (ratio CI
low), and no slower than the float8 peers (CI low >= RATIO_AIM)."""


def _summary(runs: Sequence[Run], flops: Callable[[float], dict[str, Any]]) -> dict[str, Any]:
    windows = [w for run in runs for w in run.windows_ms]
    peaks = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
    median = statistics.median(windows)
    return {
        "median_ms": median,
        **flops(median),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "micro_batches": runs[0].micro_batches,
        "ci95": list(bootstrap_ci(windows)),
        "setup_s": runs[0].setup_s,
        "setup_s_rounds": [r.setup_s for r in runs],
        "windows_ms": windows,
        "last_loss": runs[-1].losses[-1] if runs[-1].losses else None,
    }


def compare(
    measurer: Measurer,
    recommended: LoopConfig | None,
    *,
    precision: str | None,
    rounds: int,
    log: Callable[[str], None],
    peers: Sequence[str] = SMALL_PEERS,
    recommended_precision: str | None = None,
    on_round: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Peers and harness settings `rounds` times, interleaved, from the same initial weights.
    `recommended_precision`: the precision a job searching precisions chose (None: `precision`);
    the recommendation is measured in it, the seed design's baseline in `precision`.
    `on_round(done, summary)`: after each round but the last, what the rounds so far measured,
    so a run cut short (a lent machine taken back) keeps them."""
    workload = measurer.workload
    utilisation = _utilisation(workload, measurer.device, precision)
    initial = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    harness = {"seed-baseline": BASELINES["seed-baseline"]}
    if recommended is not None:
        harness = {"recommended": recommended} | ablations(recommended) | harness
    ablated = [name for name in harness if name.startswith(WITHOUT)]
    runs: dict[str, list[Run]] = {name: [] for name in [*peers, *harness]}
    errors: dict[str, str] = {}
    compile_info: dict[str, Any] = {}
    # What the rounds so far measured, read from the lists they fill.
    summary = functools.partial(_summaries, runs, errors, harness, compile_info, utilisation, peers)
    for r in range(rounds):
        for name in peers:
            run = _peer_run(measurer, name, initial, precision, r, errors, log)
            if run is not None:
                runs[name].append(run)
        for name, config in harness.items():
            # The ablation runs in the recommendation's precision: one lever differs, no more.
            chosen = recommended_precision if name in ("recommended", *ablated) else None
            outcome = measure_in_round(
                measurer, name, config, round_index=r, log=log, errors=errors, precision=chosen
            )
            if outcome is None:
                continue
            if outcome.compile is not None:
                compile_info[name] = dict(outcome.compile)
            runs[name].append(_harness_run(measurer, outcome, config))
        if on_round is not None and r + 1 < rounds:
            on_round(r + 1, summary(recommended_precision))
    return summary(recommended_precision)


def _harness_run(measurer: Measurer, outcome: Any, config: LoopConfig) -> Run:
    """A harness setting's run in one round. Its setup is what a fresh process pays: this run's
    compile, or the one whose code it kept."""
    compiled = outcome.compile or {}
    return Run(
        windows_ms=windows_ms(measurer, outcome),
        setup_s=max(float(compiled.get("compile_s") or 0), float(compiled.get("kept_s") or 0)),
        losses=[],
        peak_memory_bytes=outcome.peak_memory_bytes,
        micro_batches=config.micro_batches,
    )


def _peer_run(
    measurer: Measurer,
    name: str,
    initial: Mapping[str, torch.Tensor],
    precision: str | None,
    round_index: int,
    errors: dict[str, str],
    log: Callable[[str], None],
) -> Run | None:
    """One run of the peer `name` in one round, from the initial weights; None (with the reason
    in `errors`) where it cannot run here or failed: a failed peer is reported, not fatal."""
    spec = PEERS[name]
    cuda = measurer.device.type == "cuda"
    if spec["compile"] == "reduce-overhead" and not cuda:
        errors[name] = "reduce-overhead needs CUDA"
        return None
    if spec.get("float8") and (why := float8_peer_error(measurer.device, precision)):
        errors[name] = why
        return None
    workload, protocol = measurer.workload, measurer.protocol
    workload.model.load_state_dict(initial)
    for p in workload.model.parameters():
        p.grad = None
    try:
        with matmul_precision_for(precision):  # type: ignore[arg-type]
            run = user_loop(
                workload,
                device=measurer.device,
                precision=precision,
                fused=spec["fused"],
                compile_mode=spec["compile"],
                warmup=max(protocol.warmup, 3),
                windows=protocol.windows,
                window_steps=protocol.window_steps,
                spec=spec,
            )
    except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
        errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"round {round_index + 1} {name}: {errors[name]}")
        return None
    finally:
        if cuda:
            torch.cuda.empty_cache()
    log(
        f"round {round_index + 1} {name} {statistics.median(run.windows_ms):.3f} ms "
        f"(setup {run.setup_s:.1f} s)"
    )
    return run


def _summaries(
    runs: Mapping[str, Sequence[Run]],
    errors: Mapping[str, str],
    harness: Mapping[str, LoopConfig],
    compile_info: Mapping[str, Any],
    utilisation: Callable[[float], dict[str, Any]],
    peers: Sequence[str],
    recommended_precision: str | None,
) -> dict[str, Any]:
    """Each setting's summary under `peers` or `harness` (an error where no round ran it), the
    `floor` (the fastest setting measured) and the ratios (`_add_ratios`): what `compare`
    returns."""
    out: dict[str, Any] = {"peers": {}, "harness": {}}
    for name, done in runs.items():
        group = "peers" if name in PEERS else "harness"
        if not done:
            out[group][name] = {"error": errors.get(name, "not measured")}
            continue
        out[group][name] = _summary(done, utilisation) | (
            {"error_in_a_round": errors[name]} if name in errors else {}
        )
        if name in harness:
            out[group][name]["config"] = harness[name].to_dict()
            if name in compile_info:
                out[group][name]["compile"] = compile_info[name]
    measured = {
        name: entry
        for group in ("peers", "harness")
        for name, entry in out[group].items()
        if "median_ms" in entry
    }
    if measured:
        fastest = min(measured, key=lambda n: measured[n]["median_ms"])
        out["floor"] = {"setting": fastest, "median_ms": measured[fastest]["median_ms"]}
    _add_ratios(out, peers, recommended_precision)
    return out


def _add_ratios(
    out: dict[str, Any], peers: Sequence[str], recommended_precision: str | None
) -> None:
    """The recommendation against the fastest peer (and, where float8 peers ran, against the
    fastest of each kind) and against the seed design's baseline, into `out`."""
    peer_ok = {n: e for n, e in out["peers"].items() if "median_ms" in e}
    rec = out["harness"].get("recommended", {})
    if "median_ms" in rec:
        if recommended_precision is not None:
            out["harness"]["recommended"]["precision"] = recommended_precision
        groups = {"ratio_vs_best_peer": peer_ok}
        if any(PEERS[n].get("float8") for n in peers):
            # A job allowing float8 is judged against each kind: the fastest loop without float8
            # (what float8 must beat by the margin) and the fastest with it.
            groups["ratio_vs_best_bf16_peer"] = {
                n: e for n, e in peer_ok.items() if not PEERS[n].get("float8")
            }
            groups["ratio_vs_best_float8_peer"] = {
                n: e for n, e in peer_ok.items() if PEERS[n].get("float8")
            }
        for key, members in groups.items():
            if members:
                out[key] = ratio_vs_fastest(members, rec)
    seed = out["harness"].get("seed-baseline", {})
    if "median_ms" in seed and "median_ms" in rec:
        ratio, low, high = ratio_ci(seed["windows_ms"], rec["windows_ms"])
        out["speedup_vs_seed_baseline"] = {"ratio": ratio, "ci95": [low, high]}
    out["ablation"] = _ablation(out["harness"], rec)


def ablations(recommended: LoopConfig) -> dict[str, LoopConfig]:
    """The recommendation with each lever module's lever it sets (the levers beyond the recipes:
    `trainers.levers`, each off its default here) set back to its default, as `without-<lever>`:
    measured interleaved with the rest, they show what each lever gave. A lever whose default
    the rest of the config refuses is left out (nothing to compare). So is each setting only a
    search's second stage tries (`tuner.search.spaces.staged`: the whole-step CUDA graph), where
    the recommendation sets it."""
    out: dict[str, LoopConfig] = {}
    staged = [name for name, value in STAGED_ONLY.items() if recommended.get(name) != value]
    for name in [*(name for name, _ in recommended.modules), *staged]:
        try:
            out[f"{WITHOUT}{name}"] = recommended.replace(**{name: LEVERS[name].default})
        except ConfigError:
            continue
    return out


def _ablation(harness: Mapping[str, Any], rec: Mapping[str, Any]) -> dict[str, Any]:
    """Per lever ablated: the recommendation's value and the default, and the recommendation's
    speed over the config without the lever (ratio > 1: the lever gave that much), with its
    bootstrap CI; the reason where either was not measured."""
    out: dict[str, Any] = {}
    for name, entry in harness.items():
        if not name.startswith(WITHOUT):
            continue
        lever = name.removeprefix(WITHOUT)
        row: dict[str, Any] = {"default": LEVERS[lever].default}
        if "config" in entry:
            row["value"] = rec.get("config", {}).get(lever)
        if "median_ms" in entry and "median_ms" in rec:
            ratio, low, high = ratio_ci(entry["windows_ms"], rec["windows_ms"])
            row |= {"ratio": ratio, "ci95": [low, high]}
        else:
            row["error"] = entry.get("error") or rec.get("error") or "not measured"
        out[lever] = row
    return out


def _utilisation(
    workload: Workload, device: torch.device, precision: str | None
) -> Callable[[float], dict[str, Any]]:
    """Model TFLOP/s and MFU at a median step time: the model's FLOPs counted once
    (`trainers.flops`), the same count for every row (recomputation is not model FLOPs)."""
    from trainers.flops import count_step_flops, utilisation

    flops = count_step_flops(workload, device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    matmul = torch.get_float32_matmul_precision()

    def at(median_ms: float) -> dict[str, Any]:
        use = utilisation(
            flops, median_ms, gpu_name=gpu, precision=precision, matmul_precision=matmul
        )
        return {"flops_per_step": flops, "tflops": use.tflops, "mfu": use.mfu, "mfu_note": use.note}

    return at


def peers_for(
    spec: str, chosen: str | None, allowed: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The peers of a preset: `--peers` if given; at scale (the llama presets) the loops users of
    0.3-8B models write, otherwise the small-model loops; with FLOAT8_PEERS beside them where the
    job may choose float8 (`allowed`, its precisions)."""
    if chosen:
        names = tuple(filter(None, chosen.split(",")))
        unknown = [n for n in names if n not in PEERS]
        if unknown:
            raise SystemExit(f"--peers: unknown {unknown}; allowed {', '.join(PEERS)}")
        return names
    base = SCALE_PEERS if ":llama" in spec else SMALL_PEERS
    if allowed and "float8" in allowed:
        return base + tuple(n for n in FLOAT8_PEERS if n not in base)
    return base


def allowed_precisions(precision: str | None, allow: str | None) -> tuple[str, ...] | None:
    """The tuning job's precisions: `--allow-precisions` with the preset's own first (the
    study's reference, which the gate judges the others against); None where not given."""
    if not allow:
        return None
    names = [p for p in allow.split(",") if p]
    return tuple(dict.fromkeys([precision, *names] if precision else names))


def aims(spec: str, precision: str | None, entry: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ratio = entry.get("ratio_vs_best_peer")
    if ratio is not None:
        out["ratio_lower_bound_at_least_0.98"] = ratio["ci95"][0] >= RATIO_AIM
    allowed = (entry.get("tuning") or {}).get("precisions") or ()
    if "float8" in allowed:
        # The float8 issue's aims, where the job could choose it: float8 recommended, 1.12x the
        # fastest bf16 peer and no slower than the float8 peers (CI lows).
        # A group with no measured peer (every one failed) misses its aim: nothing was beaten.
        out["recommends_float8"] = (entry.get("recommended") or {}).get("precision") == "float8"
        bf16 = entry.get("ratio_vs_best_bf16_peer")
        out[f"ratio_vs_best_bf16_peer_low_at_least_{FLOAT8_OVER_BF16_AIM}"] = (
            bf16 is not None and bf16["ci95"][0] >= FLOAT8_OVER_BF16_AIM
        )
        f8 = entry.get("ratio_vs_best_float8_peer")
        out[f"ratio_vs_best_float8_peer_low_at_least_{RATIO_AIM}"] = (
            f8 is not None and f8["ci95"][0] >= RATIO_AIM
        )
    speed = entry.get("speedup_vs_seed_baseline")
    if precision == "tf32" and spec in AIMS_TF32 and speed is not None:
        out[f"speedup_vs_seed_baseline_at_least_{AIMS_TF32[spec]}"] = (
            speed["ratio"] >= AIMS_TF32[spec]
        )
    return out
