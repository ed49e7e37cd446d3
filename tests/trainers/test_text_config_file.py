"""`hf:causal-lm` from the user's own `config.json` (`--model-arg config=PATH`,
`trainers.workloads.text_config_file`): the file's sizes filled into the options under the
user's, its refusals without the library, and real models built from real-shaped files on the
CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from trainers import LoopConfig, RunArgs, WorkloadError, load_workload, run
from trainers.workloads import workload_key
from trainers.workloads.text import CAUSAL_LM
from trainers.workloads.text_config_file import fill_from_file

# Qwen3-0.6B's shape at a width a CPU trains in seconds: its head width (32) is not
# hidden / heads (16), as Qwen3's 128 is not 1024 / 16.
QWEN3: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 3,
    "intermediate_size": 96,
    "vocab_size": 256,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "torch_dtype": "bfloat16",
    "bos_token_id": 250,
    "eos_token_id": 251,
    "use_cache": True,
    "transformers_version": "4.51.0",
}


def write(folder: Path, data: object, name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))
    return folder


def filled(overrides: dict[str, Any], preset: str = "tiny") -> dict[str, Any]:
    values = CAUSAL_LM.preset_values(preset)
    values.update(overrides)
    return fill_from_file(values, overrides, CAUSAL_LM.option)


def test_the_files_type_and_sizes_fill_the_options_under_the_users(tmp_path: Path) -> None:
    folder = write(tmp_path / "qwen3", QWEN3)
    values = filled({"config": str(folder / "." / "config.json"), "layers": 2})
    assert values["config"] == str((folder / "config.json").resolve())  # one name from anywhere
    assert values["arch"] == "qwen3"
    assert (values["hidden"], values["heads"], values["kv_heads"]) == (64, 4, 2)
    assert (values["ffn"], values["vocab"], values["tie"]) == (96, 256, "true")
    assert values["layers"] == 2  # the user's, over the file's 3
    assert values["seq"] == 16 and values["batch"] == 2  # the preset's: the file has no batch


def test_gpt2_names_a_composites_text_config_and_equal_kv_heads_are_read_too(
    tmp_path: Path,
) -> None:
    gpt2 = {"model_type": "gpt2", "n_embd": 48, "n_head": 4, "n_layer": 2, "n_inner": None}
    values = filled({"config": str(write(tmp_path / "g", gpt2))})
    assert (values["arch"], values["hidden"], values["heads"], values["layers"]) == (
        "gpt2",
        48,
        4,
        2,
    )
    assert values["ffn"] == 0  # n_inner null: the option's own default (4 x hidden)
    text = {**QWEN3, "num_key_value_heads": 4}
    composite = {"model_type": "qwen3_vl", "text_config": text, "vision_config": {"depth": 2}}
    values = filled({"config": str(write(tmp_path / "vl", composite))})
    assert values["arch"] == "qwen3" and values["kv_heads"] == 0  # as many as heads: one name


@pytest.mark.parametrize(
    ("content", "field", "match"),
    [
        (None, "model_arg.config", r"no such file: allowed a transformers config.json"),
        ("{not json", "model_arg.config", r"is not readable JSON"),
        ({"hidden_size": 64}, "model_arg.config", r"names no model_type"),
        ({**QWEN3, "vocab_size": 0}, "model_arg.vocab", r"'0 \(from .*\)' is invalid"),
        # A JSON string: "false" had built a tied model, "64" been said as the option's value.
        (
            {**QWEN3, "tie_word_embeddings": "false"},
            "model_arg.config",
            r'config.json has tie_word_embeddings="false": allowed a JSON true or false$',
        ),
        (  # null: it had built the preset's width
            {**QWEN3, "hidden_size": None},
            "model_arg.config",
            r"config.json has hidden_size=null: allowed a JSON integer$",
        ),
        (
            {**QWEN3, "hidden_size": "64"},
            "model_arg.config",
            r'config.json has hidden_size="64": allowed a JSON integer$',
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_option_without_the_library(
    tmp_path: Path, content: object, field: str, match: str
) -> None:
    path = tmp_path / "config.json"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_text(json.dumps(content))
    with pytest.raises(WorkloadError, match=match) as info:
        filled({"config": str(path)})
    assert info.value.field == field


@pytest.mark.parametrize("kv", ["absent", None])
def test_a_file_without_key_value_heads_or_ffn_is_built_as_its_family_not_the_preset(
    tmp_path: Path, kv: object
) -> None:
    """`llama-1b`'s 8 key/value heads had come in beside an old Llama file's (none, or null:
    one per head): refused beside 4 heads, and grouped-query attention, not the file's, beside
    32 (a user's probe, 2026-12-07). GPT-2's `n_inner: null` had been refused the same way."""
    llama = {k: v for k, v in QWEN3.items() if k not in ("num_key_value_heads", "head_dim")}
    llama |= {"model_type": "llama", "intermediate_size": None}
    if kv is None:
        llama["num_key_value_heads"] = None
    values = filled({"config": str(write(tmp_path / "l", llama))}, preset="llama-1b")
    assert (values["heads"], values["kv_heads"], values["ffn"]) == (4, 0, 0)
    assert values["seq"] == 2048 and values["batch"] == 8  # the preset's still: not the model's
    gpt2 = {"model_type": "gpt2", "n_embd": 48, "n_head": 4, "n_layer": 2, "n_inner": None}
    values = filled({"config": str(write(tmp_path / "g", gpt2))}, preset="llama-1b")
    assert (values["kv_heads"], values["ffn"], values["vocab"]) == (0, 0, 32000)  # no vocab


def test_a_size_refused_beside_another_says_which_the_file_gave(tmp_path: Path) -> None:
    """`model_arg.heads=3 is invalid with hidden=64` had not said that both came from the
    file: the user had set neither."""
    llama = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 3}
    path = str(write(tmp_path / "l", llama) / "config.json")
    with pytest.raises(WorkloadError) as both:
        CAUSAL_LM.resolve("tiny", {"config": path})
    assert both.value.field == "model_arg.heads"
    assert str(both.value).endswith(f"a divisor of hidden (hidden=64, heads=3 from {path})")
    with pytest.raises(WorkloadError) as one:  # the user's heads: only the width is the file's
        CAUSAL_LM.resolve("tiny", {"config": path, "heads": 5})
    assert str(one.value).endswith(f"a divisor of hidden (hidden=64 from {path})")
    with pytest.raises(WorkloadError) as none:  # nothing the file gave: as without a file
        CAUSAL_LM.resolve("tiny", {"config": path, "heads": 4, "kv_heads": 3})
    assert str(none.value).endswith("allowed 0 or a divisor of heads")
    # The file's heads=3 is not named by the user's kv_heads=3 (a word, not a substring).
    grouped = str(write(tmp_path / "g", {**llama, "num_attention_heads": 4}) / "config.json")
    with pytest.raises(WorkloadError) as word:
        CAUSAL_LM.resolve("tiny", {"config": grouped, "kv_heads": 3})
    assert str(word.value).endswith(f"a divisor of heads (heads=4 from {grouped})")


def test_arch_beside_a_file_is_refused(tmp_path: Path) -> None:
    folder = write(tmp_path / "q", QWEN3)
    with pytest.raises(WorkloadError, match=r"arch=llama is invalid beside model_arg.config"):
        filled({"config": str(folder), "arch": "llama"})


def test_every_study_name_without_a_file_is_as_it_was() -> None:
    # The option's empty default stays out of the name: earlier studies keep theirs.
    assert workload_key("hf:causal-lm", "tiny", {"arch": "llama"}) == (
        "hf:causal-lm-tiny-arch=llama,attention=sdpa,batch=2,batches=16,data=stream,ffn=0,"
        "heads=2,hidden=32,kv_heads=0,layers=2,lr=0.0003,seq=16,tie=auto,vocab=128,"
        "weight_decay=0.01"
    )


@pytest.mark.models
def test_a_model_is_built_from_the_file_with_its_own_fields_and_trains(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = write(tmp_path / "qwen3", QWEN3)
    workload = load_workload(
        "hf:causal-lm", "tiny", seed=0, model_args={"config": str(folder), "lr": "3e-3"}
    )
    model, config = workload.model, workload.model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert config.head_dim == 32  # the file's, not hidden / heads
    assert model.model.layers[0].self_attn.q_proj.out_features == 4 * 32
    assert config.rms_norm_eps == 1e-06 and config.max_position_embeddings == 4096
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the file ties them
    assert config.use_cache is False and config.bos_token_id == 250
    result = run(workload, LoopConfig(), RunArgs(steps=32, warmup=0, windows=1, device="cpu"))
    assert all(math.isfinite(loss) for loss in result.losses)
    assert sum(result.losses[-8:]) < sum(result.losses[:8])


@pytest.mark.models
def test_a_named_types_file_keeps_its_fields_and_a_bad_size_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    llama = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": 128,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
    }
    folder = write(tmp_path / "llama", llama)
    model = load_workload("hf:causal-lm", "tiny", model_args={"config": str(folder)}).model
    assert model.config.rms_norm_eps == 1e-05  # LlamaConfig's own default is 1e-6
    assert model.model.layers[0].self_attn.k_proj.out_features == 16  # one key/value head
    odd = write(tmp_path / "odd", {**llama, "num_attention_heads": 8, "hidden_size": 40})
    with pytest.raises(WorkloadError, match=r"model_arg.heads=8 .*hidden=40") as info:
        workload_key("hf:causal-lm", "tiny", {"config": str(odd)})
    assert info.value.field == "model_arg.heads"


@pytest.mark.parametrize(
    ("heads", "kv_heads", "asked", "expected"),
    [
        (32, 8, {"heads": 4}, 1),  # Llama 3.2's 4 to 1, kept
        (16, 16, {"heads": 4}, 0),  # one per query head, kept: it had been refused (kv 16)
        (16, 4, {"heads": 8}, 2),
        (14, 2, {"heads": 4}, 1),  # Qwen2.5-0.5B's 7 to 1: at least one
        (32, 8, {"heads": 14}, 2),  # 3.5 rounds to 3, which does not divide 14: 2
        (24, 8, {"heads": 10}, 2),  # Llama-3.2-3B's 3 to 1 at 10 heads: 3 does not divide, 2
        (32, 8, {"heads": 4, "kv_heads": 2}, 2),  # the user's, over the file's grouping
    ],
)
def test_fewer_heads_than_the_files_keep_its_grouping(
    tmp_path: Path, heads: int, kv_heads: int, asked: dict[str, int], expected: int
) -> None:
    file = {**QWEN3, "hidden_size": 64 * heads, "num_attention_heads": heads}
    folder = write(tmp_path / "g", {**file, "num_key_value_heads": kv_heads})
    values = filled({"config": str(folder), "hidden": 64, **asked})
    assert values["kv_heads"] == expected


def test_a_multi_query_file_keeps_its_study_name_and_its_one_head(tmp_path: Path) -> None:
    # Falcon-7B says multi_query and num_kv_heads = heads; its attention has one. The option
    # stays 0 (the study's name as before), fewer heads too: the flag keeps the one head.
    falcon = {"model_type": "falcon", "hidden_size": 256, "num_attention_heads": 16}
    folder = write(tmp_path / "f", {**falcon, "num_kv_heads": 16, "multi_query": True})
    assert filled({"config": str(folder)})["kv_heads"] == 0
    assert filled({"config": str(folder), "heads": 4})["kv_heads"] == 0  # the flag's one head
    assert filled({"config": str(folder), "kv_heads": 4, "heads": 4})["kv_heads"] == 4
    new = {**falcon, "num_kv_heads": 2, "multi_query": True, "new_decoder_architecture": True}
    assert filled({"config": str(write(tmp_path / "n", new))})["kv_heads"] == 2


def test_mpt_and_gpt_neo_files_give_their_heads_and_layers(tmp_path: Path) -> None:
    # Their own names (n_heads, n_layers; num_heads): they had been built at the preset's.
    mpt = {"model_type": "mpt", "d_model": 64, "n_heads": 8, "n_layers": 4, "vocab_size": 128}
    neo = {"model_type": "gpt_neo", "hidden_size": 64, "num_heads": 8, "num_layers": 3}
    for name, file, layers in (("mpt", mpt, 4), ("neo", neo, 3)):
        values = filled({"config": str(write(tmp_path / name, file))})
        assert (values["hidden"], values["heads"], values["layers"]) == (64, 8, layers)


# A BART-family decoder's shape: its causal LM builds the decoder alone, whose sizes differ
# from the encoder's that num_hidden_layers (as old BART files still carry) and the common
# names map to.
BLENDERBOT: dict[str, Any] = {
    "model_type": "blenderbot",
    "d_model": 64,
    "decoder_layers": 3,
    "decoder_attention_heads": 8,
    "decoder_ffn_dim": 96,
    "encoder_layers": 2,
    "encoder_attention_heads": 16,
    "encoder_ffn_dim": 512,
    "num_hidden_layers": 2,
    "vocab_size": 128,
}


def test_a_decoder_of_an_encoder_decoder_file_gives_its_own_sizes(tmp_path: Path) -> None:
    """The decoder's depth, heads and width: the study's name had said the preset's layers=2,
    heads=2 and 4 x hidden beside a model of 3 layers of 8 heads (a user's probe,
    2026-12-08)."""
    values = filled({"config": str(write(tmp_path / "b", BLENDERBOT))})
    assert (values["hidden"], values["layers"], values["heads"], values["ffn"]) == (64, 3, 8, 96)


@pytest.mark.parametrize(
    ("file", "width"),
    [
        ({"model_type": "falcon", "hidden_size": 64, "ffn_hidden_size": 96}, 96),
        ({"model_type": "ctrl", "n_embd": 64, "dff": 80}, 80),
        ({"model_type": "bart", "d_model": 64, "decoder_ffn_dim": 112}, 112),
    ],
)
def test_a_files_feed_forward_width_under_any_name_is_kept(
    tmp_path: Path, file: dict[str, Any], width: int
) -> None:
    # Written under every name, it had been read under four: these had built 4 x hidden.
    values = filled({"config": str(write(tmp_path / "f", file))})
    assert values["ffn"] == width


@pytest.mark.models
def test_an_encoder_decoder_files_decoder_is_built_as_its_study_names_it(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = str(write(tmp_path / "b", BLENDERBOT))
    assert "ffn=96,heads=8,hidden=64" in workload_key("hf:causal-lm", "tiny", {"config": folder})
    assert ",layers=3," in workload_key("hf:causal-lm", "tiny", {"config": folder})
    for asked, layers, heads in (({}, 3, 8), ({"layers": "1", "heads": "4"}, 1, 4)):
        args = {"config": folder, **asked}
        decoder = load_workload("hf:causal-lm", "tiny", model_args=args).model.model.decoder
        assert len(decoder.layers) == layers
        assert decoder.layers[0].self_attn.num_heads == heads
        assert decoder.layers[0].fc1.out_features == 96
    # Marian's decoder embeds by decoder_vocab_size: the file's had outlasted the user's vocab.
    marian = {**BLENDERBOT, "model_type": "marian", "vocab_size": 256, "decoder_vocab_size": 256}
    args = {"config": str(write(tmp_path / "m", marian)), "vocab": "128"}
    model = load_workload("hf:causal-lm", "tiny", model_args=args).model
    assert model.model.decoder.embed_tokens.num_embeddings == 128


@pytest.mark.models
def test_falcon_and_ctrl_files_build_their_feed_forward_width(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    shape = {"vocab_size": 128, "hidden_size": 64, "num_attention_heads": 4}
    falcon = {**shape, "model_type": "falcon", "num_hidden_layers": 2, "ffn_hidden_size": 96}
    ctrl = {"model_type": "ctrl", "n_embd": 64, "n_head": 4, "n_layer": 2, "dff": 80}
    built = {
        name: load_workload(
            "hf:causal-lm",
            "tiny",
            model_args={"config": str(write(tmp_path / name, f)), "attention": "eager"},
        ).model
        for name, f in (("falcon", falcon), ("ctrl", {**ctrl, "vocab_size": 128}))
    }
    assert built["falcon"].transformer.h[0].mlp.dense_h_to_4h.out_features == 96
    assert built["ctrl"].transformer.h[0].ffn[0].out_features == 80


@pytest.mark.models
def test_a_depth_the_model_does_not_build_is_refused(tmp_path: Path) -> None:
    """xLSTM builds `num_blocks` blocks: a file's 4 had been built under layers=2, its
    `num_hidden_layers` read back as set (a probe, 2026-12-08)."""
    pytest.importorskip("transformers")
    xlstm = {"model_type": "xlstm", "hidden_size": 64, "embedding_dim": 64, "num_heads": 4}
    xlstm |= {"num_hidden_layers": 4, "num_blocks": 4, "vocab_size": 128}
    args = {"config": str(write(tmp_path / "x", xlstm)), "attention": "eager"}
    with pytest.raises(WorkloadError) as info:
        workload_key("hf:causal-lm", "tiny", {**args, "layers": "2"})
    assert info.value.field == "model_arg.layers"
    assert str(info.value).endswith(
        "holds no list of 2 layers (its lists hold [4]); allowed the file's own depth"
    )
    model = load_workload("hf:causal-lm", "tiny", model_args=args).model
    assert len(model.backbone.blocks) == 4


@pytest.mark.models
def test_gpt2_and_gpt_neox_files_keep_their_own_fields(tmp_path: Path) -> None:
    """They had been built from the project's own GPT-2 and GPT-NeoX configs, every field but
    the sizes dropped with no word (a user's probe, 2026-12-07)."""
    pytest.importorskip("transformers")
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128}
    gpt2 |= {"activation_function": "relu", "layer_norm_epsilon": 1e-3, "resid_pdrop": 0.0}
    pythia = {"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4}
    pythia |= {"num_hidden_layers": 2, "vocab_size": 128, "hidden_act": "relu"}
    pythia |= {"use_parallel_residual": False, "attention_bias": False}
    built = {
        name: load_workload(
            "hf:causal-lm", "tiny", seed=0, model_args={"config": str(write(tmp_path / name, f))}
        ).model
        for name, f in (("gpt2", gpt2), ("pythia", pythia))
    }
    gpt2_config, pythia_config = built["gpt2"].config, built["pythia"].config
    assert (gpt2_config.activation_function, gpt2_config.layer_norm_epsilon) == ("relu", 1e-3)
    assert gpt2_config.resid_pdrop == 0.0
    assert (pythia_config.hidden_act, pythia_config.use_parallel_residual) == ("relu", False)
    assert built["pythia"].gpt_neox.layers[0].attention.query_key_value.bias is None


@pytest.mark.models
def test_a_files_derived_widths_follow_the_sizes_the_user_changes(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    folder = write(tmp_path / "qwen3", QWEN3)
    asked = {"config": str(folder), "hidden": "32", "heads": "2"}
    config = load_workload("hf:causal-lm", "tiny", model_args=asked).model.config
    assert config.head_dim == 16  # hidden / heads, not the file's 32: a Gemma 2 file had run 16x
    moe = {**QWEN3, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2}
    folder = write(tmp_path / "moe", {**moe, "moe_intermediate_size": 48})
    for ffn, width in (("", 48), ("24", 24)):  # the file's, then the user's: it had kept 48
        args = {"config": str(folder), **({"ffn": ffn} if ffn else {})}
        model = load_workload("hf:causal-lm", "tiny", model_args=args).model
        assert model.config.moe_intermediate_size == width
    # A file without an expert width keeps the family's, not its dense width (96).
    folder = write(tmp_path / "moe-dense", moe)
    model = load_workload("hf:causal-lm", "tiny", model_args={"config": str(folder)}).model
    assert model.config.moe_intermediate_size == type(model.config)().moe_intermediate_size


@pytest.mark.models
def test_a_falcon_file_builds_the_key_value_heads_asked(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    falcon = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4}
    falcon |= {"num_hidden_layers": 2, "vocab_size": 128, "multi_query": True}
    folder = write(tmp_path / "f", falcon)
    for kv_heads, expected in (("", 1), ("4", 4)):  # the file's flag, then the user's
        args = {"config": str(folder), "attention": "eager"}
        model = load_workload(
            "hf:causal-lm",
            "tiny",
            model_args={**args, **({"kv_heads": kv_heads} if kv_heads else {})},
        ).model
        assert model.transformer.h[0].self_attention.num_kv_heads == expected


@pytest.mark.models
def test_a_bad_field_in_the_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    # It had been blamed on model_arg.arch, which the file sets, with "another arch" to try.
    pytest.importorskip("transformers")
    folder = write(tmp_path / "bad", {**QWEN3, "hidden_act": "swishy"})
    with pytest.raises(WorkloadError, match=r"cannot build its model .*KeyError: 'swishy'") as info:
        workload_key("hf:causal-lm", "tiny", {"config": str(folder)})
    assert info.value.field == "model_arg.config"
    assert "another arch" not in str(info.value)


@pytest.mark.models
def test_a_soft_cap_is_refused_under_sdpa_only_where_the_family_applies_it(
    tmp_path: Path,
) -> None:
    # Gemma 3 keeps attn_logit_softcapping and never passes it to attention, under either.
    pytest.importorskip("transformers")
    gemma = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    gemma |= {"vocab_size": 128, "head_dim": 16, "attn_logit_softcapping": 50.0}
    gemma3 = write(tmp_path / "g3", {**gemma, "model_type": "gemma3_text"})
    assert "gemma3_text" in workload_key("hf:causal-lm", "tiny", {"config": str(gemma3)})
    gemma2 = write(tmp_path / "g2", {**gemma, "model_type": "gemma2"})
    with pytest.raises(WorkloadError, match=r"soft-caps its logits") as info:
        workload_key("hf:causal-lm", "tiny", {"config": str(gemma2)})
    assert info.value.field == "model_arg.attention"
