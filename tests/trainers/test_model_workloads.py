"""Library models as workloads: torchvision, timm and transformers models built for real on tiny
shapes and trained a few steps on the CPU; their options, names and errors.

Tests that build a model carry the `models` marker and skip when the library is missing; the
option, naming and error tests need none of the libraries and always run.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from trainers import LoopConfig, RunArgs, WorkloadError, check_parity, load_workload, run
from trainers.blocks import find_blocks
from trainers.flops import count_step_flops, trainable
from trainers.workloads import (
    BoundFactory,
    SyntheticBatches,
    Workload,
    catalog,
    disable_dropout,
    resolve_factory,
    workload_key,
)
from trainers.workloads.adapters import bind
from trainers.workloads.extras import INSTALL, require
from trainers.workloads.options import OptionSpec
from trainers.workloads.text import CAUSAL_SDPA, FIRST_TOKEN, IGNORE, MASK, TokenStream
from trainers.workloads.vision import check_runs

models = pytest.mark.models


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    library: str
    args: tuple[tuple[str, str], ...] = ()

    @property
    def model_args(self) -> dict[str, str]:
        return dict(self.args)

    def build(self, seed: int = 0) -> Workload:
        pytest.importorskip(self.library)
        return load_workload(self.name, "tiny", seed=seed, model_args=self.model_args)


VISION = [
    Case("torchvision:resnet18", "torchvision"),
    Case("torchvision:mobilenet_v3_small", "torchvision"),
    Case("timm:resnet10t", "timm"),
    Case("timm:vit_tiny_patch16_224", "timm"),
]
TEXT = [
    Case("hf:causal-lm", "transformers", (("lr", "1e-3"),)),
    Case(
        "hf:causal-lm", "transformers", (("arch", "llama"), ("attention", "eager"), ("lr", "1e-3"))
    ),
    Case("hf:masked-lm", "transformers", (("lr", "1e-3"),)),
    Case("hf:seq-cls", "transformers", (("classes", "3"), ("lr", "1e-3"))),
    # Held-out architectures (issue 47): no preset, built from the options alone.
    Case("hf:causal-lm", "transformers", (("arch", "qwen2"), ("kv_heads", "1"), ("lr", "1e-3"))),
    Case("hf:causal-lm", "transformers", (("arch", "gpt_neox"), ("lr", "1e-3"))),
    Case("hf:causal-lm", "transformers", (("arch", "mistral"), ("kv_heads", "1"), ("lr", "1e-3"))),
]
HELD_OUT = TEXT[-3:]


def ids(case: Case) -> str:
    return "-".join([case.name, *(v for k, v in case.args if k in ("arch", "attention"))])


def cases(group: list[Case]) -> list[object]:
    return [pytest.param(case, id=ids(case), marks=models) for case in group]


# -- built for real --------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases(VISION))
def test_images_are_float_nchw_with_int64_labels(case: Case) -> None:
    workload = case.build()
    assert isinstance(workload.dataset, SyntheticBatches)
    assert 8 <= len(workload.dataset) <= 16
    images, labels = workload.dataset[0]
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (2,) and labels.dtype == torch.int64
    assert int(labels.min()) >= 0 and int(labels.max()) < 10
    assert workload.samples_per_batch == 2 and workload.batch_size is None
    logits = workload.model.eval()(images)
    assert logits.shape == (2, 10)


@pytest.mark.parametrize("case", cases(TEXT))
def test_tokens_and_labels(case: Case) -> None:
    workload = case.build()
    if case.name == "hf:masked-lm":  # fixed batches by default (see its `data` option)
        assert isinstance(workload.dataset, SyntheticBatches) and len(workload.dataset) == 16
    else:  # a stream (docs/data.md): long enough that no run repeats a batch
        assert isinstance(workload.dataset, TokenStream)
        assert len(workload.dataset) >= 1 << 20
    batch = workload.dataset[0]
    ids_ = batch[0]
    assert ids_.shape == (2, 16) and ids_.dtype == torch.int64
    assert int(ids_.min()) >= 0 and int(ids_.max()) < 128
    assert workload.samples_per_batch == 2 and workload.tokens_per_sample == 16
    if case.name == "hf:causal-lm":
        assert len(batch) == 1  # the model shifts the ids into labels itself
    elif case.name == "hf:masked-lm":
        labels = batch[1]
        masked = labels != IGNORE
        assert labels.dtype == torch.int64 and masked.any(dim=-1).all()
        assert (ids_[masked] == MASK).all() and (ids_[~masked] != MASK).all()
        assert (labels[masked] >= 2).all() and (labels[masked] < 128).all()
    else:
        labels = batch[1]
        assert labels.shape == (2,) and labels.dtype == torch.int64
        assert int(labels.min()) >= 0 and int(labels.max()) < 3


@pytest.mark.parametrize("case", cases(VISION + TEXT))
def test_same_seed_same_weights_and_batches_other_seed_differs(case: Case) -> None:
    a, b, c = case.build(0), case.build(0), case.build(1)
    for pa, pb in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True):
        assert torch.equal(pa, pb)
    assert not all(
        torch.equal(pa, pc)
        for pa, pc in zip(a.model.parameters(), c.model.parameters(), strict=True)
    )
    for ta, tb in zip(a.dataset[0], b.dataset[0], strict=True):
        assert torch.equal(ta, tb)
    assert not torch.equal(a.dataset[0][0], c.dataset[0][0])


@pytest.mark.parametrize("case", cases(VISION + TEXT))
def test_trains_through_the_loop_on_cpu(case: Case) -> None:
    steps = 4 if case in VISION else 32
    result = run(
        case.build(), LoopConfig(), RunArgs(steps=steps, warmup=0, windows=1, device="cpu")
    )
    assert len(result.losses) == steps
    assert all(math.isfinite(loss) for loss in result.losses)
    assert len(set(result.losses)) > 1
    if case in TEXT:  # cheap enough to train until the loss clearly falls
        assert sum(result.losses[-8:]) < sum(result.losses[:8])


@pytest.mark.parametrize("case", cases([VISION[2], *TEXT]))
def test_parity_holds_for_an_eager_config(case: Case) -> None:
    pytest.importorskip(case.library)
    factory = resolve_factory(case.name, case.model_args)
    assert isinstance(factory, BoundFactory)  # `timm:` is the library, not a module named timm
    config = LoopConfig(num_streams=2, sync_interval=2, sync_mode="event", prefetch_depth=2)
    verdict = check_parity(factory, config, RunArgs(steps=4, device="cpu"), preset="tiny")
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("case", cases([VISION[0], VISION[3], TEXT[1], TEXT[2]]))
def test_the_gate_reuses_one_build_of_a_library_model_with_the_same_losses(case: Case) -> None:
    """The gate's processes build each (preset, seed) once (`ReusedBuilds`): a library model's
    workload copies (no closure over the build) and every run from a copy trains like a run
    from a fresh build, bit for bit on the CPU."""
    from trainers.gate import Perturbation, trajectory
    from trainers.workloads.reuse import ReusedBuilds

    pytest.importorskip(case.library)
    factory = resolve_factory(case.name, case.model_args)
    reused = ReusedBuilds(factory)
    for perturbation in (None, Perturbation(seed=1, eps=2.0**-7), None):
        args = RunArgs(steps=3, device="cpu")
        fresh = trajectory(factory, "tiny", LoopConfig(), args, perturbation=perturbation).losses
        again = trajectory(reused, "tiny", LoopConfig(), args, perturbation=perturbation).losses
        assert again == fresh
    assert (reused.builds, reused.copies, reused.reason) == (1, 2, None)


class HostReads(TorchDispatchMode):
    """Records every op that reads a tensor's value on the host (`.item()`, `bool(t)`), has a
    data-dependent output shape, or makes a tensor from host data (`torch.tensor(0.0,
    device=...)`: a copy from pageable memory): a device sync on a GPU, and a step CUDA graphs
    cannot capture."""

    SYNCING = frozenset(
        {
            "_local_scalar_dense",
            "nonzero",
            "masked_select",
            "unique",
            "_unique2",
            "unique_consecutive",
            "repeat_interleave",
            "lift_fresh",
        }
    )

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket.__name__ in self.SYNCING:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


EAGER_BERT = [
    Case("hf:masked-lm", "transformers", (("attention", "eager"),)),
    Case("hf:seq-cls", "transformers", (("attention", "eager"), ("classes", "3"))),
]
# The held-out decoders with eager attention and their ready-made 4D mask.
EAGER_HELD_OUT = [
    dataclasses.replace(case, args=(*case.args, ("attention", "eager"))) for case in HELD_OUT
]


@pytest.mark.parametrize("case", cases(VISION + TEXT + EAGER_BERT + EAGER_HELD_OUT))
def test_the_step_never_reads_a_value_on_the_host(case: Case) -> None:
    workload = case.build()
    workload.model.train()
    with HostReads() as reads:
        loss = workload.loss_fn(workload.model, workload.dataset[0])
        loss.backward()
    assert loss.shape == () and loss.dtype == torch.float32
    assert reads.seen == []


@pytest.mark.parametrize("case", cases(EAGER_BERT))
def test_bert_eager_attention_with_its_ready_made_mask_changes_no_bit(case: Case) -> None:
    from trainers.workloads.text import labelled_loss, labelled_loss_eager

    workload = case.build()
    model, batch = workload.model.eval(), workload.dataset[0]
    assert workload.loss_fn is labelled_loss_eager
    assert torch.equal(labelled_loss_eager(model, batch), labelled_loss(model, batch))


# Stochastic depth draws in training as dropout does: torchvision's EfficientNet and ConvNeXt
# build it by default (StochasticDepth), so the gate's runs must switch it off too.
STOCHASTIC_DEPTH = [
    Case("torchvision:efficientnet_b0", "torchvision"),
    Case("torchvision:convnext_tiny", "torchvision"),
]


@pytest.mark.parametrize("case", cases(VISION + STOCHASTIC_DEPTH + TEXT))
def test_disable_dropout_leaves_no_randomness_in_training(case: Case) -> None:
    workload = case.build()
    model = workload.model.train()
    changed = disable_dropout(model)
    if case.library == "transformers" and case.name == "hf:causal-lm" and case.args[0][0] == "arch":
        # Llama and the held-out decoders have no dropout that is not 0.0 as built: attention
        # dropout is a float (GPT-NeoX's hidden dropout too), 0.0.
        assert model.config.attention_dropout == 0.0  # type: ignore[union-attr]
    elif case.library == "transformers" or case in STOCHASTIC_DEPTH:
        assert changed > 0
    assert disable_dropout(model) == 0
    batch = workload.dataset[0]
    torch.manual_seed(1)
    first = workload.loss_fn(model, batch)
    torch.manual_seed(2)
    assert torch.equal(first, workload.loss_fn(model, batch))  # no randomness left in training


class FloatDropout(torch.nn.Module):
    """A module that keeps its dropout as a float and calls the functional form, as transformers'
    attention does (`attention_dropout`), beside timm's DropPath and torchvision's
    StochasticDepth."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.attention_dropout = 0.3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(
            self.linear(x), p=self.attention_dropout, training=self.training
        )


