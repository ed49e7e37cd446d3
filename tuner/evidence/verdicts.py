"""What bounds a step, from a profile's figures (`tuner.evidence.trace`), and the sentence
that explains a recommendation.

`verdict(profile)` names what bounds the step. Its GPU fractions (busy, exposed copies) are the
GPU's time per step over `unprofiled_step_ms`, not over the profiled step: the profiler slows the
host, which records every op and launch, and not the kernels. On an H100 the eager transformer
`large` ran 38.7 ms per step unprofiled and 76.3 ms profiled, with 31.5 ms of kernels per step:
41 % busy over the profiled step would call it host-bound, 81 % over the real step says
gpu-bound, which the whole-step graph's mere 1.22x gain confirms (docs/benchmarks/README.md).
Host-side sync time stays a fraction of the profiled step. The checks run in this order, first
match wins:
1. no CUDA activity -> `unknown` (on a CPU, the sentence says it was a CPU run);
1b. `communication-bound` (a data-parallel run): NCCL's kernels that overlap no compute kernel
   take more than COMM_BOUND_FRACTION (10 %) of the step; the text gives the share of the
   communication time exposed ("communication-bound: 35 % of all-reduce time exposed"). Under
   that share, a verdict of another kind still says it (", 4 % of all-reduce time exposed");
2. `transfer-bound`: host-to-device copies that overlap no kernel take more than
   TRANSFER_BOUND_FRACTION (20 %) of the step. First, because exposed copies also leave the
   kernels idle and would otherwise read as host-bound;
3. `sync-bound`: the host is blocked in syncs for more than SYNC_BOUND_FRACTION (30 %) of the step
   while the GPU is busy less than GPU_SATURATED_FRACTION (90 %) of it: host and GPU take turns
   instead of overlapping. A host waiting on a saturated GPU is not sync-bound but gpu-bound;
4. `host-bound`: the GPU is busy less than HOST_BOUND_BUSY (50 %) of the step: it idles while the
   host launches (Python, launch calls, data loading);
5. `gpu-bound`: otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import trainers
from tuner.evidence.trace import CPU_NOTE, Profile
from tuner.store.keys import PROFILE_RECOMMENDED

HOST_BOUND_BUSY = 0.50
SYNC_BOUND_FRACTION = 0.30
TRANSFER_BOUND_FRACTION = 0.20
GPU_SATURATED_FRACTION = 0.90
CPU_EXPLANATION = "a CPU run, profiled without CUDA activity: GPU figures are not available"
"""The verdict's sentence for a profile without CUDA activity on a CPU."""
COMM_BOUND_FRACTION = 0.10
KINDS = (
    "host-bound",
    "transfer-bound",
    "sync-bound",
    "gpu-bound",
    "communication-bound",
    "unknown",
)


@dataclasses.dataclass(kw_only=True, frozen=True)
class Verdict:
    kind: str
    explanation: str
    figures: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Verdict:
        return cls(
            kind=values["kind"],
            explanation=values["explanation"],
            figures=dict(values.get("figures", {})),
        )


def _pct(fraction: float) -> str:
    return f"{round(fraction * 100)} %"


def verdict(prof: Profile | Mapping[str, Any]) -> Verdict:
    """What bounds the profiled step; the checks and their order are in the module doc."""
    p = prof if isinstance(prof, Profile) else Profile.from_attrs(prof)
    return _with_communication(p, _verdict(p))


