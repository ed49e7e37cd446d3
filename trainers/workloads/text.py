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
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

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
    "LlamaForCausalLM, Qwen2ForCausalLM, GPTNeoXForCausalLM or MistralForCausalLM), random "
    "weights, next-token loss",
    options=(
        *SHAPE_OPTIONS,
        data_option("stream"),
        OptionSpec(
            name="arch",
            kind="str",
            default="gpt2",
            choices=("gpt2", "llama", "qwen2", "gpt_neox", "mistral"),
            help="the architecture: GPT2Config, LlamaConfig, Qwen2Config, GPTNeoXConfig or "
            "MistralConfig (the family's own defaults for what no option sets)",
        ),
        OptionSpec(
            name="kv_heads",
            kind="int",
            default=0,
            low=0,
            high=1024,
            help="key/value heads for grouped-query attention (arch=llama, qwen2 or mistral; "
            "must divide heads); 0: as many as heads",
        ),
        OptionSpec(
            name="ffn",
            kind="int",
            default=0,
            low=0,
            high=1_048_576,
            help="feed-forward width (SwiGLU's for llama, qwen2 and mistral); 0: 4 x hidden",
        ),
        OptionSpec(
            name="tie",
            kind="str",
            default="auto",
            choices=("auto", "true", "false"),
            help="output head tied to the input embeddings; auto: the architecture's config "
            "default (tied for gpt2, untied for the others; Qwen2's 0.5B and 1.5B models tie)",
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
)
FAMILIES: Mapping[str, Family] = {
    f.name.removeprefix("hf:"): f for f in (CAUSAL_LM, MASKED_LM, SEQ_CLS)
}


def check_transformers(name: str, kind: str) -> None:
    require("transformers", workload=name)


GQA_ARCHS = ("llama", "qwen2", "mistral")
"""The architectures whose config takes key/value heads apart from query heads."""
GPT_NEOX_ROTARY = 0.25
"""The share of each head GPT-NeoX rotates (`rotary_pct`: its config's default, Pythia's)."""


def check_shape(options: Mapping[str, Value]) -> None:
    """What no single option can say: the heads split the width (into rotatable head widths, for
    the rotary architectures), and key/value heads only where the architecture has them."""
    hidden, heads = int(options["hidden"]), int(options["heads"])
    arch = options.get("arch")
    if hidden % heads:
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden}: allowed a divisor of hidden",
            field="model_arg.heads",
        )
    kv_heads = int(options.get("kv_heads", 0))
    if kv_heads and arch not in GQA_ARCHS:
        raise WorkloadError(
            f"model_arg.kv_heads={kv_heads} is invalid with arch={arch}: allowed 0 "
            f"(grouped-query attention is built for arch={', '.join(GQA_ARCHS)} only)",
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
    if arch == "gpt_neox" and (rotated < 2 or rotated % 2):
        raise WorkloadError(
            f"model_arg.heads={heads} is invalid with hidden={hidden} and arch=gpt_neox: allowed "
            f"heads that leave a head width hidden/heads whose rotated quarter (rotary_pct "
            f"{GPT_NEOX_ROTARY}) is an even number of at least 2, not {width} (quarter "
            f"{rotated}): e.g. a head width that is a multiple of 8",
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
    if kind == "causal-lm" and options.get("tie", "auto") != "auto":
        common["tie_word_embeddings"] = options["tie"] == "true"
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
    built: nn.Module
    if kind == "masked-lm":
        built = transformers.BertForMaskedLM(config)
        return built
    if kind == "seq-cls":
        built = transformers.BertForSequenceClassification(config)
        return built
    causal = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "gpt_neox": "GPTNeoXForCausalLM",
        "mistral": "MistralForCausalLM",
    }
    if options["arch"] in causal:
        built = getattr(transformers, causal[str(options["arch"])])(config)
        return built
    model = transformers.GPT2LMHeadModel(config)
    # transformers picks the loss from the class name, and "GPT2LMHeadModel" names none; said
    # here, or it warns before falling back to this same loss.
    model.loss_type = "ForCausalLM"
    built = model
    return built


def successor_table(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """The chain's fixed random successor of each token: entry t - FIRST_TOKEN is the token that
    follows t (a permutation of [FIRST_TOKEN, vocab)). Drawn once per seed: the structure a
    model learns, the same in every batch."""
    return FIRST_TOKEN + torch.randperm(vocab - FIRST_TOKEN, generator=generator)


def jumps(successor: torch.Tensor, seq: int) -> torch.Tensor:
    """(log2(seq), len(successor)): row j is the successor table applied 2**j times, indexed by
    token - FIRST_TOKEN; what `walk` needs for sequences of `seq` tokens."""
    rows = [successor]
    for _ in range(1, max(1, (seq - 1).bit_length())):
        rows.append(rows[-1][rows[-1] - FIRST_TOKEN])
    return torch.stack(rows)


def walk(powers: torch.Tensor, random: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """The chain over the last dimension: token t is `random[t]` where `noisy[t]` (and at t=0),
    else the successor of token t-1, the recurrence

        tokens[0] = random[0]; tokens[t] = random[t] if noisy[t] else successor(tokens[t-1])

    computed without a loop over positions: a token `hops` steps after the last random one is
    that token advanced `hops` times through the table, which its binary powers (`powers`, from
    `jumps`) do in log2(seq) gathers over the whole tensor. The same tokens as the loop, bit for
    bit (tests/trainers/test_token_stream.py)."""
    seq = random.shape[-1]
    position = torch.arange(seq)
    # Where each token's run began: the last noisy position at or before it, else 0.
    began = torch.where(noisy, position, 0).cummax(dim=-1).values
    hops = position - began
    tokens = random.gather(-1, began)
    for bit in range((seq - 1).bit_length()):
        tokens = torch.where((hops >> bit) & 1 == 1, powers[bit][tokens - FIRST_TOKEN], tokens)
    return tokens


def chain_tokens(options: Mapping[str, Value], generator: torch.Generator) -> torch.Tensor:
    """int64 token ids in [FIRST_TOKEN, vocab), (batches, batch, seq): each token follows its
    predecessor through a fixed random successor table, or is drawn at random (NOISE), so a
    language model has something to learn and its loss falls. The batches of data=fixed."""
    n, b, s = int(options["batches"]), int(options["batch"]), int(options["seq"])
    successor = successor_table(int(options["vocab"]), generator)
    random = torch.randint(FIRST_TOKEN, int(options["vocab"]), (n, b, s), generator=generator)
    noisy = torch.rand(n, b, s, generator=generator) < NOISE
    return walk(jumps(successor, s), random, noisy)


def label(
    kind: str, tokens: torch.Tensor, options: Mapping[str, Value], generator: torch.Generator
) -> Batch:
    """The batch (or stacked batches) of a model `kind` made from `tokens`: what it reads and
    what it is trained to predict; masked-lm draws its masks from `generator`."""
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


def make_batches(kind: str, options: Mapping[str, Value], generator: torch.Generator) -> Batch:
    """The `batches` batches of data=fixed, stacked (SyntheticBatches)."""
    return label(kind, chain_tokens(options, generator), options, generator)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser: nearby inputs (seed 0 and 1, batch 5 and 6) give unrelated 64-bit
    outputs, so consecutive batches and neighbouring seeds get generators that look unrelated
    (`seed + index` would give seed 0's batch 1 and seed 1's batch 0 the same tokens)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def batch_seed(seed: int, index: int) -> int:
    """The generator seed of batch `index` of the stream of `seed`, in [0, 2**64)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ index)


STREAM_LENGTH = 1 << 30
"""Batches in a stream: more than any run takes (the feed reads batch `step % len`, and a
billion steps at a millisecond each is 12 days), so no batch repeats within a run. Nothing
lists them: the feed's samplers and subsets are ranges, and each batch is made when it is read."""


class TokenStream(Dataset[Batch]):
    """The batches of data=stream: batch i is a deterministic function of (seed, i), made when it
    is read, never stored, so every step trains on a batch the model has not seen.

    Every batch walks the same successor table (`successor_table`, fixed per seed: the learnable
    structure, the same one data=fixed uses); its random tokens, where the chain breaks
    (NOISE) and masked-lm's masks come from a generator seeded by `batch_seed(seed, i)`, fresh
    per index. So the batch depends on nothing but (options, seed, i): not on the process, the
    DataLoader worker or the order of reads (a resumed run, another config in the gate, each
    data-parallel rank slicing its shard of the same global batch all see the same tokens), and
    reading it draws nothing from torch's global generators. It pickles as its options and the
    table, for DataLoader workers.

    Making a batch takes 1.8-3 ms for 8 x 2048 tokens and 3.2-4.8 ms for 16 x 2048 on one CPU
    thread (torch 2.14, a shared 2-core machine; the loop over positions of `chain_tokens` before
    `walk` took 27 ms for 8 x 2048): well inside a 1B model's step, and made in a DataLoader
    worker when the loop has them.
    """

    def __init__(
        self, kind: str, options: Mapping[str, Value], seed: int, *, length: int = STREAM_LENGTH
    ) -> None:
        self.kind = kind
        # Only what a batch needs: plain values, so the dataset pickles small and alone.
        self.options: dict[str, Value] = {
            key: options[key]
            for key in ("batch", "seq", "vocab", "classes", "mask_prob")
            if key in options
        }
        self.seed = seed
        self.length = length
        self.successor = successor_table(
            int(options["vocab"]), torch.Generator().manual_seed(seed + 1)
        )
        self._powers: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The table's powers are log2(seq) times its size (136 MB at vocab 1M, seq 131072): made
        # again where the dataset lands (a worker) rather than pickled to it.
        return {**vars(self), "_powers": None}

    def powers(self) -> torch.Tensor:
        if self._powers is None:
            self._powers = jumps(self.successor, int(self.options["seq"]))
        return self._powers

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Batch:
        # A plain int, whatever the sampler handed over (a numpy or 0-d tensor index would
        # otherwise reach the seed's arithmetic).
        index = operator.index(index)
        if not 0 <= index < self.length:
            raise IndexError(f"batch {index} of a stream of {self.length}")
        generator = torch.Generator().manual_seed(batch_seed(self.seed, index))
        shape = (int(self.options["batch"]), int(self.options["seq"]))
        random = torch.randint(FIRST_TOKEN, int(self.options["vocab"]), shape, generator=generator)
        noisy = torch.rand(shape, generator=generator) < NOISE
        return label(self.kind, walk(self.powers(), random, noisy), self.options, generator)


def make_dataset(kind: str, options: Mapping[str, Value], seed: int) -> Dataset[Batch]:
    """The workload's batches: a TokenStream (data=stream), or `batches` fixed ones."""
    if options["data"] == "stream":
        return TokenStream(kind, options, seed)
    return SyntheticBatches(make_batches(kind, options, torch.Generator().manual_seed(seed + 1)))


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
    eager = options["attention"] == "eager"
    loss_fn: LossFn = labelled_loss_eager if eager else labelled_loss
    if model == "causal-lm":
        loss_fn = causal_lm_loss_eager if eager else causal_lm_loss
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