@models
def test_disable_dropout_reaches_stochastic_depth_and_float_probabilities() -> None:
    timm = pytest.importorskip("timm")
    torchvision = pytest.importorskip("torchvision")
    model = torch.nn.Sequential(
        FloatDropout(),
        timm.layers.DropPath(0.5),
        torchvision.ops.StochasticDepth(0.5, "row"),
        torch.nn.BatchNorm1d(16),
    ).train()
    x = torch.randn(32, 16)

    def draws() -> bool:
        torch.manual_seed(1)
        first = model(x)
        torch.manual_seed(2)
        return not torch.equal(first, model(x))

    assert draws()
    assert disable_dropout(model) == 3
    assert not draws()
    assert model[1].drop_prob == 0.0 and model[2].p == 0.0
    # Other floats in [0, 1] are left alone: only the ones named like a probability change.
    assert model[3].momentum == 0.1 and model[3].eps == 1e-5


@models
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "gpt_neox", "mistral"])
def test_causal_lm_sdpa_is_causal_and_agrees_with_eager_attention(arch: str) -> None:
    # With sdpa, the model prepares no mask (see trainers.workloads.text): causality rests on SDPA.
    pytest.importorskip("transformers")
    gqa = {"kv_heads": "1"} if arch in ("qwen2", "mistral") else {}
    sdpa, eager = (
        load_workload(
            "hf:causal-lm", "tiny", model_args={"arch": arch, "attention": attention, **gqa}
        )
        for attention in ("sdpa", "eager")
    )
    assert sdpa.model.config._attn_implementation == CAUSAL_SDPA  # type: ignore[union-attr]
    (ids,) = sdpa.dataset[0]
    sdpa.model.eval()
    eager.model.eval()
    torch.testing.assert_close(sdpa.loss_fn(sdpa.model, (ids,)), eager.loss_fn(eager.model, (ids,)))
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    before, after = (sdpa.model(input_ids=x).logits for x in (ids, changed))
    assert torch.equal(before[:, :-1], after[:, :-1])  # no token sees a later one
    assert not torch.equal(before[:, -1], after[:, -1])


