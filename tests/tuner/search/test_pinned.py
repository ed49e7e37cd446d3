"""A `--fix` pin no draw could run is refused before the first trial, and one some draws run
stands (`tuner.search.spaces.pinned`): the real lever table (float8_linears, float8_head) and
test levers of their own rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.tuner.search.test_earlier import Said
from tests.tuner.tiny import load, options, sqlite_url
from trainers import INERT
from trainers.levers import Lever, ranked, registered
from tuner.errors import SpaceError
from tuner.search.spaces.named import load_space
from tuner.search.spaces.pinned import MAX_COMBINATIONS, check_pins, live_for_pins
from tuner.search.spaces.processes import for_processes
from tuner.search.spaces.space import Choice, IntRange, SearchSpace
from tuner.search.study import run_study

HEAD = Choice(values=("bf16", "float8"))


def _space(params: dict[str, Any], fixed: dict[str, Any], name: str = "scale") -> SearchSpace:
    return SearchSpace(name=name, params=params, fixed=fixed)


def test_the_head_alone_pinned_beside_a_searched_head_is_left_to_each_draw() -> None:
    """`float8_linears=none` runs beside `float8_head=float8`: with the head searched, some draws
    run it, so the pin stands and the space is not changed (a study stored with it resumes)."""
    space = _space({"float8_head": HEAD}, {"float8_linears": "none"})
    check_pins(space, ("float8",), None)
    check_pins(_space({}, {"float8_linears": "none", "float8_head": "float8"}), ("float8",), None)


@pytest.mark.parametrize("head", [{"float8_head": "bf16"}, {}], ids=["pinned", "default"])
def test_a_pin_every_combination_refuses_names_the_pin_and_what_it_allows(
    head: dict[str, Any],
) -> None:
    """The head pinned to bf16, or left at its default by a space that does not search it (a
    study that runs float8 alone): no draw could run `none`."""
    space = _space({"micro_batches": Choice(values=(1, 2))}, {"float8_linears": "none"} | head)
    with pytest.raises(SpaceError) as caught:
        check_pins(space, ("float8",), None)
    assert caught.value.field == "float8_linears" and caught.value.value == "none"
    assert "float8_head='float8'" in caught.value.allowed


def test_a_pin_no_precision_of_the_study_runs_is_refused_and_one_that_runs_is_kept() -> None:
    space = _space({"micro_batches": Choice(values=(1, 2))}, {"float8_linears": "8M"})
    with pytest.raises(SpaceError) as caught:
        check_pins(space, ("bf16",), None)
    assert caught.value.field == "float8_linears" and "float8" in caught.value.allowed
    # A study that may choose float8 runs it there (its bf16 trials refuse it one by one).
    check_pins(space, ("bf16", "float8"), None)


def _reader(reads: tuple[str, ...], refuses: Any) -> Lever:
    """A test lever whose pinned `on` is refused beside the values `refuses(get)` says."""

    def conflicts(value: Any, get: Any) -> str | None:
        if value == "on" and refuses(get):
            return f"off beside {', '.join(f'{r}={get(r)!r}' for r in reads)}"
        return None

    return Lever(
        name="pinned_lever",
        label="a test's lever whose rule reads others",
        kind="str",
        default="off",
        added=99,
        options=ranked(("off", "none", "exact", 0), ("on", "none", "exact", 1)),
        conflicts=conflicts,
    )


def test_a_rule_of_two_searched_levers_fails_only_where_no_combination_runs() -> None:
    streams, syncs = Choice(values=(1, 2)), Choice(values=("synchronize", "event"))
    params = {"num_streams": streams, "sync_mode": syncs}
    pinned = {"pinned_lever": "on"}

    def one_left(get: Any) -> bool:  # runs beside 2 streams and events only
        return not (get("num_streams") == 2 and get("sync_mode") == "event")

    with registered(_reader(("num_streams", "sync_mode"), one_left)):
        # One combination of the two levers runs: the pin stands.
        check_pins(_space(params, pinned, name="full"), ("fp32",), None)
        # With one of them fixed elsewhere, none does.
        fixed = _space({"sync_mode": syncs}, pinned | {"num_streams": 1}, name="full")
        with pytest.raises(SpaceError, match="num_streams=1"):
            check_pins(fixed, ("fp32",), None)
    with registered(_reader(("num_streams", "sync_mode"), lambda get: True)):
        with pytest.raises(SpaceError) as caught:
            check_pins(_space(params, pinned, name="full"), ("fp32",), None)
        assert caught.value.field == "pinned_lever"


def test_a_rule_that_reads_a_range_or_too_many_values_is_left_to_each_draw() -> None:
    with registered(_reader(("num_workers",), lambda get: True)):
        ranged = _space({"num_workers": IntRange(low=0, high=4)}, {"pinned_lever": "on"})
        check_pins(ranged, ("fp32",), None)
    with registered(_reader(("num_workers", "sync_interval"), lambda get: True)):
        workers, intervals = Choice(values=tuple(range(33))), Choice(values=tuple(range(1, 9)))
        assert len(workers.values) * len(intervals.values) > MAX_COMBINATIONS
        params = {"num_workers": workers, "sync_interval": intervals}
        wide = _space(params, {"pinned_lever": "on"}, name="full")
        check_pins(wide, ("fp32",), None)
    with registered(_reader(("num_workers",), lambda get: True)):
        # A fixed setting it reads is no draw: refused once, up front.
        fixed = _space({}, {"pinned_lever": "on", "num_workers": 2})
        with pytest.raises(SpaceError, match="num_workers=2"):
            check_pins(fixed, ("fp32",), None)


@pytest.mark.parametrize(
    ("pin", "owner", "searched", "allowed"),
    [
        ({"bucket_cap_mb": 5}, {}, {}, "25 with parallel='none'"),
        ({"reshard_after_forward": False}, {"parallel": "ddp"}, {}, "True with parallel='ddp'"),
        ({"checkpoint_share": 0.5}, {}, {}, "1.0 with activation_checkpointing='none'"),
        (
            {"checkpoint_share": 0.5},
            {},
            {"activation_checkpointing": Choice(values=("none",))},
            "1.0 with activation_checkpointing='none'",
        ),
    ],
)
def test_a_pin_inert_under_every_value_of_its_owner_is_refused(
    pin: dict[str, Any], owner: dict[str, Any], searched: dict[str, Any], allowed: str
) -> None:
    """Each draw had reset it to its default (`trainers.canonical`): the study ran and kept
    none, and the pin filter then recommended nothing."""
    with pytest.raises(SpaceError) as caught:
        check_pins(_space(searched, pin | owner, name="full"), ("fp32",), None)
    ((name, value),) = pin.items()
    assert caught.value.field == name and caught.value.value == value
    assert allowed in caught.value.allowed


@pytest.mark.parametrize(
    ("pin", "owner", "searched"),
    [
        ({"bucket_cap_mb": 5}, {"parallel": "ddp"}, {}),
        (
            {"checkpoint_share": 0.5},
            {},
            {"activation_checkpointing": Choice(values=("none", "blocks"))},
        ),
        ({"checkpoint_share": 0.5}, {"activation_checkpointing": "blocks"}, {}),
        ({"bucket_cap_mb": 25}, {}, {}),  # its default: inert or not, nothing is lost
    ],
)
def test_a_pin_some_value_of_its_owner_keeps_stands(
    pin: dict[str, Any], owner: dict[str, Any], searched: dict[str, Any]
) -> None:
    check_pins(_space(searched, pin | owner, name="full"), ("fp32",), None)


@pytest.mark.parametrize(
    ("fix", "owner", "left"),
    [
        # A recompute share means something only with recomputation: "none" is cut.
        ("checkpoint_share=0.5", "activation_checkpointing", ("selective", "blocks")),
        # Each block compiled needs a mode that compiles without recording graphs.
        ("compile_scope=blocks", "compile", None),
    ],
)
def test_a_pin_inert_under_some_values_of_its_owner_cuts_them_from_the_search(
    fix: str, owner: str, left: tuple[Any, ...] | None
) -> None:
    """Those draws had reset the pin (`trainers.canonical`) and run a config the user had ruled
    out, which the pin filter then never recommended."""
    space = load_space("compile", fix=[fix]) if left is None else load_space("scale", fix=[fix])
    space = for_processes(space, 2) if owner == "activation_checkpointing" else space
    name = fix.split("=")[0]
    other, inert_at, _ = INERT[name]
    assert other == owner
    before = space.params[owner]
    assert isinstance(before, Choice) and any(v in inert_at for v in before.values)
    cut = live_for_pins(space)
    after = cut.params[owner]
    assert isinstance(after, Choice)
    assert after.values == tuple(v for v in before.values if v not in inert_at)
    assert left is None or after.values == left
    assert any(owner in note and name in note for note in cut.notes)
    assert live_for_pins(cut) == cut  # nothing left to cut


def test_one_live_value_left_fixes_the_owner_and_a_pin_at_its_default_cuts_nothing() -> None:
    searched = {"activation_checkpointing": Choice(values=("none", "blocks"))}
    cut = live_for_pins(_space(searched, {"checkpoint_share": 0.5}, name="full"))
    assert "activation_checkpointing" not in cut.params
    assert cut.fixed["activation_checkpointing"] == "blocks"
    default = _space(searched, {"checkpoint_share": 1.0}, name="full")
    assert live_for_pins(default) == default


def test_a_study_with_a_pinned_share_runs_every_trial_with_recomputation(tmp_path: Path) -> None:
    """The whole run on a CPU: the recompute share pinned over a space that searches
    recomputation on and off. Before, the draws without it had reset the share and run."""
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"activation_checkpointing": ["none", "selective", "blocks"]}))
    storage = sqlite_url(tmp_path)
    opts = options(
        storage,
        "pinned-share",
        workload="transformer",
        space=str(space),
        trials=4,
        fix=("num_workers=0", "checkpoint_share=0.5"),
    )
    said = Said()
    run_study(opts, progress=said)
    assert any("activation_checkpointing searched over" in line for line in said.lines), said.lines
    study = load(storage, "pinned-share")
    configs = [t.user_attrs["config"] for t in study.trials if "config" in t.user_attrs]
    assert len(configs) >= 2
    assert all(c["activation_checkpointing"] in ("selective", "blocks") for c in configs)
    assert all(c["checkpoint_share"] == 0.5 for c in configs)
