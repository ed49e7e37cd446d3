"""`trainers.cache_key`: a graph's FX-graph cache key does not depend on what a process imported
first, so a child process finds what another process compiled (the H200 record:
docs/benchmarks/fx-keys-h200-2026-12-04.md)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch

import trainers  # noqa: F401 - registers the memory formats' reducer

# A process whose import order puts a module holding `torch` ahead of torch's own: pickle then
# names `torch.contiguous_format` through that module, as the profiles' child did on the H200.
_PREAMBLE = """
import sys, types
if {first}:
    first = types.ModuleType("aaa_imported_first")
    sys.modules["aaa_imported_first"] = first
import torch
if {first}:
    first.torch = torch
if {with_trainers}:
    import trainers
"""

_KEY = """
import torch.fx
from torch._inductor.codecache import FxGraphCachePickler
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    contiguous = torch.empty(8, 16)
pickler = FxGraphCachePickler(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()))
print(pickler.get_hash(contiguous))
"""

_COMPILE = """
import json
from torch import nn
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
step = torch.compile(model)
step(torch.randn(8, 16)).square().mean().backward()
print(json.dumps(dict(counters["inductor"])))
"""


def _run(body: str, *, first: bool, with_trainers: bool, env: dict[str, str]) -> str:
    code = _PREAMBLE.format(first=first, with_trainers=with_trainers) + body
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_every_memory_format_pickles_back_to_itself() -> None:
    for fmt in (
        torch.contiguous_format,
        torch.channels_last,
        torch.channels_last_3d,
        torch.preserve_format,
    ):
        assert pickle.loads(pickle.dumps(fmt)) is fmt
    assert b"trainers.cache_key" in pickle.dumps(torch.contiguous_format)


def test_a_contiguous_input_keys_the_same_whatever_was_imported_first() -> None:
    env = dict(os.environ)
    keyed = {
        (first, with_trainers): _run(_KEY, first=first, with_trainers=with_trainers, env=env)
        for first in (False, True)
        for with_trainers in (False, True)
    }
    # torch's own pickling, for the record: where it keys the two orders alike, this test
    # still holds and the reducer is no longer needed.
    torch_alone_differs = keyed[(False, False)] != keyed[(True, False)]
    assert keyed[(False, True)] == keyed[(True, True)], (
        f"with trainers imported the key still depends on import order ({keyed}); "
        f"without it: {'differs' if torch_alone_differs else 'the same'}"
    )


def test_a_process_of_another_import_order_reads_the_graphs_another_compiled(
    tmp_path: Path,
) -> None:
    """Real compiles on the CPU into one Inductor cache folder: the second process, whose
    import order differs, finds every FX graph the first wrote."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
    written = json.loads(_run(_COMPILE, first=False, with_trainers=True, env=env))
    read = json.loads(_run(_COMPILE, first=True, with_trainers=True, env=env))
    assert written.get("fxgraph_cache_miss", 0) >= 2, written  # forward and backward, cold
    assert read.get("fxgraph_cache_hit", 0) == written["fxgraph_cache_miss"], (written, read)
    assert read.get("fxgraph_cache_miss", 0) == 0, read
