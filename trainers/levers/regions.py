"""`compile_regions`: with the whole model compiled, whether each repeated block is a nested
compile region (`blocks`) or traced and compiled like the rest (`none`, the default).

A whole-model compile traces and compiles every decoder layer again, though they are the same
code on parameters of the same shapes: on one H200 at 2c9259f the Qwen1.5-0.5B shape's three
whole-model trials compiled 69 s (bf16), 177.5 s (float8 with the head) and 63.7 s (the head
alone), 310 s of a cold job of 822 s (docs/benchmarks/README.md, 2026-12-02), while the same
model with each layer compiled on its own (`compile_scope='blocks'`) compiled in 11-13 s and ran
its step 1.2x slower. `torch.compiler.nested_compile_region` (torch 2.8 on) marks a function that
Dynamo traces once and Inductor compiles once for every call with inputs of the same kind; the
model stays one compiled graph around the calls, so what lies between the blocks (the head, the
loss, the embedding) is still compiled with them. Each repeated block
(`trainers.blocks.find_blocks`) is given, for the run, a subclass of its class whose `forward`
is the marked one (one subclass per class for the process: a new class each run would fail
Dynamo's type guards and compile again), and its own class back after.

On this project's CPU (torch 2.13), each in a new process from an empty Inductor cache, a stack
of 24 residual MLP blocks of 256 features compiled and ran its first step in 14.7-15.1 s marked
against 21.7-23.4 s, with the same loss and gradients (the fixed cost of a first compile in a
process is most of both; 5.8 s against 16.5 s measured in one process, the plain one first,
said more than that). On a
GPU, whether Hugging Face decoder layers and float8's tensor subclasses go through the region,
and what the step loses where Inductor's fusion stops at each block's edge, is not measured:
`benchmarks/compile_regions.py` measures both, and until it has the built-in spaces do not
search this lever (`offered` is empty); `--fix compile_regions=blocks` runs it. Fusion that
stops at the blocks' edges rounds otherwise: the gate judges it by equivalence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainers.blocks import find_blocks
from trainers.errors import ConfigError
from trainers.levers.declare import Lever, Undo, Value, nothing, ranked, register

_REGION_CLASSES: dict[type[nn.Module], type[nn.Module]] = {}
"""Each block class's marked subclass, made once for the process (`_marked`)."""


def _marked(cls: type[nn.Module]) -> type[nn.Module]:
    made = _REGION_CLASSES.get(cls)
    if made is None:
        forward: Any = torch.compiler.nested_compile_region(cls.forward)
        made = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
        _REGION_CLASSES[cls] = made
    return made


def _inert(get: Callable[[str], Value]) -> bool:
    """Nothing compiles the whole model: no region to mark inside it."""
    return get("compile") == "none" or get("compile_scope") != "model"


def _conflicts(value: Value, get: Callable[[str], Value]) -> str | None:
    if value != "blocks":
        return None
    if _inert(get):
        return (
            "none unless the whole model is compiled; compile_regions='blocks' goes with "
            "compile other than 'none' and compile_scope='model'"
        )
    for name in ("activation_checkpointing", "parallel"):
        if get(name) != "none":
            return (
                f"none beside {name}={get(name)!r} (not run together yet); "
                f"compile_regions='blocks' goes with {name}='none'"
            )
    return None


def _refuse_for(value: Value, model: nn.Module) -> str | None:
    if value != "blocks":
        return None
    if not hasattr(torch.compiler, "nested_compile_region"):
        return f"none on torch {torch.__version__} (torch.compiler.nested_compile_region: 2.8 on)"
    if not find_blocks(model):
        return f"none for {type(model).__name__}, in which no block repeats"
    return None


def _mark_blocks(value: Value, model: nn.Module) -> Undo:
    if value != "blocks":
        return nothing
    refused = _refuse_for(value, model)
    if refused is not None:
        raise ConfigError("compile_regions", value, refused)
    originals = [(block, type(block)) for block in find_blocks(model)]
    for block, cls in originals:
        block.__class__ = _marked(cls)

    def undo() -> None:
        for block, cls in originals:
            block.__class__ = cls

    return undo


COMPILE_REGIONS = Lever(
    name="compile_regions",
    label="with the whole model compiled: each repeated block a nested compile region, or not",
    kind="str",
    default="none",
    added=9,
    options=ranked(("none", "none", "exact", 0), ("blocks", "compile", "equivalence", 1)),
    refuse_for=_refuse_for,
    transform=_mark_blocks,
    conflicts=_conflicts,
    inert=_inert,
    offered=(),
)
register(COMPILE_REGIONS)
