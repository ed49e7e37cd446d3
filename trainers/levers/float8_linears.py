"""`float8_linears`: which of the linears a float8 run converts stay converted: `all` (the
default: every one `trainers.float8.Float8Plan` takes, as torchao's and torchtitan's recipes
convert them), only those whose weight has at least 4M or 8M elements (`4M`, `8M`: 4 x 2^20
and 8 x 2^20), or `none`, the rest put back in bf16. `none` leaves only the output head in
float8, so it needs `float8_head='float8'` beside it (`conflicts`): the head of a large
vocabulary is the step's largest matmul (151,936 x 1,024 on the Qwen1.5-0.5B shape, 155M of its
464M parameters), while every other linear of such a model is small enough to lose in float8.

Tensorwise float8 adds casts and scale reductions around each matmul, in proportion to its
input and output, not to its multiply-adds: a small matmul can lose more to them than its float8
tensor cores save. Each linear shape compiled on its own, forward and backward at 16,384 rows on
one H200, the step captured in a CUDA graph (`benchmarks/float8_shapes.py`, docs/benchmarks/
README.md, 2026-12-02): at `llama-1b` the MLP's 2048 x 8192 and 8192 x 2048 ran 1.26x and 1.40x
in float8, the attention's 2048 x 2048 1.17x and 2048 x 512 0.76x; on the Qwen1.5-0.5B shape
every 1024-wide linear ran 0.82-0.99x. Timed as launched (the records of 2026-11-30, and this
probe before), a small linear's figure was the host's time to launch its kernels (0.99 ms in
float8 at 2048 x 512, against 0.22 ms graphed), and the probe's sums were wrong in sign at
`llama-1b` (-23.9 ms a step for float8's linears, against +25.6 ms graphed) and 30x too large at
the Qwen1.5 shape (-94.3 ms against -3.0 ms; the whole step ran 0.5 ms faster with `none`).

Alone, each linear casts its input itself; in the whole model compiled, the linears that read
one input (a decoder's q/k/v projections, its gate and up) share one cast of it. Timed alone at
the Qwen2-style 0.49B shape (one H200, 2026-12-04, `benchmarks/float8_blocks.py`), the 896 x 896
and 896 x 128 projections lost in float8 and the sum said float8 costs its linears +1.80 ms a
step; timed in their groups, -1.19 ms; whole-step trials measured `none` 2.4 and 3.2 ms a step
slower than `all` (the probe had enqueued it twice, at a predicted 1.6-1.7 ms gain). At
`llama-1b` the groups gave -35.7 ms against -26.5 alone (the 2048-wide model cut to two layers
and compiled whole: -32.7).

Its probe (`Lever.probe`) groups the linears the plan converts by the input they read in one
forward (`sibling_calls`), times each distinct group once for each mix of bf16 and float8 a
value gives it (float8 members compiled together with the rest, so their input's cast is
shared; all-bf16 eager), forward and backward on the rows that forward gives it (`group_ms`),
and sums for each value what its groups would run in; empty where the model has nothing to
convert, and every value says why where float8 cannot run. The built-in spaces offer `8M` (the
best of the three on the three models timed as launched; graphed, `all` leads at `llama-1b`)
and `none`; `4M` is a user's `--fix`. Set by hand beside a head in bf16, `none` is refused; a
search that draws that pair runs `all` (`inert`). The second stage reaches it by moving a bf16
leader into float8 with its head alone in float8 (`unconverted`: the value whose linears run as
a bf16 step's). At `llama-1b` (2026-11-30, one H200, the whole model compiled, the head in float8)
`8M` ran 0.976x (0.971-0.986) the same step with `all`, as the graphed figures say (it puts back
the 2048 x 2048 linears, which gain in float8), and a default job on `llama-1b-large` screened
its `8M` trial out at 2 % behind: a trial decides, as below.

Its effect (`Lever.transform`) runs after the run's float8 conversion and the float8 head's: each
converted linear (a `Float8Linear`, or a `Float8Conv1D` from GPT-2's `Conv1D`) whose weight is
under the value's size, other than the output head (`float8_head` decides that one), becomes an
`nn.Linear` or a `Conv1D` again holding the very same Parameters; the run's float8 report counts
what still runs in float8 (`trainers.float8.Float8Report.after_levers`). Refused in one line on a
device other than CUDA, in a precision other than float8, beside a head kept in bf16 for
`none`, and for a model where a size would keep nothing in float8 or put nothing back.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainers import float8
from trainers.errors import ConfigError
from trainers.kept_code import compile_apart
from trainers.levers.declare import (
    TABLE,
    Lever,
    ProbeInput,
    Undo,
    Value,
    nothing,
    ranked,
    register,
)
from trainers.levers.timing import graphed, timed_ms

SIZES = {"4M": 4 << 20, "8M": 8 << 20}
"""The smallest weight (elements) a size keeps in float8."""
NONE = "none"
"""The value that keeps none of them in float8 (the head aside)."""


def _least(value: Value) -> float:
    """The smallest weight (elements) `value` keeps in float8: 0 for all, none for `none`."""
    if value == "all":
        return 0
    return math.inf if value == NONE else SIZES[str(value)]


Shape = tuple[int, int, bool]
"""A linear's in features, out features and whether it has a bias."""
Group = tuple[Shape, ...]
"""The linears one forward calls one after another on one input (q/k/v; gate and up)."""
Mix = tuple[bool, ...]
"""Which of a group's linears run in float8."""


