"""`hf:causal-lm` with an `arch` outside the five named ones (`trainers.workloads.text_archs`):
real transformers decoders of other families built at the options' sizes on tiny shapes, trained
and gated on the CPU, and the types it refuses before a job is queued, each naming the option."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from trainers import LoopConfig, RunArgs, WorkloadError, check_parity, load_workload, run
from trainers.blocks import find_blocks
from trainers.workloads import resolve_factory, workload_key
from trainers.workloads.text import CAUSAL_LM, CAUSAL_SDPA

pytestmark = pytest.mark.models

OTHERS = ["qwen3", "phi3", "gemma", "olmo2", "stablelm"]


@pytest.fixture(scope="module")
def transformers():  # type: ignore[no-untyped-def]
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", OTHERS)
def test_another_decoder_type_is_built_at_the_options_sizes_and_trains(
    arch: str, transformers: object
) -> None:
    from trainers.workloads.text_archs import causal_lm_types

    args = {
        "arch": arch,
        "hidden": "64",
        "heads": "4",
        "kv_heads": "2",
        "layers": "3",
        "lr": "3e-3",
    }
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args=args)
    model, config = workload.model, workload.model.config
    assert type(model).__name__ == causal_lm_types(transformers)[arch]
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (64, 4, 3)
    assert config.num_key_value_heads == 2
    assert config.vocab_size == 128 and config.intermediate_size == 4 * 64
    if "head_dim" in type(config)().to_dict():  # Qwen3 and Gemma keep a width of their own
        assert config.head_dim == 16
    assert set(getattr(config, "layer_types", None) or ["full_attention"]) == {"full_attention"}
    assert getattr(config, "use_sliding_window", False) is False
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        assert value is None or not isinstance(value, int) or 0 <= value < 128, (name, value)
    assert config._attn_implementation == CAUSAL_SDPA
    assert len(find_blocks(model)) == 3  # what per-layer compile and recomputation wrap
    result = run(workload, LoopConfig(), RunArgs(steps=48, warmup=0, windows=1, device="cpu"))
    assert all(math.isfinite(loss) for loss in result.losses)
    assert sum(result.losses[-8:]) < sum(result.losses[:8])


@pytest.mark.parametrize("arch", ["qwen3", "phi3"])
def test_another_types_sdpa_is_causal_and_agrees_with_eager(
    arch: str, transformers: object
) -> None:
    sdpa, eager = (
        load_workload("hf:causal-lm", "tiny", model_args={"arch": arch, "attention": attention})
        for attention in ("sdpa", "eager")
    )
    (ids,) = sdpa.dataset[0]
    sdpa.model.eval()
    eager.model.eval()
    torch.testing.assert_close(sdpa.loss_fn(sdpa.model, (ids,)), eager.loss_fn(eager.model, (ids,)))
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    before, after = (sdpa.model(input_ids=x).logits for x in (ids, changed))
    assert torch.equal(before[:, :-1], after[:, :-1])
    assert not torch.equal(before[:, -1], after[:, -1])


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_ffn_sets_each_experts_width_in_a_mixture_of_experts(
    arch: str, transformers: object
) -> None:
    """Their layers are all experts by default: `ffn` had set only the dense width, which no
    layer used, and was accepted and ignored (a user's probe, 2026-12-07)."""
    args = {"arch": arch, "hidden": "64", "heads": "4", "layers": "2", "lr": "3e-3"}
    asked = load_workload("hf:causal-lm", "tiny", seed=0, model_args={**args, "ffn": "48"})
    default = load_workload("hf:causal-lm", "tiny", seed=0, model_args=args)
    family = type(default.model.config)().moe_intermediate_size
    assert asked.model.config.moe_intermediate_size == 48
    assert default.model.config.moe_intermediate_size == family != 48
    experts = {p.shape for n, p in asked.model.named_parameters() if ".experts." in n}
    assert experts and all(48 in shape or 96 in shape for shape in experts), experts
    result = run(asked, LoopConfig(), RunArgs(steps=24, warmup=0, windows=1, device="cpu"))
    assert sum(result.losses[-4:]) < sum(result.losses[:4])


# Encoder-decoder families whose causal LM is the decoder alone: their config's
# num_hidden_layers and num_attention_heads name the encoder's, which is never built.
ENCODER_DECODER_FAMILIES = [
    "bart",
    "mbart",
    "marian",
    "pegasus",
    "blenderbot",
    "blenderbot-small",
    "bigbird_pegasus",
    "mvp",
]


@pytest.mark.parametrize("arch", ENCODER_DECODER_FAMILIES)
def test_an_encoder_decoder_familys_decoder_is_built_at_the_options_sizes(
    arch: str, transformers: object
) -> None:
    """Blenderbot at layers=1, heads=2 had built 24 decoder layers of 32 heads, the family's
    own, under a study named layers=1, heads=2: the sizes and their read-back went to the
    encoder's fields (a user's probe, 2026-12-08)."""
    args = {"arch": arch, "layers": "1", "ffn": "48", "attention": "eager"}
    decoder = load_workload("hf:causal-lm", "tiny", model_args=args).model.model.decoder
    assert len(decoder.layers) == 1
    assert decoder.layers[0].self_attn.num_heads == 2
    assert decoder.layers[0].fc1.out_features == 48
    assert decoder.embed_tokens.num_embeddings == 128


def test_blenderbots_decoder_trains_at_the_options_sizes(transformers: object) -> None:
    args = {"arch": "blenderbot", "layers": "3", "lr": "3e-3"}
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args=args)
    assert len(find_blocks(workload.model)) == 3  # what per-layer compile and recomputation wrap
    result = run(workload, LoopConfig(), RunArgs(steps=24, warmup=0, windows=1, device="cpu"))
    assert sum(result.losses[-4:]) < sum(result.losses[:4])


