"""Hugging Face transformers models as workloads: `hf:causal-lm` (GPT-2 or Llama), `hf:masked-lm`
(BERT) and `hf:seq-cls` (BERT with a classification head), on synthetic token sequences.

Each model is built from its config class with random weights: nothing is downloaded. The
attention implementation is set explicitly (option `attention`: sdpa or eager) rather than left to
whatever the library finds installed, so a name means the same model on every machine. The loss
is the model's own (`labels=`), as a Hugging Face training loop computes it.

The sequences have no padding, and the step must not read a value on the host (a device sync,
and a step that a CUDA graph captures differently from how it runs eagerly). transformers'
mask preparation does read one, in two places: it checks a 2D attention mask for padding
(`padding_mask.all()`), and without a mask it checks the position ids for packed sequences; and
its eager mask starts from a host scalar (`torch.tensor(0.0, device=...)`, transformers 5.17).
So: BERT with sdpa gets no mask (bidirectional, neither check runs); with eager attention every
model gets its mask ready-made, 4D and on the device, which transformers passes through as it
is (causal, or for BERT one that masks nothing); a causal LM with sdpa runs transformers' own
SDPA function registered under `CAUSAL_SDPA`, a name with no mask function, so no mask is
prepared and SDPA runs causal (`is_causal=True`), eager or captured alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainers.errors import WorkloadError
from trainers.workloads.base import Batch, LossFn, SyntheticBatches, Workload, adamw
from trainers.workloads.extras import require
from trainers.workloads.options import Family, OptionSpec, Value

PAD, MASK = 0, 1
FIRST_TOKEN = 2  # ids below are reserved (BERT's padding and [MASK])
IGNORE = -100  # the label transformers' losses skip
NOISE = 0.1  # share of tokens drawn at random instead of from the successor table
CAUSAL_SDPA = "streamtune_causal_sdpa"

PRESETS: Mapping[str, Mapping[str, Value]] = {
    "tiny": {"batch": 2, "seq": 16, "layers": 2, "hidden": 32, "heads": 2, "vocab": 128},
    "small": {"batch": 8, "seq": 128, "layers": 4, "hidden": 256, "heads": 4, "vocab": 8192},
    "default": {},  # GPT-2 small: the options' defaults
}

# Llama-style decoders at the scale users train on one H100 (built from config, no download):
# GQA (4 query heads per key/value head), SwiGLU of 4 x hidden, a 32000-token vocabulary and
# 2048-token sequences. Each at two batches: one whose plain (eager) bf16 step fits in 80 GB, and
# the next one up, whose plain step does not, as users meet when they scale up (on an H100 the
# 1.1B model's eager step ran out of memory at 16 x 2048 tokens, where its compiled step took
# 66 GB: docs/benchmarks/scale-probe-h100-2026-11-25.md).
_LLAMA_350M: Mapping[str, Value] = {
    "arch": "llama",
    "hidden": 1024,
    "layers": 20,
    "heads": 16,
    "kv_heads": 4,
    "vocab": 32000,
    "seq": 2048,
    "batches": 4,
}
_LLAMA_1B: Mapping[str, Value] = {
    "arch": "llama",
    "hidden": 2048,
    "layers": 16,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 32000,
    "seq": 2048,
    "batches": 4,
}
CAUSAL_PRESETS: Mapping[str, Mapping[str, Value]] = {
    **PRESETS,
    "llama-350m": {**_LLAMA_350M, "batch": 16},
    "llama-350m-large": {**_LLAMA_350M, "batch": 32},
    "llama-1b": {**_LLAMA_1B, "batch": 8},
    "llama-1b-large": {**_LLAMA_1B, "batch": 16},
}

SHAPE_OPTIONS = (
    OptionSpec(name="batch", kind="int", default=8, low=1, high=65536, help="sequences per batch"),
    OptionSpec(
        name="seq",
        kind="int",
        default=512,
        low=2,
        high=131072,
        help="tokens per sequence (also the model's maximum position)",
    ),
    OptionSpec(name="layers", kind="int", default=12, low=1, high=256, help="transformer blocks"),
    OptionSpec(
        name="hidden",
        kind="int",
        default=768,
        low=8,
        high=65536,
        help="model width; the feed-forward width is 4 x hidden",
    ),
    OptionSpec(
        name="heads",
        kind="int",
        default=12,
        low=1,
        high=1024,
        help="attention heads; must divide hidden",
    ),
    OptionSpec(
        name="vocab", kind="int", default=50257, low=16, high=1_000_000, help="vocabulary size"
    ),
    OptionSpec(
        name="batches",
        kind="int",
        default=16,
        low=1,
        high=256,
        help="distinct synthetic batches, cycled",
    ),
    OptionSpec(
        name="attention",
        kind="str",
        default="sdpa",
        choices=("sdpa", "eager"),
        help="transformers' attention implementation",
    ),
    OptionSpec(
        name="lr", kind="float", default=3e-4, low=1e-8, high=1.0, help="AdamW learning rate"
    ),
    OptionSpec(
        name="weight_decay",
        kind="float",
        default=0.01,
        low=0.0,
        high=1.0,
        help="AdamW weight decay",
    ),
)

CAUSAL_LM = Family(
    name="hf:causal-lm",
    usage="hf:causal-lm",
    description="a decoder language model from transformers (GPT2LMHeadModel or "
    "LlamaForCausalLM), random weights, next-token loss",
    options=(
        *SHAPE_OPTIONS,
        OptionSpec(
            name="arch",
            kind="str",
            default="gpt2",
            choices=("gpt2", "llama"),
            help="the architecture: GPT2Config or LlamaConfig",
        ),
        OptionSpec(
            name="kv_heads",
            kind="int",
            default=0,
            low=0,
            high=1024,
            help="key/value heads for grouped-query attention (arch=llama; must divide heads); "
            "0: as many as heads",
        ),
        OptionSpec(
            name="ffn",
            kind="int",
            default=0,
            low=0,
            high=1_048_576,
            help="feed-forward width (SwiGLU's for llama); 0: 4 x hidden",
        ),
    ),
    presets=CAUSAL_PRESETS,
)
MASKED_LM = Family(
    name="hf:masked-lm",
    usage="hf:masked-lm",
    description="BERT masked language model from transformers (BertForMaskedLM), random "
    "weights, loss on the masked tokens",
    options=(
        *SHAPE_OPTIONS,
        OptionSpec(
            name="mask_prob",
            kind="float",
            default=0.15,
            low=0.0,
            high=1.0,
            help="share of tokens masked (at least one per sequence)",
        ),
    ),
    presets=PRESETS,
)
SEQ_CLS = Family(
    name="hf:seq-cls",
    usage="hf:seq-cls",
    description="BERT sequence classifier from transformers (BertForSequenceClassification), "
    "random weights, cross-entropy on one label per sequence",
    options=(
        *SHAPE_OPTIONS,
        OptionSpec(
            name="classes",
            kind="int",
            default=2,
            low=2,
            high=100_000,
            help="labels of the classification head",
        ),
    ),
    presets=PRESETS,
)
FAMILIES: Mapping[str, Family] = {
    f.name.removeprefix("hf:"): f for f in (CAUSAL_LM, MASKED_LM, SEQ_CLS)
}


def check_transformers(name: str, kind: str) -> None:
    require("transformers", workload=name)


def check_shape(options: Mapping[str, Value]) -> None:
    """What no single option can say: the heads split the width (evenly, for Llama)."""
    hidden, heads = int(options["hidden"]), int(options["heads"])
    if hidden % heads:
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden}: allowed a divisor of hidden",
            field="model_arg.heads",
        )
    kv_heads = int(options.get("kv_heads", 0))
    if kv_heads and options.get("arch") != "llama":
        raise WorkloadError(
            f"model_arg.kv_heads={kv_heads} is invalid with arch={options.get('arch')}: allowed 0 "
            "(grouped-query attention is built for arch=llama only)",
            field="model_arg.kv_heads",
        )
    if kv_heads and heads % kv_heads:
        raise WorkloadError(
            f"model_arg.kv_heads={kv_heads} is invalid with heads={heads}: allowed 0 or a divisor "
            "of heads",
            field="model_arg.kv_heads",
        )
    if options.get("arch") == "llama" and (hidden // heads) % 2:
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden} and arch=llama: allowed "
            f"heads that leave an even head width hidden/heads (rotary embeddings rotate pairs), "
            f"not {hidden // heads}",
            field="model_arg.heads",
        )


def causal_sdpa(transformers: Any) -> str:
    """transformers' SDPA attention, registered (once per process) under a name that has no
    mask function: the model then prepares no mask and SDPA applies causality itself."""
    interface = transformers.AttentionInterface
    if CAUSAL_SDPA not in interface():
        interface.register(CAUSAL_SDPA, interface()["sdpa"])
    return CAUSAL_SDPA


def make_config(kind: str, options: Mapping[str, Value], transformers: Any) -> Any:
    """The config of the model: sizes from the options, no cache (training), no dropout change."""
    vocab, hidden, heads = int(options["vocab"]), int(options["hidden"]), int(options["heads"])
    layers, seq = int(options["layers"]), int(options["seq"])
    ffn = int(options.get("ffn", 0)) or 4 * hidden
    attention = str(options["attention"])
    if kind == "causal-lm" and attention == "sdpa":
        attention = causal_sdpa(transformers)
    common: dict[str, Any] = {"vocab_size": vocab, "attn_implementation": attention}
    if kind == "causal-lm" and options["arch"] == "gpt2":
        return transformers.GPT2Config(
            n_embd=hidden,
            n_head=heads,
            n_layer=layers,
            n_inner=ffn,
            n_positions=seq,
            # GPT-2's own end-of-text id is its last one (50256); kept inside the vocabulary.
            bos_token_id=vocab - 1,
            eos_token_id=vocab - 1,
            use_cache=False,
            **common,
        )
    if kind == "causal-lm":
        return transformers.LlamaConfig(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(options.get("kv_heads", 0)) or heads,
            num_hidden_layers=layers,
            intermediate_size=ffn,
            max_position_embeddings=seq,
            # Llama's attention dropout is a float, not a module (disable_dropout finds it by
            # name); 0.0, the library's default, here.
            attention_dropout=0.0,
            use_cache=False,
            **common,
        )
    return transformers.BertConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
        pad_token_id=PAD,
        # Said, not inferred: transformers would otherwise infer it from the labels' dtype.
        num_labels=int(options.get("classes", 2)),
        problem_type="single_label_classification",
        **common,
    )


def make_model(kind: str, options: Mapping[str, Value], transformers: Any) -> nn.Module:
    config = make_config(kind, options, transformers)
    built: nn.Module
    if kind == "masked-lm":
        built = transformers.BertForMaskedLM(config)
        return built
    if kind == "seq-cls":
        built = transformers.BertForSequenceClassification(config)
        return built
    if options["arch"] == "llama":
        built = transformers.LlamaForCausalLM(config)
        return built
    model = transformers.GPT2LMHeadModel(config)
    # transformers picks the loss from the class name, and "GPT2LMHeadModel" names none; said
    # here, or it warns before falling back to this same loss.
    model.loss_type = "ForCausalLM"
    built = model
    return built


def chain_tokens(options: Mapping[str, Value], generator: torch.Generator) -> torch.Tensor:
    """int64 token ids in [FIRST_TOKEN, vocab), (batches, batch, seq): each token follows its
    predecessor through a fixed random successor table, or is drawn at random (NOISE), so a
    language model has something to learn and its loss falls."""
    n, b, s = int(options["batches"]), int(options["batch"]), int(options["seq"])
    vocab = int(options["vocab"])
    successor = FIRST_TOKEN + torch.randperm(vocab - FIRST_TOKEN, generator=generator)
    random = torch.randint(FIRST_TOKEN, vocab, (n, b, s), generator=generator)
    noisy = torch.rand(n, b, s, generator=generator) < NOISE
    tokens = random.clone()
    for t in range(1, s):
        follow = successor[tokens[..., t - 1] - FIRST_TOKEN]
        tokens[..., t] = torch.where(noisy[..., t], random[..., t], follow)
    return tokens


def make_batches(kind: str, options: Mapping[str, Value], generator: torch.Generator) -> Batch:
    tokens = chain_tokens(options, generator)
    if kind == "causal-lm":
        return (tokens,)  # the labels are the ids: the model shifts them itself
    if kind == "seq-cls":
        # The class is read from the first token, which BERT's pooler sees directly.
        return tokens, (tokens[..., 0] - FIRST_TOKEN) % int(options["classes"])
    masked = torch.rand(tokens.shape, generator=generator) < float(options["mask_prob"])
    # One forced mask per sequence: a batch with nothing to predict would make the loss NaN.
    forced = torch.randint(0, tokens.shape[-1], (*tokens.shape[:-1], 1), generator=generator)
    masked.scatter_(-1, forced, True)
    return torch.where(masked, MASK, tokens), torch.where(masked, tokens, IGNORE)


def causal_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    (ids,) = batch
    loss: torch.Tensor = model(input_ids=ids, labels=ids).loss
    return loss


def causal_lm_loss_eager(model: nn.Module, batch: Batch) -> torch.Tensor:
    (ids,) = batch
    # The causal mask made here, on the device, in the 4D additive form that transformers passes
    # through as it is: without a mask it would look for packed sequences in the position ids
    # (a host read every step), and the eager mask it builds from a 2D one starts from
    # `torch.tensor(0.0, device=...)`, a copy from pageable host memory that syncs every step and
    # that a CUDA graph cannot capture (seen on an H100 with transformers 5.17).
    seq = ids.shape[-1]
    blocked = torch.full((seq, seq), torch.finfo(torch.float32).min, device=ids.device)
    mask = blocked.triu(1)[None, None]
    loss: torch.Tensor = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    return loss


def labelled_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    ids, labels = batch
    loss: torch.Tensor = model(input_ids=ids, labels=labels).loss
    return loss


def labelled_loss_eager(model: nn.Module, batch: Batch) -> torch.Tensor:
    ids, labels = batch
    # BERT with eager attention: a ready-made 4D mask that masks nothing (added, it changes no
    # bit), made on the device. transformers 5.17 otherwise builds the eager mask from
    # `torch.tensor(0.0, device=...)`, a copy from pageable host memory that syncs every step and
    # that a CUDA graph cannot capture (seen on an H100); 5.18 builds none here.
    mask = torch.zeros((1, 1, 1, 1), device=ids.device)
    loss: torch.Tensor = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    return loss


def build(
    *, name: str, model: str, preset: str, options: Mapping[str, Value], seed: int
) -> Workload:
    """`model` is the kind (causal-lm, masked-lm, seq-cls)."""
    check_shape(options)
    transformers = require("transformers", workload=name)
    torch.manual_seed(seed)
    net = make_model(model, options, transformers)
    generator = torch.Generator().manual_seed(seed + 1)
    eager = options["attention"] == "eager"
    loss_fn: LossFn = labelled_loss_eager if eager else labelled_loss
    if model == "causal-lm":
        loss_fn = causal_lm_loss_eager if eager else causal_lm_loss
    return Workload(
        name=name,
        preset=preset,
        model=net,
        dataset=SyntheticBatches(make_batches(model, options, generator)),
        loss_fn=loss_fn,
        samples_per_batch=int(options["batch"]),
        tokens_per_sample=int(options["seq"]),
        make_optimizer=adamw(float(options["lr"]), float(options["weight_decay"])),
    )
