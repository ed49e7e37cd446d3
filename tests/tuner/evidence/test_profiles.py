"""`tuner.profile`: real profiler runs on the CPU, the trace analysis on traces with known answers,
the verdict thresholds, the one-line explanation, and storing on real SQLite studies."""

from __future__ import annotations

import gzip
import html
import itertools
import json
import os
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import trainers
from tests.tuner.tiny import sqlite_url
from trainers import LoopConfig
from trainers.kept_code import forget_compiled
from tuner.errors import TunerError
from tuner.evidence import intervals, profiles, trace, verdicts
from tuner.evidence import reader as study_reading
from tuner.evidence.reader import StudyReader as JobStudyReader
from tuner.evidence.recommendation import Recommendation
from tuner.evidence.report import build_report
from tuner.evidence.trace import CPU_NOTE, Profile, analyze_trace, profile_config
from tuner.evidence.verdicts import CPU_EXPLANATION, Verdict, explain, verdict
from tuner.search.deciding import profiling
from tuner.store import keys
from tuner.store.counting import TrialCounts

SEED_BASELINE = LoopConfig(num_streams=2, pin_memory=True, non_blocking=True)


@pytest.fixture(scope="module")
def cpu_profile() -> Profile:
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    return profile_config(workload, LoopConfig(sync_interval=2), steps=4, warmup=2, device="cpu")


def marks_of(trace: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith(prefix)
    ]


# -- a real profile on the CPU ---------------------------------------------------------------


def test_cpu_profile_says_it_has_no_cuda_activity_and_leaves_gpu_figures_empty(
    cpu_profile: Profile,
) -> None:
    assert cpu_profile.cuda_activity is False
    assert cpu_profile.device == "cpu"
    assert cpu_profile.note == CPU_NOTE
    assert cpu_profile.note == (
        "profiled without CUDA activity (CPU run): GPU figures are not available"
    )
    for figure in (
        "gpu_busy_fraction",
        "launch_ms_per_step",
        "h2d_ms_per_step",
        "h2d_overlap_fraction",
        "h2d_exposed_ms_per_step",
        "kernels_per_step",
    ):
        assert getattr(cpu_profile, figure) is None, figure
    assert cpu_profile.sync_ms_per_step == 0.0  # the CPU harvester never blocks


def test_cpu_profile_figures_are_sane(cpu_profile: Profile) -> None:
    assert cpu_profile.steps == 4
    assert cpu_profile.config == LoopConfig(sync_interval=2).to_dict()
    assert 0.0 < cpu_profile.step_ms < 1000.0
    assert cpu_profile.unprofiled_step_ms is not None and cpu_profile.unprofiled_step_ms > 0
    assert cpu_profile.ops_per_step > 10  # an MLP step is dozens of aten ops
    assert cpu_profile.seconds > cpu_profile.step_ms * 3 * cpu_profile.steps / 1e3
    parts = cpu_profile.breakdown_ms
    assert set(parts) == {"data", "optimizer", "host", "sync"}
    assert all(v >= 0.0 for v in parts.values())
    assert parts["optimizer"] > 0.0 and parts["data"] > 0.0
    assert sum(parts.values()) == pytest.approx(cpu_profile.step_ms, rel=1e-6)


def test_the_recorded_region_is_exactly_the_profiled_steps(cpu_profile: Profile) -> None:
    trace = cpu_profile.trace()
    (mark,) = marks_of(trace, "ProfilerStep#")
    start, end = mark["ts"], mark["ts"] + mark["dur"]
    inside = [
        e
        for e in marks_of(trace, "Optimizer.step#")
        if start <= e["ts"] and e["ts"] + e["dur"] <= end
    ]
    assert len(inside) == cpu_profile.steps
    assert cpu_profile.step_ms == pytest.approx(mark["dur"] / cpu_profile.steps / 1e3)
    assert "host_name" not in trace and "traceName" not in trace


def test_profiling_puts_the_weights_back() -> None:
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    profile_config(workload, LoopConfig(), steps=2, warmup=1, device="cpu")
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_profiling_writes_nothing_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    profile_config(workload, LoopConfig(), steps=2, warmup=1, device="cpu")
    assert capfd.readouterr().err == ""  # kineto's USDT/STAGE banner lines are dropped


