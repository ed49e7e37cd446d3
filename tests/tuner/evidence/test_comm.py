"""The share of communication hidden under compute, on small Chrome traces worked out by hand,
and the verdict that says it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tuner.evidence.comm import communication
from tuner.evidence.trace import Profile, analyze_trace
from tuner.evidence.verdicts import KINDS, verdict


def X(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 7}


ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def ddp_trace() -> dict[str, Any]:
    """One step of 1000 us (the ProfilerStep region). Compute kernels cover [0, 300] and
    [400, 700] (two streams' kernels overlapping there: [400, 600] and [500, 700]). NCCL's
    all-reduces: [250, 450] is under compute for [250, 300] and [400, 450] and exposed for
    [300, 400]; [800, 900] is exposed whole; [950, 1100] is clipped to the region, [950, 1000],
    exposed. Communication 350 us, exposed 250 us."""
    return {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#2", 0, 1000),
            X("kernel", "sm90_xmma_gemm_f32f32", 0, 300),
            X("kernel", "vectorized_elementwise_kernel", 400, 200),
            X("kernel", "reduce_kernel", 500, 200),
            X("kernel", ALLREDUCE, 250, 200),
            X("kernel", ALLREDUCE, 800, 100),
            X("kernel", ALLREDUCE, 950, 150),
            # A copy neither hides communication nor is one.
            X("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 300, 100),
        ]
    }


def test_exposed_communication_is_its_time_minus_the_compute_kernels() -> None:
    kernels = [e for e in ddp_trace()["traceEvents"] if e["cat"] == "kernel"]
    found = communication(kernels, (0.0, 1000.0), steps=1)
    assert found["comm_ms_per_step"] == pytest.approx(350 / 1e3)
    assert found["comm_exposed_ms_per_step"] == pytest.approx(250 / 1e3)
    assert found["comm_exposed_fraction"] == pytest.approx(250 / 350)
    assert found["comm_kind"] == "all-reduce"


def test_the_trace_figures_carry_it_and_a_run_without_nccl_has_none() -> None:
    trace = json.loads(json.dumps(ddp_trace()))  # as read back from the file
    figures = analyze_trace(trace, steps=1, cuda=True)
    assert figures["comm_exposed_fraction"] == pytest.approx(250 / 350)
    # Communication kernels are GPU work: in the busy time with the rest ([0, 700] chained
    # through the first all-reduce, [800, 900], [950, 1000]).
    assert figures["gpu_busy_fraction"] == pytest.approx((700 + 100 + 50) / 1000)
    plain = {"traceEvents": [e for e in trace["traceEvents"] if "nccl" not in e["name"]]}
    none = analyze_trace(plain, steps=1, cuda=True)
    assert none["comm_ms_per_step"] is None and none["comm_exposed_fraction"] is None


def test_fully_hidden_and_fsdp_collectives() -> None:
    kernels = [
        X("kernel", "gemm", 0, 1000),
        X("kernel", "ncclDevKernel_AllGather_RING_LL", 100, 200),
        X("kernel", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 500, 100),
    ]
    found = communication(kernels, (0.0, 1000.0), steps=2)
    assert found["comm_exposed_fraction"] == 0.0
    assert found["comm_ms_per_step"] == pytest.approx(300 / 2 / 1e3)
    assert found["comm_kind"] == "communication"


def profile(comm_exposed_ms: float | None, comm_ms: float | None = 2.0) -> Profile:
    return Profile(
        config={},
        device="cuda:0",
        cuda_activity=True,
        steps=10,
        step_ms=10.0,
        unprofiled_step_ms=10.0,
        gpu_busy_fraction=0.8,
        launch_ms_per_step=0.1,
        h2d_ms_per_step=0.0,
        h2d_overlap_fraction=None,
        h2d_exposed_ms_per_step=0.0,
        sync_ms_per_step=0.0,
        kernels_per_step=100.0,
        ops_per_step=200.0,
        breakdown_ms={},
        note=None,
        comm_ms_per_step=comm_ms,
        comm_exposed_ms_per_step=comm_exposed_ms,
        comm_exposed_fraction=None if comm_exposed_ms is None else comm_exposed_ms / 2.0,
        comm_kind="all-reduce",
    )


def test_the_verdict_says_how_much_all_reduce_time_is_exposed() -> None:
    assert "communication-bound" in KINDS
    bound = verdict(profile(comm_exposed_ms=1.4))  # 70 % of 2 ms exposed: 14 % of the step
    assert bound.kind == "communication-bound"
    assert bound.explanation == (
        "communication-bound: 70 % of all-reduce time exposed (14 % of the step)"
    )
    assert bound.figures["comm_exposed_fraction"] == pytest.approx(0.7)
    hidden = verdict(profile(comm_exposed_ms=0.2))  # 10 % of 2 ms: 2 % of the step
    assert hidden.kind == "gpu-bound"
    assert (
        hidden.explanation
        == "gpu-bound: GPU busy 80 % of the step, 10 % of all-reduce time exposed"
    )
    plain = verdict(profile(comm_exposed_ms=None, comm_ms=None))
    assert plain.explanation == "gpu-bound: GPU busy 80 % of the step"
    # Stored profiles from before these figures read back without them.
    stored = profile(None, None).to_attrs()
    for key in (
        "comm_ms_per_step",
        "comm_exposed_ms_per_step",
        "comm_exposed_fraction",
        "comm_kind",
    ):
        del stored[key]
    assert verdict(stored).kind == "gpu-bound"


def test_the_explanation_names_the_lever_that_acts_on_exposed_communication() -> None:
    from trainers import LoopConfig
    from tuner.evidence.verdicts import explain

    rec = {
        "config": LoopConfig(parallel="ddp", bucket_cap_mb=5, static_graph=True).to_dict(),
        "source": "trial-3",
        "speedup": {"pytorch-default": {"median": 1.2, "ci95": [1.1, 1.3]}},
        "final_round": [
            {"name": "pytorch-default", "config": LoopConfig(parallel="ddp").to_dict()}
        ],
    }
    line = explain(rec, {"pytorch-default": verdict(profile(comm_exposed_ms=1.4))})
    assert line == (
        "communication-bound: 70 % of all-reduce time exposed (14 % of the step); "
        "5 MiB gradient buckets started the all-reduces at other points of the backward "
        "(also DDP's static graph): 1.20x (CI 1.10-1.30) over pytorch-default"
    )
