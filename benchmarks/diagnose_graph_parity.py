"""Why does a CUDA-graph config's loss differ from the reference? Separate the optimizer's
arithmetic from the capture.

    python benchmarks/diagnose_graph_parity.py torchvision:resnet18 --preset small --steps 20

Runs, from the same seed, dropout off, deterministic kernels (as the parity gate does):
  a: the reference (eager, optimizer as the workload builds it, not capturable);
  b: the same eager loop with the optimizer built capturable=True, twice (b, b');
  c: the graph config (`--graph-config`, default {"cuda_graph": true});
  p: the reference from weights perturbed in their last bit, `--perturbations` times.
Prints per-step losses and deviations: a vs b isolates the capturable optimizer's arithmetic,
b vs c isolates the capture (b vs b' says whether the eager twin is reproducible at all), a vs p
is the workload's own rounding noise. Then the windowed equivalence statistic of b and c, and
the largest differences of the BatchNorm running statistics and of the weights after the last
step, next to the same figures for the perturbed runs.

It also lists the ops of one training step that still draw random numbers once the gate switched
dropout off (`random_ops`, by `torch.Tag.nondeterministic_seeded`; SDPA is tagged whatever its
dropout, so its float arguments are shown): such a draw would make b and c differ for reasons
other than the capture. `--sdpa math` runs everything with SDPA's math backend, to tell a
difference made by an attention kernel under capture from one made by the loop.

On a CPU (`--device cpu`) only a and p run: capturable optimizers and graphs need CUDA.
`--out DIR` (default: $OUT when set) also writes diagnose_graph_parity.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainers import (
    MATMUL_PRECISION,
    PRECISIONS,
    REFERENCE,
    LoopConfig,
    Precision,
    RunArgs,
    fingerprint,
    resolve_device,
    resolve_factory,
)
from trainers.gate import (
    MULTIPLE,
    PERTURBATIONS,
    WINDOW,
    Equivalence,
    Perturbation,
    Trajectory,
    judge,
    rounding_eps,
    trajectory,
)
from trainers.workloads import disable_dropout

State = dict[str, torch.Tensor]
BATCHNORM_BUFFERS = ("running_mean", "running_var")


def state_of(run: Trajectory) -> State:
    """The trained model's parameters and buffers, on the CPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in run.workload.model.state_dict().items()}


def max_abs_diff(a: State, b: State, *, buffers: bool) -> tuple[float, str]:
    """The largest |a - b| over BatchNorm running statistics (buffers) or over everything else,
    and the name of the tensor where it is."""
    worst, where = 0.0, "-"
    for name, x in a.items():
        is_bn = name.rsplit(".", 1)[-1] in BATCHNORM_BUFFERS
        if is_bn != buffers or not x.is_floating_point():
            continue
        diff = (x.double() - b[name].double()).abs().max().item() if x.numel() else 0.0
        if not math.isfinite(diff) or diff > worst:
            worst, where = diff, name
    return worst, where