@models
def test_an_arch_whose_causal_lm_sees_later_tokens_is_refused_naming_it() -> None:
    """BERT's causal-LM head takes its mask from `config.is_decoder`: under the mask-free SDPA
    it attended to every token and its loss learned the token it predicts (a user's probe,
    2026-12-06). Eager attention passes the causal mask itself, which BERT honours."""
    pytest.importorskip("transformers")
    with pytest.raises(WorkloadError, match=r"^model_arg.arch='bert' is invalid: its causal LM a"):
        load_workload("hf:causal-lm", "tiny", model_args={"arch": "bert"})
    eager = load_workload("hf:causal-lm", "tiny", model_args={"arch": "bert", "attention": "eager"})
    assert eager.model.training  # the check ran in eval mode and gave the modes back


@models
def test_a_special_id_outside_the_vocabulary_goes_where_the_data_never_draws() -> None:
    """Phi-3's pad id 32000 at vocab 128 had gone to 127, a token the data draws (38 times in
    200 batches) into an embedding row `padding_idx` keeps at zero (a probe, 2026-12-07)."""
    pytest.importorskip("transformers")
    workload = load_workload("hf:causal-lm", "tiny", model_args={"arch": "phi3"})
    pad = workload.model.config.pad_token_id
    assert pad is not None and pad < FIRST_TOKEN
    drawn = torch.cat([batch[0].flatten() for batch in itertools.islice(workload.dataset, 200)])
    assert not (drawn == pad).any()


