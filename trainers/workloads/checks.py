"""Checks of a user's own workload, made once it is built (`package.module:factory`, and
`trainers.workload_from_parts` for a `Trainer`): what would otherwise fail at every step, so in
every trial and both baselines of a job, with a message about tensors that names neither the
cause nor the contract.

- A batch is a tuple (or list) of tensors: the loop moves each to the device and hands the tuple
  to `loss_fn(model, batch)`. A dict of tensors (the Hugging Face habit) or a bare tensor is fed
  as one (`trainers.workloads.as_tuples`), its `loss_fn` handed the dict or tensor back: both had
  failed every step ("'str' object has no attribute 'to'"; a tensor split into its rows). What
  is still not a tensor (a list of strings beside them) is refused, naming it.
- `loss_fn` returns the loss alone, a tensor of one element: `return loss, logits` failed as
  "'tuple' object has no attribute 'detach'", and a loss of shape [1] trained but failed every
  gate run ("must be real number, not list"). Run once on a copy of the model whose weights are
  meta tensors (`trainers.meta`), on the first batch: no FLOP, no memory. A loss that reads
  values (`.item()`) cannot run there and is left to the run; where the model's sizes and the
  batch's disagree (`loss_contract.SHAPES_DISAGREE`), BatchNorm gets a batch of one, or the loss
  is cut from the model (`.detach()`), it is refused, as every step would fail.
- The optimizer, built once as the loop builds it, steps the model's own parameters and needs no
  closure: an Adam built on another module trained nothing while every gate passed, and LBFGS
  failed at the first step.
- The model has a trainable parameter, and lazy modules (`nn.LazyLinear`) get their sizes from
  one forward on the first batch, as the first step would have given them.

Found by a new user's trial (2026-12-02): each of these reached the user only as every trial's
failure. The first batch is read once, when the workload is built (a `Trainer` resumed past it
reads it too).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
import traceback
from collections.abc import Iterator, Mapping, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from trainers.errors import WorkloadError
from trainers.meta import meta_copy_or_none
from trainers.workloads import as_tuples
from trainers.workloads.as_tuples import adapted, original_loss
from trainers.workloads.base import Workload, item_as_loaded
from trainers.workloads.loss_contract import ONE_PER_CHANNEL, not_the_contract, swapped

# Imported from here by the text models' and evaluation's checks, as before it moved.
from trainers.workloads.loss_contract import shapes_disagree as shapes_disagree
from trainers.workloads.whole import check_numbers, check_whole, samples_in


def own_workload(
    workload: Workload, name: str, *, parts: bool = False, counted: bool = False
) -> Workload:
    """The built `workload`, fed as tuples where its batches are dicts or tensors
    (`as_tuples.adapted`); WorkloadError naming what it gets wrong: in `workload` (`name`, as the
    user named it: `mymodels:build`), or with `parts` (`trainers.workload_from_parts`) in the
    argument given, `data` or `loss_fn`. With `parts`, a whole batch's samples are counted from
    its tensors (`samples_in`) unless `counted` (the user gave `samples_per_batch`)."""
    data = _Where("data" if parts else "workload", "data" if parts else f"workload={name!r}")
    loss = _Where("loss_fn" if parts else "workload", "loss_fn" if parts else f"workload={name!r}")
    optimizer = _Where(
        "optimizer" if parts else "workload", "optimizer" if parts else f"workload={name!r}"
    )
    model = _Where("model" if parts else "workload", "model" if parts else f"workload={name!r}")
    _check_materialised(workload, model)
    _check_optimizer(workload, optimizer)
    size, per_batch = workload.batch_size, workload.samples_per_batch
    if size is not None and per_batch != size:
        # Every throughput is samples_per_batch over a step's time: 1000 against batch_size 8
        # had been shown 125x too high, without a word (a probe, 2026-12-06).
        raise data.error(
            f"samples_per_batch={per_batch} but batch_size={size}: the loader batches {size} "
            f"samples a step, so samples/s would be counted {per_batch / size:.3g}x; set "
            f"samples_per_batch={size}"
        )
    batch = _first_batch(workload, data)
    if batch is None:
        _check_trainable(workload, model)
        return mark_checked(workload)
    original = batch
    if workload.batch_size is None:
        check_numbers(original)
    workload, batch = adapted(workload, batch)
    _check_batch(batch, data, list(original) if isinstance(original, Mapping) else None)
    _materialise(workload, tuple(batch), loss)
    _check_trainable(workload, model)
    _check_loss(workload, tuple(batch), loss)
    if workload.batch_size is None:
        # A Workload built by hand, or parts with `counted`, give samples_per_batch: a size of
        # some tensor of a whole item; parts without it count the item's samples here.
        check_whole(tuple(batch), None if parts and not counted else workload.samples_per_batch)
        if parts and not counted:
            workload = dataclasses.replace(workload, samples_per_batch=samples_in(tuple(batch)))
    return mark_checked(workload)


_CHECKED = "_streamtune_checked"


def mark_checked(workload: Workload) -> Workload:
    """`workload`, marked as checked here or built by a factory whose batches are tuples (the
    built-ins, the library models): a `Trainer` given it reads no batch to check it again."""
    setattr(workload, _CHECKED, True)
    return workload


def checked(workload: Workload) -> bool:
    """Whether `workload` went through `own_workload` or `mark_checked` (a `Workload` built by
    hand, given straight to a `Trainer`, did not)."""
    return bool(getattr(workload, _CHECKED, False))


@dataclasses.dataclass(frozen=True)
class _Where:
    """What an error names: its field, and the words that begin its message."""

    field: str
    said: str

    def error(self, message: str) -> WorkloadError:
        return WorkloadError(f"{self.said}: {message}", field=self.field)


def first_batch(workload: Workload) -> Any:
    """The workload's first batch as its loader makes it (a dict, a tensor or a tuple), or None
    where the dataset can be neither indexed nor iterated; what making it raises is said
    naming `data`."""
    return _first_batch(workload, _Where("data", "data"))


def _first_batch(workload: Workload, where: _Where) -> Any:
    """The first batch as the loader would make it, before the loop turns it into a tuple (of an
    IterableDataset, from an iterator of its own, as each epoch's loader makes one); None where
    the dataset can be neither indexed nor iterated."""
    dataset = workload.dataset
    wanted = 1 if workload.batch_size is None else workload.batch_size
    if isinstance(dataset, IterableDataset):
        return _first_streamed(workload, wanted, where)
    if isinstance(dataset, DataLoader | Iterator):  # the loop's loader would index it
        raise where.error(
            f"the dataset is a {type(dataset).__name__}: a Workload takes a Dataset (items by "
            "index, or an IterableDataset) and batches it itself; give workload_from_parts the "
            "DataLoader, which reads its dataset, batch_size and collate_fn from it"
        )
    if not hasattr(dataset, "__getitem__"):
        return None
    size = len(dataset) if isinstance(dataset, Sized) else None
    if size is not None and size < wanted:
        raise where.error(
            f"the dataset has {size} items, fewer than one batch ("
            + (
                f"batch_size {wanted}; the loop drops a last, partial batch"
                if workload.batch_size is not None
                else "each item is a batch"
            )
            + "): give it more items, or a smaller batch_size",
        )
    try:
        if workload.batch_size is None:  # each item a batch, converted as the loader does
            return item_as_loaded(workload, dataset[0])
        samples = [dataset[i] for i in range(wanted)]
        return (workload.collate_fn or default_collate)(samples)
    except Exception as exc:  # the user's code: said in one line, as each step would fail
        raise _raised(exc, where) from exc


def _first_streamed(workload: Workload, wanted: int, where: _Where) -> Any:
    try:
        stream, dataset = iter(workload.dataset), cast(object, workload.dataset)
        if stream is not dataset and stream is iter(workload.dataset):
            # One iterator for good (a generator made once): this read took the first batch from
            # training, and the loop ended at its end mid-run, "the workload's dataset yields no
            # batch" (a probe, 2026-12-07). A dataset that is its own iterator may start again
            # at each `iter` (`__iter__` resets and returns self): left to run.
            raise where.error(
                f"{type(workload.dataset).__name__}.__iter__ returns the same iterator each "
                "time: the loop starts a new pass over the dataset from a new one; make "
                "__iter__ a generator (yield the samples) or return a new iterator each call"
            )
        samples = list(itertools.islice(stream, wanted))
        if len(samples) < wanted:
            raise where.error(
                f"the dataset yields {len(samples)} items, fewer than one batch (batch_size "
                f"{wanted}; the loop drops a last, partial batch): give it more, or a smaller "
                "batch_size"
            )
        if workload.batch_size is None:
            return item_as_loaded(workload, samples[0])
        return (workload.collate_fn or default_collate)(samples)
    except WorkloadError:
        raise
    except Exception as exc:  # the user's code: said in one line, as each step would fail
        raise _raised(exc, where) from exc


def _raised(exc: Exception, where: _Where) -> WorkloadError:
    """What making the first batch raised (the user's code), in one line, as each step would."""
    said = " ".join(str(exc).split()) or "(no message)"
    return where.error(f"making its first batch raised {type(exc).__name__}: {said}")


def _check_batch(batch: Any, where: _Where, keys: list[Any] | None) -> None:
    """`batch` (as the loop is fed it) a tuple of tensors; `keys`: the dict's it was made from."""
    fix = (
        "give a tuple (or a dict with string keys) of tensors from the dataset's __getitem__ "
        "(or from collate_fn), and keep other values out of it"
    )
    if isinstance(batch, Mapping):
        shown = ", ".join(map(repr, list(batch)[:6])) or "none"
        raise where.error(f"a batch is a dict whose keys are not all strings ({shown}): {fix}")
    if not isinstance(batch, tuple | list) or not batch:
        raise where.error(
            f"a batch is {type(batch).__name__}; the loop feeds tensors, as a tuple: {fix}"
        )
    for index, item in enumerate(batch):
        if not isinstance(item, torch.Tensor):
            named = f"{keys[index]!r}" if keys is not None else f"item {index}"
            raise where.error(
                f"a batch's {named} is {_described(item)}, not a tensor; the loop moves "
                f"each of a batch's tensors to the device: {fix}"
            )


def _described(item: object) -> str:
    """What a batch's non-tensor item is: the loader gathers each sample's `str` into a list or
    tuple of them, which had been named only "tuple" for a dataset whose label was a string."""
    if isinstance(item, list | tuple) and item:
        kinds = sorted({type(x).__name__ for x in item})
        if len(kinds) == 1 and not isinstance(item[0], torch.Tensor):
            first = repr(item[0])
            first = first if len(first) <= 40 else f"{first[:36]}..."
            return (
                f"a {type(item).__name__} of {len(item)} {kinds[0]} ({first}, ...: each "
                f"sample's {kinds[0]}, gathered by the loader)"
            )
    return type(item).__name__


_LOSS_CHECKED: set[tuple[object, ...]] = set()
"""The workloads whose loss this process has checked: a factory is called at every build (the
gate builds the workload for each of its runs), and the loss is the same code each time. Keyed by
the loss's code object (equal where the code is), not its name alone: a loss redefined in one
process (a notebook cell run again, or a second lambda, every one named `<lambda>`) was taken as
checked, and a shape-[8, 1] loss reached torch's "grad can be implicitly created only for scalar
outputs" (a user's probe, 2026-12-05)."""


def _captured(loss_fn: object) -> tuple[object, ...]:
    """What a closure captured, where that is a plain value (a `reduction` string, a weight):
    one code made with `make_loss("mean")`, then `make_loss("none")`, had been taken as
    checked, and the second reached torch's "grad can be implicitly created only for scalar
    outputs" (a user's probe, 2026-12-06). Anything else counts by its type: a factory makes a
    new module or tensor at every build, and the check is kept once per code."""
    cells = getattr(getattr(loss_fn, "__func__", loss_fn), "__closure__", None) or ()
    plain = (str, int, float, bool, type(None))
    captured: list[object] = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            value = None
        captured.append(value if isinstance(value, plain) else type(value))
    return tuple(captured)


def _parameter_shapes(model: torch.nn.Module) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(p.shape) for p in model.parameters())


def _check_loss(workload: Workload, batch: tuple[torch.Tensor, ...], where: _Where) -> None:
    loss_fn = original_loss(workload.loss_fn)
    model = _qualified(type(workload.model))
    code = getattr(loss_fn, "__code__", None)  # a function's or a bound method's
    key: tuple[object, ...] = (where.said, workload.name, workload.preset, _qualified(loss_fn))
    key += (code, model, *_captured(loss_fn))
    # The shapes too: one model class and loss given other data (a notebook's second build, with
    # 12 features for a model of 8) had been taken as checked, and failed at the first step with
    # torch's traceback (a probe, 2026-12-07).
    key += (tuple((tuple(t.shape), t.dtype) for t in batch), _parameter_shapes(workload.model))
    if key in _LOSS_CHECKED:
        return
    copied = meta_copy_or_none(workload.model)
    if copied is None:  # the first step tells what the loss gets wrong
        return
    try:
        loss = workload.loss_fn(copied, tuple(t.to("meta") for t in batch))
    except Exception as exc:  # noqa: BLE001 - judged there: refused, or left to the first step
        _refuse_raised(workload, copied, batch, exc, where)
        return
    _check_loss_value(loss, copied, key, where)


def _refuse_raised(
    workload: Workload,
    copied: torch.nn.Module,
    batch: tuple[torch.Tensor, ...],
    exc: Exception,
    where: _Where,
) -> None:
    """What the loss raised on the meta copy, as one line where every step would raise it too;
    nothing where the first real step is left to tell."""
    said = " ".join(str(exc).split())
    if shapes_disagree(said):  # the same sizes fail the run: said now, once
        raise where.error(
            f"loss_fn(model, batch) on the first batch raised {type(exc).__name__}"
            f"{raised_at(exc)}: {said[:300].rstrip('.')}: the model and the batches it is fed "
            "do not fit"
        ) from exc
    if swapped(workload, copied, batch):  # said at every trial as "too many values to unpack"
        raise where.error(
            f"loss_fn(model, batch) on the first batch raised {type(exc).__name__}"
            f"{raised_at(exc)}: {said[:200].rstrip('.')}; called as loss_fn(batch, model) it "
            "returned a loss: the loop passes the model first, loss_fn(model, batch)"
        ) from exc
    contract = not_the_contract(original_loss(workload.loss_fn), copied, exc)
    if contract is not None:  # each step would raise it, as a traceback from the loop
        raise where.error(
            f"loss_fn(model, batch) on the first batch raised {type(exc).__name__}"
            f"{raised_at(exc)}: {said[:200].rstrip('.')}: {contract}"
        ) from exc
    if ONE_PER_CHANNEL in said and workload.batch_size == 1:
        # BatchNorm in training needs two values per channel: every step of a batch of one
        # raises it, which Trainer had shown as torch's traceback (a probe, 2026-12-08).
        raise WorkloadError(
            f"batch_size=1 is invalid for this model: loss_fn(model, batch) raised ValueError"
            f"{raised_at(exc)}: {said[:200].rstrip('.')}: allowed 2 or more (or a norm that "
            "needs no batch, e.g. GroupNorm or LayerNorm)",
            field="batch_size",
        ) from exc


def _check_loss_value(
    loss: object, copied: torch.nn.Module, key: tuple[object, ...], where: _Where
) -> None:
    """The loss the meta copy returned: a scalar that requires grad, or one line saying what it
    is instead."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.dim() == 0:
        if not loss.requires_grad and any(p.requires_grad for p in copied.parameters()):
            # A detached loss trains nothing: backward() fails at the first step.
            raise where.error(
                "loss_fn(model, batch) returned a loss that does not require grad, cut from the "
                "model's parameters (.detach(), .item(), torch.no_grad(), a new tensor): return "
                "the loss the model's outputs computed"
            )
        _LOSS_CHECKED.add(key)
        return
    if isinstance(loss, torch.Tensor):
        got = f"a tensor of shape {list(loss.shape)}"
        fix = "reduce it to a scalar, e.g. .mean(), or .squeeze() a shape [1]"
    else:
        got = type(loss).__name__
        if isinstance(loss, tuple | list) and loss:
            got += f" of {len(loss)} ({', '.join(type(x).__name__ for x in loss[:4])})"
        fix = "return the loss alone (`return loss`, not `return loss, logits`)"
    raise where.error(
        f"loss_fn(model, batch) returned {got}; the loop backpropagates a "
        f"scalar loss tensor: {fix}",
    )


def _materialise(workload: Workload, batch: tuple[torch.Tensor, ...], where: _Where) -> None:
    """A model with lazy modules (`nn.LazyLinear`) gets its sizes from one forward, here on the
    first batch, in eval mode and without grad (no running statistic moves, nothing is kept):
    the meta copy of `_check_loss`, the FLOP count and the loop's first step all read sizes it
    did not have yet ("Attempted to use an uninitialized parameter", from a new user's trial).
    The sizes come from the batch, as they would at the first step."""
    model = workload.model
    if not any(torch.nn.parameter.is_lazy(p) for p in model.parameters()):
        return
    training = model.training
    try:
        with torch.no_grad():
            model.eval()
            workload.loss_fn(model, batch)
    except Exception as exc:
        said = " ".join(str(exc).split())[:300].rstrip(".")
        raise where.error(
            "the model has lazy modules (nn.LazyLinear, ...) whose sizes come from one forward, "
            f"and loss_fn(model, batch) on the first batch raised {type(exc).__name__}"
            f"{raised_at(exc)}: {said}"
        ) from exc
    finally:
        model.train(training)


def _check_materialised(workload: Workload, where: _Where) -> None:
    """Parameters on the meta device hold no values: the run had failed only at its start
    ("Cannot copy out of meta tensor"), naming no field (a probe, 2026-12-06). Lazy ones
    (`nn.LazyLinear`) are `_materialise`'s."""
    on_meta = [
        name
        for name, p in workload.model.named_parameters()
        if p.is_meta and not torch.nn.parameter.is_lazy(p)
    ]
    if on_meta:
        raise where.error(
            f"{len(on_meta)} of the model's parameters are on the meta device (the first: "
            f"{on_meta[0]}), with no values to train: build the model on a real device, or "
            "materialise it in the factory (model.to_empty(device=...), then initialise it)"
        )


def _check_trainable(workload: Workload, where: _Where) -> None:
    """A model none of whose parameters requires grad trains nothing: every step failed at its
    backward ("element 0 of tensors does not require grad") in every trial and baseline."""
    params = list(workload.model.parameters())
    if not params:
        # "Unfreeze some" cannot apply: weights kept as plain tensors are not the model's.
        raise where.error(
            "the model has no parameters: the loop trains what model.parameters() gives; hold "
            "the weights as nn.Parameter (or in nn.Linear and the like), not as plain tensors"
        )
    if not any(p.requires_grad for p in params):
        raise where.error(
            f"the model has no trainable parameter (its {len(params)} parameters all have "
            "requires_grad=False): the loop trains the model's parameters; unfreeze some "
            "(p.requires_grad_(True))"
        )


def _check_optimizer(workload: Workload, where: _Where) -> None:
    """The optimizer the loop will build (`make_optimizer(model.parameters(), False)`) steps the
    model's parameters, and without a closure. An Adam built on another module's parameters
    trained nothing while every gate passed (the losses of a model that does not change are
    reproducible), and LBFGS failed at the first step ("missing 1 required positional argument:
    'closure'"): a new user's trial, 2026-12-02. Building an optimizer allocates no state in
    torch's own (its state is made at the first step)."""
    params = list(workload.model.parameters())
    try:
        optimizer = workload.make_optimizer(params, False)
    except TypeError as exc:
        if "required" not in str(exc):  # not its settings left out: the run says it again
            return
        # An optimizer class that needs a setting (MyOpt(params, lr)): it had been named as
        # the workload's fault, at a line inside trainers (a probe, 2026-12-07).
        raise where.error(
            f"the optimizer factory raised TypeError: {' '.join(str(exc).split())}: give its "
            "settings, e.g. functools.partial(MyOptimizer, lr=1e-3)"
        ) from exc
    except Exception:  # noqa: BLE001 - the run builds it again and says what it raised
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise where.error(
            f"the optimizer factory returned {type(optimizer).__name__}, not a "
            "torch.optim.Optimizer"
        )
    kind = type(optimizer).__name__
    closure = inspect.signature(optimizer.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise where.error(
            f"{kind}.step needs a closure (it evaluates the loss again within a step); the "
            "loop steps the optimizer once after each backward: use one whose step() takes "
            "no argument (SGD, Adam, AdamW, ...)"
        )
    own = {id(p) for p in params}
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    foreign = sum(id(p) not in own for p in stepped)
    if foreign:
        raise where.error(
            f"{foreign} of the {len(stepped)} parameters the {kind} steps are not the model's "
            "(built on another module, or on a copy of the model?): build it on "
            "model.parameters(), or give a factory, e.g. trainers.workloads.adam(1e-3)"
        )
    if any(p.requires_grad for p in params) and not stepped:
        raise where.error(f"the {kind} steps none of the model's parameters")


def raised_at(exc: BaseException) -> str:
    """ " at file:line" of the innermost frame of the user's code (not torch's) in `exc`."""
    ours = (__file__, as_tuples.__file__)  # the call itself failed: no frame of the user's
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "/torch/" not in f.filename
        and not _INDUCTOR_CODE.search(f.filename)
        and f.filename not in ours
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


_INDUCTOR_CODE = re.compile(r"torchinductor_|[\\/][a-z0-9]{2}[\\/]c[a-z0-9]{40,}\.py$")
"""A module Inductor generated (`<cache>/oh/cohqz32u...py`), wherever its cache folder is: not
the user's frame (TORCHINDUCTOR_CACHE_DIR set elsewhere had put it there in CI)."""


def _qualified(thing: object) -> str:
    return f"{getattr(thing, '__module__', '')}.{getattr(thing, '__qualname__', repr(thing))}"
