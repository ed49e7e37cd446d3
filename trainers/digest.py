"""A model's architecture as a short digest: its module tree and every parameter's and buffer's
name, shape and dtype. The tuner stores it with each study (`tuner.search.identity`: a run whose
model changed gets a study of its own) and the script `python -m tuner export --format python`
writes checks it when it builds the model, so that a recommendation measured on one model is not
applied to an edited one without a word (a new user's trial, 2026-12-03)."""

from __future__ import annotations

import hashlib

from torch import nn

DIGEST_LENGTH = 8  # hex digits: a name a user can type, no collision among one user's edits


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:DIGEST_LENGTH]


def architecture_digest(model: nn.Module) -> str:
    shapes = [(n, tuple(p.shape), str(p.dtype)) for n, p in model.state_dict().items()]
    return digest(repr(model), repr(shapes))