@models
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_a_mixture_of_experts_decoder_is_not_taken_for_one_that_sees_later_tokens(
    arch: str,
) -> None:
    """Its experts group the tokens, so a changed last token moves earlier logits by float noise
    (6e-8 on Mixtral): 28 such decoders had been refused as non-causal (a probe, 2026-12-07)."""
    pytest.importorskip("transformers")
    workload = load_workload("hf:causal-lm", "tiny", model_args={"arch": arch})
    ids = torch.randint(4, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(workload.loss_fn(workload.model, (ids,)))


HELD_OUT_CLASSES = {
    "qwen2": ("Qwen2ForCausalLM", "Qwen2DecoderLayer"),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXLayer"),
    "mistral": ("MistralForCausalLM", "MistralDecoderLayer"),
}


@pytest.mark.parametrize("case", cases(HELD_OUT))
def test_a_held_out_architecture_is_built_from_its_options(case: Case) -> None:
    pytest.importorskip(case.library)
    arch = case.model_args["arch"]
    workload = load_workload(
        case.name, "tiny", model_args={**case.model_args, "layers": "3", "ffn": "48"}
    )
    model, config = workload.model, workload.model.config  # type: ignore[union-attr]
    model_class, layer_class = HELD_OUT_CLASSES[arch]
    assert type(model).__name__ == model_class
    assert config._attn_implementation == CAUSAL_SDPA and config.use_cache is False
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (32, 3, 48)
    assert config.vocab_size == 128 and config.max_position_embeddings == 16
    if arch == "gpt_neox":
        assert config.rope_parameters["partial_rotary_factor"] == 0.25  # Pythia's rotary_pct
        assert config.use_parallel_residual
    else:
        assert config.num_key_value_heads == 1 and config.num_attention_heads == 2
        assert getattr(config, "sliding_window", None) is None  # full causal attention
    # The family's default: untied input and output embeddings.
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    # The block levers find its decoder layers, in order.
    blocks = find_blocks(model)
    assert [type(b).__name__ for b in blocks] == [layer_class] * 3
    layers = model.gpt_neox.layers if arch == "gpt_neox" else model.model.layers
    assert all(a is b for a, b in zip(blocks, layers, strict=True))
    # torchao's float8 conversion would keep its output head in high precision.
    from trainers.float8 import output_heads

    assert output_heads(model) == {"lm_head"}
    assert model.lm_head is model.get_output_embeddings()


@models
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "gpt_neox", "mistral"])
def test_tie_ties_the_output_head_to_the_embeddings_or_keeps_the_familys_default(
    arch: str,
) -> None:
    pytest.importorskip("transformers")
    tied = {}
    for tie in ("auto", "true", "false"):
        model = load_workload("hf:causal-lm", "tiny", model_args={"arch": arch, "tie": tie}).model
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
        tied[tie] = head.weight is embeddings.weight
    assert (tied["true"], tied["false"]) == (True, False)
    assert tied["auto"] == (arch == "gpt2")  # each config's own default


