"""Is the eager step bit-reproducible here? The question every exact test depends on.

An exact test (a loop setting against the reference, a graph against its eager twin) measures
our loop only if two identical eager runs give the same losses bit for bit. Where they do not
(atomics in a backward kernel, split-K GEMMs, scatter-adds, an op with no deterministic
implementation), a bit-for-bit comparison only measures that noise and rejects legitimate
configs. So before an exact test the gate asks `Reproducibility`: the reference loop run twice
(or once more beside a reference already measured) on this workload, device, precision and
determinism mode. Not reproducible: the exact test is skipped, the verdict says why
(`ParityVerdict.exact_skipped`, the first step at which the two runs differed and by how much)
and the equivalence test decides.

On a GPU the probe also asks the question a graph's exact test depends on: does the simplest
whole-step graph (the reference loop with `cuda_graph=True`: one stream, a host sync every step)
replay its eager twin bit for bit? Where it does not, a kernel computes other bits when captured
(on an H100, torch 2.11: SDPA's memory-efficient attention in BERT, fp32 and bf16, while the
math backend replays bit for bit, `docs/benchmarks/README.md`), and no graph config can be held
to its twin bit for bit: a graph's exact test is skipped the same way.

The answer depends on the workload, the device and the precision only, so it is measured once:
`eager_reproducibility` keeps it in a process-level cache keyed by (workload key, device key,
precision, determinism), and `Reproducibility.to_dict()` / `from_dict()` let a caller persist it
(with its study) and hand it back (`gate(probe=...)` or `remember`).

Why a fault cannot hide behind "not reproducible": the probe refuses to run while a fault is
planted (`trainers.gate.faults.planted` marks it), so it is measured with our real loop parts and
cached before any; and a skipped exact test still leaves the equivalence test, which
`benchmarks/gate_power.py` shows catches the planted faults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from trainers.config import REFERENCE
from trainers.errors import TrainerError
from trainers.gate.trajectories import (
    DETERMINISMS,
    GATE_ARGS,
    GATE_DETERMINISM,
    Determinism,
    trajectory,
)
from trainers.loop import resolve_device
from trainers.precision import Precision
from trainers.runargs import RunArgs
from trainers.workloads import BUILTIN, BoundFactory, WorkloadFactory, resolve_factory
from trainers.workloads.options import key_of

FORMAT = 1
"""Version of `Reproducibility.to_dict()`'s layout."""

ProbeKey = tuple[str, str, str, str]
"""(workload key, device key, precision, determinism)."""

_PROBES: dict[ProbeKey, Reproducibility] = {}
_planted = 0
"""How many planted faults are installed now (`fault_planted`)."""


@contextlib.contextmanager
def fault_planted() -> Iterator[None]:
    """Marks a planted fault for the duration (`trainers.gate.faults.planted` enters it): the
    probe must not measure broken loop parts and call the breakage irreproducibility."""
    global _planted
    _planted += 1
    try:
        yield
    finally:
        _planted -= 1


def fault_is_planted() -> bool:
    """Whether a planted fault is installed now: the gate then asks the probe (cached, or
    refusing to measure) before any exact comparison, as it always did."""
    return _planted > 0


