"""The CLI's `FLAGS` (field -> the flag a user typed, for error messages) against the owners of
the settings: `trainers.LoopConfig`, `RunOptions` and the measurement `Protocol`. Every flag named
exists on a command, every field has a flag or a reason not to, and where `run` and `train` have
a flag for a field its default is the owner's."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import typer.main

import trainers
from tuner.cli import FLAGS, app
from tuner.search.measuring.measure import Protocol
from tuner.search.options import RunOptions

COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]
OWNERS: dict[str, Any] = {
    "LoopConfig": trainers.LoopConfig,
    "RunOptions": RunOptions,
    "Protocol": Protocol,
}
# Fields without a flag of their own, and why.
NO_FLAG = {
    "protocol": "RunOptions' measurement protocol: its fields are flags (--warmup, --windows, ...)",
    "auto_window_steps": "set where --window-steps is not given",
    "precision_spec": "built from --precision, --precisions and --matmul-precision, checked once",
    "scope": "the service's: a job's owner (a CLI run reads every record of its own storage)",
    # Newer levers of LoopConfig: searched by the space and pinned with --fix NAME=VALUE.
    "micro_batches": "--fix",
    "activation_checkpointing": "--fix",
    "checkpoint_share": "--fix",
    "compile_scope": "--fix",
    # The data-parallel levers (searched when --nproc-per-node > 1, pinned with --fix).
    "parallel": "--fix",
    "bucket_cap_mb": "--fix",
    "gradient_as_bucket_view": "--fix",
    "static_graph": "--fix",
    "reshard_after_forward": "--fix",
    "fsdp_prefetch": "--fix",
    # A lever module's values (trainers.levers.register): each pinned with --fix NAME=VALUE.
    "modules": "--fix",
}
# Where a command's default differs from the owner's on purpose.
OWN_DEFAULTS = {
    ("run", "objectives"),  # "throughput" typed, ("throughput",) parsed
    ("run", "fix"),  # None typed, () parsed
    ("run", "model_args"),  # None typed, {} parsed
    ("train", "model_args"),
    # None typed: the CPU's own default where not given (`cli._cpu_defaults`), else the owner's.
    ("run", "final_rounds"),
    ("run", "profile"),
    # None typed: the scale space's window where not given (`search.measurement_protocol`).
    ("run", "window_steps"),
    # None typed: the owner's 5, or the steps where fewer (`cli.train`).
    ("train", "windows"),
}


def _options(command: str) -> dict[str, click.Parameter]:
    return {opt: p for p in COMMANDS[command].params for opt in p.opts}


def _fields() -> dict[str, Any]:
    """field -> its default (dataclasses.MISSING if none), over every owner."""
    found: dict[str, Any] = {}
    for owner in OWNERS.values():
        for field in dataclasses.fields(owner):
            default = field.default
            if field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            found.setdefault(field.name, default)
    return found


def test_every_flag_named_exists_on_a_command() -> None:
    every = {opt for name in COMMANDS for opt in _options(name)}
    assert {flag for flag in FLAGS.values()} - every == set()


def test_every_field_of_the_owners_has_a_flag_or_a_reason() -> None:
    fields = set(_fields())
    assert fields - set(FLAGS) - set(NO_FLAG) == set()
    assert set(NO_FLAG) <= fields  # no stale reason
    assert not set(NO_FLAG) & set(FLAGS)
    run_or_train = {*_options("run"), *_options("train")}
    for name, why in NO_FLAG.items():
        assert f"--{name.replace('_', '-')}" not in run_or_train, (name, why)


def test_where_run_and_train_have_a_fields_flag_its_default_is_the_owners() -> None:
    fields = _fields()
    loop = {f.name for f in dataclasses.fields(trainers.LoopConfig)}
    checked = []
    for command in ("run", "train"):
        options = _options(command)
        for name, flag in FLAGS.items():
            if flag not in options or name not in fields or (command, name) in OWN_DEFAULTS:
                continue
            if command == "run" and name in loop:
                continue  # run pins LoopConfig fields through --fix, not through these
            owner = fields[name]
            if owner is dataclasses.MISSING:
                continue  # the owner has no default (workload, preset): the command picks one
            assert options[flag].default == owner, (command, flag, options[flag].default, owner)
            checked.append((command, name))
    assert ("run", "trials") in checked and ("run", "windows") in checked
    assert ("train", "num_streams") in checked and ("train", "compile") in checked


def test_a_wrong_default_would_be_seen() -> None:
    assert _options("run")["--trials"].default == RunOptions(workload="w", preset="p").trials
    assert _fields()["trials"] != 41


def test_run_leaves_the_window_to_the_job_only_when_not_given() -> None:
    from tuner.flags import RunFlags
    from tuner.request import run_options
    from tuner.search.proposing.defaults import DEFAULT_WINDOW_STEPS

    def options(**flags: object) -> RunOptions:
        given = RunFlags(workload="mlp", **flags)  # type: ignore[arg-type]
        settings = given.settings() | {"final_rounds": 3, "profile": "none"}
        return run_options(given.spec(), **settings)

    default = options()
    assert default.auto_window_steps is True
    assert default.protocol.window_steps == DEFAULT_WINDOW_STEPS
    given = options(window_steps=7)
    assert (given.auto_window_steps, given.protocol.window_steps) == (False, 7)
    # Given as the default's own value, it is still the user's choice: kept on the scale space.
    same = options(window_steps=DEFAULT_WINDOW_STEPS)
    assert same.auto_window_steps is False