def _refuse_on(value: Value, device: str) -> str | None:
    if value != "all" and device != "cuda":
        return f"float8_linears={value!r} chooses among float8 matmuls, which {device} lacks"
    return None


def _refuse_in(value: Value, precision: str) -> str | None:
    if value != "all" and precision != "float8":
        return f"all unless the run's precision is float8 (this run's is {precision})"
    return None


def converted_linears(model: nn.Module) -> dict[str, Shape]:
    """The linears a float8 run converts (the output head aside), by qualified name: on a model
    the run converted, its float8 modules; on a plain one, what `Float8Plan.of` would convert."""
    heads = float8.output_heads(model)
    converted = {n: m for n, m in model.named_modules() if float8.is_float8(m) and n not in heads}
    if not converted:
        plan = float8.Float8Plan.of(model)
        converted = {n: model.get_submodule(n) for n in plan.converted}
    shapes: dict[str, Shape] = {}
    for name, module in converted.items():
        # A Float8Linear (a Float8Conv1D too) is an nn.Linear: its in and out features.
        dims = float8.linear_dims(module)
        assert dims is not None  # the plan and the conversion take linears only
        shapes[name] = (dims[0], dims[1], getattr(module, "bias", None) is not None)
    return shapes


def _refuse_for(value: Value, model: nn.Module) -> str | None:
    if value == "all":
        return None
    shapes = converted_linears(model)
    if not shapes:
        return None  # nothing converted: the precision's own refusal names it
    if value == NONE:
        # It keeps nothing by design and puts every one back: what it needs is a head float8
        # can take (the float8 head's own rule: features multiples of 16), or has taken.
        if any(float8.is_float8(model.get_submodule(n)) for n in float8.output_heads(model)):
            return None
        rule = TABLE["float8_head"].refuse_for
        head = None if rule is None else rule("float8", model)
        if head is not None:
            return (
                "all, 4M or 8M for this model: none keeps its head alone in float8, and "
                f"float8_head allows only {head}"
            )
        return None
    least = _least(value)
    kept = [n for n, (i, o, _) in shapes.items() if i * o >= least]
    if not kept:
        name, (i, o, _) = max(shapes.items(), key=lambda kv: kv[1][0] * kv[1][1])
        return (
            f"all for this model: none of its float8 linears has a weight of {value} elements "
            f"or more (the largest, {name}, is {i} x {o})"
        )
    if len(kept) == len(shapes):
        return f"all for this model: every float8 linear's weight has {value} elements or more"
    return None