def test_xlstm_builds_the_heads_asked(transformers: object) -> None:
    """Its heads are `num_heads`: `heads` had gone to a `num_attention_heads` it never reads,
    read back as set, while every layer kept 8 (a user's probe, 2026-12-08)."""
    args = {"arch": "xlstm", "attention": "eager", "heads": "4"}
    model = load_workload("hf:causal-lm", "tiny", model_args=args).model
    assert model.config.num_heads == 4
    # One input gate per head.
    assert model.backbone.blocks[0].mlstm_layer.igate_preact.out_features == 4


@pytest.mark.parametrize("arch", ["mamba", "rwkv"])
def test_an_attention_free_family_is_built_at_its_depth_without_heads(
    arch: str, transformers: object
) -> None:
    """No attention heads to set: built as before the read-back learnt each family's own
    fields, at the options' depth and width, not refused for a `heads` the preset gives."""
    args = {"arch": arch, "attention": "eager", "layers": "3", "hidden": "48"}
    model = load_workload("hf:causal-lm", "tiny", model_args=args).model
    assert model.config.num_hidden_layers == 3 and model.config.hidden_size == 48


@pytest.mark.parametrize(
    "arch", ["gemma2", "mpt", "bloom", "openai-gpt", "xglm", "gpt_neo", "gptj"]
)
def test_families_sdpa_cannot_run_train_under_eager_attention(
    arch: str, transformers: object
) -> None:
    """BLOOM, the original GPT and XGLM take only a 2D mask: the eager loss's 4D one had failed
    their first step, after the sdpa refusal had advised eager (a user's probe, 2026-12-07).
    They build their own causal mask, which the build checks (`check_causal`)."""
    from trainers.workloads.text_losses import causal_lm_loss, causal_lm_loss_eager

    args = {"arch": arch, "attention": "eager", "lr": "3e-3"}
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args=args)
    config = workload.model.config
    if arch == "gptj":  # a quarter of the 16-wide head, as GPT-J's own 64 of 256: it had kept 64
        assert config.rotary_dim == 4
        wide = {**args, "hidden": "512", "heads": "4", "layers": "1"}  # 64 fits a head of 128
        assert load_workload("hf:causal-lm", "tiny", model_args=wide).model.config.rotary_dim == 64
    if arch == "gpt_neo":  # all global, as many as layers: its 24 had refused any other depth
        assert config.attention_layers == ["global", "global"]
    own_mask = arch in ("bloom", "openai-gpt", "xglm")
    assert workload.loss_fn is (causal_lm_loss if own_mask else causal_lm_loss_eager)
    if own_mask:
        (ids,) = workload.dataset[0]
        with pytest.raises((ValueError, RuntimeError)):  # each family fails its own way
            causal_lm_loss_eager(workload.model, (ids,))
    result = run(workload, LoopConfig(), RunArgs(steps=24, warmup=0, windows=1, device="cpu"))
    assert sum(result.losses[-4:]) < sum(result.losses[:4])


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


