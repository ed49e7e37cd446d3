"""How the size options land in a config of a type outside the named five, or of the user's
file (`trainers.workloads.text_archs.other_config`): the fields each family's causal LM builds
from (`size_fields`, read back by `check_built` and `check_depth`), and the widths a config
derives from them (key/value heads, head width, rotated width, each expert's width), which
follow the options where the user changes a size the file gave.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from trainers.errors import WorkloadError
from trainers.workloads.options import Value
from trainers.workloads.text_config_file import CONFIG_SIZES, FFN_FIELDS

BUILT_SIZES = ("hidden", "heads", "layers", "vocab")
"""The sizes every causal LM has and `size_fields` finds the family's own field of."""
_WHAT = {"hidden": "width", "heads": "attention heads", "layers": "depth", "vocab": "vocabulary"}
EXPERT_FFN_FIELDS = ("moe_intermediate_size", "expert_ffn_hidden_size")
"""The names a mixture of experts gives each expert's width where it keeps it apart from its
dense layers' (Qwen2/3-MoE, DeepSeek, GLM-4-MoE; LongCat): `ffn` sets it too. Shared experts
keep their family's width."""
KV_FIELDS = ("num_key_value_heads", "num_kv_heads")
"""The names configs give the key/value heads (Llama's, Falcon's), the first found."""


def _resized(options: Mapping[str, Value], given: Mapping[str, Any], *names: str) -> bool:
    """Whether the options change one of the file's sizes `names` (`CONFIG_SIZES`' options):
    a field the file derives from them (its head width, its experts' width) then follows the
    options, not the file. False without a file."""
    return any(_file_size(given, o) not in (None, int(options.get(o, 0))) for o in names)


def _file_size(given: Mapping[str, Any], option: str) -> int | None:
    """The file's value of the size option `option`, by `CONFIG_SIZES`' names."""
    field = next((f for f in CONFIG_SIZES[option] if given.get(f) is not None), None)
    return None if field is None else int(given[field])


def size_fields(family: Any) -> dict[str, str]:
    """The config field each of `BUILT_SIZES` is built from: the first of its `CONFIG_SIZES`
    names that the family's config declares (a field, or an alias in its `attribute_map`), as
    the field itself. The common names had gone through the `attribute_map` alone: BART's kind
    maps `num_hidden_layers` to its encoder, which its causal LM never builds (24 decoder layers
    of 32 heads under a study named layers=1, heads=2), and xLSTM has no `num_attention_heads`
    (a plain attribute, read back as set, while `num_heads` stayed 8; a probe, 2026-12-08). An
    option none of whose names the config declares is left out (refused by `check_built`)."""
    aliases: dict[str, str] = dict(getattr(family, "attribute_map", None) or {})
    declared = set(family.to_dict()) | set(aliases)
    fields: dict[str, str] = {}
    for option in BUILT_SIZES:
        name = next((name for name in CONFIG_SIZES[option] if name in declared), None)
        if name is not None:
            fields[option] = aliases.get(name, name)
    return fields


def built_sizes(
    options: Mapping[str, Value], family: Any, given: Mapping[str, Any]
) -> dict[str, Any]:
    """The file's fields `given` with the options' sizes in the fields `size_fields` finds, and
    without any alias of those: a file's `num_attention_heads` beside GPT-2's `n_head` would
    leave which one wins to the order transformers sets them in."""
    fields = size_fields(family)
    aliases: dict[str, str] = dict(getattr(family, "attribute_map", None) or {})
    sizes = {
        name: value
        for name, value in given.items()
        if aliases.get(name, name) not in fields.values() or name in fields.values()
    }
    sizes.update({field: int(options[option]) for option, field in fields.items()})
    return sizes


def check_built(arch: str, options: Mapping[str, Value], config: Any, family: Any) -> None:
    """Each of `BUILT_SIZES` read back from the built config's field of it (`size_fields`), and
    the output head's `vocab_size`: refused, naming the option, where the family has no field
    of it or its config keeps another value (one it derives). A family with no attention heads
    at all (Mamba, RWKV) is built without them: `heads` has nothing to set there."""
    fields = size_fields(family)
    for option, field in [*((o, fields.get(o)) for o in BUILT_SIZES), ("vocab", "vocab_size")]:
        value = int(options[option])
        if field is None and option == "heads":
            continue  # attention-free (Mamba, RWKV): no heads to set, built as before
        if field is None:
            raise WorkloadError(
                f"model_arg.{option}={value} is not taken by arch={arch}: its config has no "
                f"{_WHAT[option]} field ({', '.join(CONFIG_SIZES[option])}); allowed another "
                "arch",
                field=f"model_arg.{option}",
            )
        if getattr(config, field, None) != value:
            raise WorkloadError(
                f"model_arg.{option}={value} is not taken by arch={arch}: its config keeps "
                f"{field} as {getattr(config, field, None)!r}; allowed another arch",
                field=f"model_arg.{option}",
            )


