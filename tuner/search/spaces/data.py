"""What a workload's data rules out of its space.

An IterableDataset is copied into every DataLoader worker process by PyTorch: each worker yields
the whole stream, unless the dataset shards it by `torch.utils.data.get_worker_info()`, so a
config with workers trains on each batch several times, in another order, and fails the gate
(bit for bit against the loop without workers). A second new user's trial (2026-12-02) lost 2 of
3 trials so, with a message about bits. Searched, `num_workers` is fixed at 0 for such a dataset,
with a note; pinned by the user (`--fix num_workers=N`: a dataset that shards), it is kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch.utils.data import IterableDataset

from tuner.search.spaces.space import SearchSpace

STREAM_NOTE = (
    "num_workers fixed at 0: the dataset is an IterableDataset, which each DataLoader worker "
    "copies whole unless it shards by get_worker_info(); --fix num_workers=N runs N"
)


def for_data(space: SearchSpace, dataset: Any) -> SearchSpace:
    """`space` with `num_workers` fixed at 0 (with a note) where `dataset` is an IterableDataset
    and the space searches it; else `space`."""
    if not isinstance(dataset, IterableDataset) or "num_workers" not in space.params:
        return space
    return dataclasses.replace(
        space,
        params={f: s for f, s in space.params.items() if f != "num_workers"},
        fixed={**space.fixed, "num_workers": 0},
        notes=(*space.notes, STREAM_NOTE),
    )