def test_a_familys_own_out_of_vocabulary_token_ids_are_not_warned_of(
    transformers: object,
) -> None:
    # StarCoder2's defaults hold bos/eos 50256 of a 49152 vocabulary; the built config moves
    # them (`PAD`), and the warnings were about the family's default, which no run builds.
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()
    kept, logger = _Kept(), logging.getLogger("transformers.configuration_utils")
    logger.addHandler(kept)
    try:
        workload = load_workload("hf:causal-lm", "tiny", model_args={"arch": "starcoder2"})
    finally:
        logger.removeHandler(kept)
    assert workload.model.config.bos_token_id == 0
    assert not [said for said in kept.said if "within the vocabulary" in said]


def test_gpt_bigcode_builds_the_key_value_heads_asked(transformers: object) -> None:
    """GPTBigCode builds one key/value head or one per query head by `multi_query` alone, True
    by default: it had been multi-query whatever kv_heads said (a user's probe, 2026-12-06)."""
    widths = {}
    for kv_heads in ("0", "1", "4"):
        args = {"arch": "gpt_bigcode", "hidden": "64", "heads": "4", "kv_heads": kv_heads}
        attention = load_workload("hf:causal-lm", "tiny", model_args=args).model.transformer.h[0]
        widths[kv_heads] = attention.attn.c_attn.weight.shape[0]
    # Queries 64 wide, then keys and values: 64 each for four heads, 16 each for one.
    assert widths == {"0": 192, "1": 96, "4": 192}


def test_the_gate_passes_an_eager_config_on_another_type(transformers: object) -> None:
    factory = resolve_factory("hf:causal-lm", {"arch": "olmo2"})
    config = LoopConfig(num_streams=2, sync_interval=2, sync_mode="event", prefetch_depth=2)
    verdict = check_parity(factory, config, RunArgs(steps=4, device="cpu"), preset="tiny")
    assert verdict.passed, verdict.reason


def test_the_study_name_tells_the_types_apart(transformers: object) -> None:
    keys = {workload_key("hf:causal-lm", "tiny", {"arch": a}) for a in ("qwen3", "phi3", "llama")}
    assert len(keys) == 3 and all("arch=" in key for key in keys)


@pytest.mark.parametrize(
    ("args", "field", "match"),
    [
        ({"arch": "qwen"}, "model_arg.arch", r"'qwen' is invalid \(did you mean qwen3, qwen2"),
        ({"arch": "gemma3"}, "model_arg.arch", r"a composite model .* arch=gemma3_text"),
        (
            {"arch": "bloom"},
            "model_arg.attention",
            r"^model_arg.attention='sdpa' is invalid with arch=bloom: .*no SDPA .*allowed eager$",
        ),
        (
            {"arch": "gpt_bigcode", "hidden": "64", "heads": "4", "kv_heads": "2"},
            "model_arg.kv_heads",
            r"one key/value head \(multi_query\) or one per query head; allowed 0 .* or 1$",
        ),
        (
            {"arch": "opt", "kv_heads": "1"},
            "model_arg.kv_heads",
            r"no key/value heads \(num_key_value_heads, num_kv_heads\)",
        ),
        (
            {"arch": "openai-gpt", "ffn": "64"},
            "model_arg.ffn",
            r"model_arg.ffn=64 is invalid with arch=openai-gpt: its config has no "
            r"feed-forward width \(intermediate_size, ffn_dim.*moe_intermediate_size",
        ),
        # SDPA drops Gemma 2's soft-capped attention logits: another model than the family's.
        (
            {"arch": "gemma2"},
            "model_arg.attention",
            r"^model_arg.attention='sdpa' is invalid with arch=gemma2: .*"
            r"attn_logit_softcapping=50.0.* allowed eager$",
        ),
        # MPT's attn_config is a group of its own fields, not a model: not called composite.
        ({"arch": "mpt"}, "model_arg.attention", r"arch=mpt: .*no SDPA attention; allowed eager"),
        (
            {"arch": "stablelm", "hidden": "48", "heads": "4"},
            "model_arg.arch",
            r"cannot build one step at hidden=48, heads=4.*broadcast",  # 12 x 0.25 rotated: odd
        ),
        (
            {"arch": "qwen3", "hidden": "36", "heads": "4"},
            "model_arg.arch",
            r"cannot build its config at hidden=36, heads=4.*even rotary dimension",
        ),
        ({"arch": "roberta"}, "model_arg.arch", r"positions start after its pad id \(1\)"),
        ({"arch": "deepseek_v2"}, "model_arg.arch", r"cannot build one step .*TypeError"),
        # Its own table of attention classes: a KeyError naming our function, not the option.
        (
            {"arch": "falcon"},
            "model_arg.attention",
            r"^model_arg.attention='sdpa' is invalid with arch=falcon: .* allowed eager$",
        ),
    ],
)
def test_a_type_the_run_cannot_build_is_refused_before_a_job_naming_the_option(
    args: dict[str, str], field: str, match: str, transformers: object
) -> None:
    # A study's name, which the service and `run` resolve before anything is queued or built.
    with pytest.raises(WorkloadError, match=match) as info:
        workload_key("hf:causal-lm", "tiny", args)
    assert info.value.field == field


