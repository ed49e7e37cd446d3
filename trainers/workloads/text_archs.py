"""`hf:causal-lm` beyond its five named architectures: any decoder type that transformers builds
a causal LM for (`arch=qwen3`, `phi3`, `gemma2`, `olmo2`, `stablelm`, ...), from
`transformers.AutoConfig.for_model` with the options' sizes and that family's own defaults for
everything else, random weights as for the named ones.

The named five (`NAMED_ARCHS`) are built by their own config classes in
`trainers.workloads.text_models`; their presets and benchmark rows were measured so. Another
type is built by the same rules, said once here rather than per family:

- the sizes go to the fields the family's causal LM builds from (`text_sizes.size_fields`:
  the decoder's, `decoder_layers`, where an encoder-decoder family's causal LM is its decoder
  alone; xLSTM's `num_heads`), `num_key_value_heads`, `intermediate_size` and `head_dim` only
  where the family's config has them (`ffn` also each expert's width, where a mixture of
  experts keeps it apart), and every size is read back from those fields: a family without
  one (Mamba's heads) or that keeps its width elsewhere (a composite config, a `text_config`)
  is refused, naming its text decoder's type where transformers has one;
- every layer attends to the whole causal prefix: a sliding window is switched off
  (`use_sliding_window`), or set to the sequence length where the config takes only a number,
  and a `layer_types` list of full and sliding attention becomes all full. The causal SDPA path
  (`CAUSAL_SDPA`) applies no window whatever the config says, so a config that kept one would
  name a model the run does not compute. (A mix with other layer kinds, as a hybrid's
  convolution or state-space layers, keeps the family's pattern.)
- a family whose attention soft-caps its logits (Gemma 2) is refused under sdpa, which would
  drop the cap: it runs with attention=eager;
- special token ids the family's defaults put outside the vocabulary (Phi-3's pad id 32000 at
  a smaller `vocab`) are moved to `PAD` (0), an id the data never draws (`FIRST_TOKEN`). The
  last id, where they had gone, is drawn: a pad id's embedding row is frozen (`padding_idx`),
  so 1 token in 126 at `tiny` had read a zero row that never trained (a probe, 2026-12-07).

`check_arch` refuses, before a job is queued, a type transformers does not know as a causal
LM, a composite one, sizes the config does not take, and a model that cannot be made or run at
these sizes (made and run on meta tensors: no memory, no FLOP; `_check_runs` says which errors
there count). Of the 178 causal-LM types of transformers 5.18 at the `tiny` preset, on a CPU
(2026-12-05): 98 built and trained a step with sdpa attention and 116 with eager; 140 of the
356 pairings were refused (composites, sdpa where the family has none, sizes its config does
not take, RoBERTa's offset positions) and 2 were built and failed at their first step (the
original GPT and XLM, each with eager attention, whose masks take another form). On
2026-12-07 the check before a job passed 134 with eager and 96 with sdpa: a family that takes
only a 2D mask (BLOOM, the original GPT, XGLM) now trains under eager attention with the causal
mask it builds itself (`causal_loss`), GPT-J and GPT-Neo build at any head width and depth,
Gemma 2 is refused under sdpa (its soft cap), and XLM, whose failure meta tensors cannot show,
is refused at the build. On 2026-12-08, 132 and 98 (`tiny`, CPU): the sizes went to the fields
each causal LM builds from, so PLBart and Whisper, whose decoders had kept the family's heads,
now build; Mamba, Falcon-Mamba and RWKV, which have no attention heads, are refused naming
`heads`, which they had taken and ignored.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainers.errors import WorkloadError, did_you_mean
from trainers.workloads.base import LossFn, evaluating
from trainers.workloads.checks import raised_at, shapes_disagree
from trainers.workloads.extras import require
from trainers.workloads.options import Value
from trainers.workloads.text_config_file import FFN_FIELDS, file_fields
from trainers.workloads.text_losses import causal_lm_loss, causal_lm_loss_eager
from trainers.workloads.text_sizes import (
    EXPERT_FFN_FIELDS,
    KV_FIELDS,
    built_sizes,
    check_built,
    check_depth,
    family_config,
    ffn_sizes,
    head_sizes,
)
from trainers.workloads.text_stream import PAD

CAUSAL_SDPA = "streamtune_causal_sdpa"

NAMED_ARCHS = ("gpt2", "llama", "qwen2", "gpt_neox", "mistral")
"""Built by their own config classes (`trainers.workloads.text_models`)."""

_FULL, _SLIDING = "full_attention", "sliding_attention"
_TOKEN_ID = re.compile(r"_token_id$")
_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_\-]*")


def causal_sdpa(transformers: Any) -> str:
    """transformers' SDPA attention, registered (once per process) under a name that has no
    mask function: the model then prepares no mask and SDPA applies causality itself."""
    interface = transformers.AttentionInterface
    if CAUSAL_SDPA not in interface():
        interface.register(CAUSAL_SDPA, interface()["sdpa"])
    return CAUSAL_SDPA


def common_config(kind: str, options: Mapping[str, Value], transformers: Any) -> dict[str, Any]:
    """What every `hf:` config takes alike: the vocabulary, the attention implementation (a
    causal LM's sdpa as `CAUSAL_SDPA`) and, where said, the tied head."""
    attention = str(options["attention"])
    if kind == "causal-lm" and attention == "sdpa":
        attention = causal_sdpa(transformers)
    common: dict[str, Any] = {"vocab_size": int(options["vocab"]), "attn_implementation": attention}
    if kind == "causal-lm" and options.get("tie", "auto") != "auto":
        common["tie_word_embeddings"] = options["tie"] == "true"
    return common


def causal_lm_types(transformers: Any) -> Mapping[str, str]:
    """Every model type transformers builds a causal LM for, to its class name."""
    auto = importlib.import_module(f"{transformers.__name__}.models.auto.modeling_auto")
    names: Mapping[str, str] = auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return names


def other_config(options: Mapping[str, Value], transformers: Any, common: Mapping[str, Any]) -> Any:
    """The config of a causal LM of a type outside `NAMED_ARCHS`, or of any type from the
    user's config file (`trainers.workloads.text_config_file`), by the module's rules."""
    arch = str(options["arch"])
    layers, seq, vocab = int(options["layers"]), int(options["seq"]), int(options["vocab"])
    given = file_fields(options)
    family = family_config(arch, transformers)
    fields = {**family.to_dict(), **given}
    sizes: dict[str, Any] = {
        **built_sizes(options, family, given),
        # A file's longer context kept: its RoPE scaling may be defined against it.
        "max_position_embeddings": max(seq, int(given.get("max_position_embeddings") or 0)),
        "use_cache": False,
    }
    sizes.update(head_sizes(options, given, family, fields))
    sizes.update(ffn_sizes(options, given, fields))
    if fields.get("use_sliding_window") is not None:
        sizes["use_sliding_window"] = False
    if isinstance(fields.get("sliding_window"), int):
        # A window as long as the sequence masks nothing causal attention does not.
        sizes["sliding_window"] = max(seq, int(fields["sliding_window"]))
    if isinstance(fields.get("attention_types"), list):
        # GPT-Neo's own form of `layer_types` ([[["global", "local"], 12]]): all global, and as
        # many as `layers` (its 24 by default had refused every other depth).
        sizes["attention_types"] = [[["global"], layers]]
    kinds = fields.get("layer_types")
    if isinstance(kinds, list) and set(kinds) <= {_FULL, _SLIDING}:
        sizes["layer_types"] = [_FULL] * layers
    for name, value in fields.items():
        # Said at construction, where transformers checks them (and warns).
        if _TOKEN_ID.search(name) and isinstance(value, int) and not 0 <= value < vocab:
            sizes[name] = PAD
    config = transformers.AutoConfig.for_model(arch, **{**sizes, **common})
    for name, value in list(vars(config).items()):
        if _TOKEN_ID.search(name) and isinstance(value, int) and not 0 <= value < vocab:
            setattr(config, name, PAD)
    return config


def check_arch(options: Mapping[str, Value]) -> None:
    """Refuse, naming `model_arg.arch` (or the size it cannot take), a type outside
    `NAMED_ARCHS` that the run could not build or run at these options (the module's list).
    Once per process for each set of options that passes: a study's name is resolved from them
    wherever a job is named (`trainers.workload_key`), and the check makes a model."""
    if str(options["arch"]) not in NAMED_ARCHS or options.get("config"):
        _checked(tuple(sorted(options.items())))


def causal_loss(options: Mapping[str, Value]) -> LossFn:
    """The loss a causal LM of these options trains with: under eager attention the 4D mask
    made on the device (`causal_lm_loss_eager`), except for a family whose code takes only a 2D
    mask (BLOOM, the original GPT), which then builds its own causal one (`causal_lm_loss`)."""
    if options["attention"] != "eager":
        return causal_lm_loss
    if str(options["arch"]) in NAMED_ARCHS and not options.get("config"):
        return causal_lm_loss_eager
    return _checked(tuple(sorted(options.items())))


@functools.lru_cache(maxsize=256)
def _checked(items: tuple[tuple[str, Value], ...]) -> LossFn:
    options = dict(items)
    arch = str(options["arch"])
    if not _MODEL_TYPE.fullmatch(arch):
        # Said without the library: no model type is written so (`Llama`, `qwen 3`).
        raise WorkloadError(
            f"model_arg.arch={arch!r} is invalid{did_you_mean(arch.lower(), NAMED_ARCHS)}: "
            f"allowed {', '.join(NAMED_ARCHS)}, or another transformers model type (lowercase "
            "letters, digits, '_' and '-', as qwen3 or phi3)",
            field="model_arg.arch",
        )
    transformers = require("transformers", workload="hf:causal-lm")
    types = causal_lm_types(transformers)
    if arch not in types:
        hint = did_you_mean(arch, (*NAMED_ARCHS, *types))
        raise WorkloadError(
            f"model_arg.arch={arch!r} is invalid{hint}: allowed {', '.join(NAMED_ARCHS)}, or a "
            f"model type transformers {transformers.__version__} builds a causal LM for "
            f"({len(types)} types, e.g. qwen3, phi3, gemma2, olmo2)",
            field="model_arg.arch",
        )
    try:
        common = common_config("causal-lm", options, transformers)
        config = other_config(options, transformers, common)
    except Exception as exc:  # transformers' validation raises many kinds
        raise _cannot(arch, options, "its config", exc) from exc
    _check_sizes(arch, options, config, transformers)
    model_class = getattr(transformers, types[arch])
    _softcap_dropped(arch, options, config, model_class)
    _heads_split(arch, options, model_class)
    return _check_runs(arch, options, config, model_class)


def _check_sizes(arch: str, options: Mapping[str, Value], config: Any, transformers: Any) -> None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config or _component_models(config):
        inner = getattr(text, "model_type", None)
        known = causal_lm_types(transformers)
        instead = (
            f"its text decoder, arch={inner}"
            if isinstance(inner, str) and inner != arch and inner in known
            else "a decoder-only type"
        )
        raise WorkloadError(
            f"model_arg.arch={arch!r} is invalid: a composite model (its config holds "
            f"{', '.join(_component_models(config) or ['a text config'])}), whose sizes "
            f"the options do not set: allowed {instead}",
            field="model_arg.arch",
        )
    family = family_config(arch, transformers)
    check_built(arch, options, config, family)
    kv_heads = int(options.get("kv_heads", 0))
    if kv_heads not in (0, 1, int(options["heads"])) and _multi_query_only(config):
        raise WorkloadError(
            f"model_arg.kv_heads={kv_heads} is invalid with arch={arch}: its attention has one "
            "key/value head (multi_query) or one per query head; allowed 0 (one per query "
            "head) or 1",
            field="model_arg.kv_heads",
        )
    fields = family.to_dict()
    for option, what, names in (
        ("kv_heads", "key/value heads", KV_FIELDS),
        ("ffn", "feed-forward width", FFN_FIELDS + EXPERT_FFN_FIELDS),
    ):
        if int(options.get(option, 0)) and not any(name in fields for name in names):
            raise WorkloadError(
                f"model_arg.{option}={options[option]} is invalid with arch={arch}: its config "
                f"has no {what} ({', '.join(names)}); allowed 0",
                field=f"model_arg.{option}",
            )


def _component_models(config: Any) -> list[str]:
    """The config's parts that are models of their own (a vision tower, a patcher), not groups
    of its own fields: MPT's and DBRX's `attn_config` have no model type and had made them
    refused as composite models."""
    parts = getattr(config, "sub_configs", None) or {}
    return [name for name, part in parts.items() if getattr(part, "model_type", None) != ""]


def _softcap_dropped(
    arch: str, options: Mapping[str, Value], config: Any, model_class: Any
) -> None:
    """SDPA takes no soft-capping of the attention logits: transformers passes Gemma 2's
    `attn_logit_softcapping` to it and SDPA drops it, so the run would train another model
    than the family's, with no word (a user's probe, 2026-12-07). Only where the family's code
    passes it (`softcap=`): Gemma 3 keeps the field and never applies it, under either."""
    softcap = getattr(config, "attn_logit_softcapping", None)
    if options["attention"] == "eager" or softcap is None:
        return
    if "softcap=" in inspect.getsource(sys.modules[model_class.__module__]):
        raise WorkloadError(
            f"model_arg.attention={options['attention']!r} is invalid with arch={arch}: its "
            f"attention soft-caps its logits (attn_logit_softcapping={softcap}), which SDPA "
            "would drop; allowed eager",
            field="model_arg.attention",
        )


def _heads_split(arch: str, options: Mapping[str, Value], model_class: Any) -> None:
    """CodeGen's attention splits its heads over a fixed number of groups written in its code
    (`mp_num = 4`), not its config: other heads failed the first step with a reshape error."""
    found = re.search(r"\bmp_num = (\d+)", inspect.getsource(sys.modules[model_class.__module__]))
    groups = int(found.group(1)) if found else 1
    if int(options["heads"]) % groups:
        raise WorkloadError(
            f"model_arg.heads={options['heads']} is invalid with arch={arch}: its attention "
            f"splits the heads into {groups} groups (mp_num in its code); allowed a multiple "
            f"of {groups}",
            field="model_arg.heads",
        )


def _multi_query_only(config: Any) -> bool:
    """Whether the config's attention takes its key/value heads from `multi_query` alone (not
    Falcon's new decoder architecture, which reads num_kv_heads)."""
    return getattr(config, "multi_query", None) is not None and not getattr(
        config, "new_decoder_architecture", False
    )


def _check_runs(arch: str, options: Mapping[str, Value], config: Any, model_class: Any) -> LossFn:
    """Made and run once on meta tensors, fed as the run feeds it (the loss of `attention`):
    what fails there for the model's own reasons fails every step of the run. A shape that
    disagrees, or a Python error of the modeling code (a `None` where the config left a size
    out: DeepSeek-V2's `topk`); not torch's other errors, which may be the meta device's own
    limits (a mixture of experts' grouped matmul checks dtypes there that it does not on real
    tensors, a value read on the host). Returns the loss that ran (`causal_loss`)."""
    try:
        with torch.device("meta"):
            model = model_class(config)
    except Exception as exc:  # a model's init raises many kinds
        raise _cannot(arch, options, "its model", exc) from exc
    check_depth(arch, options, model)
    _check_positions(arch, options, model)
    name_causal_loss(model)
    shape = (int(options["batch"]), int(options["seq"]))
    ids = torch.zeros(shape, dtype=torch.long, device="meta")
    eager = options["attention"] == "eager"
    failed = _step_fails(causal_lm_loss_eager if eager else causal_lm_loss, model, ids)
    if failed is None:
        return causal_lm_loss_eager if eager else causal_lm_loss
    # BLOOM and the original GPT take only a 2D mask ("too many values to unpack" from a 4D
    # one) and build the causal one themselves: the sdpa refusal had advised eager, which then
    # failed too (a user's probe, 2026-12-07). `check_causal` still checks what they build.
    if eager and _step_fails(causal_lm_loss, model, ids) is None:
        return causal_lm_loss
    raise _cannot(arch, options, "one step", failed) from failed


def _step_fails(loss: LossFn, model: nn.Module, ids: torch.Tensor) -> Exception | None:
    """The error of one step on meta tensors that every real step would raise too, or None."""
    try:
        loss(model, (ids,)).backward()
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, AssertionError) as exc:
        return exc  # the modeling code's own (XLM asserts its mask is 2D)
    except Exception as exc:  # noqa: BLE001 (torch raises many kinds; shapes_disagree picks)
        if shapes_disagree(str(exc)):
            return exc
    return None