@dataclasses.dataclass(kw_only=True, frozen=True)
class Reproducibility:
    """Two identical eager runs of the reference loop, compared bit for bit.

    workload: the workload's key (`workload_key`); device: the device's key (`device_key`).
    first_difference: the first step whose losses differed (None: reproducible);
    max_abs_difference: the largest per-step |difference| (0.0 when reproducible; inf when a
    loss was not finite in one run only). strict: both runs held strict deterministic algorithms
    (False under determinism "off", or where an op has no deterministic implementation).
    seconds: what the second run cost.
    graph_replays_twin, graph_first_difference, graph_max_abs_difference: the one-stream
    whole-step graph against its eager twin (None: not measured, on a CPU; graph_error: why the
    graph could not run).
    """

    workload: str
    device: str
    precision: Precision | None
    determinism: Determinism
    steps: int
    seed: int
    reproducible: bool
    first_difference: int | None
    max_abs_difference: float
    strict: bool
    seconds: float
    graph_replays_twin: bool | None = None
    graph_first_difference: int | None = None
    graph_max_abs_difference: float | None = None
    graph_error: str | None = None

    @property
    def key(self) -> ProbeKey:
        return (self.workload, self.device, str(self.precision), self.determinism)

    def skipped_reason(self) -> str:
        """Why an exact test cannot apply (`ParityVerdict.exact_skipped`)."""
        return (
            f"the eager step is not bitwise reproducible here: two identical eager runs first "
            f"differ at step {self.first_difference} (max |diff| {self.max_abs_difference:.2g}, "
            f"determinism {self.determinism}), so the exact test cannot apply and the "
            "equivalence test decides"
        )

    def capture_skipped_reason(self) -> str:
        """Why a graph's exact test against its eager twin cannot apply."""
        return (
            f"this workload's kernels compute other bits when captured: the one-stream "
            f"whole-step graph of the reference loop first differs from its eager twin at step "
            f"{self.graph_first_difference} (max |diff| {self.graph_max_abs_difference:.2g}), so "
            "a graph's exact test cannot tell a capture bug from the kernel and the equivalence "
            "test decides"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Reproducibility:
        if values.get("format") != FORMAT:
            raise ValueError(f"format={values.get('format')!r} is invalid: allowed {FORMAT}")
        if values.get("determinism") not in DETERMINISMS:
            raise ValueError(
                f"determinism={values.get('determinism')!r} is invalid: allowed "
                f"{', '.join(DETERMINISMS)}"
            )
        fields = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        fields["max_abs_difference"] = float(fields["max_abs_difference"])
        return cls(**fields)


def workload_key(workload: str | WorkloadFactory, preset: str) -> str | None:
    """A name that is the same for the same workload shape in every process: the name and preset
    for a built-in or user module name, the effective options too for a library model (a
    `BoundFactory`), module.function for a module-level factory. None for anything else (a
    closure, a lambda): such a probe is not cached, the caller keeps it."""
    if isinstance(workload, str):
        return f"{workload}-{preset}"
    if isinstance(workload, BoundFactory):
        return f"{workload.name}-{preset}-{key_of(workload.options(preset))}"
    for name, factory in BUILTIN.items():
        if factory is workload:
            return f"{name}-{preset}"
    qualname = getattr(workload, "__qualname__", None)
    module = getattr(workload, "__module__", None)
    if not qualname or not module or "<" in qualname:
        return None
    return f"{module}:{qualname}-{preset}"


def device_key(device: torch.device) -> str:
    """The device's model and the software that runs its kernels (no driver query: cheap)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (
            f"{props.name} sm{props.major}{props.minor}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}"
        )
    return f"{device.type}, torch {torch.__version__}"


def _differences(a: Sequence[float], b: Sequence[float]) -> tuple[int | None, float]:
    """The first step whose losses differ bit for bit and the largest |difference|. As in the
    exact test, a non-finite loss counts as a difference (NaN != NaN), of size inf."""
    first: int | None = None
    largest = 0.0
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            first = step if first is None else first
            largest = max(largest, abs(x - y) if math.isfinite(x - y) else math.inf)
    if len(a) != len(b):
        first = min(len(a), len(b)) if first is None else first
        largest = math.inf
    return first, largest


def measure(
    workload: str | WorkloadFactory,
    preset: str,
    args: RunArgs = GATE_ARGS,
    *,
    determinism: Determinism | None = None,
    reference: Sequence[float] | None = None,
    capture: bool = True,
) -> Reproducibility:
    """Run the reference loop twice, each a trajectory of `args` (once, beside `reference`: the
    reference's losses for these very arguments and determinism, such as `Envelope.reference`)
    and compare the runs; on a GPU
    also (unless `capture` is False) its one-stream whole-step graph against its eager twin
    (`_capture`)."""
    if _planted:
        raise RuntimeError(
            "the reproducibility probe cannot run while a fault is planted: measure it "
            "(`eager_reproducibility`) before `planted`, as the reference and the envelope"
        )
    mode: Determinism = GATE_DETERMINISM if determinism is None else determinism
    factory = resolve_factory(workload) if isinstance(workload, str) else workload
    dev = resolve_device(args.device)
    args = args.replace(device=dev)
    strict = True
    if reference is None:
        first = trajectory(factory, preset, REFERENCE, args, determinism=mode)
        reference, strict = first.losses, first.strict
        del first  # its trained model leaves the device before the second run
    started = time.perf_counter()
    second = trajectory(factory, preset, REFERENCE, args, determinism=mode)
    seconds = time.perf_counter() - started
    losses, second_strict = second.losses, second.strict
    del second  # before the capture's runs
    differ, largest = _differences(losses, reference)
    graph = _capture(factory, preset, args, mode) if capture and dev.type == "cuda" else {}
    return Reproducibility(
        workload=workload_key(workload, preset) or str(getattr(factory, "__name__", "?")),
        device=device_key(dev),
        precision=args.precision,
        determinism=mode,
        steps=args.steps,
        seed=args.seed,
        reproducible=differ is None,
        first_difference=differ,
        max_abs_difference=largest,
        strict=strict and second_strict and mode == "strict",
        seconds=seconds,
        **graph,
    )


def _capture(
    factory: WorkloadFactory, preset: str, args: RunArgs, mode: Determinism
) -> dict[str, Any]:
    """The reference loop as a whole-step graph against its eager twin (the same loop with the
    capturable optimizer): the probe's `graph_*` fields."""
    graph_config = REFERENCE.replace(cuda_graph=True)
    try:
        twin = trajectory(
            factory, preset, REFERENCE, args, capturable=True, determinism=mode
        ).losses
        graph = trajectory(factory, preset, graph_config, args, determinism=mode).losses
    except (RuntimeError, TrainerError) as exc:
        return {"graph_error": f"{type(exc).__name__}: {exc}"[:300]}
    differ, largest = _differences(graph, twin)
    return {
        "graph_replays_twin": differ is None,
        "graph_first_difference": differ,
        "graph_max_abs_difference": largest,
    }


def cached(
    workload: str | WorkloadFactory,
    preset: str,
    *,
    device: str | torch.device = "auto",
    precision: Precision | None = None,
    determinism: Determinism | None = None,
) -> Reproducibility | None:
    """The probe `eager_reproducibility` would return from the process cache, or None where it
    would have to measure one (the gate then asks only when an exact comparison fails)."""
    key = _key(workload, preset, device, precision, determinism)
    return None if key is None else _PROBES.get(key)


def _key(
    workload: str | WorkloadFactory,
    preset: str,
    device: str | torch.device,
    precision: Precision | None,
    determinism: Determinism | None,
) -> ProbeKey | None:
    mode: Determinism = GATE_DETERMINISM if determinism is None else determinism
    name = workload_key(workload, preset)
    return (
        None if name is None else (name, device_key(resolve_device(device)), str(precision), mode)
    )


def eager_reproducibility(
    workload: str | WorkloadFactory,
    preset: str,
    args: RunArgs = GATE_ARGS,
    *,
    determinism: Determinism | None = None,
    reference: Sequence[float] | None = None,
) -> Reproducibility:
    """The probe for this workload, device, precision and determinism: from the process-level
    cache if measured before (at any seed and steps: a property of the kernels, not of the
    data), else measured now (`measure`) and cached when the workload has a key."""
    mode: Determinism = GATE_DETERMINISM if determinism is None else determinism
    key = _key(workload, preset, args.device, args.precision, mode)
    if key is not None and key in _PROBES:
        return _PROBES[key]
    probe = measure(workload, preset, args, determinism=mode, reference=reference)
    if key is not None:
        _PROBES[key] = probe
    return probe


def remember(probe: Reproducibility) -> None:
    """Put a probe measured elsewhere (read back with `from_dict`) into the process cache."""
    _PROBES[probe.key] = probe


def forget() -> None:
    """Empty the process cache (a new study, or a test that wants a fresh measurement)."""
    _PROBES.clear()


def check_probe(
    probe: Reproducibility,
    workload: str | WorkloadFactory,
    preset: str,
    *,
    device: str | torch.device,
    precision: Precision | None,
) -> None:
    """A probe of another workload, device, precision or determinism mode would answer for
    other kernels: refuse it."""
    name = workload_key(workload, preset)
    wanted = {
        "workload": probe.workload if name is None else name,
        "device": device_key(resolve_device(device)),
        "precision": precision,
        "determinism": GATE_DETERMINISM,
    }
    got = {key: getattr(probe, key) for key in wanted}
    if got != wanted:
        raise ValueError(f"probe measured for {got}, the gate runs {wanted}")
