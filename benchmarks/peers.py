"""The recommendation against what a user would write instead, measured interleaved in one process.

    python benchmarks/peers.py --presets transformer:small,transformer:medium \
        --precisions tf32,bf16-autocast --trials 12 --search-timeout 180 --out docs/benchmarks

Per preset and precision, on one GPU:
1. a tuning job over the default space (`--space auto`: on a GPU the compiler levers without
   max-autotune; the runs of 2026-11-23 used `compile`, with it), `--trials`, `--search-timeout`:
   its wall time, GPU-seconds and recommended config;
2. the peers, each a plain training loop written the way a user writes it (`user_loop`): the
   workload's model, loss, optimizer and dataset, a pinned 2-worker DataLoader, `loss.item()`
   every 10 steps, autocast where the precision asks for it:
   - `pytorch-idiom`: that loop as it is;
   - `fused-optimizer`: the optimizer rebuilt with `fused=True`;
   - `compile-default`: plus `torch.compile(model)`;
   - `compile-reduce-overhead`: plus `torch.compile(model, mode="reduce-overhead")` with
     `torch.compiler.cudagraph_mark_step_begin()` before each step, as the PyTorch docs say;
3. the recommendation and the seed design's baseline, run by the harness (`trainers.run`) with
   the tuner's protocol;
4. all of them `--rounds` times, interleaved, every run from the same initial weights. Each peer
   reports its setup (`setup_s`: its warm-up's wall time beyond that many steady steps, compile
   included), each run's windows (ms/step, device-synchronised at both ends) and their median
   and bootstrap CI; `ratio_vs_best_peer` is the recommendation's throughput over the fastest
   peer's, with a bootstrap CI; `floor` is the fastest setting measured.

A compiled peer starts from `torch._dynamo.reset()`, as a new training process would: Inductor's
on-disk caches stay warm (the tuning job filled them), the in-memory ones do not.

Writes `peers-<gpu>-<date>[-<tag>].json` after each preset and a Markdown twin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.peers_compare import aims, allowed_precisions, compare, peers_for
from benchmarks.peers_loops import FLOAT8_PEERS, PEERS, SCALE_PEERS
from benchmarks.peers_record import add_mfu, merge, to_markdown, update_readme
from benchmarks.peers_tuning import given_config, recommendation_of, tune
from benchmarks.run_meta import run_meta
from trainers import LoopConfig
from tuner.search.measuring.measure import Measurer, Protocol

# The parts, by responsibility: the peers' loops (`peers_loops`), the tuning job or what stands in
# for it (`peers_tuning`), the interleaved measurement (`peers_compare`), the record
# (`peers_record`); this file is the command line and one preset's run.


def run_preset(
    spec: str,
    precision: str | None,
    args: argparse.Namespace,
    storage: str,
    log: Callable[[str], None],
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One preset in one precision: the tuning job (or what stands in for it), then the peers and
    the harness interleaved (`compare`), as the record's entry. `save(entry)`: after each round
    but the last, the entry so far, marked with `rounds_done`."""
    workload, preset = spec.rsplit(":", 1)
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    started = time.perf_counter()
    allowed = allowed_precisions(precision, getattr(args, "allow_precisions", None))
    tuning = _tuning(spec, precision, args, storage, log, model_args, allowed)
    chosen = tuning["precision"]
    log(
        f"recommended {tuning['config']}"
        + (f" in {chosen}" if chosen else "")
        + ("" if tuning.get("wall_s") is None else f" in {tuning['wall_s']:.0f} s")
    )
    measurer = Measurer(
        workload,
        preset,
        device=args.device,
        protocol=getattr(args, "peer_protocol", None) or args.protocol or Protocol(),
        model_args=model_args,
        precision=precision,  # type: ignore[arg-type]
    )
    recommended = None if tuning["config"] is None else LoopConfig.from_dict(tuning["config"])

    def entry_of(compared: dict[str, Any]) -> dict[str, Any]:
        entry = _entry(spec, precision, args, measurer, tuning, compared)
        return entry | {"wall_s": time.perf_counter() - started}

    def round_done(done: int, compared: dict[str, Any]) -> None:
        if save is not None:
            save(entry_of(compared) | {"rounds_done": done})

    return entry_of(
        compare(
            measurer,
            recommended,
            precision=precision,
            rounds=args.rounds,
            log=log,
            peers=peers_for(spec, getattr(args, "peers", None), allowed),
            recommended_precision=chosen,
            on_round=round_done,
        )
    )