def _with_communication(p: Profile, found: Verdict) -> Verdict:
    """A data-parallel profile's exposed communication, as its own verdict or said in another."""
    if p.comm_exposed_fraction is None or found.kind == "unknown":
        return found
    base_ms = p.unprofiled_step_ms if p.unprofiled_step_ms else p.step_ms
    # NCCL's kernels run on the GPU's clock, unslowed by the profiler: over the real step.
    exposed_step = min(1.0, (p.comm_exposed_ms_per_step or 0.0) / base_ms) if base_ms else 0.0
    words = f"{_pct(p.comm_exposed_fraction)} of {p.comm_kind or 'communication'} time exposed"
    figures = found.figures | {
        "comm_ms_per_step": p.comm_ms_per_step,
        "comm_exposed_ms_per_step": p.comm_exposed_ms_per_step,
        "comm_exposed_fraction": p.comm_exposed_fraction,
        "comm_exposed_step_fraction": exposed_step,
    }
    if exposed_step > COMM_BOUND_FRACTION:
        return Verdict(
            kind="communication-bound",
            figures=figures,
            explanation=f"communication-bound: {words} ({_pct(exposed_step)} of the step)",
        )
    return Verdict(kind=found.kind, figures=figures, explanation=f"{found.explanation}, {words}")


