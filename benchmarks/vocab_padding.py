"""Does padding the output vocabulary to a multiple of 64 pay? The LM head and its loss, forward
and backward, at a model's own shapes, with the vocabulary as the model has it and padded.

GPT-2's vocabulary, 50,257, is odd: the head's matmul then has an output dimension no tensor-core
tile divides, and its logits rows are not 16-byte aligned. A padded head (extra rows whose logits
are sliced off before the loss, so the loss is the same function) is the folk remedy. This
measures it before any lever is built on it:

    python benchmarks/vocab_padding.py --commit <sha> --out DIR

Each row: `eager` (the head's matmul, the logits upcast to float32, `F.cross_entropy`, as
Hugging Face's loss does it) and `compiled` (the same under `torch.compile`), each also `padded`
(the head padded to the next multiple of 64 rows, the logits sliced back before the loss), timed
by CUDA events, forward and backward, the median of 3 groups of 20 calls after 5 warm-up.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
from collections.abc import Callable

import torch
import torch.nn.functional as F

from trainers.levers.timing import timed_ms

SHAPES = [(1280, 50257), (2048, 50257), (2048, 50304), (896, 151936)]
"""(hidden, vocabulary): GPT-2-large's, a 2,048-wide model with GPT-2's tokenizer, Pythia's
(already a multiple of 64: the control) and Qwen2's (a multiple of 64 too)."""


def _loss(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, vocab: int
) -> torch.Tensor:
    logits = hidden @ weight.t()
    # The padded rows' logits leave before the loss: the same function as the unpadded head.
    return F.cross_entropy(logits[:, :vocab].float(), labels)


def _step(
    fn: Callable[..., torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab: int,
) -> Callable[[], None]:
    def step() -> None:
        hidden.grad = weight.grad = None
        fn(hidden, weight, labels, vocab).backward()

    return step


def measure(width: int, vocab: int, rows: int, device: torch.device) -> dict[str, float | int]:
    padded = -(-vocab // 64) * 64
    hidden = torch.randn(rows, width, device=device, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,), device=device)
    weight = (torch.randn(vocab, width, device=device) * 0.02).to(torch.bfloat16).requires_grad_()
    wide = torch.cat([weight.detach(), weight.new_zeros(padded - vocab, width)]).requires_grad_()
    # One compiled function per variant and shape: a shared one recompiles per shape and, past
    # Dynamo's recompile limit (8), runs eager without a word.
    torch._dynamo.reset()
    compiled, compiled_wide = torch.compile(_loss), torch.compile(_loss)
    result: dict[str, float | int] = {"hidden": width, "vocab": vocab, "padded_vocab": padded}
    for name, fn, w in [
        ("eager_ms", _loss, weight),
        ("eager_padded_ms", _loss, wide),
        ("compiled_ms", compiled, weight),
        ("compiled_padded_ms", compiled_wide, wide),
    ]:
        result[name] = round(timed_ms(_step(fn, hidden, w, labels, vocab), device, 5, 20), 3)
    # The same function: the padded head's loss matches the plain one's.
    # Under grad mode as timed (a change of grad mode is a recompile), each with its own function.
    gap = compiled_wide(hidden, wide, labels, vocab) - compiled(hidden, weight, labels, vocab)
    result["loss_gap"] = float(gap.detach().abs())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--rows", type=int, default=8 * 2048, help="tokens a step (8 x 2048)")
    args = parser.parse_args()
    device = torch.device("cuda")
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    rows = [measure(w, v, args.rows, device) for w, v in SHAPES]
    record = {
        "gpu": smi.split(",")[0].strip(),
        "driver": smi.split(",")[1].strip(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "commit": args.commit,
        "tokens": args.rows,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vocab-padding.json").write_text(json.dumps(record, indent=1) + "\n")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
