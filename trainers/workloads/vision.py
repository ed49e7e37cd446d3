"""Image classifiers from torchvision and timm as workloads, on synthetic images.

`torchvision:<model_name>` is any classification model that `torchvision.models.get_model` knows,
`timm:<model_name>` any of `timm.list_models()`. Weights are random (`weights=None`,
`pretrained=False`): nothing is downloaded, and the same seed gives the same weights. The models
are kept as the libraries build them (BatchNorm, dropout, stochastic depth and all);
`disable_dropout` reaches their dropout and stochastic depth for the gate's runs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from trainers.errors import WorkloadError
from trainers.meta import meta_copy_or_none
from trainers.workloads.base import Batch, SyntheticBatches, Workload, adamw
from trainers.workloads.extras import require
from trainers.workloads.mlp import classification_loss
from trainers.workloads.options import Family, OptionSpec, Value

PRESETS: Mapping[str, Mapping[str, Value]] = {
    "tiny": {"batch": 2, "image": 32, "classes": 10},
    "small": {"batch": 64, "image": 128, "classes": 100},
    "default": {},  # ImageNet shapes: the options' defaults
}


IMAGE_HIGH = 4096  # the largest `model_arg.image`


def vision_options(channels: OptionSpec) -> tuple[OptionSpec, ...]:
    return (
        OptionSpec(
            name="batch", kind="int", default=128, low=1, high=65536, help="images per batch"
        ),
        OptionSpec(
            name="image",
            kind="int",
            default=224,
            low=8,
            high=IMAGE_HIGH,
            help="image height and width, in pixels",
        ),
        OptionSpec(
            name="classes", kind="int", default=1000, low=2, high=100_000, help="output classes"
        ),
        channels,
        OptionSpec(
            name="batches",
            kind="int",
            default=8,
            low=1,
            high=256,
            help="distinct synthetic batches, cycled; they are held in host memory "
            "(batches x batch x channels x image^2 x 4 bytes)",
        ),
        OptionSpec(
            name="lr", kind="float", default=1e-3, low=1e-8, high=1.0, help="AdamW learning rate"
        ),
        OptionSpec(
            name="weight_decay",
            kind="float",
            default=0.01,
            low=0.0,
            high=1.0,
            help="AdamW weight decay",
        ),
    )


TORCHVISION = Family(
    name="torchvision",
    usage="torchvision:<model_name>",
    description="a torchvision classification model (resnet18, resnet50, mobilenet_v3_small, "
    "vit_b_16, ...), random weights, on synthetic images",
    options=vision_options(
        OptionSpec(
            name="channels",
            kind="int",
            default=3,
            choices=(3,),
            help="input channels (torchvision's classifiers take RGB only)",
        )
    ),
    presets=PRESETS,
)
TIMM = Family(
    name="timm",
    usage="timm:<model_name>",
    description="a timm image model (resnet10t, convnext_atto, vit_tiny_patch16_224, ...), "
    "random weights, on synthetic images",
    options=vision_options(
        OptionSpec(
            name="channels",
            kind="int",
            default=3,
            low=1,
            high=64,
            help="input channels (timm adapts the model's stem)",
        )
    ),
    presets=PRESETS,
)

TORCHVISION_EXAMPLES = ("resnet18", "resnet50", "mobilenet_v3_small", "vit_b_16")
TIMM_EXAMPLES = ("resnet10t", "resnet50", "convnext_atto", "vit_tiny_patch16_224")


def check_name(
    name: str, model: str, known: Sequence[str], examples: Sequence[str], listing: str
) -> None:
    if model in known:
        return
    close = difflib.get_close_matches(model, known, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise WorkloadError(
        f"workload={name!r}: no model {model!r}{hint}: allowed e.g. {', '.join(examples)} "
        f"({len(known)} models: {listing})",
        field="workload",
    )


def check_torchvision(name: str, model: str) -> None:
    models = require("torchvision", workload=name).models
    classifiers = models.list_models(module=models)
    if model not in classifiers and model in models.list_models():
        # A detection or segmentation model takes targets this family does not make: "no
        # model" had told the user a name torchvision has was misspelt.
        kinds = ("detection", "segmentation", "video", "optical_flow", "quantization")
        kind = next(
            (
                k
                for k in kinds
                if hasattr(models, k) and model in models.list_models(module=getattr(models, k))
            ),
            "non-classification",
        )
        raise WorkloadError(
            f"workload={name!r}: {model!r} is a torchvision {kind.replace('_', ' ')} model; "
            f"this family trains image classifiers: allowed e.g. "
            f"{', '.join(TORCHVISION_EXAMPLES)} (torchvision.models.list_models("
            "module=torchvision.models)), or a factory of your own for it",
            field="workload",
        )
    check_name(
        name,
        model,
        models.list_models(module=models),
        TORCHVISION_EXAMPLES,
        "torchvision.models.list_models(module=torchvision.models)",
    )


def check_timm(name: str, model: str) -> None:
    timm = require("timm", workload=name)
    check_name(name, model, timm.list_models(), TIMM_EXAMPLES, "timm.list_models()")


def torchvision_kwargs(model: str, image: int) -> dict[str, Any]:
    """What some torchvision builders need beyond `num_classes`."""
    if model.startswith("vit_"):
        return {"image_size": image}  # position embeddings are sized when the model is built
    if model.startswith("maxvit_"):
        return {"input_size": (image, image)}
    if model in ("googlenet", "inception_v3"):
        # Without their auxiliary heads they return logits, like every other classifier, instead
        # of a tuple in training mode; init_weights=True is the current initialisation, said
        # explicitly (leaving it out only adds a FutureWarning).
        return {"aux_logits": False, "init_weights": True}
    return {}


def build_torchvision(
    *, name: str, model: str, preset: str, options: Mapping[str, Value], seed: int
) -> Workload:
    models = require("torchvision", workload=name).models
    kwargs = torchvision_kwargs(model, int(options["image"]))
    torch.manual_seed(seed)
    net = construct(
        name,
        options,
        lambda: models.get_model(model, weights=None, num_classes=options["classes"], **kwargs),
    )
    return classifier_workload(name, preset, net, options, seed)


def build_timm(
    *, name: str, model: str, preset: str, options: Mapping[str, Value], seed: int
) -> Workload:
    timm = require("timm", workload=name)
    kwargs: dict[str, Any] = {}
    config = timm.models.get_pretrained_cfg(model)
    if config is not None and config.fixed_input_size:
        # ViTs and Swins size their position embeddings or windows when they are built.
        kwargs["img_size"] = options["image"]
    torch.manual_seed(seed)
    net = construct(
        name,
        options,
        lambda: timm.create_model(
            model,
            pretrained=False,
            num_classes=options["classes"],
            in_chans=options["channels"],
            **kwargs,
        ),
    )
    return classifier_workload(name, preset, net, options, seed)


def construct(name: str, options: Mapping[str, Value], make: Callable[[], nn.Module]) -> nn.Module:
    try:
        return make()
    except (ValueError, TypeError, AssertionError, RuntimeError) as exc:
        raise WorkloadError(
            f"workload={name!r} cannot be built with image={options['image']}, "
            f"classes={options['classes']}, channels={options['channels']}: {exc}",
            field="model_arg",
        ) from exc


def check_runs(name: str, model: nn.Module, shape: tuple[int, ...]) -> None:
    """A forward pass on the meta device, in training mode: shapes only, no arithmetic and no
    memory. It fails at build time, naming the image size, for an image too small for the
    network (inception_v3 under 75 pixels, alexnet under 63) rather than at the first step.
    The model's own tensors are untouched: the pass runs on a copy whose tensors are meta
    (`trainers.meta`). Swapped into the model itself (`functional_call`), a submodule registered
    under two names had kept meta weights: every CoaT of timm then failed at its first step,
    "Cannot copy out of meta tensor" (a probe, 2026-12-07). A model that cannot be copied is
    not checked."""
    copied = meta_copy_or_none(model)
    if copied is None:
        return
    try:
        copied(torch.empty(shape, device="meta"))
    except NotImplementedError:
        return  # an op with no meta kernel: the first real step will tell
    except (RuntimeError, ValueError, AssertionError, TypeError) as exc:
        if shape[0] == 1 and _runs(copied, (2, *shape[1:])):
            # A BatchNorm in training needs two values per channel: the batch, not the image.
            raise WorkloadError(
                f"model_arg.batch=1 is invalid for workload={name!r}: {exc}; allowed 2 or more",
                field="model_arg.batch",
            ) from exc
        raise WorkloadError(
            f"workload={name!r} cannot run on {shape[0]} images of {shape[1]}x{shape[2]}x"
            f"{shape[3]}: {exc}{_allowed_images(copied, shape)}",
            field="model_arg.image",
        ) from exc


def _allowed_images(model: nn.Module, shape: tuple[int, ...]) -> str:
    smallest = _smallest_image(model, shape)
    if smallest is None:
        return ""
    if _runs(model, (*shape[:2], smallest + 1, smallest + 1)):
        return f"; allowed model_arg.image={smallest} or more"
    return f"; allowed e.g. model_arg.image={smallest}"  # sizes that run are not one range


def _smallest_image(model: nn.Module, shape: tuple[int, ...]) -> int | None:
    """The smallest image above `shape`'s that runs, where a larger one does: doubling to the
    first size that runs, then halving the gap, on meta tensors (about 20 passes). Where sizes
    that run are not one range (a network that wants multiples of 32), it is the edge the
    search met, and it runs; None where none up to `IMAGE_HIGH` does (a network of one size)."""

    def runs(size: int) -> bool:
        return _runs(model, (*shape[:2], size, size))

    failing, trying = shape[2], min(shape[2] * 2, IMAGE_HIGH)
    if failing >= IMAGE_HIGH:
        return None
    while not runs(trying):
        if trying >= IMAGE_HIGH:
            return None
        failing, trying = trying, min(trying * 2, IMAGE_HIGH)
    while trying - failing > 1:  # `failing` does not run, `trying` does
        middle = (failing + trying) // 2
        failing, trying = (failing, middle) if runs(middle) else (middle, trying)
    return trying


def _runs(model: nn.Module, shape: tuple[int, ...]) -> bool:
    """Whether `model` (a meta copy) runs a forward on a batch of `shape`."""
    try:
        model(torch.empty(shape, device="meta"))
    except (RuntimeError, ValueError, AssertionError, TypeError, NotImplementedError):
        return False
    return True


def coloured_noise(options: Mapping[str, Value], generator: torch.Generator) -> Batch:
    """Gaussian noise plus a colour per class: real images' shapes and dtypes (float32 NCHW,
    int64 labels) with a signal that any classifier starts learning in a few steps."""
    n, b = int(options["batches"]), int(options["batch"])
    c, size, k = int(options["channels"]), int(options["image"]), int(options["classes"])
    colours = torch.randn(k, c, generator=generator)
    labels = torch.randint(0, k, (n, b), generator=generator)
    images = torch.randn(n, b, c, size, size, generator=generator)
    images += colours[labels][..., None, None]  # in place: the default preset's images are 616 MB
    return images, labels


def classifier_workload(
    name: str, preset: str, model: nn.Module, options: Mapping[str, Value], seed: int
) -> Workload:
    shape = (
        int(options["batch"]),
        int(options["channels"]),
        int(options["image"]),
        int(options["image"]),
    )
    check_runs(name, model, shape)
    generator = torch.Generator().manual_seed(seed + 1)
    return Workload(
        name=name,
        preset=preset,
        model=model,
        dataset=SyntheticBatches(coloured_noise(options, generator)),
        loss_fn=classification_loss,
        samples_per_batch=shape[0],
        make_optimizer=adamw(float(options["lr"]), float(options["weight_decay"])),
    )
