"""One FX-graph cache key for one graph in every process, whatever it imported first.

Inductor keys its FX-graph cache (and AOTAutograd's) by pickling what a graph is compiled for,
each example input's metadata among it, with a pickler that starts from `copyreg`'s table. A
memory format (`torch.contiguous_format`) pickles as a global whose module pickle has to look
for (it has no `__module__`): the first module in `sys.modules` that holds the name `torch`.
Which module that is depends on what the process imported before torch and in what order, so
two processes can key the same graph apart. On an H200 (torch 2.11, 2026-12-04) the tuner's
profiles' child keyed every contiguous input apart from the measuring process (the graphs' text
the same, the keys not) and compiled the recommended config cold: 131 s of a 542 s job.

`register` gives memory formats a reducer of their own, by name through this module, so every
process that imports `trainers` pickles them to the same bytes. It is set once, at import (by
`trainers.compilation`); a key computed before it differs from one computed after, so artefacts
written by a process without it are missed once, then written again under the stable key.
The reducer is process-wide: anything this process pickles with a memory format in it (an
AOTAutograd cache entry's metadata) loads back only where `trainers` is importable; elsewhere
Inductor counts that entry a miss.
"""

from __future__ import annotations

import copyreg
from typing import Any

import torch

_FORMATS: dict[str, torch.memory_format] = {
    str(fmt): fmt
    for fmt in (
        torch.contiguous_format,
        torch.channels_last,
        torch.channels_last_3d,
        torch.preserve_format,
    )
}


def memory_format(name: str) -> torch.memory_format:
    """The memory format named `name` (its `str`, e.g. "torch.contiguous_format"): what a
    pickled memory format loads back as."""
    return _FORMATS[name]


def _reduce(fmt: torch.memory_format) -> tuple[Any, tuple[str]]:
    return memory_format, (str(fmt),)


def register() -> None:
    """Pickle memory formats by name through `memory_format` in this process (see the module
    doc). Idempotent."""
    copyreg.pickle(torch.memory_format, _reduce)