def _keep_large(value: Value, model: nn.Module) -> Undo:
    if value == "all":
        return nothing
    if not any(float8.is_float8(m) for m in model.modules()):
        raise ConfigError(
            "float8_linears", value, "all unless the run's precision is float8 (nothing converted)"
        )
    refused = _refuse_for(value, model)
    if refused is not None:
        raise ConfigError("float8_linears", value, refused)
    least = _least(value)
    swapped: dict[str, nn.Module] = {}
    for name, (i, o, _) in converted_linears(model).items():
        if i * o < least:
            swapped[name] = model.get_submodule(name)
            _put(model, name, _in_bf16(value, swapped[name], i, o))

    def undo() -> None:
        for name, module in swapped.items():
            _put(model, name, module)

    return undo


def _put(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _in_bf16(value: Value, converted: nn.Module, features_in: int, features_out: int) -> nn.Module:
    """The float8 module `converted` in bf16, holding its Parameters: the very module it was made
    from (`trainers.float8.original_of`: an `nn.Linear`, or a `Conv1D` of whatever library); or,
    for a Float8Linear made elsewhere, an `nn.Linear` on the meta device given its Parameters."""
    original = float8.original_of(converted)
    if original is not None:
        return original
    if type(converted).__name__ == "Float8Conv1D":  # only `convert` makes one: never here
        raise ConfigError(
            "float8_linears", value, "all for a Conv1D converted without its original"
        )
    with torch.device("meta"):
        plain: nn.Module = nn.Linear(features_in, features_out, bias=False)
    plain.weight = converted.weight
    plain.bias = converted.bias
    return plain


def _probe(where: ProbeInput) -> dict[Value, float | str]:
    """Each value's milliseconds a step in the linears the plan converts: every distinct group
    of linears that read one input (with its rows, from one forward) timed once for each mix of
    bf16 and float8 the values give it (`group_ms`), forward and backward; a value sums, for
    each call of a group, the figure of its mix."""
    shapes = converted_linears(where.model)
    if not shapes:
        return {}
    calls = sibling_calls(where, shapes)
    if not calls:
        return {}
    unavailable = float8.unavailable(where.device)
    if unavailable:
        return dict.fromkeys(FLOAT8_LINEARS.values(), unavailable)
    figures: dict[tuple[Group, int, Mix], float] = {}
    out: dict[Value, float | str] = {}
    try:
        for value in FLOAT8_LINEARS.values():
            least = _least(value)
            total = 0.0
            for (group, n_rows), times in calls.items():
                mix = tuple(i * o >= least for i, o, _ in group)
                if (group, n_rows, mix) not in figures:
                    figures[(group, n_rows, mix)] = group_ms(group, n_rows, mix, where.device)
                total += times * figures[(group, n_rows, mix)]
            out[value] = total
    except torch.cuda.OutOfMemoryError:
        raise  # no evidence either way: the search stages the lever unpredicted
    except RuntimeError as exc:  # the compile failed, or no kernel for these shapes
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        return dict.fromkeys(FLOAT8_LINEARS.values(), why)
    return out


def _conflicts(value: Value, get: Callable[[str], Value]) -> str | None:
    if value == NONE and get("float8_head") != "float8":
        return (
            f"all, 4M or 8M beside float8_head={get('float8_head')!r} (with none, nothing would "
            "run in float8): float8_head='float8' with float8_linears='none' keeps the head alone"
        )
    return None


def _inert(get: Callable[[str], Value]) -> bool:
    # `none` names the head alone: beside a head in bf16 there is nothing for it to keep, and a
    # search that draws the pair runs the float8 of the recipes (`all`) instead of a refusal.
    return get("float8_linears") == NONE and get("float8_head") != "float8"


def sibling_calls(where: ProbeInput, shapes: dict[str, Shape]) -> Counter[tuple[Group, int]]:
    """How many calls one forward makes of each group of linear shapes in `shapes` on how many
    rows. A group is the linears called one after another on the same input tensor (q, k and v;
    gate and up): the whole model compiled casts that input to float8 once for all of them. A
    layer called twice a step runs twice; on another input it starts a group of its own."""
    calls: Counter[tuple[Group, int]] = Counter()
    # The group being gathered: its input (held, so that no other tensor can reuse its id), its
    # shapes and rows; a call on another input closes it.
    current: Any = None
    group: list[Shape] = []
    rows = 0

    def close() -> None:
        if group:
            calls[(tuple(group), rows)] += 1
        group.clear()

    def record(name: str) -> Any:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            # None: a pre-hook's result would replace the layer's input.
            nonlocal current, rows
            if args[0] is not current:
                close()
                current, rows = args[0], args[0].numel() // shapes[name][0]
            group.append(shapes[name])

        return hook

    hooks = [where.model.get_submodule(n).register_forward_pre_hook(record(n)) for n in shapes]
    try:
        where.forward()
        close()
    finally:
        for hook in hooks:
            hook.remove()
    return calls


def linear_ms(
    shape: Shape, rows: int, value: str, device: torch.device, iters: int = 10, graph: bool = True
) -> float:
    """One linear of `shape` in `value` (bf16 or float8), timed alone (`group_ms`): what the
    probe timed before it grouped the linears that read one input."""
    return group_ms((shape,), rows, (value == "float8",), device, iters, graph)


def group_ms(
    group: Group,
    rows: int,
    mix: Mix,
    device: torch.device,
    iters: int = 10,
    graph: bool = True,
) -> float:
    """The linears of `group` (fp32 weights, as a run keeps them) on one input of `rows` rows,
    each in float8 where `mix` says so and bf16 otherwise, forward and backward under bf16
    autocast, CUDA events (`timed_ms`) on the step captured in a CUDA graph (`graphed`: the
    whole model compiled launches its layers' kernels back to back, and one layer launched
    alone times the host; `graph=False` times it as launched, as the records of 2026-11-30
    did). With a float8 member the group is compiled together (static shapes), as the whole
    model compiled fuses float8's casts and scales and casts a shared input once; all-bf16
    eager, whose matmuls are the same cuBLAS calls compiled or not (a compile saved: the probe
    runs inside the job's time)."""
    step = group_step(group, rows, mix, device)
    return timed_ms(graphed(step, device) if graph else step, device, warmup=3, iters=iters)


class _Siblings(nn.ModuleList):
    """Linears that read one input: each one's output, in order."""

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(layer(inputs) for layer in self)


def group_step(group: Group, rows: int, mix: Mix, device: torch.device) -> Callable[[], None]:
    """`group_ms`'s step: one forward and backward of fresh linears of `group`'s shapes."""
    holder = _Siblings(nn.Linear(i, o, bias=b, device=device) for i, o, b in group)
    compiled: Any = holder
    if any(mix):
        converted = tuple(str(k) for k, in_float8 in enumerate(mix) if in_float8)
        float8.convert(holder, float8.Float8Plan(converted=converted, kept=()))
        # Each group on a code object of its own (`compile_apart`): one shared by every
        # holder's call would pile up entries past Dynamo's recompile limit (8) and run eager
        # without an error, and a reset would drop the trials' code kept in this process (the
        # leader then compiled again in the gate and the final round, 2026-12-02).
        compiled = compile_apart(holder)
    inputs = torch.randn(rows, group[0][0], device=device, dtype=torch.bfloat16)
    inputs.requires_grad_(True)
    grads = [torch.randn(rows, o, device=device, dtype=torch.bfloat16) for _, o, _ in group]

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            outs = compiled(inputs)
        torch.autograd.backward(outs, grads)
        inputs.grad = None
        holder.zero_grad(set_to_none=True)

    return step


FLOAT8_LINEARS = Lever(
    name="float8_linears",
    label="which linears a float8 run keeps in float8: all (the recipes' choice), those "
    "whose weight has at least 4M or 8M elements, or none (the head alone, with float8_head)",
    kind="str",
    default="all",
    added=8,
    options=ranked(
        ("all", "none", "exact", 0),
        ("4M", "none", "equivalence", 1),
        ("8M", "none", "equivalence", 1),
        (NONE, "none", "equivalence", 1),
    ),
    refuse_on=_refuse_on,
    refuse_in=_refuse_in,
    refuse_for=_refuse_for,
    transform=_keep_large,
    probe=_probe,
    conflicts=_conflicts,
    inert=_inert,
    offered=("all", "8M", NONE),
    unconverted=NONE,
)
register(FLOAT8_LINEARS)