def first_difference(x: Sequence[float], y: Sequence[float]) -> int | None:
    return next((t for t, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)


def describe(label: str, eq: Equivalence) -> str:
    verdict = "inside" if eq.passed else "OUTSIDE"
    return (
        f"{label}: windowed deviation {eq.deviation:.3g} at steps {eq.decisive_steps[0]}-"
        f"{eq.decisive_steps[1] - 1} = {eq.window_ratio:.3g} x its bound ({eq.multiple:g} x "
        f"max(envelope {eq.envelope:.3g}, floor {eq.floor:.3g})); drift {eq.drift:.3g} = "
        f"{eq.drift_ratio:.3g} x its bound ({eq.multiple:g} x max(envelope "
        f"{eq.drift_envelope:.3g}, floor)): {verdict} the noise"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workload", help="a built-in name or an adapter such as torchvision:resnet18"
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", choices=PRECISIONS, default=None)
    parser.add_argument("--perturbations", type=int, default=PERTURBATIONS)
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--multiple", type=float, default=MULTIPLE)
    parser.add_argument(
        "--graph-config",
        default='{"cuda_graph": true}',
        help="the graph config, as a LoopConfig JSON dict",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of a library model, e.g. batch=128 (torchvision:, hf:)",
    )
    parser.add_argument(
        "--sdpa",
        choices=("default", "math"),
        default="default",
        help="SDPA backends: PyTorch's choice, or the math backend only",
    )
    parser.add_argument("--out", default=None, help="folder for the JSON (default: $OUT)")
    args = parser.parse_args(argv)
    if args.sdpa == "math":
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            return diagnose(args)
    return diagnose(args)


class RandomOps(TorchDispatchMode):
    """Counts the ops that draw from a random generator, with their float arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if torch.Tag.nondeterministic_seeded in func.tags:
            floats = [a for a in [*args, *(kwargs or {}).values()] if isinstance(a, float)]
            self.seen[f"{func}{floats if floats else ''}"] += 1
        return func(*args, **(kwargs or {}))


def random_ops(factory: Any, preset: str, device: torch.device) -> dict[str, int]:
    """The random ops of one forward and backward, dropout off as in the gate's runs."""
    built = factory(preset, seed=0)
    disable_dropout(built.model)
    model = built.model.to(device).train()
    batch = tuple(t.to(device) for t in built.dataset[0])
    with RandomOps() as mode:
        built.loss_fn(model, batch).backward()
    return dict(mode.seen)


@dataclasses.dataclass
class _Setup:
    """What every run of the diagnosis shares: the model's factory, the graph config, the
    arguments of `trajectory` and the perturbation's size."""

    factory: Any
    device: torch.device
    model_args: dict[str, str]
    graph_config: LoopConfig
    run_args: RunArgs
    matmul: str
    eps: float | None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def _setup(args: argparse.Namespace) -> _Setup:
    device = resolve_device(args.device)
    model_args = dict(item.split("=", 1) for item in args.model_arg)
    precision: Precision | None = args.precision
    matmul = (
        torch.get_float32_matmul_precision() if precision is None else MATMUL_PRECISION[precision]
    )
    setup = _Setup(
        factory=resolve_factory(args.workload, model_args or None),
        device=device,
        model_args=model_args,
        graph_config=LoopConfig.from_dict(json.loads(args.graph_config)),
        run_args=RunArgs(steps=args.steps, seed=args.seed, device=device, precision=precision),
        matmul=matmul,
        eps=rounding_eps(precision, matmul),
    )
    print(
        f"{args.workload} {args.preset} on {device} ({fingerprint(device).get('gpu') or 'CPU'}, "
        f"torch {torch.__version__}), {args.steps} steps, seed {args.seed}, precision "
        f"{precision or matmul}; perturbation eps {setup.eps or 'dtype machine epsilon'}",
        flush=True,
    )
    return setup


def _trajectories(
    setup: _Setup, args: argparse.Namespace
) -> tuple[dict[str, list[float]], list[list[float]], dict[str, State], list[State]]:
    """Runs a (and on a GPU b, b', c) and the perturbed p runs: their losses and trained states."""
    factory, run_args = setup.factory, setup.run_args
    runs: dict[str, Trajectory] = {"a": trajectory(factory, args.preset, REFERENCE, run_args)}
    states: dict[str, State] = {"a": state_of(runs["a"])}
    if setup.cuda:
        for key in ("b", "b'"):
            runs[key] = trajectory(factory, args.preset, REFERENCE, run_args, capturable=True)
        runs["c"] = trajectory(factory, args.preset, setup.graph_config, run_args)
    else:
        print("CPU: b (capturable optimizer) and c (graph) need CUDA; running a and p only")
    perturbed: list[Trajectory] = []
    for k in range(args.perturbations):
        perturbed.append(
            trajectory(
                factory,
                args.preset,
                REFERENCE,
                run_args,
                perturbation=Perturbation(seed=args.seed * 1000 + k + 1, eps=setup.eps),
            )
        )
    for key, run in runs.items():
        if key not in states:
            states[key] = state_of(run)
        if not run.strict:
            print(
                f"note: run {key} needed warn-only deterministic mode (an op without a "
                "deterministic implementation): it may vary from run to run"
            )
    p_states = [state_of(p) for p in perturbed]
    return (
        {key: run.losses for key, run in runs.items()},
        [p.losses for p in perturbed],
        states,
        p_states,
    )


def _print_steps(
    losses: Mapping[str, Sequence[float]], p_losses: Sequence[Sequence[float]], *, cuda: bool
) -> None:
    """Per step: the reference's loss, the noise, and on a GPU each run's distance."""
    a = losses["a"]
    header = f"{'step':>4} {'a: reference':>14} {'noise max|p-a|':>15}"
    if cuda:
        header += f" {'|b-a|':>10} {'|b-a|/|a|':>10} {'|c-b|':>10} {'|c-a|':>10} {'|b-bprime|':>10}"
    print(header)
    for t in range(len(a)):
        noise = max((abs(p[t] - a[t]) for p in p_losses), default=0.0)
        line = f"{t:>4} {a[t]:>14.8g} {noise:>15.3g}"
        if cuda:
            b, c, b2 = losses["b"][t], losses["c"][t], losses["b'"][t]
            line += (
                f" {abs(b - a[t]):>10.3g} {abs(b - a[t]) / max(abs(a[t]), 1e-12):>10.3g}"
                f" {abs(c - b):>10.3g} {abs(c - a[t]):>10.3g} {abs(b - b2):>10.3g}"
            )
        print(line)


def _graph_verdicts(
    losses: Mapping[str, list[float]], p_losses: list[list[float]], args: argparse.Namespace
) -> dict[str, Any]:
    """On a GPU: the capturable arithmetic and the graph judged against the reference, whether
    the eager twin reproduces itself, and where the capture first differs from it."""
    a = losses["a"]
    b_eq = judge(losses["b"], a, p_losses, window=args.window, multiple=args.multiple)
    c_eq = judge(losses["c"], a, p_losses, window=args.window, multiple=args.multiple)
    twin_diff = first_difference(losses["b"], losses["b'"])
    capture_diff = first_difference(losses["c"], losses["b"])
    print(describe("a vs b (capturable arithmetic)", b_eq))
    print(describe("a vs c (graph against the reference)", c_eq))
    print(
        "b vs b' (eager twin reproducible?): "
        + (
            "identical bit for bit"
            if twin_diff is None
            else f"differ from step {twin_diff}: "
            "the exact test cannot apply (non-deterministic kernels)"
        )
    )
    print(
        "b vs c (capture): "
        + (
            "identical bit for bit: the capture is faithful"
            if capture_diff is None
            else f"first differs at step {capture_diff}: a capture bug "
            "(stale input, a buffer not refreshed, a missing wait) or a "
            "kernel chosen differently under capture"
        )
    )
    return {
        "capturable": b_eq.to_dict(),
        "graph": c_eq.to_dict(),
        "twin_first_difference": twin_diff,
        "capture_first_difference": capture_diff,
    }


def _state_differences(
    states: Mapping[str, State], p_states: Sequence[State], *, cuda: bool
) -> dict[str, dict[str, Any]]:
    """After the last step, the largest differences of the BatchNorm running statistics and of
    the weights between the runs, and those of the perturbed runs beside them."""
    print()
    print("after the last step, largest |difference| (BatchNorm running stats / weights):")
    comparisons: dict[str, tuple[State, State]] = {
        f"a vs p{k}": (states["a"], s) for k, s in enumerate(p_states)
    }
    if cuda:
        comparisons = {
            "a vs b": (states["a"], states["b"]),
            "b vs c": (states["b"], states["c"]),
            "a vs c": (states["a"], states["c"]),
            **comparisons,
        }
    found = {}
    for label, (x, y) in comparisons.items():
        bn, bn_where = max_abs_diff(x, y, buffers=True)
        weights, w_where = max_abs_diff(x, y, buffers=False)
        print(f"  {label:<8} BN {bn:>10.3g} ({bn_where})  weights {weights:>10.3g} ({w_where})")
        found[label] = {
            "batchnorm": bn,
            "batchnorm_where": bn_where,
            "weights": weights,
            "weights_where": w_where,
        }
    if not any(k.rsplit(".", 1)[-1] in BATCHNORM_BUFFERS for k in states["a"]):
        print("  (the model has no BatchNorm running statistics)")
    return found


def diagnose(args: argparse.Namespace) -> dict[str, Any]:
    setup = _setup(args)
    losses, p_losses, states, p_states = _trajectories(setup, args)
    a = losses["a"]
    _print_steps(losses, p_losses, cuda=setup.cuda)
    report: dict[str, Any] = {
        "workload": args.workload,
        "model_args": setup.model_args,
        "preset": args.preset,
        "device": str(setup.device),
        "fingerprint": fingerprint(setup.device),
        "precision": setup.run_args.precision,
        "matmul_precision": setup.matmul,
        "eps": setup.eps,
        "graph_config": setup.graph_config.to_dict(),
        "sdpa": args.sdpa,
        "random_ops": random_ops(setup.factory, args.preset, setup.device),
        "losses": losses,
        "perturbed": p_losses,
    }
    print(f"random ops in a step, dropout off: {report['random_ops'] or 'none'}")
    print()
    if setup.cuda:
        report.update(_graph_verdicts(losses, p_losses, args))
    noise_loo = [
        judge(
            p, a, [q for q in p_losses if q is not p], window=args.window, multiple=args.multiple
        ).ratio
        for p in p_losses
    ]
    print(
        f"perturbed runs against each other's envelope (rounding noise only): ratios "
        f"{', '.join(f'{r:.3g}' for r in noise_loo)}"
    )
    report["leave_one_out_ratios"] = noise_loo
    report["state_differences"] = _state_differences(states, p_states, cuda=setup.cuda)
    out = args.out or os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "diagnose_graph_parity.json"
        path.write_text(json.dumps(_plain(report), indent=1, default=str) + "\n")
        print(f"wrote {path}")
    return report


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


if __name__ == "__main__":
    main()
