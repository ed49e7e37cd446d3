"""`kernels`: which kernels a Hugging Face decoder's layers run: `torch` (the model's own code,
the default) or `liger` (liger-kernel's fused Triton kernels: RMSNorm, SwiGLU and the fused linear
cross-entropy, which computes the loss from the last hidden states and the head's weight in
chunks, never storing the logits).

liger-kernel patches a model in place, by its `config.model_type`, through
`liger_kernel.transformers.monkey_patch` (the model types of its `MODEL_TYPE_TO_APPLY_LIGER_FN`:
llama, mistral, qwen2, qwen3, phi3, gemma and others). On the model it sets attributes and bound
methods of its modules; beside them it replaces names in the model's `transformers` modeling
module (the RMSNorm and MLP classes, the RoPE function), which would reach every model of that
type the process builds while the run lasts: a gate's reference built beside it, say. So only
the model's own modules keep liger's code: `_patched` puts back at once every change outside
them, and the rest when the run ends. RoPE, a module-wide function in transformers, is therefore
not asked for. The cross-entropy is asked for as the fused linear one alone
(`cross_entropy=False`): the plain one would replace `torch.nn.functional.cross_entropy`.

Refused in one line on a device other than CUDA (Triton's kernels), beside the loss lever's
`compiled` (the fused loss no longer calls the model's `loss_function`), beside a whole-step
CUDA graph (the fused loss reads a count on the host in every forward), beside the whole model
compiled (`compile_scope='model'`: Dynamo cannot trace the fused loss) and beside
`float8_head='float8'` (the fused loss multiplies by the head's weight itself, so a converted
head would not run), and at the run's start for a model liger-kernel does not patch, whose
patch fails or changes nothing on the model itself, or where liger-kernel is not installed
(`pip install 'streamtune[kernels]'`). Its kernels change the rounding: the gate judges it by
equivalence. Triton compiles them in the first step, hence a warm-up step. Not searched by the
built-in spaces: on one H200 (`llama-1b`, float8, each layer compiled, liger-kernel 0.8.5,
2026-11-29) the whole step ran 0.919x (0.914-0.923) as fast with liger's kernels as without
them, 0.89x the fastest peer (docs/benchmarks/levers-h200-2026-11-29.md). `--fix kernels=liger`
(or the API's `fix`) runs it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainers.errors import ConfigError
from trainers.levers.declare import Lever, Undo, Value, nothing, ranked, register

INSTALL = "pip install 'streamtune[kernels]'"
_FAMILIAR = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "olmo2", "granite")
"""The model types a refusal names first, of the many liger-kernel patches."""


def _refuse_on(value: Value, device: str) -> str | None:
    if value == "liger" and device != "cuda":
        return f"kernels='liger' runs liger-kernel's Triton kernels, which need CUDA, not {device}"
    return None


def _conflicts(value: Value, get: Callable[[str], Value]) -> str | None:
    if value != "liger":
        return None
    if get("loss") == "compiled":
        return (
            "torch beside loss='compiled' (liger's fused linear cross-entropy computes the loss "
            "and never calls the model's loss_function): loss='model' with kernels='liger'"
        )
    if get("cuda_graph") is True:
        return (
            "torch beside cuda_graph=True (liger's fused linear cross-entropy reads a count with "
            ".item() in every forward, a host sync a CUDA graph cannot capture)"
        )
    if get("compile") != "none" and get("compile_scope") == "model":
        # On one H200 (torch 2.11, liger-kernel 0.8.5, 2026-11-29) the whole compiled llama-1b
        # failed in its first step: Dynamo traces liger's fused loss and its fake tensors cannot
        # run the addmm with out_dtype it accumulates the head's gradient with.
        return (
            f"torch beside compile={get('compile')!r} with compile_scope='model' (torch.compile "
            "cannot trace liger's fused linear cross-entropy): compile_scope='blocks' compiles "
            "each layer and leaves liger's loss outside the compiled code"
        )
    if get("float8_head") == "float8":
        return (
            "torch beside float8_head='float8' (liger's fused linear cross-entropy multiplies by "
            "the head's weight itself, so a float8 head would not run): float8_head='bf16'"
        )
    return None


def _refuse_for(value: Value, model: nn.Module) -> str | None:
    """Where liger cannot be asked to patch `model` (what its patch then does is `_apply`'s)."""
    if value != "liger":
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model_type, str):
        return f"torch for {type(model).__name__}, not a Hugging Face model"
    try:
        from liger_kernel.transformers import monkey_patch
    # Not installed, Triton missing beside it, or an import that fails otherwise: this rule runs
    # in a search's loop (`trainers.invalid_reason`), where it must refuse, not raise.
    except Exception as exc:  # noqa: BLE001
        return f"torch where liger-kernel cannot be imported ({exc!r:.200}; {INSTALL})"
    patches: dict[str, Callable[..., None]] = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN
    if model_type not in patches:
        named = [t for t in _FAMILIAR if t in patches]
        return (
            f"torch for model type {model_type!r}: liger-kernel patches "
            f"{', '.join(named)} and {len(patches) - len(named)} more model types"
        )
    return None