def test_only_kinetos_banner_lines_are_dropped(capfd: pytest.CaptureFixture[str]) -> None:
    with trace._kineto_quiet():
        os.write(
            2,
            b"USDT:2026-11-22 14:11:46 1578:1578 SyncActivityProfilerHandler.cpp:52] "
            b"profiler_start\nkeep me\nSTAGE:2026-11-22 14:11:46 1:1 X.cpp:51] "
            b"Completed Stage: Warm Up\nand me\n",
        )
    assert capfd.readouterr().err == "keep me\nand me\n"


def test_a_cuda_graph_on_the_cpu_is_refused_like_a_run() -> None:
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    with pytest.raises(trainers.UnsupportedOnDevice):
        profile_config(workload, LoopConfig(cuda_graph=True), steps=2, device="cpu")


def _unprofiled(study: str) -> Recommendation:
    """A recommendation that left no profile out: `said` then speaks of the stored ones only."""
    return Recommendation(
        study=study, config=None, reason="none passed", trial_counts=TrialCounts(), gpu_seconds=0
    )


@pytest.mark.slow
def test_a_compiled_profile_says_what_it_found_in_the_fx_graph_cache(tmp_path: Path) -> None:
    """A profile in a child compiles its config again: the first into an empty cache misses, a
    second (a new process's Dynamo, the same cache folder) hits, and the progress line says
    which."""
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    config = LoopConfig(compile="default")
    found = []
    with trainers.compile_cache_dir(tmp_path / "inductor"):
        for _ in range(2):
            forget_compiled()  # as the profiles' child: the code of a run elsewhere is not here
            found.append(profile_config(workload, config, steps=2, warmup=2, device="cpu"))
    cold, warm = found
    assert cold.compile_cache is not None and warm.compile_cache is not None
    assert cold.compile_cache["hits"] == 0 and cold.compile_cache["misses"] > 0
    assert warm.compile_cache == {"hits": cold.compile_cache["misses"], "misses": 0}
    study = optuna.create_study(storage=sqlite_url(tmp_path), study_name="looked")
    for name, profile in (("recommended", cold), ("seed-baseline", warm)):
        profiles.store_profile(study, profile, None, name=name)
    lines = profiling.said(study, _unprofiled("looked"))
    assert any(
        line.startswith("profile of recommended:")
        and line.endswith(f"; FX-graph cache: 0 of {cold.compile_cache['misses']} graphs hit")
        for line in lines
    ), lines
    assert any(line.endswith(" graphs hit") and "seed-baseline" in line for line in lines)


def test_an_eager_profile_looked_in_no_cache_and_its_line_says_nothing_of_one(
    tmp_path: Path, cpu_profile: Profile
) -> None:
    assert cpu_profile.compile_cache is None
    study = optuna.create_study(storage=sqlite_url(tmp_path), study_name="eager")
    profiles.store_profile(study, cpu_profile, None, name="seed-baseline")
    (line,) = profiling.said(study, _unprofiled("eager"))
    assert line.startswith("profile of seed-baseline:") and "cache" not in line


def test_the_verdict_of_a_cpu_profile_is_unknown_and_says_why(cpu_profile: Profile) -> None:
    found = verdict(cpu_profile)
    assert found.kind == "unknown"
    # Said as a CPU run, not as "unknown: ...", which reads as an error (issue 29).
    assert found.explanation == verdicts.CPU_EXPLANATION
    assert not found.explanation.startswith("unknown")


# -- the analysis on a trace with known answers ----------------------------------------------


