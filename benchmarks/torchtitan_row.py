"""torchtitan 0.3.0 as a reference row: its own Llama3 trainer at a custom ~1B shape, one GPU.

    PYTHONPATH=/tmp/site:$PWD python benchmarks/torchtitan_row.py --steps 30 --warmup 10 --out DIR

One process set up as `torchrun --nproc_per_node 1` would; flavor `streamtune_1b` registered into
torchtitan's llama3 registry (the package is not edited); a `Trainer.Config` built as its llama3
`config_registry` builds its own (float8 via its `Float8LinearConverter`, compile per block), then
`build()`, `train()`, `close()` as `torchtitan.train.main` does. Offline: a WordLevel tokenizer and
JSONL documents written here feed torchtitan's own tokenizer and `HuggingFaceTextDataLoader`;
`datasets` and `torch.utils.tensorboard` (imported, never called here) are stubbed where missing.
Writes DIR/torchtitan-row.json (failures: exception, phase, step) and DIR/torchtitan.log.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import json
import logging
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, make_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

FLAVOR = "streamtune_1b"
DATASET = "streamtune_local"
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 of the written tokenizer
# The (multiple_of, ffn_dim_multiplier) pairs torchtitan's own Llama3 flavors use.
MULTIPLES = (256, 512, 1024, 2048, 4096)
MULTIPLIERS = (None, 1.0, 1.2, 1.3, 1.5)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torchtitan 0.3.0 components/metrics.py MetricsProcessor.log, colours removed.
_STEP = re.compile(
    r"(?<!validate )step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)\s+grad_norm:\s*(?P<grad_norm>\S+)"
    r"\s+memory:\s*(?P<memory_gib>[\d.]+)GiB\((?P<memory_pct>[\d.]+)%\)\s+tps:\s*(?P<tps>[\d,]+)"
    r"\s+tflops:\s*(?P<tflops>[\d,.]+)\s+mfu:\s*(?:N/A|(?P<mfu_pct>[\d.]+)%)"
)


@dataclass(frozen=True)
class Shape:
    dim: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 8192
    vocab: int = 32000
    seq: int = 2048
    batch: int = 8
    tie: bool = False


def ffn_hidden_dim(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan's `compute_ffn_hidden_dim` (models/common/feed_forward.py), restated."""
    hidden = int(2 * 4 * dim / 3)
    hidden = hidden if multiplier is None else int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def ffn_args(dim: int, target: int) -> dict[str, Any]:
    """The torchtitan-style (multiple_of, ffn_dim_multiplier) whose hidden size is closest to
    `target` (the first exact one in torchtitan's order, else the nearest)."""
    best: dict[str, Any] | None = None
    for multiplier in MULTIPLIERS:
        for multiple_of in MULTIPLES:
            hidden = ffn_hidden_dim(dim, multiple_of, multiplier)
            if best is None or abs(hidden - target) < abs(best["hidden_dim"] - target):
                best = {"multiple_of": multiple_of, "ffn_dim_multiplier": multiplier}
                best["hidden_dim"] = hidden
    assert best is not None
    return {**best, "requested": target, "exact": best["hidden_dim"] == target}


def parse_step_line(line: str) -> dict[str, Any] | None:
    """One training step's values from torchtitan's log line; None for any other line."""
    found = _STEP.search(_ANSI.sub("", line))
    if found is None:
        return None
    values = found.groupdict().items()
    parsed: dict[str, Any] = {key: text and float(text.replace(",", "")) for key, text in values}
    parsed["step"] = int(parsed["step"])
    return parsed


