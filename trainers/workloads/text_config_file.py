"""`hf:causal-lm` from the user's own model's `config.json` (`--model-arg config=PATH`, a file or
a folder holding one, as a Hugging Face checkpoint has): that model's architecture and every
field of its config, with random weights, trained at the options' batch and sequence length.

The file is read as JSON, without transformers, wherever the options are resolved (a service
refuses a missing or unreadable file before a job is queued): its type becomes `arch` and its
sizes (`CONFIG_SIZES`) the size options, over the preset's and under the user's, so the study's
name carries the sizes trained and `--model-arg layers=2` still cuts the model for a first try.
Key/value heads, feed-forward width and tying that the file leaves out or sets null are the
family's own (`FAMILY_DEFAULTED`), as transformers builds that file, never the preset's.
A composite model's file (a vision-language model's `text_config`) gives its text decoder's.

The model is then built by `trainers.workloads.text_archs.other_config` from the file's fields,
under the same rules as any type there (no cache, every layer full causal attention, the
options' sizes); fields that name a checkpoint rather than a model (`FILE_ONLY`: its dtype, a
quantization, custom code) are left out: nothing is loaded, and the run chooses its precision.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainers.errors import WorkloadError
from trainers.workloads.options import Value, format_value

FFN_FIELDS = (
    "intermediate_size",
    "ffn_dim",
    "n_inner",
    "d_ff",
    "dff",
    "dim_ff",
    "ffn_hidden_size",
    "decoder_ffn_dim",
)
"""The names configs give the feed-forward width (Llama's, OPT's, GPT-2's, T5's, CTRL's,
CPM-Ant's, Falcon's, a BART decoder's), the first found."""

CONFIG_SIZES: Mapping[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": (
        "decoder_attention_heads",
        "num_decoder_attention_heads",
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
    ),
    "layers": (
        "decoder_layers",
        "num_decoder_layers",
        "num_hidden_layers",
        "n_layer",
        "num_layers",
        "n_layers",
    ),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn": FFN_FIELDS,
    "vocab": ("decoder_vocab_size", "vocab_size"),
    "tie": ("tie_word_embeddings",),
}
"""Each size option and the config fields it is read from, the first one present: the file's
sizes, and where `trainers.workloads.text_sizes` writes the options' (one list, so a size
is read where it is written: a Falcon `ffn_hidden_size`, a CTRL `dff` and a BART
`decoder_ffn_dim` had been written and never read, and built 4 x hidden). The decoder's names
come first: an encoder-decoder family's causal LM (BART's, Marian's, Pegasus's kind) builds the
decoder alone, and its `num_hidden_layers` and `num_attention_heads` name the encoder's (a
user's probe, 2026-12-08)."""

FAMILY_DEFAULTED = ("kv_heads", "ffn", "tie")
"""Options whose default means the family's own (0: as many key/value heads as heads, 4 x hidden;
auto): a file without them, or null (GPT-2's `n_inner`, an old Llama's `num_key_value_heads`),
is built so. The preset's had come in: `llama-1b`'s 8 key/value heads beside a file's 4 heads."""

FILE_ONLY = (
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "auto_map",
    "quantization_config",
    "use_cache",
    "attn_implementation",
    "_attn_implementation",
)
"""Fields of a checkpoint's file that are not the model's shape or numerics."""

_FIELD = "model_arg.config"