@models
def test_a_tied_qwen2_trains_with_one_shared_matrix() -> None:
    """Qwen2's small models (0.5B, 1.5B) tie their embeddings: the shared matrix gets the
    gradients of both uses and the loss falls."""
    pytest.importorskip("transformers")
    args = {"arch": "qwen2", "kv_heads": "1", "tie": "true", "lr": "1e-3"}
    workload = load_workload("hf:causal-lm", "tiny", model_args=args)
    before = workload.model.get_input_embeddings().weight.detach().clone()
    result = run(workload, LoopConfig(), RunArgs(steps=32, warmup=0, windows=1, device="cpu"))
    assert all(math.isfinite(loss) for loss in result.losses)
    assert sum(result.losses[-8:]) < sum(result.losses[:8])
    shared = workload.model.get_input_embeddings().weight
    assert shared is workload.model.get_output_embeddings().weight
    assert not torch.equal(before, shared.detach())


@models
def test_flops_are_counted_for_each_architecture_apart() -> None:
    """Counted > 0 and for the model built: the count is cached per process, and options are not
    in a workload's name or preset, so qwen2's fewer key/value heads must show (they did not,
    before the cache was keyed on the model)."""
    pytest.importorskip("transformers")
    cpu = torch.device("cpu")
    counts = {}
    for arch in ("llama", "qwen2", "mistral", "gpt_neox"):
        gqa = {"kv_heads": "1"} if arch in ("qwen2", "mistral") else {}
        workload = load_workload("hf:causal-lm", "tiny", model_args={"arch": arch, **gqa})
        counts[arch] = count_step_flops(workload, cpu)
        tokens = workload.samples_per_batch * 16
        # Below the 6 x parameters x tokens figure (the embeddings are no matmul) and near it.
        assert 0.6 * 6 * trainable(workload.model) * tokens < counts[arch]
        assert counts[arch] < 6 * trainable(workload.model) * tokens
    # Grouped-query attention: 2 heads sharing one key/value head makes fewer FLOPs than 2.
    assert counts["qwen2"] == counts["mistral"] < counts["llama"]
    assert counts["gpt_neox"] != counts["llama"]