def name_causal_loss(model: Any) -> None:
    """transformers picks a causal LM's loss from its class name, and some name none
    (GPT2LMHeadModel, OpenAIGPTLMHeadModel, CTRLLMHeadModel): said, or it warns before falling
    back to this same loss."""
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"


def _check_positions(arch: str, options: Mapping[str, Value], model: nn.Module) -> None:
    """RoBERTa's kind counts positions from past its pad id, so `seq` positions need more rows
    than `max_position_embeddings = seq` gives; on meta tensors an index past the end raises
    nothing, on real ones every step."""
    seq = int(options["seq"])
    for name, module in model.named_modules():
        pad = module.padding_idx if isinstance(module, nn.Embedding) else None
        rows = module.num_embeddings if isinstance(module, nn.Embedding) else 0
        if name.endswith("position_embeddings") and pad is not None and rows < seq + pad + 1:
            raise WorkloadError(
                f"model_arg.arch={arch!r} is invalid: its positions start after its pad id "
                f"({pad}), so seq={seq} needs {seq + pad + 1} position rows and its config "
                f"gives {rows}; allowed a decoder whose positions start at 0",
                field="model_arg.arch",
            )


def _cannot(arch: str, options: Mapping[str, Value], what: str, exc: BaseException) -> Exception:
    sizes = ", ".join(
        f"{key}={options[key]}" for key in ("hidden", "heads", "kv_heads", "ffn", "layers", "seq")
    )
    said = " ".join(str(exc).split()) or f"raised{raised_at(exc) or ' with no message'}"
    if isinstance(exc, KeyError) and exc.args == (CAUSAL_SDPA,):
        # Falcon and a few others pick an attention class by name from their own table, which
        # has no entry for a registered function (the mask-free causal SDPA): the bare
        # KeyError named our function and not the option that chose it.
        return WorkloadError(
            f"model_arg.attention={options['attention']!r} is invalid with arch={arch}: its "
            "modeling code takes only its own attention classes, not the mask-free causal "
            "SDPA this option registers; allowed eager",
            field="model_arg.attention",
        )
    if "does not support an attention implementation through" in said:
        # BLOOM, GPT-J, GPT-Neo, MPT, CodeGen: the family has no SDPA path at all; transformers'
        # 300 characters had buried the one option that fixes it.
        return WorkloadError(
            f"model_arg.attention={options['attention']!r} is invalid with arch={arch}: its "
            "modeling code in transformers has no SDPA attention; allowed eager",
            field="model_arg.attention",
        )
    allowed = "options its family takes, or another arch"
    if options["attention"] == "sdpa" and "scaled_dot_product_attention" in said:
        allowed = "attention=eager, " + allowed
    field, value = "model_arg.arch", arch
    if options.get("config"):
        # The file's own fields (an activation, a RoPE type, a string where a number goes) had
        # been blamed on arch, which the file sets, with "another arch" as the way out.
        field, value = "model_arg.config", str(options["config"])
        allowed = allowed.replace("options its family takes, or another arch", "fields its")
        allowed += " family takes in the file (transformers' own config.json), or other sizes"
    return WorkloadError(
        f"{field}={value!r} cannot build {what} at {sizes}: transformers raised "
        f"{type(exc).__name__}: {said[:300]}; allowed {allowed}",
        field=field,
    )