def check_depth(arch: str, options: Mapping[str, Value], model: nn.Module) -> None:
    """The built model (on meta tensors) holds its layers in a list as long as `layers`: where
    the family builds from a field beside the one `size_fields` sets, its config reads back
    right and its model is as deep as that other field (an xLSTM file's `num_blocks`: 4 blocks
    under a study named layers=2; a probe, 2026-12-08). Every causal LM that passed the other
    checks at layers=3 had such a list (2026-12-08)."""
    layers = int(options["layers"])
    lengths = sorted({len(part) for part in model.modules() if isinstance(part, nn.ModuleList)})
    if layers not in lengths:
        raise WorkloadError(
            f"model_arg.layers={layers} is not taken by arch={arch}: its model holds no list "
            f"of {layers} layers (its lists hold {lengths or 'none'}); allowed "
            + ("the file's own depth" if options.get("config") else "another arch"),
            field="model_arg.layers",
        )


def head_sizes(
    options: Mapping[str, Value], given: Mapping[str, Any], family: Any, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """The attention's key/value heads, head width and rotated width, by the module's rules."""
    hidden, heads = int(options["hidden"]), int(options["heads"])
    kv_heads = int(options.get("kv_heads", 0))
    sizes: dict[str, Any] = {}
    kv_field = next((name for name in KV_FIELDS if name in fields), None)
    if kv_field is not None:  # Falcon's is num_kv_heads
        sizes[kv_field] = kv_heads or heads
    if "multi_query" in fields and (kv_heads or "multi_query" not in given):
        # GPTBigCode and Falcon build one key/value head or one per query head by this flag
        # alone: GPTBigCode had been multi-query whatever kv_heads said, and a Falcon file's
        # flag had outweighed kv_heads (users' probes). A file's flag stays where none is given.
        sizes["multi_query"] = kv_heads == 1
    resized = _resized(options, given, "hidden", "heads")
    if "head_dim" in fields and ("head_dim" not in given or resized):
        # Families that keep the head width apart (Qwen3: 128, Gemma: 256) would otherwise run
        # heads of their own width whatever `hidden` and `heads` say; a file's too (a Gemma 2
        # file at hidden=64 had run attention 16 times as wide).
        sizes["head_dim"] = hidden // heads
    rotary = fields.get("rotary_dim")
    if isinstance(rotary, int) and rotary > hidden // heads:
        # GPT-J and CodeGen rotate 64 dims of each head, a quarter of theirs: a narrower head
        # failed every step. There the share of the head is kept (the file's, or the
        # family's); a head it fits keeps it (and the study's name its model).
        width, rotated = family.hidden_size // family.num_attention_heads, family.rotary_dim
        file_hidden, file_heads = _file_size(given, "hidden"), _file_size(given, "heads")
        if "rotary_dim" in given and file_hidden and file_heads:
            width, rotated = file_hidden // file_heads, int(given["rotary_dim"])
        share = rotated / width
        sizes["rotary_dim"] = max(2, int(hidden // heads * share) // 2 * 2)
    return sizes


def ffn_sizes(
    options: Mapping[str, Value], given: Mapping[str, Any], fields: Mapping[str, Any]
) -> dict[str, Any]:
    """The feed-forward width and, for a mixture of experts, each expert's."""
    ffn = int(options.get("ffn", 0))
    sizes: dict[str, Any] = {}
    dense = next((name for name in FFN_FIELDS if name in fields), None)
    if dense is not None:
        sizes[dense] = ffn or 4 * int(options["hidden"])
    # With a file, only where ffn changes the file's own: a file without an expert width had
    # had its experts widened to its dense width (a review, 2026-12-07).
    asked = bool(ffn) and (_resized(options, given, "ffn") if given else True)
    for name in EXPERT_FFN_FIELDS:
        if name in fields and asked:
            # Qwen2-MoE's layers are all experts by default: `ffn` set only the dense width,
            # which no layer used, and was accepted and ignored (users' probes, 2026-12-07).
            sizes[name] = ffn
    return sizes


def family_config(arch: str, transformers: Any) -> Any:
    """The family's default config. Some defaults hold token ids outside their own vocabulary
    (StarCoder2's 50256 of 49152), of which transformers warns at construction: about a config
    no run builds (`other_config` moves such ids), so not said to the user."""
    logger = logging.getLogger("transformers.configuration_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return transformers.AutoConfig.for_model(arch)
    finally:
        logger.setLevel(level)
