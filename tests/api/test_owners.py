"""The API's models against the owners of their fields (issue 26): the request's fields are
`JobSpec`'s, the space's and the pins' are `trainers.LoopConfig`'s with its allowed values and
bounds, and the worker hands every field of the request on to the run (`RunOptions`)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pydantic
import pytest

import trainers
from api.schemas.jobs import FixIn, JobIn, JobOut, PrecisionName, SpaceIn
from tests.api.conftest import make_worker
from tuner.request import JobSpec
from tuner.search.options import RunOptions
from tuner.service.jobstore import JobStore

SPEC_FIELDS = [f.name for f in dataclasses.fields(JobSpec)]
# LoopConfig's settings the API does not offer (its fields stay as they were; a pin of these is
# `python -m tuner run --fix`'s for now). A new LoopConfig field fails this test until it is
# offered or listed here.
NOT_IN_THE_API: set[str] = set()
# Every field of the request with a value that is not its default.
EVERYTHING: dict[str, Any] = {
    "workload": "mlp",
    "preset": "small",
    "space": {"num_streams": [1, 2], "sync_mode": ["event", "query"]},
    "fix": {"num_workers": 0, "pin_memory": True},
    "trials": 7,
    "timeout_s": 120.5,
    "objectives": ["throughput", "memory"],
    "max_memory_bytes": 2**30,
    "device": "cpu",
    "model_args": {"batch": "8"},
    "precision": "bf16-autocast",
    # One precision: several are refused with nproc_per_node > 1 (the data-parallel gate judges
    # one); tests/tuner/search/test_precisions.py searches several.
    "precisions": ["bf16-autocast"],
    "nproc_per_node": 2,
    "screen": "on",
    # 0 (off): the one patience RunOptions takes beside objectives throughput,memory.
    "patience": 0,
    "gpus": 2,
}


def test_the_request_has_jobspecs_fields_and_defaults() -> None:
    assert list(JobIn.model_fields) == SPEC_FIELDS
    assert set(EVERYTHING) == set(SPEC_FIELDS)
    assert JobIn(workload="mlp", preset="tiny").to_spec() == JobSpec(workload="mlp", preset="tiny")
    spec = JobIn.model_validate(EVERYTHING).to_spec()
    default = JobSpec(workload="other", preset="other")
    assert [n for n in SPEC_FIELDS if getattr(spec, n) == getattr(default, n)] == []
    assert spec.objectives == ("throughput", "memory") and spec.space == EVERYTHING["space"]


def test_the_job_shows_every_field_of_its_request(tmp_path: object) -> None:
    store = JobStore(f"sqlite:///{tmp_path}/owners.db")
    row = store.create(JobIn.model_validate(EVERYTHING).to_spec(), owner="me")
    shown = JobOut.of(store.get(row.id)).model_dump()
    assert {name: shown[name] for name in SPEC_FIELDS} == EVERYTHING


def _allowed(model: type[pydantic.BaseModel], name: str, value: object) -> bool:
    try:
        model.model_validate({name: value})
    except pydantic.ValidationError:
        return False
    return True


def _loop_allows(name: str, value: object) -> bool:
    # The field's own rule: a value that is refused only beside other settings (a checkpoint
    # share without checkpointing) is the job's to refuse as a whole, with LoopConfig's reason.
    try:
        trainers.check_setting(name, value)
    except trainers.ConfigError:
        return False
    return True


def _candidates(name: str) -> list[object]:
    # By the lever's declared kind (`trainers.LEVERS`), so a lever module's lever, which is no
    # LoopConfig field with a type hint, is tried too: its values and one it does not declare.
    lever = trainers.LEVERS[name]
    if lever.kind == "str":
        return [*lever.choices(), "bogus"]
    if lever.kind == "bool":
        return [True, False]
    if lever.kind == "float":
        return [0.25, 0.5, 1.0, 0.3, 0.0, -0.5, 2.0]
    return list(range(-2, 40))


def check_request_models(
    space_in: type[pydantic.BaseModel], fix_in: type[pydantic.BaseModel]
) -> None:
    """`space_in` and `fix_in` offer every lever of the table as it is now (`field_names()`, read
    here, not when this module was imported), each with exactly the values LoopConfig allows."""
    loop_fields = trainers.field_names()
    assert list(space_in.model_fields) == list(fix_in.model_fields)
    assert set(fix_in.model_fields) == set(loop_fields) - NOT_IN_THE_API
    assert set(loop_fields) >= NOT_IN_THE_API
    for name in fix_in.model_fields:
        for value in _candidates(name):
            loop = _loop_allows(name, value)
            assert _allowed(fix_in, name, value) == loop, (name, value)
            assert _allowed(space_in, name, value) == loop, (name, value)
            assert _allowed(space_in, name, [value]) == loop, (name, [value])


def test_the_space_and_the_pins_are_loopconfigs_settings_with_its_values() -> None:
    check_request_models(SpaceIn, FixIn)


def test_the_other_choices_are_their_owners() -> None:
    assert typing.get_args(PrecisionName) == trainers.PRECISIONS
    for objectives in (["throughput"], ["throughput", "memory"]):
        JobIn.model_validate(EVERYTHING | {"objectives": objectives})
        RunOptions(workload="mlp", preset="tiny", objectives=tuple(objectives))


# The fields of the request that reach `RunOptions` otherwise than by their own name, and why.
MAPPED = {
    "workload": "workload",  # a plug-in's name becomes its factory path (the registry's target)
    "device": "device",  # auto and cuda become the worker's own device
    "timeout_s": None,  # the job's deadline, kept by the job's slots (JobSlots), not the run
    "gpus": None,  # how many workers join the job (Membership.join), not one run's setting
    "precision": "precision",  # also decides matmul_precision (the worker's, or highest)
}


@pytest.mark.parametrize("name", SPEC_FIELDS)
def test_the_worker_hands_every_field_of_the_request_to_the_run(
    tmp_path: object, name: str
) -> None:
    storage = f"sqlite:///{tmp_path}/handed.db"
    spec = JobIn.model_validate(EVERYTHING).to_spec()
    row = JobStore(storage).create(spec, owner="me")
    options = make_worker(storage).options_for(row, JobSpec.of(row))
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    if name not in MAPPED:
        assert name in fields and getattr(options, name) == getattr(spec, name), name
        return
    target = MAPPED[name]
    if name == "gpus":
        assert spec.max_members == 2 and not hasattr(options, "gpus")
    elif target is None:
        assert options.timeout_s is None
    elif name == "device":
        assert options.device == "cpu"
    elif name == "workload":
        assert options.workload == "mlp"
    else:
        assert (options.precision, options.matmul_precision) == ("bf16-autocast", "highest")