NOISE = 1e-5
"""How far, relative to the logits' largest, `check_causal` lets earlier positions move."""


def check_causal(options: Mapping[str, Value], model: nn.Module, loss: LossFn) -> None:
    """A causal LM whose logits at a position change with a later token learns from the token
    it predicts: the encoder kinds transformers builds a causal-LM head for (BERT, ELECTRA,
    ERNIE, ...) take their mask from `config.is_decoder`, not from the attention, and attended
    to every token under the mask-free SDPA this family feeds (a user's probe, 2026-12-06: on
    random tokens BERT's loss fell from 4.86 to 2.04, below ln(vocab)). Run once, in eval
    mode, on 8 tokens and on the same with the last one changed, as the loss calls it."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        return
    seq = min(8, int(options["seq"]))
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % vocab
    extra: dict[str, torch.Tensor] = {}
    if loss is causal_lm_loss_eager:  # as it masks it
        blocked = torch.full((seq, seq), torch.finfo(torch.float32).min, device=device)
        extra["attention_mask"] = blocked.triu(1)[None, None]
    try:
        with evaluating(model), torch.no_grad():
            seen = [model(input_ids=x.to(device), **extra).logits[:, :-1] for x in (ids, changed)]
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as exc:  # its modeling code's own, of many kinds
        # Where meta tensors could not tell: XLM reads its lengths on the host, then asserts
        # its mask is 2D; this had surfaced as a bare AssertionError from the build.
        raise _cannot(str(options["arch"]), options, "one step", exc) from exc
    # Within float noise, not bit for bit: a mixture of experts groups the tokens by expert, so
    # a changed last token moves the sums of earlier ones by 1e-8-6e-8 (Mixtral, OLMoE, Qwen3-MoE:
    # 28 decoders had been refused), where the encoders' leaks are 1e-4-2e-3 (a probe, 2026-12-07).
    scale = max(1.0, float(seen[0].abs().max()))
    if float((seen[0] - seen[1]).abs().max()) > NOISE * scale:
        said = "model_arg.config" if options.get("config") else "model_arg.arch"
        value = options.get("config") or options.get("arch")
        raise WorkloadError(
            f"{said}={value!r} is invalid: its causal LM attends to later tokens (its logits "
            f"at earlier positions changed with the last token, attention="
            f"{options['attention']}), so its loss would learn the token it predicts; "
            "allowed a decoder, or attention=eager where its mask is honoured (it passes the "
            "causal mask itself)",
            field=said,
        )