def _verdict(p: Profile) -> Verdict:
    step_ms = p.step_ms
    figures: dict[str, Any] = {
        "step_ms": step_ms,
        "cuda_activity": p.cuda_activity,
        "sync_fraction": p.sync_ms_per_step / step_ms if step_ms else None,
    }
    if not p.cuda_activity or p.gpu_busy_fraction is None:
        reason = p.note or CPU_NOTE
        # On a CPU nothing is unknown about the run: there is no GPU to tell anything about.
        said = CPU_EXPLANATION if reason == CPU_NOTE else f"unknown: {reason}"
        return Verdict(kind="unknown", explanation=said, figures=figures)
    # The profiler slows the host (every op and launch is recorded), not the kernels: GPU time
    # is taken over the step as it runs unprofiled (see the module doc).
    base_ms = p.unprofiled_step_ms if p.unprofiled_step_ms else step_ms
    busy = min(1.0, p.gpu_busy_fraction * step_ms / base_ms)
    sync = p.sync_ms_per_step / step_ms
    exposed = min(1.0, (p.h2d_exposed_ms_per_step or 0.0) / base_ms)
    figures |= {
        "gpu_busy_fraction": busy,
        "gpu_busy_fraction_profiled": p.gpu_busy_fraction,
        "unprofiled_step_ms": p.unprofiled_step_ms,
        "gpu_idle_fraction": 1.0 - busy,
        "h2d_exposed_fraction": exposed,
        "h2d_overlap_fraction": p.h2d_overlap_fraction,
        "launch_ms_per_step": p.launch_ms_per_step,
        "kernels_per_step": p.kernels_per_step,
    }
    if exposed > TRANSFER_BOUND_FRACTION:
        return Verdict(
            kind="transfer-bound",
            figures=figures,
            explanation=(
                f"transfer-bound: host-to-device copies not overlapped with compute take "
                f"{_pct(exposed)} of the step"
            ),
        )
    if sync > SYNC_BOUND_FRACTION and busy < GPU_SATURATED_FRACTION:
        return Verdict(
            kind="sync-bound",
            figures=figures,
            explanation=(
                f"sync-bound: host blocked in syncs {_pct(sync)} of the step while the GPU idled "
                f"{_pct(1.0 - busy)}"
            ),
        )
    if busy < HOST_BOUND_BUSY:
        return Verdict(
            kind="host-bound",
            figures=figures,
            explanation=f"host-bound: GPU idle {_pct(1.0 - busy)} of the step",
        )
    return Verdict(
        kind="gpu-bound",
        figures=figures,
        explanation=f"gpu-bound: GPU busy {_pct(busy)} of the step",
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _every(n: int) -> str:
    return "every step" if n == 1 else f"every {n} steps"


def _changes(config: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, str]:
    """What `config` changes against `base`, field -> a few words."""
    out: dict[str, str] = {}
    for field in trainers.field_names():
        new, old = config.get(field), base.get(field)
        if new == old or new is None:
            continue
        if field == "cuda_graph":
            out[field] = "whole-step CUDA graph" if new else "no CUDA graph"
        elif field == "num_streams":
            out[field] = f"{_plural(new, 'stream')} instead of {old}"
        elif field == "sync_interval":
            out[field] = f"syncing {_every(int(new))} instead of {_every(int(old or 1))}"
        elif field == "sync_mode":
            out[field] = f"{new} syncs instead of {old}"
        elif field == "prefetch_depth":
            out[field] = f"prefetching {_plural(new, 'batch')}" if new else "no prefetch"
            out[field] = out[field].replace("batchs", "batches")
        elif field == "pin_memory":
            out[field] = "pinned batches" if new else "unpinned batches"
        elif field == "non_blocking":
            out[field] = "non-blocking copies" if new else "blocking copies"
        elif field == "num_workers":
            out[field] = f"{_plural(new, 'DataLoader worker')}" if new else "no DataLoader workers"
        elif field == "compile":
            out[field] = _COMPILE_WORDS.get(str(new), f"torch.compile {new}")
        elif field == "optimizer":
            out[field] = _OPTIMIZER_WORDS.get(str(new), f"optimizer {new}")
        elif field in _DATA_PARALLEL_WORDS:
            out[field] = _DATA_PARALLEL_WORDS[field](new)
        else:  # a field added to LoopConfig later
            out[field] = f"{field}={new}"
    if config.get("cuda_graph") and "cuda_graph" in out and "compile" in out:
        # One lever, not two: the graph replays the compiled step (its kernels fused).
        out["cuda_graph"] = f"{out.pop('compile')} (kernels fused) in one whole-step CUDA graph"
    return out


_COMPILE_WORDS = {
    "none": "no torch.compile",
    "default": "torch.compile",
    "max-autotune-no-cudagraphs": "torch.compile max-autotune (no CUDA graphs)",
    "reduce-overhead": "torch.compile reduce-overhead (Inductor's CUDA graphs)",
}
_DATA_PARALLEL_WORDS: dict[str, Any] = {
    "parallel": lambda v: {"ddp": "DDP", "fsdp2": "FSDP2"}.get(str(v), "one process"),
    "bucket_cap_mb": lambda v: f"{v} MiB gradient buckets",
    "gradient_as_bucket_view": lambda v: "gradients as bucket views" if v else "gradient copies",
    "static_graph": lambda v: "DDP's static graph" if v else "no static graph",
    "reshard_after_forward": lambda v: (
        "parameters resharded after the forward" if v else "parameters kept to the backward"
    ),
    "fsdp_prefetch": lambda v: "explicit FSDP2 prefetch" if v else "FSDP2's implicit prefetch",
}
_OPTIMIZER_WORDS = {
    "as-built": "the optimizer as built",
    "foreach": "the foreach optimizer",
    "fused": "the fused optimizer",
    "compiled": "the optimizer step compiled",
}

# For each verdict kind: the settings that act on that bottleneck, what they did, in order.
# Compilation comes in twice: under a whole-step graph the graph removes the launches and the
# compiler fuses the kernels; reduce-overhead does both itself.
_EFFECTS: dict[str, list[tuple[str, str, Any]]] = {
    "host-bound": [
        ("compile", "removed the launch overhead and fused kernels", "reduce-overhead"),
        ("cuda_graph", "removed the launch overhead", True),
        ("compile", "fused kernels, so fewer launches", None),
        ("sync_interval", "let the host queue work ahead of the GPU", None),
        ("sync_mode", "let the host queue work ahead of the GPU", "query"),
    ],
    "sync-bound": [
        ("sync_interval", "removed most of the host's waits", None),
        ("sync_mode", "removed the host's waits", "query"),
        ("cuda_graph", "removed the launch overhead", True),
    ],
    # Busy most of the step, the GPU still idles between kernels; only the graph closes those
    # gaps (H100, transformer large: busy 76 % eager, 97 % as one graph, 1.26x).
    "gpu-bound": [
        ("compile", "fused kernels, so the GPU reads and writes less", None),
        ("cuda_graph", "closed the GPU's idle gaps between kernels", True),
    ],
    # Exposed communication: the settings that decide when the collectives start and what they
    # wait for.
    "communication-bound": [
        ("bucket_cap_mb", "started the all-reduces at other points of the backward", None),
        (
            "fsdp_prefetch",
            "issued each block's all-gather under the previous block's compute",
            None,
        ),
        ("reshard_after_forward", "kept the gathered parameters for the backward", False),
        ("static_graph", "let DDP reorder its buckets", True),
        ("gradient_as_bucket_view", "saved the copy into each bucket", True),
        ("parallel", "changed the collectives", None),
    ],
    "transfer-bound": [
        (field, "overlapped the copies with compute", None)
        for field in ("prefetch_depth", "pin_memory", "non_blocking", "num_streams", "num_workers")
    ],
}


def _ratio(value: float) -> str:
    return f"{value:.2f}" if value < 2 else f"{value:.1f}"


def speedup_text(entry: Mapping[str, Any]) -> str:
    """`6.4x (CI 6.2-6.6)` from a recommendation's `speedup` entry."""
    low, high = entry["ci95"]
    return f"{_ratio(entry['median'])}x (CI {_ratio(low)}-{_ratio(high)})"


def _config_of(rec: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    for entry in rec.get("final_round", []):
        if entry.get("name") == name:
            return dict(entry["config"])
    return None


def _explained_against(speedups: Mapping[str, Any], verdicts: Mapping[str, Verdict]) -> str | None:
    """The baseline `explain` compares with: the first of seed-baseline, pytorch-default and the
    others with both a speedup and a verdict, else the first with either."""
    candidates = [
        n for n in ("seed-baseline", "pytorch-default", *speedups) if n in speedups or n in verdicts
    ]
    return next(
        (n for n in candidates if n in speedups and n in verdicts),
        candidates[0] if candidates else None,
    )


def explain(
    recommendation: Mapping[str, Any],
    verdicts: Mapping[str, Verdict],
    *,
    baseline: str | None = None,
) -> str:
    """One line: the baseline's verdict, what the recommended config changed, its speedup.

    "host-bound: GPU idle 83 % of the step; whole-step CUDA graph removed the launch overhead:
    6.4x (CI 6.2-6.6) over seed-baseline". The baseline is `seed-baseline` when it was measured
    and profiled, else `pytorch-default`, else the first one with a speedup. When the
    recommended config's own verdict is in `verdicts` (key "recommended") and differs, it is added
    ("; now gpu-bound: GPU busy 96 % of the step").
    """
    speedups: Mapping[str, Any] = recommendation.get("speedup") or {}
    if baseline is None:
        baseline = _explained_against(speedups, verdicts)
    head = (
        verdicts[baseline].explanation if baseline is not None and baseline in verdicts else (None)
    )
    config = recommendation.get("config")
    if config is None:
        text = f"no recommendation: {recommendation.get('reason', 'none was decided')}"
        return f"{head} ({baseline}); {text}" if head else text
    if baseline is None:
        return "recommended config measured without baselines"

    base_config = _config_of(recommendation, baseline)
    if base_config is None and baseline == "pytorch-default":
        base_config = trainers.REFERENCE.to_dict()
    changes = _changes(config, base_config or config)
    kind = verdicts[baseline].kind if baseline in verdicts else "unknown"
    main, effect = None, ""
    for field, words, when in _EFFECTS.get(kind, []):
        if field in changes and (when is None or config.get(field) == when):
            main, effect = field, words
            break
    if recommendation.get("source") == baseline or not changes:
        what = f"keeping {baseline}'s settings"
    elif recommendation.get("source") == "pytorch-default":
        what = "the PyTorch default (change nothing)"
    else:
        ordered = ([main] if main else []) + [f for f in changes if f != main]
        what = changes[ordered[0]] + (f" {effect}" if effect else "")
        if len(ordered) > 1:
            what += " (also " + ", ".join(changes[f] for f in ordered[1:]) + ")"
    line = f"{head}; {what}" if head else what
    if baseline in speedups:
        line += f": {speedup_text(speedups[baseline])} over {baseline}"
    now = verdicts.get(PROFILE_RECOMMENDED)
    if now is not None and now.kind not in (kind, "unknown"):
        line += f"; now {now.explanation}"
    return line