def write_assets(folder: Path, shape: Shape, docs: int, seed: int = 0) -> dict[str, Any]:
    """tokenizer.json (WordLevel, `shape.vocab` ids), tokenizer_config.json, data.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), shape.vocab)})
    tokenizer: dict[str, Any] = dict.fromkeys(("truncation", "padding", "normalizer", "decoder"))
    tokenizer.update(version="1.0", added_tokens=[], post_processor=None)
    tokenizer["pre_tokenizer"] = {"type": "WhitespaceSplit"}
    tokenizer["model"] = {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIALS[0]}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    special: dict[str, Any] = {"add_bos_token": True, "add_eos_token": True}
    special.update(zip(("unk_token", "bos_token", "eos_token"), SPECIALS, strict=True))
    (folder / "tokenizer_config.json").write_text(json.dumps(special))
    rng, words = random.Random(seed), shape.seq * 3 // 2
    with (folder / "data.jsonl").open("w") as out:
        for _ in range(docs):
            ids = (rng.randrange(len(SPECIALS), shape.vocab) for _ in range(words))
            out.write(json.dumps({"text": " ".join(f"t{i}" for i in ids)}) + "\n")
    return {"folder": str(folder), "docs": docs, "words_per_doc": words, "vocab": shape.vocab}


def torchrun_env() -> dict[str, str]:
    """The variables torchrun sets for one process on one GPU; ones already set are kept."""
    wanted = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    wanted.update(GROUP_RANK="0", ROLE_RANK="0", ROLE_WORLD_SIZE="1", HF_HUB_OFFLINE="1")
    wanted.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WANDB_MODE": "disabled"})
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


def install_stubs(shim_torch: bool = False) -> dict[str, str]:
    """Stand-ins where missing for modules torchtitan imports but never calls here, and with
    `shim_torch` for the torch >= 2.12 name it imports, only builds past one GPU: {name: why}."""
    stubs: dict[str, str] = {}
    fsdp = importlib.import_module("torch.distributed.fsdp")
    if shim_torch and not hasattr(fsdp, "DataParallelMeshDims"):
        fields = [("shard", Any, None), ("replicate", Any, None)]
        fsdp.__dict__["DataParallelMeshDims"] = make_dataclass("DataParallelMeshDims", fields)
        stubs["torch.distributed.fsdp.DataParallelMeshDims"] = f"absent in {torch.__version__}"
    if shim_torch:
        stubs.update(_shim_block_mask())
    for name in ("torch.utils.tensorboard", "datasets"):
        try:
            importlib.import_module(name)
        except ImportError as error:
            stubs[name] = f"{type(error).__name__}: {error}"
    if "torch.utils.tensorboard" in stubs:
        _stub("torch.utils.tensorboard", SummaryWriter=None)
    if "datasets" in stubs:
        split = _stub("datasets.distributed", split_dataset_by_node=lambda ds, r, n: ds[r::n])
        fake = {"Dataset": type("Dataset", (), {}), "load_dataset": None, "stub": True}
        _stub("datasets", distributed=split, **fake)
    return stubs


def _shim_block_mask() -> dict[str, str]:
    """torchtitan 0.3.0's flex-attention mask passes `separate_full_blocks=True` (False only in
    its batch-invariant mode), a keyword torch 2.11's `create_block_mask` lacks though it always
    separates the full blocks (on a GPU, 2026-11-29: "create_block_mask() got an unexpected
    keyword argument 'separate_full_blocks'"). Where it is missing, the function takes it: True
    is what it does anyway, False is refused. Set before torchtitan compiles the function at
    import."""
    flex = importlib.import_module("torch.nn.attention.flex_attention")
    original = flex.create_block_mask
    if "separate_full_blocks" in inspect.signature(original).parameters:
        return {}

    @functools.wraps(original)
    def create_block_mask(*args: Any, separate_full_blocks: bool = True, **kwargs: Any) -> Any:
        if not separate_full_blocks:
            raise NotImplementedError(
                f"separate_full_blocks=False: torch {torch.__version__} always separates them"
            )
        return original(*args, **kwargs)

    flex.create_block_mask = create_block_mask
    name = "torch.nn.attention.flex_attention.create_block_mask(separate_full_blocks=)"
    return {name: f"absent in {torch.__version__}: True taken, its only behaviour there"}


def _stub(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def load_documents(path: str) -> Any:
    """The documents in `path`/data.jsonl: a list, or a `datasets.Dataset` where it is real."""
    import datasets

    with open(Path(path) / "data.jsonl") as lines:
        rows = [json.loads(line) for line in lines]
    return rows if getattr(datasets, "stub", False) else datasets.Dataset.from_list(rows)


def register(shape: Shape, data_path: str) -> dict[str, Any]:
    """The flavor into torchtitan's llama3 registry (built as its `_1b`), the data into DATASETS."""
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    ffn, dim, vocab = ffn_args(shape.dim, shape.ffn), shape.dim, shape.vocab

    def build(attn_backend: str, tp_gemm_backend: Any = "default") -> Any:
        emb = llama3._EMBEDDING_SKIP_INIT if shape.tie else llama3._EMBEDDING_INIT
        rope_args = {"max_seq_len": 131072, "theta": 500000.0, "scaling": "llama"}
        rope = ComplexRoPE.Config(dim=dim // shape.heads, **rope_args)
        blocks = {"n_layers": shape.layers, "dim": dim, "n_heads": shape.heads, "rope": rope}
        blocks.update(n_kv_heads=shape.kv_heads, hidden_dim=ffn["hidden_dim"], fuse_qkv=True)
        blocks.update(attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend)
        embedding = Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=emb)
        head = {"param_init": llama3._output_linear_init(dim)}
        return llama3.Llama3Model.Config(
            dim=dim,
            vocab_size=vocab,
            enable_weight_tying=shape.tie,
            tok_embeddings=embedding,
            norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
            lm_head=Linear.Config(in_features=dim, out_features=vocab, **head),
            layers=llama3._build_llama3_layers(**blocks),
        )

    llama3.llama3_configs[FLAVOR] = build
    text = lambda sample: sample["text"]  # noqa: E731
    DATASETS[DATASET] = DatasetConfig(path=data_path, loader=load_documents, sample_processor=text)
    return ffn


def trainer_config(args: argparse.Namespace, shape: Shape, assets: Path) -> Any:
    """A `Trainer.Config` as torchtitan's llama3 `config_registry` functions write theirs."""
    from torchtitan.components import checkpoint, loss, metrics, optimizer, validate
    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig, configs
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.llama3 import model_registry
    from torchtitan.tools.profiler import Profiler
    from torchtitan.trainer import Trainer

    converters = []
    if args.float8 != "none":
        skip = [name for name in args.float8_filter.split(",") if name]
        float8 = {"recipe_name": args.float8, "model_compile_enabled": args.compile}
        converters.append(Float8LinearConverter.Config(filter_fqns=skip, **float8))
    spec = model_registry(FLAVOR, attn_backend=args.attn, converters=converters or None)
    ac = {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}[args.ac]
    graphs_off = args.cuda_graphs == "off"
    training = {"local_batch_size": shape.batch, "seq_len": shape.seq, "steps": args.steps}
    log = {"log_freq": args.log_freq, "disable_color_printing": True}
    cross_entropy = loss.CrossEntropyLoss.Config(global_vocab_size=shape.vocab)
    return Trainer.Config(
        loss=loss.ChunkedLossWrapper.Config(loss_fn=cross_entropy),
        hf_assets_path=str(assets),
        dump_folder=str(Path(args.out) / "torchtitan-dump"),
        model_spec=spec,
        optimizer=optimizer.default_adamw(lr=8e-4),
        lr_scheduler=optimizer.LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8),
        training=TrainingConfig(disable_cuda_graphs=graphs_off, **training),
        dataloader=HuggingFaceTextDataLoader.Config(dataset=DATASET, dataset_path=str(assets)),
        metrics=metrics.MetricsProcessor.Config(**log),
        checkpoint=checkpoint.CheckpointManager.Config(enable=False),
        activation_checkpoint=ac,
        parallelism=ParallelismConfig(spmd_backend=args.spmd_backend),
        compile=CompileConfig(enable=args.compile, components=["model", "loss"]),
        profiler=Profiler.Config(enable_profiling=False),
        validator=validate.Validator.Config(enable=False),
        debug=configs.DebugConfig(seed=args.seed, enable_structured_logging=False),
    )