def _apply(value: Value, model: nn.Module) -> Undo:
    if value != "liger":
        return nothing
    refused = _refuse_for(value, model)
    if refused is not None:
        raise ConfigError("kernels", value, refused)
    from liger_kernel.transformers import monkey_patch

    model_type = str(getattr(getattr(model, "config", None), "model_type", ""))

    def patch() -> None:
        monkey_patch._apply_liger_kernel_to_instance(
            model=model, rope=False, cross_entropy=False, fused_linear_cross_entropy=True
        )

    try:
        undo, changed = _patched(patch, model)
    except Exception as exc:  # liger's patch met a model it could not take; nothing is left
        raise ConfigError(
            "kernels", value, f"torch for this {model_type} model (liger-kernel's patch: {exc!r})"
        ) from exc
    if not changed:
        raise ConfigError(
            "kernels",
            value,
            f"torch for model type {model_type!r}: liger-kernel's patch changes nothing on the "
            "model itself (only names module-wide, which are not kept)",
        )
    return undo


Slot = tuple[Any, bool]
"""Where a patch may set names: a dict's items (True: a module's or an instance's `__dict__`,
a dict it holds) or a class's attributes (False: set through the class)."""


def _patched(patch: Callable[[], None], model: nn.Module) -> tuple[Undo, int]:
    """Run `patch` on `model`. What it set outside the model's modules (on their classes, in the
    Python modules that define them and the dicts those hold, in `torch.nn.functional`) is put
    back at once; what it set on the modules themselves (attributes, bound methods, submodules,
    parameters, buffers) is put back by the returned undo, returned with how many names it set
    there. Only what `patch` changed is put back; what changes later (the run's own state) is
    left. A patch that raises has everything it set put back before its exception goes on.
    Instances' and modules' `__dict__`s are restored as dicts, past `nn.Module.__setattr__`."""
    on_model: list[Slot] = []
    for module in model.modules():
        own = vars(module)
        on_model += [
            (own, True),
            *((own[d], True) for d in ("_modules", "_parameters", "_buffers")),
        ]
    classes = {type(m) for m in model.modules()}
    namespaces = {sys.modules[c.__module__] for c in classes if c.__module__ in sys.modules}
    namespaces.add(torch.nn.functional)
    outside: list[Slot] = [(c, False) for c in classes] + [(vars(n), True) for n in namespaces]
    outside += [
        (value, True)
        for space in namespaces
        for name, value in vars(space).items()
        if isinstance(value, dict) and not name.startswith("__")
    ]
    slots = on_model + outside
    before = [_items(slot) for slot in slots]

    def changes() -> list[tuple[Slot, list[tuple[str, Any]]]]:
        found = [(s, _changed(old, _items(s))) for s, old in zip(slots, before, strict=True)]
        return [(slot, changed) for slot, changed in found if changed]

    try:
        patch()
    except BaseException:
        _put_back(changes())
        raise
    found = changes()
    mine = {id(target) for target, _ in on_model}
    kept = [change for change in found if id(change[0][0]) in mine]
    _put_back([change for change in found if id(change[0][0]) not in mine])
    return (lambda: _put_back(kept)), sum(len(changed) for _, changed in kept)


def _items(slot: Slot) -> dict[str, Any]:
    """A copy of the slot's names and values as stored: `dict.items` reads a dict subclass's
    storage past its own `__getitem__` (transformers' ACT2FN builds a new module on each read)."""
    target, is_dict = slot
    return dict(dict.items(target)) if is_dict else dict(vars(target))


def _put_back(changes: list[tuple[Slot, list[tuple[str, Any]]]]) -> None:
    for (target, is_dict), changed in changes:
        for name, old in changed:
            if is_dict:
                if old is _ABSENT:
                    target.pop(name, None)  # added by the patch
                else:
                    target[name] = old
            elif old is _ABSENT:
                delattr(target, name)
            else:
                setattr(target, name, old)


_ABSENT = object()


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, value before, or _ABSENT) for each name `new` added, changed or removed."""
    added_or_changed = [
        (n, old.get(n, _ABSENT)) for n, v in new.items() if old.get(n, _ABSENT) is not v
    ]
    removed = [(n, v) for n, v in old.items() if n not in new]
    return added_or_changed + removed


KERNELS = Lever(
    name="kernels",
    label="a Hugging Face decoder's kernels: its own (torch) or liger-kernel's fused ones",
    kind="str",
    default="torch",
    added=7,
    options=ranked(
        ("torch", "none", "exact", 0),
        ("liger", "compile", "equivalence", 1),
    ),
    refuse_on=_refuse_on,
    refuse_for=_refuse_for,
    transform=_apply,
    conflicts=_conflicts,
    offered=(),
)
register(KERNELS)