def test_a_failure_meta_tensors_cannot_show_is_refused_at_the_build(transformers: object) -> None:
    # XLM reads its lengths on the host (not on meta tensors), then asserts its mask is 2D: the
    # build's causal check runs it on real ones; it had raised a bare AssertionError.
    args = {"arch": "xlm", "attention": "eager"}
    with pytest.raises(WorkloadError, match=r"'xlm' cannot build one step .*AssertionError"):
        load_workload("hf:causal-lm", "tiny", model_args=args)


def test_each_refused_type_above_would_fail_if_built_anyway(transformers: object) -> None:
    # The refusals are not guesses: built past the check, the model fails as the check said.
    from trainers.workloads.text_models import make_model

    options = CAUSAL_LM.resolve("tiny", {})
    for arch, attention in (("roberta", "sdpa"), ("deepseek_v2", "sdpa"), ("xlm", "eager")):
        options.update(arch=arch, attention=attention)
        model = make_model("causal-lm", options, transformers)
        workload = load_workload("hf:causal-lm", "tiny", model_args={"arch": "llama"})
        (ids,) = workload.dataset[0]
        loss = workload.loss_fn if attention == "sdpa" else _eager_loss()
        with pytest.raises(Exception):  # noqa: B017 (each family fails its own way)
            loss(model, (ids,))


def test_sdpa_would_drop_the_soft_cap_that_eager_applies(transformers: object) -> None:
    # Why Gemma 2 is refused under sdpa: transformers' SDPA takes `softcap` and drops it.
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 1, True, False
    q, k, v = torch.randn(3, 1, 2, 8, 4, generator=torch.Generator().manual_seed(0)).mul(4)
    capped, plain = (
        sdpa_attention_forward(module, q, k, v, None, scaling=1.0, softcap=s)[0]
        for s in (0.5, None)
    )
    assert torch.equal(capped, plain)
    capped, plain = (
        eager_attention_forward(module, q, k, v, None, scaling=1.0, softcap=s)[0]
        for s in (0.5, None)
    )
    assert not torch.allclose(capped, plain, atol=1e-3)


def _eager_loss():  # type: ignore[no-untyped-def]
    from trainers.workloads.text import causal_lm_loss_eager

    return causal_lm_loss_eager


def test_codegen_heads_are_a_multiple_of_the_groups_its_code_splits_them_into(
    transformers: object,
) -> None:
    """CodeGen splits its heads over `mp_num = 4` groups written in its attention: two heads
    had passed the options' checks and failed in a reshape (a user's probe, 2026-12-07)."""
    args = {"arch": "codegen", "attention": "eager", "hidden": "32", "heads": "2"}
    with pytest.raises(WorkloadError) as caught:
        load_workload("hf:causal-lm", "tiny", model_args=args)
    assert caught.value.field == "model_arg.heads"
    assert str(caught.value).endswith("allowed a multiple of 4")
    fits = load_workload("hf:causal-lm", "tiny", model_args={**args, "heads": "4"})
    assert fits.model.config.n_head == 4
