"""The tests that once pinned today's list of levers, run again with a real lever module in the
table: a scaled-dot-product-attention backend around the forward (`default|cudnn`, refused on a
CPU, offered to the built-in spaces), written as `trainers/levers/<name>.py` would be (issue 53).

Each of those tests reads the lever table, so a new lever module needs no edit there; this module
shows it by registering the lever (`trainers.levers.registered`) and calling them. The lever is
not in `trainers/levers/`: the real ones come with their GPU measurements.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pydantic
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from api.schemas.jobs import job_model
from tests.api import test_owners
from tests.trainers import test_config, test_levers
from tests.tuner.evidence import test_reader
from tests.tuner.search import test_space
from trainers import LEVERS, LoopConfig, invalid_reason
from trainers.gate.parity import NUMERICS_FIELDS, twin_of
from trainers.levers import Lever, Value, ranked, registered
from tuner.search.spaces.named import load_space

NAME = "attention_sample"


def _refuse_on(value: Value, device: str) -> str | None:
    if value == "cudnn" and device != "cuda":
        return f"{NAME}='cudnn' needs a CUDA device, and this run is on {device}"
    return None


def _around_forward(value: Value) -> AbstractContextManager[object]:
    if value == "cudnn":
        return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
    return nullcontext()


ATTENTION = Lever(
    name=NAME,
    label="the scaled-dot-product-attention backend around the forward",
    kind="str",
    default="default",
    added=4,
    options=ranked(("default", "none", "exact", 0), ("cudnn", "none", "equivalence", 0)),
    refuse_on=_refuse_on,
    around_forward=_around_forward,
    offered=("default", "cudnn"),
)


@pytest.fixture
def attention() -> Iterator[Lever]:
    with registered(ATTENTION) as lever:
        yield lever
    assert NAME not in LEVERS


def test_the_lever_is_real(attention: Lever) -> None:
    assert LoopConfig.from_dict({NAME: "cudnn"}).get(NAME) == "cudnn"
    assert "needs a CUDA device" in str(invalid_reason({NAME: "cudnn"}, device_type="cpu"))
    assert invalid_reason({NAME: "cudnn"}, device_type="cuda") is None
    # Its effect: the cuDNN backend alone while the context is open (flags only: no GPU needed).
    with attention.around_forward("cudnn"):  # type: ignore[misc]
        assert torch.backends.cuda.cudnn_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled()
    # Where the tests below meet it: the gate's fields, the twin, the spaces and a CPU's notes.
    assert NUMERICS_FIELDS[NAME] == "default"
    assert twin_of(LoopConfig.from_dict({NAME: "cudnn"}))[0].get(NAME) == "cudnn"
    assert NAME in load_space("full").params and NAME not in load_space("streams").params
    # A CPU leaves it out of the built-in space without a note (its default alone), and says
    # so to a space of one's own that asked for it.
    cpu = load_space("full", cuda=False)
    assert NAME not in cpu.params and NAME not in cpu.fixed
    own = load_space({NAME: ["default", "cudnn"], "num_streams": [1, 2]}, cuda=False)
    assert any(note.startswith(NAME) for note in own.notes)


def _request_models() -> tuple[type[pydantic.BaseModel], type[pydantic.BaseModel]]:
    """`SpaceIn` and `FixIn` as the table is now (`JobIn`'s were built at import, before it)."""
    fields = job_model().model_fields

    def models(annotation: object) -> list[type[pydantic.BaseModel]]:
        # Inside the tagged union (`api.schemas.space.space_type`): Annotated[A | B, ...].
        if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            return [annotation]
        return [found for arg in typing.get_args(annotation) for found in models(arg)]

    (space_in,) = models(fields["space"].annotation)
    fix_in = fields["fix"].annotation
    assert isinstance(fix_in, type) and issubclass(fix_in, pydantic.BaseModel)
    return space_in, fix_in


PINNED: dict[str, Callable[[Path], None]] = {
    "readers": lambda _: test_levers.test_the_readers_get_what_they_wrote_out_before_the_table(),
    "request models": lambda _: test_owners.check_request_models(*_request_models()),
    "streams space": lambda _: test_space.test_streams_space_has_exactly_the_three_seed_settings(),
    "full space": lambda _: test_space.test_full_space_is_the_streams_space_plus_four_settings(),
    "suggest streams": lambda _: test_space.test_suggest_with_a_real_study_stays_inside_the_space(
        "streams"
    ),
    "suggest full": lambda _: test_space.test_suggest_with_a_real_study_stays_inside_the_space(
        "full"
    ),
    "space file": test_space.test_a_space_file_with_choices_ranges_and_scalars,
    "pins": lambda _: test_space.test_pins_move_settings_from_the_search_to_fixed(),
    "cpu notes": lambda _: test_space.test_cpu_mode_drops_cuda_graph_with_a_note(),
    "cpu graph": test_space.test_cpu_mode_rejects_a_required_graph,
    "stored config": lambda _: (
        test_config.test_a_stored_config_from_before_the_new_levers_still_loads()
    ),
}


@pytest.mark.parametrize("name", PINNED)
def test_the_tests_that_pinned_the_levers_read_the_table(
    attention: Lever, tmp_path: Path, name: str
) -> None:
    PINNED[name](tmp_path)


def test_an_export_round_trips_the_lever_off_its_default(attention: Lever) -> None:
    test_reader.test_every_export_round_trips(LoopConfig.from_dict({NAME: "cudnn"}))
    test_reader.test_every_export_round_trips(LoopConfig())