def X(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def cuda_trace() -> dict[str, Any]:
    """2 steps in a 10 ms window (microseconds): every figure below is worked out by hand."""
    return {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#2", 0, 10_000),
            X("gpu_user_annotation", "ProfilerStep#2", 0, 10_000),  # the GPU's copy: not the region
            X("cpu_op", "aten::mm", 50, 100),
            X("cpu_op", "aten::add", 300, 50),
            # kernels: [100, 600] and [500, 1100] overlap -> 1000 us; [2000, 2500] -> 500 us;
            # one half outside the window counts only inside it: [9900, 10000] -> 100 us.
            X("kernel", "gemm", 100, 500),
            X("kernel", "elementwise", 500, 600),
            X("kernel", "reduce", 2000, 500),
            X("kernel", "late", 9900, 200),
            # H2D copies: [50, 250] (150 us under a kernel) and [3000, 3400] (no kernel): 600 us,
            # 150 overlapped, 450 exposed. A D2H copy [2600, 2700] is other GPU work.
            X("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 50, 200),
            X("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 3000, 400),
            X("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 2600, 100),
            X("gpu_memset", "Memset (Device)", 2550, 100),  # [2550, 2650]: 50 us not under D2H
            # host calls: three kernel launches and a graph launch of 10 us each, a memcpy launch
            X("cuda_runtime", "cudaLaunchKernel", 90, 10),
            X("cuda_runtime", "cudaLaunchKernel", 400, 10),
            X("cuda_driver", "cuLaunchKernelEx", 1900, 10),
            X("cuda_runtime", "cudaGraphLaunch", 5000, 10),
            X("cuda_runtime", "cudaMemcpyAsync", 2990, 10),
            # syncs: the window's own device syncs at both ends are left out; a stream sync of
            # 1000 us with the GPU busy for 400 of it (H2D [3000, 3400]) and idle for 600.
            X("cuda_runtime", "cudaDeviceSynchronize", 0, 20),
            X("cuda_runtime", "cudaStreamSynchronize", 3000, 1000),
            X("cuda_runtime", "cudaEventQuery", 4500, 5),  # a poll, not a sync
            X("cuda_runtime", "cudaDeviceSynchronize", 9800, 200),
        ]
    }


def test_trace_figures_union_overlapping_kernels_and_split_the_copies() -> None:
    figures = analyze_trace(cuda_trace(), steps=2, cuda=True)
    assert figures["step_ms"] == pytest.approx(5.0)
    assert figures["gpu_busy_fraction"] == pytest.approx((1000 + 500 + 100) / 10_000)
    assert figures["kernels_per_step"] == pytest.approx(2.0)
    assert figures["launch_ms_per_step"] == pytest.approx(40 / 2 / 1e3)
    assert figures["h2d_ms_per_step"] == pytest.approx(600 / 2 / 1e3)
    assert figures["h2d_overlap_fraction"] == pytest.approx(150 / 600)
    assert figures["h2d_exposed_ms_per_step"] == pytest.approx(450 / 2 / 1e3)
    assert figures["sync_ms_per_step"] == pytest.approx(1000 / 2 / 1e3)
    assert figures["ops_per_step"] == pytest.approx(1.0)
    assert figures["breakdown_ms"] == pytest.approx(
        {
            "kernels": 1600 / 2e3,
            "h2d_exposed": 450 / 2e3,
            "other_gpu": 150 / 2e3,  # memset [2550, 2650] + D2H [2600, 2700]
            "idle_sync": 600 / 2e3,  # the stream sync's [3400, 4000]
            "idle_host": (10_000 - 1600 - 450 - 150 - 600) / 2e3,
        }
    )
    assert sum(figures["breakdown_ms"].values()) == pytest.approx(figures["step_ms"])


def test_the_window_syncs_count_when_asked() -> None:
    figures = analyze_trace(cuda_trace(), steps=2, cuda=True, window_syncs=False)
    assert figures["sync_ms_per_step"] == pytest.approx((20 + 1000 + 200) / 2 / 1e3)


def test_without_h2d_copies_the_overlap_is_unknown_not_perfect() -> None:
    trace = cuda_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if "HtoD" not in e["name"]]
    figures = analyze_trace(trace, steps=2, cuda=True)
    assert figures["h2d_ms_per_step"] == 0.0
    assert figures["h2d_overlap_fraction"] is None


def test_a_trace_without_step_marks_is_taken_whole() -> None:
    trace = {"traceEvents": [X("cpu_op", "aten::mm", 100, 100), X("kernel", "k", 150, 250)]}
    figures = analyze_trace(trace, steps=1, cuda=True)
    assert figures["step_ms"] == pytest.approx(0.3)
    assert figures["gpu_busy_fraction"] == pytest.approx(250 / 300)
    with pytest.raises(ValueError, match="no complete events"):
        analyze_trace({"traceEvents": []}, steps=1, cuda=False)


interval_lists = st.lists(
    st.tuples(st.integers(0, 100), st.integers(0, 30)).map(
        lambda p: (float(p[0]), float(p[0] + p[1]))
    ),
    max_size=12,
)


@given(interval_lists, interval_lists)
def test_interval_algebra_adds_up(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> None:
    ma, mb = intervals.merge(a), intervals.merge(b)
    both = intervals.intersect(ma, mb)
    union = intervals.merge([*ma, *mb])
    assert intervals.total(union) == pytest.approx(
        intervals.total(ma) + intervals.total(mb) - intervals.total(both)
    )
    assert intervals.total(intervals.subtract(ma, mb)) + intervals.total(both) == pytest.approx(
        intervals.total(ma)
    )
    assert all(s < e for s, e in ma) and all(x[1] < y[0] for x, y in itertools.pairwise(ma))


# -- verdicts --------------------------------------------------------------------------------


def gpu_profile(
    *,
    busy: float,
    sync: float = 0.0,
    exposed: float = 0.0,
    step_ms: float = 10.0,
    unprofiled_ms: float | None = None,
) -> Profile:
    """A CUDA profile whose fractions of a `step_ms` step are the given ones (by default the
    profiler did not slow the step)."""
    return Profile(
        config=SEED_BASELINE.to_dict(),
        device="cuda:0",
        cuda_activity=True,
        steps=10,
        step_ms=step_ms,
        unprofiled_step_ms=step_ms if unprofiled_ms is None else unprofiled_ms,
        gpu_busy_fraction=busy,
        launch_ms_per_step=1.0,
        h2d_ms_per_step=exposed * step_ms + 0.5,
        h2d_overlap_fraction=0.5,
        h2d_exposed_ms_per_step=exposed * step_ms,
        sync_ms_per_step=sync * step_ms,
        kernels_per_step=120.0,
        ops_per_step=300.0,
        breakdown_ms={"kernels": busy * step_ms},
        note=None,
    )


@pytest.mark.parametrize(
    ("prof", "kind", "explanation"),
    [
        (gpu_profile(busy=0.17), "host-bound", "host-bound: GPU idle 83 % of the step"),
        (gpu_profile(busy=0.49), "host-bound", "host-bound: GPU idle 51 % of the step"),
        (gpu_profile(busy=0.5), "gpu-bound", "gpu-bound: GPU busy 50 % of the step"),
        (gpu_profile(busy=0.96, sync=0.1), "gpu-bound", "gpu-bound: GPU busy 96 % of the step"),
        # A host waiting on a saturated GPU is gpu-bound, however long it waits.
        (gpu_profile(busy=0.95, sync=0.8), "gpu-bound", "gpu-bound: GPU busy 95 % of the step"),
        (
            gpu_profile(busy=0.6, sync=0.35),
            "sync-bound",
            "sync-bound: host blocked in syncs 35 % of the step while the GPU idled 40 %",
        ),
        (gpu_profile(busy=0.6, sync=0.30), "gpu-bound", "gpu-bound: GPU busy 60 % of the step"),
        # Sync is checked before host: both hold here, and the waits are what to remove first.
        (
            gpu_profile(busy=0.3, sync=0.4),
            "sync-bound",
            "sync-bound: host blocked in syncs 40 % of the step while the GPU idled 70 %",
        ),
        # Transfer is checked first: exposed copies also make the kernels look idle.
        (
            gpu_profile(busy=0.3, exposed=0.25, sync=0.4),
            "transfer-bound",
            "transfer-bound: host-to-device copies not overlapped with compute take 25 % of "
            "the step",
        ),
        (gpu_profile(busy=0.7, exposed=0.2), "gpu-bound", "gpu-bound: GPU busy 70 % of the step"),
    ],
)
def test_verdict_thresholds_and_order(prof: Profile, kind: str, explanation: str) -> None:
    found = verdict(prof)
    assert (found.kind, found.explanation) == (kind, explanation)
    assert found.figures["gpu_busy_fraction"] == pytest.approx(prof.gpu_busy_fraction)
    assert found.figures["sync_fraction"] == pytest.approx(prof.sync_ms_per_step / prof.step_ms)
    # The same verdict from the stored attributes.
    assert verdict(json.loads(json.dumps(prof.to_attrs()))) == found


def test_gpu_time_is_judged_against_the_unprofiled_step() -> None:
    # transformer large, eager, on an H100: 76.3 ms per step profiled, 38.7 ms unprofiled.
    slowed = gpu_profile(busy=0.413, step_ms=76.3, unprofiled_ms=38.7)
    found = verdict(slowed)
    assert (found.kind, found.explanation) == ("gpu-bound", "gpu-bound: GPU busy 81 % of the step")
    assert found.figures["gpu_busy_fraction_profiled"] == 0.413
    # transformer small, eager: the GPU idles whichever step it is measured against.
    assert verdict(gpu_profile(busy=0.068, step_ms=35.1, unprofiled_ms=21.7)).kind == "host-bound"
    # A profile faster than its unprofiled window never reads as more than fully busy.
    assert (
        verdict(gpu_profile(busy=0.9, step_ms=10.0, unprofiled_ms=5.0)).figures["gpu_busy_fraction"]
        == 1.0
    )
    exposed = verdict(gpu_profile(busy=0.3, exposed=0.15, step_ms=20.0, unprofiled_ms=10.0))
    assert exposed.kind == "transfer-bound"  # 3 ms of exposed copies in a 10 ms step


def test_every_kind_is_reachable() -> None:
    kinds = {
        verdict(p).kind
        for p in (
            gpu_profile(busy=0.1),
            gpu_profile(busy=0.4, exposed=0.3),
            gpu_profile(busy=0.5, sync=0.4),
            gpu_profile(busy=0.9),
            dataclasses_replace(
                gpu_profile(busy=0.9), cuda_activity=False, gpu_busy_fraction=None, note=CPU_NOTE
            ),
            dataclasses_replace(
                gpu_profile(busy=0.9),
                comm_ms_per_step=2.0,
                comm_exposed_ms_per_step=1.5,
                comm_exposed_fraction=0.75,
                comm_kind="all-reduce",
            ),
        )
    }
    assert kinds == set(verdicts.KINDS)


def dataclasses_replace(prof: Profile, **changes: Any) -> Profile:
    return Profile.from_attrs(prof.to_attrs() | changes)


# -- the one-line explanation ----------------------------------------------------------------


def recommendation(
    config: LoopConfig,
    *,
    source: str = "trial-7",
    median: float = 6.4,
    ci: tuple[float, float] = (6.2, 6.6),
) -> dict[str, Any]:
    return {
        "config": config.to_dict(),
        "source": source,
        "speedup": {
            "pytorch-default": {"median": median * 1.1, "ci95": [6.9, 7.2]},
            "seed-baseline": {"median": median, "ci95": list(ci)},
        },
        "final_round": [
            {"name": "pytorch-default", "config": trainers.REFERENCE.to_dict()},
            {"name": "seed-baseline", "config": SEED_BASELINE.to_dict()},
            {"name": source, "config": config.to_dict()},
        ],
    }


def test_explain_in_the_issue_style() -> None:
    rec = recommendation(SEED_BASELINE.replace(cuda_graph=True))
    verdicts = {
        "seed-baseline": verdict(gpu_profile(busy=0.17)),
        "pytorch-default": verdict(gpu_profile(busy=0.2)),
    }
    assert explain(rec, verdicts) == (
        "host-bound: GPU idle 83 % of the step; whole-step CUDA graph removed the launch "
        "overhead: 6.4x (CI 6.2-6.6) over seed-baseline"
    )


def test_explain_lists_the_other_changes_and_the_new_verdict() -> None:
    config = SEED_BASELINE.replace(
        cuda_graph=True, num_streams=1, sync_interval=10, sync_mode="event"
    )
    verdicts = {
        "seed-baseline": verdict(gpu_profile(busy=0.17)),
        keys.PROFILE_RECOMMENDED: verdict(gpu_profile(busy=0.96)),
    }
    assert explain(recommendation(config), verdicts) == (
        "host-bound: GPU idle 83 % of the step; whole-step CUDA graph removed the launch "
        "overhead (also 1 stream instead of 2, syncing every 10 steps instead of every step, "
        "event syncs instead of synchronize): 6.4x (CI 6.2-6.6) over seed-baseline; now "
        "gpu-bound: GPU busy 96 % of the step"
    )


def test_explain_a_sync_bound_baseline() -> None:
    config = SEED_BASELINE.replace(sync_interval=20)
    verdicts = {"seed-baseline": verdict(gpu_profile(busy=0.55, sync=0.4))}
    assert explain(recommendation(config, median=1.31, ci=(1.25, 1.36)), verdicts) == (
        "sync-bound: host blocked in syncs 40 % of the step while the GPU idled 45 %; syncing "
        "every 20 steps instead of every step removed most of the host's waits: 1.31x "
        "(CI 1.25-1.36) over seed-baseline"
    )


def test_explain_a_gpu_bound_baseline_credits_the_graph_not_the_first_field() -> None:
    """The figures of transformer large on an H100 (2026-11-22): busy 76 % eager, 97 % as a graph.

    Before gpu-bound had effects, the first changed field in LoopConfig order (sync_interval)
    led the sentence, as if syncing less had made a GPU-bound step 1.26x faster.
    """
    config = SEED_BASELINE.replace(cuda_graph=True, sync_interval=16, sync_mode="event")
    verdicts = {
        "seed-baseline": verdict(gpu_profile(busy=0.76)),
        keys.PROFILE_RECOMMENDED: verdict(gpu_profile(busy=0.97)),
    }
    assert explain(recommendation(config, median=1.26, ci=(1.21, 1.34)), verdicts) == (
        "gpu-bound: GPU busy 76 % of the step; whole-step CUDA graph closed the GPU's idle gaps "
        "between kernels (also syncing every 16 steps instead of every step, event syncs "
        "instead of synchronize): 1.26x (CI 1.21-1.34) over seed-baseline"
    )


def test_a_stored_recommendation_is_read_again_under_the_current_rules(tmp_path: Path) -> None:
    """`best`, the API and the report derive verdicts and the sentence from the stored figures:
    a study written by older code (here: a stale sentence and verdict) reads like a new one."""
    url = sqlite_url(tmp_path)
    config = SEED_BASELINE.replace(cuda_graph=True, sync_interval=16, sync_mode="event")
    study = optuna.create_study(storage=url, study_name="old")
    stale = {"kind": "host-bound", "explanation": "host-bound: GPU idle 59 % of the step"}
    study.set_user_attr(
        keys.RECOMMENDATION,
        recommendation(config, median=1.26, ci=(1.21, 1.34))
        | {
            "study": "old",
            "explanation": "host-bound: GPU idle 59 % of the step; syncing every "
            "16 steps instead of every step",
            "verdicts": {"seed-baseline": stale},
        },
    )
    study.set_user_attr("profile/seed-baseline", gpu_profile(busy=0.76).to_attrs())
    study.set_user_attr("profile/recommended", gpu_profile(busy=0.97).to_attrs())
    read = study_reading.recommendation(url, "old").to_dict()
    assert read["explanation"].startswith(
        "gpu-bound: GPU busy 76 % of the step; whole-step CUDA graph closed the GPU's idle gaps"
    )
    assert read["verdicts"]["seed-baseline"]["kind"] == "gpu-bound"
    assert read["verdicts"]["recommended"]["kind"] == "gpu-bound"
    reader = JobStudyReader(optuna.storages.RDBStorage(url))
    assert reader.recommendation("old").explanation == read["explanation"]
    page = build_report(optuna.load_study(study_name="old", storage=url))
    assert html.escape(read["explanation"]) in page

    bare = optuna.create_study(storage=url, study_name="no-profiles")
    bare.set_user_attr(keys.RECOMMENDATION, recommendation(config) | {"explanation": "kept"})
    assert study_reading.recommendation(url, "no-profiles").explanation == "kept"


def test_explain_change_nothing_on_a_cpu() -> None:
    rec = recommendation(trainers.REFERENCE, source="pytorch-default", median=1.06, ci=(1.0, 1.08))
    verdicts = {
        "seed-baseline": verdict(
            dataclasses_replace(
                gpu_profile(busy=0.5), cuda_activity=False, gpu_busy_fraction=None, note=CPU_NOTE
            )
        )
    }
    assert explain(rec, verdicts) == (
        f"{CPU_EXPLANATION}; the PyTorch default (change nothing): 1.06x (CI 1.00-1.08) over "
        "seed-baseline"
    )


def test_explain_when_the_baseline_itself_wins() -> None:
    rec = recommendation(SEED_BASELINE, source="seed-baseline", median=1.0, ci=(0.97, 1.03))
    verdicts = {"seed-baseline": verdict(gpu_profile(busy=0.92))}
    assert explain(rec, verdicts) == (
        "gpu-bound: GPU busy 92 % of the step; keeping "
        "seed-baseline's settings: 1.00x (CI 0.97-1.03) over "
        "seed-baseline"
    )


def test_explain_without_a_recommendation_gives_the_reason() -> None:
    rec = {"config": None, "reason": "no config passed parity (and the memory cap)"}
    assert explain(rec, {"seed-baseline": verdict(gpu_profile(busy=0.17))}) == (
        "host-bound: GPU idle 83 % of the step (seed-baseline); no recommendation: no config "
        "passed parity (and the memory cap)"
    )
    assert explain(rec, {}) == "no recommendation: no config passed parity (and the memory cap)"


# -- storing ---------------------------------------------------------------------------------


def test_artifact_dir_sits_beside_an_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(profiles.ARTIFACTS_ENV, raising=False)
    assert profiles.artifact_dir(f"sqlite:///{tmp_path}/tuner.db") == tmp_path / "tuner-artifacts"
    assert profiles.artifact_dir("sqlite:///tuner.db") == Path("tuner-artifacts")
    with pytest.raises(TunerError, match="--artifacts"):
        profiles.artifact_dir("postgresql+psycopg://postgres@127.0.0.1/test")
    with pytest.raises(TunerError, match="--artifacts"):
        profiles.artifact_dir("sqlite:///:memory:")
    assert profiles.artifact_dir("postgresql+psycopg://h/db", tmp_path / "x") == tmp_path / "x"
    assert profiles.trace_dir("postgresql+psycopg://h/db") is None
    assert profiles.trace_dir(f"sqlite:///{tmp_path}/t.db") == tmp_path / "t-artifacts"
    monkeypatch.setenv(profiles.ARTIFACTS_ENV, str(tmp_path / "env"))
    assert profiles.artifact_dir("postgresql+psycopg://h/db") == tmp_path / "env"


def test_store_profile_on_the_study_round_trips_trace_and_figures(
    tmp_path: Path, cpu_profile: Profile
) -> None:
    storage = sqlite_url(tmp_path)
    study = optuna.create_study(storage=storage, study_name="stored")
    directory = profiles.artifact_dir(storage)
    artifact_id = profiles.store_profile(study, cpu_profile, directory, name="seed-baseline")
    assert artifact_id is not None
    assert (directory / artifact_id).is_file()

    reloaded = optuna.load_study(study_name="stored", storage=storage)
    attrs = reloaded.user_attrs["profile/seed-baseline"]
    assert attrs["artifact_id"] == artifact_id
    assert attrs["artifact_file"] == "seed-baseline.trace.json.gz"
    assert attrs["verdict"] == verdict(cpu_profile).to_dict()
    assert Profile.from_attrs(attrs) == dataclasses_replace(cpu_profile)  # figures, no trace
    assert profiles.study_profiles(reloaded) == {"seed-baseline": attrs}

    (meta,) = optuna.artifacts.get_all_artifact_meta(reloaded)
    assert (meta.artifact_id, meta.filename, meta.encoding) == (
        artifact_id,
        "seed-baseline.trace.json.gz",
        "gzip",
    )
    # Downloaded back by hand: gzip, then a Chrome trace with the profiled step in it.
    with gzip.open(directory / artifact_id) as f:
        trace = json.load(f)
    assert trace == cpu_profile.trace() == profiles.load_trace(directory, artifact_id)
    assert len(marks_of(trace, "ProfilerStep#")) == 1


def test_store_profile_on_a_running_trial_and_never_on_a_finished_one(
    tmp_path: Path, cpu_profile: Profile
) -> None:
    storage = sqlite_url(tmp_path)
    study = optuna.create_study(storage=storage, study_name="trials")
    directory = tmp_path / "artifacts"
    trial = study.ask()
    artifact_id = profiles.store_profile(trial, cpu_profile, directory)
    study.tell(trial, 1.0)
    frozen = study.trials[0]
    assert frozen.user_attrs["profile"]["artifact_id"] == artifact_id
    assert frozen.user_attrs["profile"]["artifact_file"] == "trial-0.trace.json.gz"
    (meta,) = optuna.artifacts.get_all_artifact_meta(frozen, storage=study._storage)
    assert meta.artifact_id == artifact_id
    with pytest.raises(TypeError, match="finished"):
        profiles.store_profile(frozen, cpu_profile, directory)
    with pytest.raises(ValueError, match="name="):
        profiles.store_profile(study, cpu_profile, directory)


def test_without_an_artifact_dir_only_the_figures_are_stored(
    tmp_path: Path, cpu_profile: Profile
) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), study_name="figures")
    assert profiles.store_profile(study, cpu_profile, None, name="recommended") is None
    attrs = study.user_attrs["profile/recommended"]
    assert (attrs["artifact_id"], attrs["artifact_file"]) == (None, None)
    assert attrs["step_ms"] == cpu_profile.step_ms
    assert optuna.artifacts.get_all_artifact_meta(study) == []


def test_profile_trial_records_a_failure_instead_of_raising(tmp_path: Path) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), study_name="failing")
    workload = trainers.load_workload("mlp", "tiny", seed=0)
    profiler = profiling.in_process(workload, device="cpu", steps=2, warmup=1)
    trial = study.ask()
    profiling.profile_trial(trial, LoopConfig(cuda_graph=True), tmp_path / "a", profiler)
    ok = study.ask()
    profiling.profile_trial(ok, LoopConfig(), tmp_path / "a", profiler)
    assert "needs a CUDA device" in study.trials[0].user_attrs["profile_error"]
    assert "profile" not in study.trials[0].user_attrs
    assert study.trials[1].user_attrs["profile"]["verdict"]["kind"] == "unknown"


