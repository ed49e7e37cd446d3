"""The models of the `hf:` text workloads (`trainers.workloads.text`): each built from its
transformers config class with random weights (`make_model`), the config's sizes from the
workload's options (`make_config`), checked before anything is built (`check_shape`).

A causal LM with sdpa attention runs transformers' own SDPA function registered under
`CAUSAL_SDPA`, a name with no mask function, so no mask is prepared and SDPA runs causal
(`trainers.workloads.text` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from trainers.errors import WorkloadError
from trainers.workloads.init_once import built_once
from trainers.workloads.options import Value
from trainers.workloads.text_archs import (
    NAMED_ARCHS,
    causal_lm_types,
    check_arch,
    common_config,
    name_causal_loss,
    other_config,
)
from trainers.workloads.text_stream import PAD

GQA_ARCHS = ("llama", "qwen2", "mistral")
"""The architectures whose config takes key/value heads apart from query heads."""
GPT_NEOX_ROTARY = 0.25
"""The share of each head GPT-NeoX rotates (`rotary_pct`: its config's default, Pythia's)."""


def check_shape(options: Mapping[str, Value]) -> None:
    """What no single option can say: the heads split the width (into rotatable head widths, for
    the rotary architectures), and key/value heads only where the architecture has them; an
    architecture outside the named five by `trainers.workloads.text_archs.check_arch`."""
    hidden, heads = int(options["hidden"]), int(options["heads"])
    arch = options.get("arch")
    if hidden % heads:
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden}: allowed a divisor of hidden",
            field="model_arg.heads",
        )
    kv_heads = int(options.get("kv_heads", 0))
    if kv_heads and arch in NAMED_ARCHS and arch not in GQA_ARCHS:
        raise WorkloadError(
            f"model_arg.kv_heads={kv_heads} is invalid with arch={arch}: allowed 0 (of the "
            f"named five, grouped-query attention is built for arch={', '.join(GQA_ARCHS)}; "
            "other transformers decoders whose config has num_key_value_heads take it too, "
            "e.g. arch=qwen3)",
            field="model_arg.kv_heads",
        )
    if kv_heads and heads % kv_heads:
        raise WorkloadError(
            f"model_arg.kv_heads={kv_heads} is invalid with heads={heads}: allowed 0 or a divisor "
            "of heads",
            field="model_arg.kv_heads",
        )
    width = hidden // heads
    if arch in GQA_ARCHS and width % 2:
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden} and arch={arch}: allowed "
            f"heads that leave an even head width hidden/heads (rotary embeddings rotate pairs), "
            f"not {width}",
            field="model_arg.heads",
        )
    rotated = int(width * GPT_NEOX_ROTARY)
    if arch == "gpt_neox" and not options.get("config") and (rotated < 2 or rotated % 2):
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden} and arch=gpt_neox: allowed "
            f"heads that leave a head width hidden/heads whose rotated quarter (rotary_pct "
            f"{GPT_NEOX_ROTARY}) is an even number of at least 2, not {width} (quarter "
            f"{rotated}): e.g. a head width that is a multiple of 8",
            field="model_arg.heads",
        )
    if arch is not None:
        check_arch(options)


def make_config(kind: str, options: Mapping[str, Value], transformers: Any) -> Any:
    """The config of the model: sizes from the options, no cache (training), no dropout change."""
    vocab, hidden, heads = int(options["vocab"]), int(options["hidden"]), int(options["heads"])
    layers, seq = int(options["layers"]), int(options["seq"])
    ffn = int(options.get("ffn", 0)) or 4 * hidden
    common = common_config(kind, options, transformers)
    if kind == "causal-lm" and (options["arch"] not in NAMED_ARCHS or options.get("config")):
        # A file first, whatever its type: a GPT-2 or Pythia file had been built from the
        # project's own GPT-2 and GPT-NeoX configs below, its other fields (activation, norm
        # eps, rotary share, parallel residual) dropped with no word (a user's probe, 2026-12-07).
        return other_config(options, transformers, common)
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
    if kind == "causal-lm" and options["arch"] == "gpt_neox":
        return transformers.GPTNeoXConfig(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_hidden_layers=layers,
            intermediate_size=ffn,
            max_position_embeddings=seq,
            # Said, not left to the library: `check_shape` holds the head width to it.
            rotary_pct=GPT_NEOX_ROTARY,
            # Its dropouts are floats (disable_dropout finds them by name); 0.0, the library's
            # defaults, here.
            attention_dropout=0.0,
            hidden_dropout=0.0,
            use_cache=False,
            **common,
        )
    if kind == "causal-lm":
        return _rotary_decoder_config(options, transformers, common)
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


def _rotary_decoder_config(
    options: Mapping[str, Value], transformers: Any, common: Mapping[str, Any]
) -> Any:
    """The config of a Llama, Qwen2 or Mistral decoder (the same fields; grouped-query
    attention through `kv_heads`)."""
    hidden, heads = int(options["hidden"]), int(options["heads"])
    extra: dict[str, Any] = {}
    if options["arch"] == "mistral":
        # No sliding window (Mistral's config defaults to 4096): the causal SDPA path
        # (`CAUSAL_SDPA`) and the eager path's ready-made mask are both full causal attention,
        # and a window shorter than the sequence would be silently ignored by the one and not
        # by the other. Mistral 7B v0.2 on has none either.
        extra["sliding_window"] = None
    if options["arch"] == "qwen2":
        # Qwen2's default (every layer full attention), said for the same reason.
        extra["use_sliding_window"] = False
    config_class = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[str(options["arch"])]
    return config_class(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(options.get("kv_heads", 0)) or heads,
        num_hidden_layers=int(options["layers"]),
        intermediate_size=int(options.get("ffn", 0)) or 4 * hidden,
        max_position_embeddings=int(options["seq"]),
        # The attention dropout of these is a float, not a module (disable_dropout finds it by
        # name); 0.0, the library's default, here.
        attention_dropout=0.0,
        use_cache=False,
        **extra,
        **common,
    )


def make_model(kind: str, options: Mapping[str, Value], transformers: Any) -> nn.Module:
    config = make_config(kind, options, transformers)
    made: Any = built_once(lambda: _model_class(kind, options, transformers)(config))
    if kind == "causal-lm":
        name_causal_loss(made)
    built: nn.Module = made
    return built


def _model_class(kind: str, options: Mapping[str, Value], transformers: Any) -> Any:
    """The transformers class of `kind` and the options' architecture."""
    if kind == "masked-lm":
        return transformers.BertForMaskedLM
    if kind == "seq-cls":
        return transformers.BertForSequenceClassification
    causal = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "gpt_neox": "GPTNeoXForCausalLM",
        "mistral": "MistralForCausalLM",
    }
    arch = str(options["arch"])
    if arch not in NAMED_ARCHS or options.get("config"):
        return getattr(transformers, causal_lm_types(transformers)[arch])
    return getattr(transformers, causal.get(arch, "GPT2LMHeadModel"))