def _entry(
    spec: str,
    precision: str | None,
    args: argparse.Namespace,
    measurer: Measurer,
    tuning: dict[str, Any],
    compared: dict[str, Any],
) -> dict[str, Any]:
    """The record's entry of one preset from what `compare` measured (its `wall_s` aside)."""
    workload, preset = spec.rsplit(":", 1)
    entry: dict[str, Any] = {
        "workload": workload,
        "preset": preset,
        "model_args": dict(kv.split("=", 1) for kv in args.model_arg),
        "parameters": measurer.parameters(),
        "vocab_size": None if measurer.program is not None else vocab_size(measurer.workload.model),
        "precision": precision,
        "tuning": tuning,
        "rounds": args.rounds,
        "protocol": measurer.protocol.to_dict(),
        **compared,
    }
    entry["recommended"] = _recommended(tuning, compared, precision)
    entry["aims"] = aims(spec, precision, entry)
    return entry


def vocab_size(model: torch.nn.Module) -> int | None:
    """A language model's vocabulary as its config gives it (Hugging Face's `config.vocab_size`,
    on the model or a module inside it, such as a workload's wrapper); None for a model without
    one. The record names it because the output head's size decides what its levers give."""
    for module in model.modules():
        size = getattr(getattr(module, "config", None), "vocab_size", None)
        if isinstance(size, int):
            return size
    return None


def _recommended(
    tuning: dict[str, Any], compared: dict[str, Any], precision: str | None
) -> dict[str, Any]:
    """The entry's `recommended`: the config, the precision it ran in, its time and set-up."""
    rec = compared["harness"].get("recommended", {})
    return {
        "config": tuning["config"],
        "precision": tuning["precision"] or precision,
        "median_ms": rec.get("median_ms"),
        "ci95": rec.get("ci95"),
        "compile_s": (rec.get("compile") or {}).get("compile_s"),
        "setup_s": tuning.get("setup_s"),
    }


def _tuning(
    spec: str,
    precision: str | None,
    args: argparse.Namespace,
    storage: str,
    log: Callable[[str], None],
    model_args: dict[str, str],
    allowed: tuple[str, ...] | None,
) -> dict[str, Any]:
    """The tuning entry: the config given by `--config`, the recommendation of a
    `--recommendation` record, or a tuning job run here."""
    workload, preset = spec.rsplit(":", 1)
    choice = f" (may choose {','.join(allowed)})" if allowed else ""
    given = getattr(args, "recommendation", None)
    if getattr(args, "config", None) is not None:
        log(f"== {spec} {precision}: the config given by --config")
        return given_config(
            args.config,
            getattr(args, "config_precision", None),
            getattr(args, "config_base", None),
        )
    if given is not None:
        log(f"== {spec} {precision}: the recommendation of {given.name}")
        return recommendation_of(given, workload, preset, model_args, precision)
    log(f"== {spec} {precision}: tuning{choice}")
    return tune(
        workload,
        preset,
        precision=precision,
        storage=storage,
        device=args.device,
        trials=args.trials,
        timeout_s=args.search_timeout,
        model_args=model_args,
        log=log,
        protocol=args.protocol,
        final_rounds=args.final_rounds,
        precisions=allowed,
        parity_steps=getattr(args, "parity_steps", None),
        precision_parity_steps=getattr(args, "precision_parity_steps", None),
        precision_tolerance=getattr(args, "precision_tolerance", None),
        profile=getattr(args, "profile", None) or "none",
    )


def _protocol(text: str) -> Protocol:
    try:
        warmup, windows, steps = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--protocol: expected WARMUP,WINDOWS,WINDOW_STEPS (three integers), got {text!r}"
        ) from None
    return Protocol(warmup=warmup, windows=windows, window_steps=steps)


def _add_preset_flags(parser: argparse.ArgumentParser) -> None:
    """What is measured: the presets, precisions and peers, and the rounds."""
    parser.add_argument("--presets", default="transformer:small")
    parser.add_argument("--precisions", default="tf32")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--peers",
        default=None,
        help="comma-separated peers (default: the small-model loops, or at scale, for the llama "
        f"presets, {','.join(SCALE_PEERS)}); all: {','.join(PEERS)}",
    )
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument(
        "--allow-precisions",
        default=None,
        help="the precisions each tuning job may choose among beside the preset's own (e.g. "
        "float8: the job runs with --precisions <precision>,float8, and the float8 peers "
        f"{','.join(FLOAT8_PEERS)} join the preset's)",
    )


def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    """How the tuning job and the measurements run."""
    parser.add_argument(
        "--parity-steps",
        type=int,
        default=None,
        help="the gate's run length in each tuning job (default: the tuner's, 20)",
    )
    parser.add_argument(
        "--precision-parity-steps",
        type=int,
        default=None,
        help="the gate's run length for a config in another precision than the preset's, "
        "judged against its seed-to-seed envelope (the float8 evidence asks at least 200; "
        "default: --parity-steps)",
    )
    parser.add_argument(
        "--precision-tolerance",
        type=float,
        default=None,
        help="the multiple of the seed-to-seed envelope a config in another precision may "
        "deviate by in each tuning job (default: the tuner's, 3)",
    )
    parser.add_argument(
        "--protocol",
        type=_protocol,
        default=None,
        help="WARMUP,WINDOWS,WINDOW_STEPS of every measurement, tuning and peers "
        "(default: the tuner's, 10,5,20)",
    )
    parser.add_argument(
        "--peer-protocol",
        type=_protocol,
        default=None,
        help="WARMUP,WINDOWS,WINDOW_STEPS of the peers' interleaved measurement alone, leaving "
        "the tuning job its own defaults (default: --protocol)",
    )
    parser.add_argument(
        "--profile",
        default="none",
        help="the tuning job's profiles: none (default: the tuning time is the search's alone) "
        "or baselines (a default job's, as `python -m tuner run` takes them)",
    )
    parser.add_argument("--final-rounds", type=int, default=None)
    parser.add_argument("--search-timeout", type=float, default=None)


