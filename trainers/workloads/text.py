"""Hugging Face transformers models as workloads: `hf:causal-lm` (GPT-2, Llama, Qwen2, GPT-NeoX or
Mistral), `hf:masked-lm` (BERT) and `hf:seq-cls` (BERT with a classification head), on synthetic
token sequences: by default a stream that never repeats a batch (`TokenStream`, docs/data.md).

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

The parts: the models and their configs in `trainers.workloads.text_models`, the token
sequences (`TokenStream`) in `trainers.workloads.text_stream`, the losses in
`trainers.workloads.text_losses`; their public names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainers.workloads.base import LossFn, Workload, adamw
from trainers.workloads.extras import require
from trainers.workloads.options import Family, OptionSpec, Value
from trainers.workloads.text_archs import (
    CAUSAL_SDPA,
    NAMED_ARCHS,
    causal_loss,
    causal_sdpa,
    check_causal,
)
from trainers.workloads.text_config_file import check_with_file, fill_from_file
from trainers.workloads.text_losses import (
    causal_lm_loss,
    causal_lm_loss_eager,
    labelled_loss,
    labelled_loss_eager,
)
from trainers.workloads.text_models import (
    GPT_NEOX_ROTARY,
    GQA_ARCHS,
    check_shape,
    make_config,
    make_model,
)
from trainers.workloads.text_stream import (
    FIRST_TOKEN,
    IGNORE,
    MASK,
    NOISE,
    PAD,
    STREAM_LENGTH,
    TokenStream,
    batch_seed,
    chain_tokens,
    jumps,
    label,
    make_batches,
    make_dataset,
    successor_table,
    walk,
)

__all__ = [
    "CAUSAL_LM",
    "CAUSAL_PRESETS",
    "CAUSAL_SDPA",
    "FAMILIES",
    "FIRST_TOKEN",
    "GPT_NEOX_ROTARY",
    "GQA_ARCHS",
    "IGNORE",
    "MASK",
    "MASKED_LM",
    "NAMED_ARCHS",
    "NOISE",
    "PAD",
    "PRESETS",
    "SEQ_CLS",
    "SHAPE_OPTIONS",
    "STREAM_LENGTH",
    "TokenStream",
    "batch_seed",
    "build",
    "causal_lm_loss",
    "causal_lm_loss_eager",
    "causal_sdpa",
    "chain_tokens",
    "check_shape",
    "check_transformers",
    "data_option",
    "jumps",
    "label",
    "labelled_loss",
    "labelled_loss_eager",
    "make_batches",
    "make_config",
    "make_dataset",
    "make_model",
    "successor_table",
    "walk",
]

PRESETS: Mapping[str, Mapping[str, Value]] = {
    "tiny": {"batch": 2, "seq": 16, "layers": 2, "hidden": 32, "heads": 2, "vocab": 128},
    "small": {"batch": 8, "seq": 128, "layers": 4, "hidden": 256, "heads": 4, "vocab": 8192},
    "default": {},  # GPT-2 small: the options' defaults
}

# Llama-style decoders at the scale users train on one H100 (built from config, no download):
# GQA (4 query heads per key/value head), SwiGLU of 4 x hidden, a 32000-token vocabulary and
# 2048-token sequences, trained on the token stream (`data`'s default; `batches` is how many
# fixed batches `data=fixed` makes, as these presets had before the stream). Each at two
# batches: one whose plain (eager) bf16 step fits in 80 GB, and the next one up, whose plain step
# does not, as users meet when they scale up (on an H100 the 1.1B model's eager step ran out of
# memory at 16 x 2048 tokens, where its compiled step took 66 GB:
# docs/benchmarks/scale-probe-h100-2026-11-25.md).
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
        help="distinct synthetic batches, cycled (data=fixed; a stream never repeats one)",
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


def data_option(default: str) -> OptionSpec:
    return OptionSpec(
        name="data",
        kind="str",
        default=default,
        choices=("stream", "fixed"),
        help="stream: every step a new batch, drawn from the seed and its index (never "
        "repeated, so a large model cannot memorise it; docs/data.md); fixed: `batches` "
        "batches made once and cycled",
    )


CAUSAL_LM = Family(
    name="hf:causal-lm",
    usage="hf:causal-lm",
    description="a decoder language model from transformers (GPT2LMHeadModel, "
    "LlamaForCausalLM, Qwen2ForCausalLM, GPTNeoXForCausalLM, MistralForCausalLM, or any other "
    "causal LM type by `arch`), random weights, next-token loss",
    options=(
        *SHAPE_OPTIONS,
        data_option("stream"),
        OptionSpec(
            name="arch",
            kind="str",
            default="gpt2",
            help="the architecture: gpt2, llama, qwen2, gpt_neox or mistral (their config "
            "classes), or any other model type transformers builds a causal LM for (qwen3, phi3, "
            "gemma2, olmo2, ...; every layer full causal attention); the family's own defaults "
            "for what no option sets",
        ),
        OptionSpec(
            name="kv_heads",
            kind="int",
            default=0,
            low=0,
            high=1024,
            help="key/value heads for grouped-query attention (arch=llama, qwen2, mistral or "
            "another whose config has num_key_value_heads; must divide heads); 0: as many as "
            "heads",
        ),
        OptionSpec(
            name="ffn",
            kind="int",
            default=0,
            low=0,
            high=1_048_576,
            help="feed-forward width (SwiGLU's for llama, qwen2 and mistral; a mixture of "
            "experts' each expert's too, where its config keeps that apart); 0: 4 x hidden (the "
            "family's own expert width)",
        ),
        OptionSpec(
            name="tie",
            kind="str",
            default="auto",
            choices=("auto", "true", "false"),
            help="output head tied to the input embeddings; auto: the architecture's config "
            "default (tied for gpt2; untied for llama, qwen2, gpt_neox and mistral, whose 0.5B "
            "and 1.5B Qwen2 models tie; another arch's own family default, as Gemma's and OPT's "
            "tied)",
        ),
        OptionSpec(
            name="config",
            kind="str",
            default="",
            help="your model's transformers config.json (or its folder), random weights: its "
            "model_type is arch, its sizes the options' unless given too (its head width and "
            "experts' width then follow hidden, heads and ffn; fewer heads keep its key/value "
            "grouping); empty: none",
        ),
    ),
    presets=CAUSAL_PRESETS,
    fill=fill_from_file,
    check=check_with_file(check_shape),
)
MASKED_LM = Family(
    name="hf:masked-lm",
    usage="hf:masked-lm",
    description="BERT masked language model from transformers (BertForMaskedLM), random "
    "weights, loss on the masked tokens",
    options=(
        *SHAPE_OPTIONS,
        # Fixed by default: on the stream its loss hardly moves within a gate's steps (on a CPU,
        # the tiny preset 4.84 to 4.81 over 128 steps, against 4.87 to 3.66 on 16 fixed batches;
        # the small preset 9.07 to 9.07 over 120, against 8.94 to 6.63), and a loss that does not
        # move cannot tell a loop that trains from one that does not. A masked token is
        # predicted from its neighbours, a circuit slower to form than the causal model's lookup
        # of the token it reads.
        data_option("fixed"),
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
    check=check_shape,
)
SEQ_CLS = Family(
    name="hf:seq-cls",
    usage="hf:seq-cls",
    description="BERT sequence classifier from transformers (BertForSequenceClassification), "
    "random weights, cross-entropy on one label per sequence",
    options=(
        *SHAPE_OPTIONS,
        data_option("stream"),
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
    check=check_shape,
)
FAMILIES: Mapping[str, Family] = {
    f.name.removeprefix("hf:"): f for f in (CAUSAL_LM, MASKED_LM, SEQ_CLS)
}


def check_transformers(name: str, kind: str) -> None:
    require("transformers", workload=name)


def build(
    *, name: str, model: str, preset: str, options: Mapping[str, Value], seed: int
) -> Workload:
    """`model` is the kind (causal-lm, masked-lm, seq-cls)."""
    check_shape(options)
    transformers = require("transformers", workload=name)
    torch.manual_seed(seed)
    net = make_model(model, options, transformers)
    eager = options["attention"] == "eager"
    loss_fn: LossFn = labelled_loss_eager if eager else labelled_loss
    if model == "causal-lm":
        loss_fn = causal_loss(options)
        check_causal(options, net, loss_fn)
    return Workload(
        name=name,
        preset=preset,
        model=net,
        dataset=make_dataset(model, options, seed),
        loss_fn=loss_fn,
        samples_per_batch=int(options["batch"]),
        tokens_per_sample=int(options["seq"]),
        make_optimizer=adamw(float(options["lr"]), float(options["weight_decay"])),
    )