# -- on a GPU (run with -m gpu on a lent GPU) --------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_profiles_attribute_the_small_transformer() -> None:
    workload = trainers.load_workload("transformer", "small", seed=0)
    seed = profile_config(workload, SEED_BASELINE, device="cuda")
    graph = profile_config(
        workload,
        SEED_BASELINE.replace(num_streams=1, cuda_graph=True, sync_interval=10),
        device="cuda",
    )
    for prof in (seed, graph):
        assert prof.cuda_activity and prof.note is None
        assert prof.gpu_busy_fraction is not None and 0.0 < prof.gpu_busy_fraction <= 1.0
        assert prof.kernels_per_step is not None and prof.kernels_per_step > 10
        assert prof.h2d_ms_per_step is not None and prof.h2d_ms_per_step > 0.0
        assert sum(prof.breakdown_ms.values()) == pytest.approx(prof.step_ms, rel=1e-6)
    assert seed.launch_ms_per_step is not None and graph.launch_ms_per_step is not None
    assert graph.launch_ms_per_step < seed.launch_ms_per_step
    names = {e["name"] for e in graph.trace()["traceEvents"] if e.get("cat") == "cuda_runtime"}
    assert "cudaGraphLaunch" in names
    # GPU-FACTS: the graph is ~6x faster on transformer small, so eager leaves the GPU idle.
    assert verdict(seed).kind == "host-bound"
    assert graph.gpu_busy_fraction is not None and seed.gpu_busy_fraction is not None
    assert graph.gpu_busy_fraction > 2 * seed.gpu_busy_fraction
    assert isinstance(verdict(graph), Verdict)


def test_explain_names_the_compiler_levers() -> None:
    verdicts = {"seed-baseline": verdict(gpu_profile(busy=0.17))}
    graph = SEED_BASELINE.replace(cuda_graph=True, compile="default", optimizer="fused")
    assert explain(recommendation(graph), verdicts) == (
        "host-bound: GPU idle 83 % of the step; torch.compile (kernels fused) in one whole-step "
        "CUDA graph removed the launch overhead (also the fused optimizer): 6.4x (CI 6.2-6.6) "
        "over seed-baseline"
    )
    inductor = SEED_BASELINE.replace(compile="reduce-overhead")
    assert explain(recommendation(inductor), verdicts).startswith(
        "host-bound: GPU idle 83 % of the step; torch.compile reduce-overhead (Inductor's CUDA "
        "graphs) removed the launch overhead and fused kernels: 6.4x"
    )
    gpu_bound = {"seed-baseline": verdict(gpu_profile(busy=0.9))}
    fused = SEED_BASELINE.replace(compile="max-autotune-no-cudagraphs")
    assert "torch.compile max-autotune (no CUDA graphs) fused kernels, so the GPU reads" in (
        explain(recommendation(fused), gpu_bound)
    )
