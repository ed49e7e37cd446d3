"""The losses of the `hf:` text workloads (`trainers.workloads.text`): the model's own
(`labels=`), as a Hugging Face training loop computes it. With eager attention each passes a
ready-made 4D mask made on the device, so that transformers builds none from a host value
(`trainers.workloads.text` says why).
"""

from __future__ import annotations

import torch
from torch import nn

from trainers.workloads.base import Batch


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