@models
@pytest.mark.parametrize(
    ("args", "field", "match"),
    [
        (
            {"arch": "gpt_neox", "kv_heads": "1"},
            "model_arg.kv_heads",
            r"model_arg.kv_heads=1 is invalid with arch=gpt_neox: allowed 0 \(of the named "
            r"five, grouped-query attention is built for arch=llama, qwen2, mistral; other "
            r"transformers decoders whose config has num_key_value_heads take it too, e.g. "
            r"arch=qwen3\)",
        ),
        (
            {"arch": "qwen2", "kv_heads": "3", "heads": "4"},
            "model_arg.kv_heads",
            r"model_arg.kv_heads=3 is invalid with heads=4: allowed 0 or a divisor of heads",
        ),
        (
            {"arch": "mistral", "heads": "32"},
            "model_arg.heads",
            r"model_arg.heads=32 is invalid with hidden=32 and arch=mistral: allowed heads that "
            r"leave an even head width",
        ),
        (
            {"arch": "gpt_neox", "heads": "8"},
            "model_arg.heads",
            r"model_arg.heads=8 is invalid with hidden=32 and arch=gpt_neox: allowed heads that "
            r"leave a head width hidden/heads whose rotated quarter \(rotary_pct 0.25\) is an "
            r"even number of at least 2, not 4 \(quarter 1\)",
        ),
        ({"arch": "qwen2", "heads": "3"}, "model_arg.heads", r"allowed a divisor of hidden"),
    ],
)
def test_held_out_shapes_are_checked_naming_the_option(
    args: dict[str, str], field: str, match: str
) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload("hf:causal-lm", "tiny", model_args=args)
    assert info.value.field == field


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(
    "case", cases(VISION + STOCHASTIC_DEPTH + TEXT + EAGER_BERT + EAGER_HELD_OUT)
)
def test_on_a_gpu_the_step_never_syncs_implicitly(case: Case) -> None:
    workload = case.build()
    model = workload.model.cuda().train()
    optimizer = workload.make_optimizer(model.parameters(), True)
    batch = tuple(tensor.cuda() for tensor in workload.dataset[0])
    for step in range(3):
        if step == 2:  # after the lazy initialisations of the first steps
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            workload.loss_fn(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(
    "case", cases(VISION + STOCHASTIC_DEPTH + TEXT + EAGER_BERT + EAGER_HELD_OUT)
)
def test_on_a_gpu_a_cuda_graph_trains_like_the_eager_loop(case: Case) -> None:
    pytest.importorskip(case.library)
    factory = resolve_factory(case.name, case.model_args)
    verdict = check_parity(
        factory, LoopConfig(cuda_graph=True), RunArgs(steps=12, device="cuda"), preset="tiny"
    )
    assert verdict.passed, verdict.reason


# -- errors ----------------------------------------------------------------------------------


@models
@pytest.mark.parametrize(
    ("name", "library", "match"),
    [
        (
            "torchvision:resnet19",
            "torchvision",
            r"no model 'resnet19' \(did you mean resnet18.*"
            r"allowed e\.g\. resnet18, resnet50",
        ),
        ("timm:vit_tiny_patch16_2244", "timm", r"did you mean vit_tiny_patch16_224.*allowed e\.g"),
        # A name torchvision has, of a kind this family does not train: not "no model".
        (
            "torchvision:fasterrcnn_resnet50_fpn",
            "torchvision",
            r"'fasterrcnn_resnet50_fpn' is a torchvision detection model; this family trains "
            r"image classifiers: allowed e\.g\. resnet18",
        ),
        ("torchvision:deeplabv3_resnet50", "torchvision", r"is a torchvision segmentation model"),
    ],
)
def test_unknown_model_names_the_allowed_ones(name: str, library: str, match: str) -> None:
    pytest.importorskip(library)
    with pytest.raises(WorkloadError, match=match) as info:
        resolve_factory(name)
    assert info.value.field == "workload"


@models
def test_an_image_too_small_for_the_model_fails_at_build_naming_the_image() -> None:
    pytest.importorskip("torchvision")
    with pytest.raises(
        WorkloadError, match=r"cannot run on 2 images of 3x32x32: .*; allowed model_arg.image=75 or"
    ) as info:
        load_workload("torchvision:inception_v3", "tiny")
    assert info.value.field == "model_arg.image"
    with pytest.raises(WorkloadError, match=r"cannot be built with image=30") as info:
        load_workload("torchvision:vit_b_16", "tiny", model_args={"image": "30"})
    assert info.value.field == "model_arg"
    # A BatchNorm in training at batch=1 had been blamed on the image.
    for name in ("torchvision:resnet18", "timm:resnet10t"):
        pytest.importorskip(name.split(":")[0])
        with pytest.raises(
            WorkloadError, match=r"^model_arg.batch=1 is invalid .*2 or more$"
        ) as info:
            load_workload(name, "tiny", model_args={"batch": "1"})
        assert info.value.field == "model_arg.batch"
    assert load_workload("timm:vit_tiny_patch16_224", "tiny", model_args={"batch": "1"}).model


class _Needs(nn.Module):
    """Runs on images of at least `least` pixels that are multiples of `multiple`."""

    def __init__(self, least: int, multiple: int = 1) -> None:
        super().__init__()
        self.least, self.multiple = least, multiple
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-1]
        if size < self.least or size % self.multiple:
            raise RuntimeError(f"Output size is too small: {size}")
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize(
    ("model", "image", "allowed"),
    [
        (_Needs(75), 32, r"; allowed model_arg\.image=75 or more$"),
        (_Needs(9), 8, r"; allowed model_arg\.image=9 or more$"),
        # Sizes that run are not one range: the size named runs, and no "or more" is claimed.
        (_Needs(16, multiple=8), 12, r"; allowed e\.g\. model_arg\.image=24$"),
        # One size only, never met by the search: no size is claimed at all.
        (_Needs(4097), 32, r"3x32x32: Output size is too small: 32$"),
    ],
)
def test_an_image_too_small_names_the_smallest_that_runs(
    model: nn.Module, image: int, allowed: str
) -> None:
    with pytest.raises(WorkloadError, match=allowed) as info:
        check_runs("mine", model, (2, 3, image, image))
    assert info.value.field == "model_arg.image"
    assert next(model.parameters()).device.type == "cpu"  # the search ran on meta copies


