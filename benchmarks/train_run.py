"""A real training run with the recommendation (`trainers.Trainer`) against the PyTorch idiom.

    python benchmarks/train_run.py --workload torchvision:resnet18 --preset default \\
        --model-arg batch=128 --model-arg image=32 --model-arg classes=10 \\
        --config docs/benchmarks/recommended.json --steps 2000 --precision tf32 --out $OUT

Both runs train the same workload from the same weights on the same batches for `--steps` steps
with a warm-up + cosine schedule (5 % warm-up) and gradient clipping at norm 1.0:
- `idiom`: the loop a user writes (pinned 2-worker DataLoader, `loss.item()` every 10 steps,
  `clip_grad_norm_`, `scheduler.step()`), its losses kept on the device and read at the end;
- `recommended`: `Trainer(workload, config, ...)` for half the steps with a checkpoint at the
  half, then a new Trainer resumed from it for the rest, as a run cut in two would be. Its wall
  time includes both constructions, compilation, graph capture and the checkpoint.
- `recommended_warm` (`--warm`): the same again, now that the first filled Inductor's on-disk
  cache, as a run on the machine the tuning job compiled on finds it;
- `perturbed`: `--perturbed` (2) more idiom runs from the weights moved by one rounding unit of
  the precision (`trainers.gate.trajectories.Perturbation`), the envelope the gate judges with:
  `equivalence` is `trainers.gate.equivalence.judge` of the recommended losses against the idiom's,
  in windows of `--window` (100) steps.

Writes `train-run-<gpu>-<date>[-<tag>].json` and a Markdown twin.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import trainers
from benchmarks.run_meta import run_meta
from trainers import matmul_precision_for, warmup_cosine
from trainers.gate import Perturbation, judge, rounding_eps

READ_EVERY = 10
CLIP = 1.0


def idiom(
    workload: trainers.Workload, *, steps: int, device: torch.device, precision: str | None
) -> dict[str, Any]:
    """The PyTorch idiom with a schedule and clipping; returns wall time and every loss."""
    cuda = device.type == "cuda"
    torch.cuda.synchronize(device) if cuda else None
    started = time.perf_counter()
    model = workload.model.to(device)
    model.train()
    optimizer = workload.make_optimizer(model.parameters(), False)
    scheduler = warmup_cosine(steps, max(1, steps // 20))(optimizer)
    loader = torch.utils.data.DataLoader(
        workload.dataset,
        batch_size=workload.batch_size,
        shuffle=False,
        num_workers=2,
        pin_memory=cuda,
        collate_fn=workload.collate_fn,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    dtype = {"bf16-autocast": torch.bfloat16}.get(precision or "")
    kept: list[torch.Tensor] = []
    step = 0
    while step < steps:
        for host_batch in loader:
            if step == steps:
                break
            batch = tuple(t.to(device, non_blocking=True) for t in host_batch)
            autocast = (
                torch.autocast(device.type, dtype)
                if dtype is not None
                else contextlib.nullcontext()
            )
            with autocast:
                loss = workload.loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            kept.append(loss.detach())
            step += 1
            if step % READ_EVERY == 0:
                loss.item()  # the user's sync: read the loss every 10 steps
    losses = torch.stack(kept).float().tolist()
    torch.cuda.synchronize(device) if cuda else None
    return {"wall_s": time.perf_counter() - started, "losses": losses}


def recommended(
    make: Any,
    config: trainers.LoopConfig,
    *,
    steps: int,
    device: torch.device,
    precision: str | None,
) -> dict[str, Any]:
    """The Trainer, cut in two at half the steps by a checkpoint and a resume."""
    half = steps // 2
    options: dict[str, Any] = dict(
        device=device,
        precision=precision,
        scheduler=warmup_cosine(steps, max(1, steps // 20)),
        clip_grad_norm=CLIP,
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.pt"
        started = time.perf_counter()
        first = trainers.Trainer(make(), config, **options).fit(
            half, checkpoint_every=half, checkpoint_path=path
        )
        middle = time.perf_counter()
        second = trainers.Trainer(make(), config, **options).fit(steps, resume_from=path)
        ended = time.perf_counter()
    return {
        "wall_s": ended - started,
        "first_half_s": middle - started,
        "second_half_s": ended - middle,
        "checkpoint_step": half,
        "losses": first.losses + second.losses,
        "n_syncs": first.n_syncs + second.n_syncs,
    }


def summary(losses: list[float], window: int) -> dict[str, Any]:
    return {
        "final_loss": statistics.fmean(losses[-window:]),
        "curve": [statistics.fmean(losses[i : i + window]) for i in range(0, len(losses), window)],
    }


def to_markdown(data: Mapping[str, Any]) -> str:
    meta, runs, eq = data["meta"], data["runs"], data["equivalence"]
    rec, base = runs["recommended"], runs["idiom"]
    lines = [
        f"# A {data['steps']}-step training run with the recommendation on {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, commit "
        f"`{meta['commit']}`, {meta['date']}; command: `{meta['command']}`.",
        "",
        f"Workload `{data['workload']}` (preset {data['preset']}, {data['model_args']}), precision "
        f"{data['precision']}; warm-up + cosine schedule, clipping at norm {CLIP}. Recommended "
        f"config `{data['config']}`, cut by a checkpoint at step {rec['checkpoint_step']} and "
        "resumed in a new Trainer.",
        "",
        "| run | wall s (all included) | final loss (mean of last window) |",
        "|---|---|---|",
        f"| PyTorch idiom | {base['wall_s']:.1f} | {base['final_loss']:.3g} |",
        f"| recommended (Trainer, checkpoint + resume) | {rec['wall_s']:.1f} "
        f"({rec['first_half_s']:.1f} + {rec['second_half_s']:.1f}) | {rec['final_loss']:.3g} |",
    ]
    warm = runs.get("recommended_warm")
    if warm is not None:
        lines.append(
            f"| recommended, warm Inductor cache | {warm['wall_s']:.1f} "
            f"({warm['first_half_s']:.1f} + {warm['second_half_s']:.1f}) "
            f"| {warm['final_loss']:.3g} |"
        )
    for index, run in enumerate(runs.get("perturbed", [])):
        lines.append(
            f"| idiom, perturbed {index + 1} | {run['wall_s']:.1f} | {run['final_loss']:.3g} |"
        )
    lines += [
        "",
        f"Speedup in wall time: {data['speedup']:.2f}x"
        + (
            f" (warm cache: {data['speedup_warm']:.2f}x)"
            if data.get("speedup_warm") is not None
            else ""
        )
        + f". Loss curves (windows of {data['window']} "
        f"steps) judged against the idiom's within the gate's envelope: "
        f"{'inside' if eq['passed'] else 'outside'} (ratio {eq['ratio']:.3g}; <= 1 is inside; "
        f"{eq['reason']}).",
    ]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="torchvision:resnet18")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--config", required=True, help="a JSON config or recommendation")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--precision", default="tf32")
    parser.add_argument("--perturbed", type=int, default=2)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--warm", action="store_true", help="also a run with a warm cache")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser


def _train(
    make: Callable[[], trainers.Workload],
    config: trainers.LoopConfig,
    args: argparse.Namespace,
    device: torch.device,
    precision: str | None,
) -> dict[str, Any]:
    """The idiom, the recommendation (and warm, with `--warm`) and the perturbed idiom runs, each
    with its final loss and loss curve."""
    runs: dict[str, Any] = {}
    with matmul_precision_for(precision) as matmul:  # type: ignore[arg-type]
        runs["idiom"] = idiom(make(), steps=args.steps, device=device, precision=precision)
        runs["recommended"] = recommended(
            make, config, steps=args.steps, device=device, precision=precision
        )
        if args.warm:
            runs["recommended_warm"] = recommended(
                make, config, steps=args.steps, device=device, precision=precision
            )
        eps = rounding_eps(precision, matmul)  # type: ignore[arg-type]
        runs["perturbed"] = []
        for seed in range(1, args.perturbed + 1):
            workload = make()
            Perturbation(seed=seed, eps=eps).apply(workload.model)
            runs["perturbed"].append(
                idiom(workload, steps=args.steps, device=device, precision=precision)
            )
    timed = [runs["idiom"], runs["recommended"], *runs["perturbed"]]
    for run in timed + ([runs["recommended_warm"]] if args.warm else []):
        run.update(summary(run["losses"], args.window))
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    config = trainers.load_config(args.config)
    device = trainers.resolve_device(args.device)
    precision = None if args.precision == "none" else args.precision
    if precision not in (None, "fp32", "tf32", "bf16-autocast"):
        # The idiom loop here has no loss scaler: fp16 would compare unlike with like.
        parser.error(f"--precision {args.precision!r}: allowed none, fp32, tf32, bf16-autocast")

    def make() -> trainers.Workload:
        return trainers.load_workload(args.workload, args.preset, model_args=model_args)

    runs = _train(make, config, args, device, precision)
    equivalence = judge(
        runs["recommended"]["losses"],
        runs["idiom"]["losses"],
        [run["losses"] for run in runs["perturbed"]],
        window=args.window,
    )
    meta, where = run_meta(device, "train_run.py", argv or sys.argv[1:], args.commit)
    stem = f"train-run-{where}" + (f"-{args.tag}" if args.tag else "")
    data = {
        "meta": meta,
        "workload": args.workload,
        "preset": args.preset,
        "model_args": model_args,
        "precision": precision,
        "steps": args.steps,
        "window": args.window,
        "config": config.to_dict(),
        "runs": runs,
        "speedup": runs["idiom"]["wall_s"] / runs["recommended"]["wall_s"],
        "speedup_warm": (
            runs["idiom"]["wall_s"] / runs["recommended_warm"]["wall_s"] if args.warm else None
        ),
        "equivalence": equivalence.to_dict(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
    print(to_markdown(data))


if __name__ == "__main__":
    main()