def _add_record_flags(parser: argparse.ArgumentParser) -> None:
    """Where the record goes, and what stands in for measuring or for the tuning job."""
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--from-json", type=Path, default=None, help="regenerate the Markdown")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="skip measuring: join the presets of these JSON files (one 10-minute run each) "
        "into --out/<first file's stem>-merged.json",
    )
    parser.add_argument(
        "--readme", type=Path, default=None, help="with --merge: rewrite the README's table"
    )
    parser.add_argument(
        "--add-mfu",
        type=Path,
        default=None,
        help="skip measuring: add TFLOP/s and MFU to this JSON's entries (FLOPs counted on the "
        "CPU) and regenerate its Markdown (and with --readme, the README's table)",
    )
    parser.add_argument(
        "--recommendation",
        type=Path,
        default=None,
        help="skip the tuning job: measure the recommendation of this `benchmarks/default_job.py` "
        "record (its first run that recommended a config for the preset) against the peers",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="skip the tuning job: measure this LoopConfig (JSON) against the peers, labelled "
        "as given (for instance the fastest trial of a job that did not finish)",
    )
    parser.add_argument(
        "--config-precision",
        default=None,
        help="with --config: the precision it runs in, when not the preset's (e.g. float8)",
    )
    parser.add_argument(
        "--config-base",
        default=None,
        metavar="SPACE",
        help="with --config: lay the JSON over this search space's fixed settings (scale: its "
        "feed, compile and fused optimizer); without it the JSON is the whole config, and what "
        "it leaves out runs at the loop's default (default: none)",
    )
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _add_preset_flags(parser)
    _add_job_flags(parser)
    _add_record_flags(parser)
    args = parser.parse_args(argv)
    for flag in ("config_precision", "config_base"):
        if getattr(args, flag) is not None and args.config is None:
            parser.error(f"--{flag.replace('_', '-')} needs --config")
    if not _rewrite(args):
        _measure(args, argv)


def _rewrite(args: argparse.Namespace) -> bool:
    """`--add-mfu`, `--from-json`, `--merge`: records rewritten without measuring; False when
    none was asked for."""
    if args.add_mfu is not None:
        data = add_mfu(json.loads(args.add_mfu.read_text(encoding="utf-8")))
        args.add_mfu.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        args.add_mfu.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return True
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text(encoding="utf-8"))
        args.from_json.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        return True
    if args.merge is not None:
        data = merge([json.loads(p.read_text(encoding="utf-8")) for p in args.merge])
        path = args.out / f"{args.merge[0].stem}-merged.json"
        data["meta"]["file"] = path.name
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return True
    return False


def _measure(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """Every preset in every precision, the record written after each (a run cut short keeps
    what it measured)."""
    device = trainers.resolve_device(args.device)
    meta, where = run_meta(device, "peers.py", sys.argv[1:] if argv is None else argv, args.commit)
    stem = f"peers-{where}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    storage = f"sqlite:///{Path(tempfile.mkdtemp(prefix='streamtune-peers-')) / 'peers.db'}"
    meta["file"] = path.name
    presets: list[dict[str, Any]] = []

    def log(text: str) -> None:
        print(text, flush=True)

    def write(entries: list[dict[str, Any]]) -> None:
        data = {"meta": meta, "presets": entries}
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        log(f"wrote {path}")

    partial: list[dict[str, Any]] = []  # the preset's rounds so far, kept if a later one fails

    def save(entry: dict[str, Any]) -> None:
        partial[:] = [entry]
        write([*presets, entry])

    for spec in filter(None, args.presets.split(",")):
        for precision in filter(None, args.precisions.split(",")):
            partial.clear()
            try:
                presets.append(run_preset(spec, precision, args, storage, log, save))
            except Exception as exc:  # noqa: BLE001 - one preset's failure must not lose the rest
                log(f"== {spec} {precision}: failed: {type(exc).__name__}: {exc}")
                workload, _, preset = spec.rpartition(":")
                base = partial[0] if partial else {"workload": workload, "preset": preset}
                presets.append(
                    base | {"precision": precision, "error": f"{type(exc).__name__}: {exc}"}
                )
            write(presets)


if __name__ == "__main__":
    main()