class Live(logging.Handler):
    """What a run leaves for its record, however far it got: the trainer, each torchtitan step
    line parsed as it is logged (this is a handler on the root logger), each step's span."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.trainer: Any = None
        self.steps: list[dict[str, Any]] = []
        self.spans: list[tuple[float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        parsed = parse_step_line(record.getMessage())
        if parsed is not None:
            self.steps.append(parsed)


def summarize(
    steps: Sequence[dict[str, Any]], spans: Sequence[tuple[float, float]], warmup: int, tokens: int
) -> dict[str, Any]:
    """Medians after `warmup`; wall tokens/s from the end of step `warmup` (`spans[warmup - 1]`)
    to the end of the last, both device-synchronised, all between steps included."""
    kept = [step for step in steps if step["step"] > warmup]
    keys = ("tps", "tflops", "mfu_pct", "memory_gib", "loss")
    median = {
        key: statistics.median(values) if values else None
        for key in keys
        for values in [[step[key] for step in kept if step.get(key) is not None]]
    }
    summary: dict[str, Any] = {"median": median, "steps_after_warmup": len(kept)}
    after = spans[warmup:]
    if after:
        window = after[-1][1] - (spans[warmup - 1][1] if warmup else after[0][0])
        n = len(after)
        wall = {"window_s": window, "steps": n, "tokens_per_s": tokens * n / window}
        wall["median_host_step_s"] = statistics.median(end - start for start, end in after)
        summary["wall"] = wall
    return summary


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("torch", "torchao", "torchtitan", "triton", "tyro", "spmd_types", "datasets"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def run(args: argparse.Namespace, record: dict[str, Any], live: Live) -> None:
    """Set up, build and train, filling `record` as it goes (`phase` says how far it got)."""
    shape = Shape(**{key: getattr(args, key) for key in Shape.__dataclass_fields__})
    record["shape"] = asdict(shape)
    record["phase"] = "setup"
    assets = Path(args.data_dir or tempfile.mkdtemp(prefix="torchtitan-row-"))
    record["data"] = write_assets(assets, shape, docs=args.docs, seed=args.seed)
    record["env"] = torchrun_env()
    record["phase"] = "import"
    record["stubs"] = install_stubs(args.shim_torch)
    record["versions"] = versions()
    record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
    import torchtitan.trainer  # all of the path's module-level imports, in this phase

    torchtitan.tools.logging.init_logger()
    logging.getLogger().addHandler(live)
    logging.getLogger().addHandler(logging.FileHandler(Path(args.out) / "torchtitan.log", "w"))
    record["phase"] = "config"
    record["shape"]["ffn_args"] = register(shape, str(assets))
    config = trainer_config(args, shape, assets)
    record["config"] = json.loads(json.dumps(config.to_dict(), default=str))
    record["phase"] = "build"
    live.trainer = trainer = config.build()
    record["reported"] = {"flops_per_token": trainer.metrics_processor.num_flops_per_token}
    record["reported"]["gpu_peak_flops"] = trainer.metrics_processor.gpu_peak_flops
    train_step = trainer.train_step

    def timed(data_iterator: Any) -> None:  # host span; synchronised at the window's two ends
        start = time.perf_counter()
        train_step(data_iterator)
        if len(live.spans) + 1 in (args.warmup, args.steps):
            torch.cuda.synchronize()
        live.spans.append((start, time.perf_counter()))

    trainer.train_step = timed
    record["phase"] = "train"
    trainer.train()
    record["phase"] = "done"


def finish(args: argparse.Namespace, record: dict[str, Any], live: Live) -> None:
    """Steps, summary, failed step into the record; trainer closed, process group destroyed."""
    steps = live.steps
    for step in steps:
        if step["step"] <= len(live.spans):
            start, end = live.spans[step["step"] - 1]
            step["host_step_s"] = end - start
    record["steps"] = steps
    if "error" in record and live.trainer is not None:
        record["error"]["step"] = live.trainer.step
    record["summary"] = summarize(steps, live.spans, args.warmup, args.batch * args.seq)
    peak = record.get("reported", {}).get("gpu_peak_flops")
    tflops = record["summary"]["median"].get("tflops")
    if peak and tflops:  # torchtitan logs "mfu: N/A" under float8: its tflops over its BF16 peak
        record["summary"]["mfu_pct_vs_bf16_peak_derived"] = 100 * tflops * 1e12 / peak
    with contextlib.suppress(Exception):
        if live.trainer is not None:
            live.trainer.close()
    with contextlib.suppress(Exception):
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = {"steps": 30, "warmup": 10, "log_freq": 10, "docs": 128, "seed": 0}
    ints.update({key: value for key, value in asdict(Shape()).items() if key != "tie"})
    for name, default in ints.items():
        cli.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    cli.add_argument("--out", default="docs/benchmarks")
    cli.add_argument("--tie", action="store_true", help="lm_head tied to the embeddings")
    recipes = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]
    cli.add_argument("--float8", default="tensorwise", choices=recipes, help="torchao recipe")
    cli.add_argument("--no-float8", dest="float8", action="store_const", const="none")
    cli.add_argument("--float8-filter", default="lm_head", help="FQNs kept high precision")
    cli.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    cli.add_argument("--cuda-graphs", choices=["on", "off"], default="on", help="torchtitan: on")
    cli.add_argument("--ac", choices=["none", "selective", "full"], default="none")
    cli.add_argument("--attn", choices=["flex", "flex_flash", "varlen"], default="flex")
    backends = ["spmd_types", "partial_dtensor", "full_dtensor"]
    cli.add_argument("--spmd-backend", choices=backends, default="spmd_types", help="its default")
    cli.add_argument("--shim-torch", action="store_true", help="torch 2.11: see install_stubs")
    cli.add_argument("--data-dir", default=None, help="where the data go (default: a temp dir)")
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    (out := Path(args.out)).mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"row": "torchtitan", "argv": list(argv or sys.argv[1:])}
    record["settings"] = dict(vars(args))
    started, live = time.perf_counter(), Live()
    try:
        run(args, record, live)
    except BaseException as error:  # noqa: BLE001 - the record must say why, whatever it was
        failed = {"phase": record.get("phase"), "step": None, "type": type(error).__qualname__}
        record["error"] = {**failed, "message": str(error), "traceback": traceback.format_exc()}
    finish(args, record, live)
    record["ok"] = "error" not in record
    record["elapsed_s"] = time.perf_counter() - started
    path = out / "torchtitan-row.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {path}: ok={record['ok']}", file=sys.stderr)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