class _Shared(nn.Module):
    """One convolution registered under two names, as timm's CoaT shares its position encoders."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Conv2d(3, 3, 1)
        self.blocks = nn.ModuleList([nn.Sequential(self.shared)])
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[0](x))


def test_the_image_check_leaves_a_shared_submodule_on_its_device() -> None:
    """Swapped into the model, the shared convolution had kept meta weights, and the first step
    failed "Cannot copy out of meta tensor" (every CoaT of timm; a probe, 2026-12-07)."""
    model = _Shared()
    check_runs("mine", model, (2, 3, 32, 32))
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@models
def test_heads_must_divide_hidden() -> None:
    pytest.importorskip("transformers")
    with pytest.raises(WorkloadError, match=r"model_arg.heads=3 is invalid with hidden=32") as info:
        load_workload("hf:masked-lm", "tiny", model_args={"heads": "3"})
    assert info.value.field == "model_arg.heads"


@pytest.mark.parametrize(
    ("name", "args", "field", "match"),
    [
        (
            "torchvision:resnet18",
            {"widht": "3"},
            "model_arg.widht",
            r"model_arg 'widht' is unknown for torchvision:<model_name>: allowed batch, image, "
            r"classes, channels, batches, lr, weight_decay",
        ),
        (
            "hf:causal-lm",
            {"classes": "3"},
            "model_arg.classes",
            r"unknown for hf:causal-lm: allowed .*arch",
        ),
        (
            "torchvision:resnet18",
            {"batch": "two"},
            "model_arg.batch",
            r"model_arg.batch='two' is invalid: allowed an integer in 1\.\.65536",
        ),
        (
            "timm:resnet10t",
            {"image": "4"},
            "model_arg.image",
            r"model_arg.image='4' is invalid: allowed an integer in 8\.\.4096",
        ),
        (
            "torchvision:resnet18",
            {"channels": "1"},
            "model_arg.channels",
            r"model_arg.channels='1' is invalid: allowed one of 3",
        ),
        ("hf:seq-cls", {"lr": "nan"}, "model_arg.lr", r"model_arg.lr='nan' is invalid"),
        (
            "hf:masked-lm",
            {"mask_prob": "1.5"},
            "model_arg.mask_prob",
            r"allowed a number in 0\.\.1",
        ),
        ("hf:translation", {}, "workload", r"allowed hf:causal-lm, hf:masked-lm, hf:seq-cls"),
        ("torchvision:", {}, "workload", r"names no model: allowed torchvision:<model_name>"),
        (
            "examples.my_workload:build",
            {"batch": "2"},
            "model_arg",
            r"takes no model args \(got batch\): they apply to torchvision:, timm:, hf: ",
        ),
        ("transformer", {"seq": "8"}, "model_arg", r"takes no model args"),
    ],
)
def test_bad_names_and_options_need_no_library(
    name: str, args: dict[str, str], field: str, match: str
) -> None:
    # The options are checked before the library is imported: these run without the extra.
    with pytest.raises(WorkloadError, match=match) as info:
        resolve_factory(name, args)
    assert info.value.field == field


def test_an_arch_no_model_type_is_spelled_like_is_refused_with_its_study_name_and_no_library() -> (
    None
):
    # Any other lowercase type is looked up in transformers (tests/trainers/test_text_archs.py).
    with pytest.raises(
        WorkloadError,
        match=r"model_arg.arch='Llama' is invalid \(did you mean "
        r"llama\?\): allowed gpt2, llama, qwen2, gpt_neox, mistral, or another "
        r"transformers model type",
    ) as info:
        workload_key("hf:causal-lm", "tiny", {"arch": "Llama"})
    assert info.value.field == "model_arg.arch"


def test_an_unknown_preset_names_the_presets() -> None:
    with pytest.raises(WorkloadError, match=r"preset='large' is invalid .*tiny, small, default"):
        workload_key("hf:seq-cls", "large")


def test_a_missing_library_names_the_extra() -> None:
    with pytest.raises(WorkloadError, match=r'pip install "streamtune\[models\]"') as info:
        require("no_such_model_library_xyz", workload="timm:resnet10t")
    assert info.value.field == "workload"
    assert INSTALL == 'pip install "streamtune[models]"'


# -- names, options, catalog ------------------------------------------------------------------


def test_import_trainers_imports_no_model_library() -> None:
    code = (
        "import sys, trainers\n"
        "from trainers.workloads import catalog, workload_key\n"
        "catalog(); workload_key('hf:causal-lm', 'tiny', {'seq': '8'})\n"
        "print(sorted(m for m in ('torchvision', 'timm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="."
    )
    assert out.stdout.strip() == "[]"


def test_workload_key_writes_the_effective_options_sorted() -> None:
    key = workload_key("torchvision:resnet18", "tiny", {"image": "64"})
    assert key == (
        "torchvision:resnet18-tiny-batch=2,batches=8,channels=3,classes=10,image=64,"
        "lr=0.001,weight_decay=0.01"
    )
    # Spelled differently, or given the preset's own value: the same shape, the same key.
    assert workload_key("torchvision:resnet18", "tiny", {"batch": " 02"}) == workload_key(
        "torchvision:resnet18", "tiny"
    )
    keys = {
        workload_key("hf:causal-lm", "tiny"),
        workload_key("hf:causal-lm", "tiny", {"arch": "llama"}),
        workload_key("hf:causal-lm", "small"),
        workload_key("hf:causal-lm", "tiny", {"seq": "32"}),
        workload_key("hf:masked-lm", "tiny"),
    }
    assert len(keys) == 5
    assert workload_key("transformer", "small") == "transformer-small"


def test_options_override_the_preset_which_overrides_the_defaults() -> None:
    factory = bind("hf:seq-cls", {"seq": "24", "classes": "5"}, check_model=False)
    assert factory is not None
    options = factory.options("tiny")
    assert (options["seq"], options["classes"], options["hidden"]) == (24, 5, 32)
    assert factory.options("default")["hidden"] == 768
    assert bind("examples.my_workload:build", {}) is None


def test_catalog_lists_every_family_with_presets_and_typed_options() -> None:
    families = {family.name: family for family in catalog()}
    assert list(families) == ["torchvision", "timm", "hf:causal-lm", "hf:masked-lm", "hf:seq-cls"]
    for family in families.values():
        assert {"tiny", "small", "default"} <= set(family.presets)
        assert family.description and family.usage
        assert all(spec.help and spec.allowed() for spec in family.options)
    vision = {spec.name for spec in families["timm"].options}
    assert {"batch", "image", "classes", "channels", "lr"} <= vision
    text = {spec.name for spec in families["hf:seq-cls"].options}
    assert {"batch", "seq", "layers", "hidden", "heads", "vocab", "classes", "lr"} <= text
    assert families["torchvision"].preset_values("tiny")["image"] == 32
    assert families["hf:causal-lm"].preset_values("default")["hidden"] == 768


def test_option_spec_parses_each_type() -> None:
    flag = OptionSpec(name="fused", kind="bool", default=False, help="h")
    assert flag.parse("yes") is True and flag.parse("False") is False
    with pytest.raises(WorkloadError, match=r"model_arg.fused='maybe' is invalid: allowed true"):
        flag.parse("maybe")
    rate = OptionSpec(name="lr", kind="float", default=0.1, low=0.0, high=1.0, help="h")
    assert rate.parse("1e-3") == 1e-3
    with pytest.raises(WorkloadError, match=r"allowed a number in 0\.\.1"):
        rate.parse("inf")
    with pytest.raises(WorkloadError, match=r"model_arg.n='2.5' is invalid: allowed an int"):
        OptionSpec(name="n", kind="int", default=1, low=1, help="h").parse("2.5")


@models
def test_disable_dropout_reaches_patch_dropout_and_router_jitter() -> None:
    """timm's PatchDropout keeps its rate as `prob`, Mixtral's router its jitter as
    `jitter_noise` (from `router_jitter_noise`): both drew random numbers in training after
    `disable_dropout`, so the gate could not compare a user's such model bit for bit."""
    timm = pytest.importorskip("timm")
    transformers = pytest.importorskip("transformers")
    vit = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=3, patch_drop_rate=0.5
    )
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, router_jitter_noise=0.5,
    )  # fmt: skip
    mixtral = transformers.MixtralForCausalLM(config)
    inputs = [torch.randn(2, 3, 32, 32), torch.randint(0, 64, (2, 8))]
    for model, x in zip((vit, mixtral), inputs, strict=True):
        model.train()
        assert disable_dropout(model) > 0
        outputs = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            out = model(x) if model is vit else model(input_ids=x).logits
            outputs.append(out.detach())
        assert torch.equal(*outputs), type(model).__name__