def model_fields(raw: str) -> dict[str, Any]:
    """The model's fields in the file `raw` names (its `text_config` for a composite model);
    WorkloadError naming `model_arg.config` for a missing, unreadable or untyped one."""
    path = Path(raw).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise WorkloadError(
            f"{_FIELD}={raw!r} is invalid: no such file: allowed a transformers config.json, or "
            "a folder holding one, on the machine that runs the job",
            field=_FIELD,
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(
            f"{_FIELD}={raw!r} is invalid: {path} is not readable JSON ({exc}): allowed a "
            "transformers config.json",
            field=_FIELD,
        ) from exc
    text = data.get("text_config") if isinstance(data, dict) else None
    fields = text if isinstance(text, dict) and "model_type" in text else data
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        raise WorkloadError(
            f"{_FIELD}={raw!r} is invalid: {path} names no model_type: allowed a transformers "
            "config.json (its model_type names the architecture)",
            field=_FIELD,
        )
    return fields


def fill_from_file(
    values: dict[str, Value], overrides: Mapping[str, Value], specs: Any
) -> dict[str, Value]:
    """`values` with the architecture and sizes of the file `values["config"]` names, where the
    user (`overrides`) did not set them; `specs(name)` is each option's `OptionSpec`. Unchanged
    without a file."""
    raw = str(values.get("config", ""))
    if not raw:
        return values
    if "arch" in overrides:
        raise WorkloadError(
            f"model_arg.arch={format_value(overrides['arch'])} is invalid beside {_FIELD}: the "
            "file's model_type is the architecture; allowed one of the two",
            field="model_arg.arch",
        )
    fields = model_fields(raw)
    filled = dict(values)
    read: dict[str, Value] = {}
    # Absolute: the study's name and an exported script then name one file from any folder.
    filled["config"] = str(Path(raw).expanduser().resolve())
    filled["arch"] = fields["model_type"]
    for option, names in CONFIG_SIZES.items():
        _fill_size(option, names, fields, raw, overrides, specs, filled, read)
    multi_query = fields.get("multi_query") is True
    if multi_query and not fields.get("new_decoder_architecture"):
        # Falcon-7B's and GPTBigCode's one key/value head, whatever num_kv_heads says: grouped
        # as one below. The option stays as it was (the study's name with it); the built
        # config keeps the file's flag unless kv_heads is given (`text_sizes.head_sizes`).
        read["kv_heads"] = 1
        if "kv_heads" not in overrides:  # its num_kv_heads means nothing beside the flag
            filled["kv_heads"] = specs("kv_heads").default
    if "heads" in overrides and "kv_heads" not in overrides and "heads" in read and not multi_query:
        filled["kv_heads"] = _grouped_as_file(read, int(filled["heads"]))
    if int(filled.get("kv_heads", 0)) == int(filled["heads"]) and not multi_query:
        # As many as heads: one study name for one model. Not beside a multi-query file,
        # where 0 keeps its one head and kv_heads=heads asks for as many.
        filled["kv_heads"] = 0
    return filled


def _fill_size(
    option: str,
    names: tuple[str, ...],
    fields: Mapping[str, Any],
    raw: str,
    overrides: Mapping[str, Value],
    specs: Any,
    filled: dict[str, Value],
    read: dict[str, Value],
) -> None:
    """Sets `filled[option]` from the file's first field of `names` (unless the user gave it)
    and `read[option]` to the file's own integer, which fewer heads are grouped by."""
    present = [name for name in names if name in fields]
    name = next((name for name in present if fields[name] is not None), None)
    if name is None and present and option not in FAMILY_DEFAULTED:
        name = present[0]  # null for a size the family cannot default: refused below
    if option in overrides:
        found = fields[name] if name is not None else None
        if isinstance(found, int) and not isinstance(found, bool):
            read[option] = found  # the file's own: how it groups its heads
        return
    if name is None:  # left out: the family's own where it has one, else the preset's
        if option in FAMILY_DEFAULTED:
            filled[option] = specs(option).default
        return
    found = fields[name]
    wanted = bool if option == "tie" else int
    if not isinstance(found, wanted) or (wanted is int and isinstance(found, bool)):
        # A JSON string ("false", "64") had been read as true, or said as the option's; a null
        # hidden size had built the preset's.
        raise WorkloadError(
            f"{_FIELD}: {raw} has {name}={json.dumps(found)}: allowed a JSON "
            f"{'true or false' if wanted is bool else 'integer'}",
            field="model_arg.config",
        )
    if option == "tie":
        found = "true" if found else "false"
    # Through the option's own check: a size out of its range names the option and file.
    filled[option] = read[option] = specs(option).check(found, raw=f"{found} (from {raw})")


def check_with_file(check: Callable[[Mapping[str, Value]], None]) -> Callable[..., None]:
    """`check`, whose refusal says which of the sizes it names the user's file gave: the user
    had been told `model_arg.heads=3 is invalid` for an option they never set."""

    def checked(options: Mapping[str, Value]) -> None:
        try:
            check(options)
        except WorkloadError as exc:
            raw = str(options.get("config", ""))
            said = str(exc)
            if not raw or raw in said or not (exc.field or "").startswith("model_arg."):
                raise
            fields = model_fields(raw)
            given = [
                f"{option}={format_value(options[option])}"
                for option, names in CONFIG_SIZES.items()
                if _names(said, option, options.get(option, ""))
                and next((fields[n] for n in names if fields.get(n) is not None), None)
                == options[option]
            ]
            if not given:
                raise
            raise WorkloadError(f"{said} ({', '.join(given)} from {raw})", field=exc.field) from exc

    return checked


def _names(said: str, option: str, value: Value) -> bool:
    """Whether `said` names `option=value` as a word: `heads=3` is not in `kv_heads=3`, nor
    `hidden=64` in `hidden=640`."""
    word = re.escape(f"{option}={format_value(value)}")
    return re.search(rf"(?<![A-Za-z0-9_]){word}(?![0-9])", said) is not None


def _grouped_as_file(read: Mapping[str, Value], heads: int) -> int:
    """The key/value heads for `heads` query heads grouped as the file groups its own (32 to 8:
    4 to 1), at least one: a file's 16 of 16 had been refused beside heads=4, naming kv_heads,
    which the user never set (a user's probe, 2026-12-07)."""
    file_heads, file_kv = int(read["heads"]), int(read.get("kv_heads", 0)) or int(read["heads"])
    if file_heads <= 0 or file_kv <= 0:
        return 0  # a file's nonsense: the options' own checks name it
    # The largest divisor of heads at most the file's share: 32 to 8 at heads=14 is 2, not 3.
    share = max(1, heads * file_kv // file_heads)
    return next(kv for kv in range(min(share, heads), 0, -1) if heads % kv == 0)


def file_fields(options: Mapping[str, Value]) -> dict[str, Any]:
    """The file's fields the model is built from (none without a file), less `FILE_ONLY`."""
    raw = str(options.get("config", ""))
    if not raw:
        return {}
    return {k: v for k, v in model_fields(raw).items() if k not in FILE_ONLY}
