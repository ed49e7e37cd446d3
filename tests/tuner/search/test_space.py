from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from trainers import LEVERS, SYNC_MODES, ConfigError, LoopConfig, field_names
from trainers.levers import FIELD_LEVERS
from tuner.errors import SpaceError
from tuner.search.options import RunOptions
from tuner.search.proposing.defaults import AUTO_SCALE_BUDGET_S, AUTO_SEARCH_BUDGET_S
from tuner.search.spaces.named import (
    AUTOTUNE_TRAIN_STEPS,
    DEFAULT_SPACE,
    full_space,
    load_space,
    parse_fix,
    streams_space,
)
from tuner.search.spaces.space import (
    SIMPLICITY_ORDER,
    Choice,
    IntRange,
    SearchSpace,
    Spec,
    config_key,
    simplicity_key,
)
from tuner.search.study import search_budget

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _inside(config: LoopConfig, space: SearchSpace) -> None:
    """Assert that `config` lies in `space`: searched values in spec, fixed values and defaults."""
    default = LoopConfig()
    for field in field_names():  # every lever of the table, a lever module's too
        value = config.get(field)
        spec = space.params.get(field)
        if isinstance(spec, IntRange):
            assert spec.low <= value <= spec.high, (field, value)
        elif isinstance(spec, Choice):
            assert value in spec.values, (field, value)
        elif field in space.fixed:
            assert value == space.fixed[field], (field, value)
        else:
            assert value == default.get(field), (field, value)


def _ask_many(space: SearchSpace, n: int = 30, seed: int = 0) -> list[LoopConfig]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs = []
    for i in range(n):
        trial = study.ask()
        config = space.suggest(trial)
        configs.append(config)
        study.tell(trial, float(i))
    return configs


def _write(tmp_path: Path, content: Any) -> str:
    path = tmp_path / "space.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# ----------------------------------------------------------------------------- built-ins


def test_streams_space_has_exactly_the_three_seed_settings() -> None:
    space = load_space("streams")
    assert space.name == "streams"
    assert space.params == {
        "num_streams": IntRange(low=2, high=4),
        "sync_interval": IntRange(low=1, high=100, log=True),
        "sync_mode": Choice(values=("event", "synchronize", "query")),
    }
    assert space.fixed == {
        "pin_memory": True,
        "non_blocking": True,
        "prefetch_depth": 0,
        "num_workers": 0,
        "cuda_graph": False,
    }
    # The compiler and memory levers are not the seed's question: they keep their defaults.
    later = {"compile", "optimizer", "micro_batches", "activation_checkpointing"}
    later |= {"checkpoint_share", "compile_scope"}
    # Nor are the data-parallel levers (searched only with --nproc-per-node > 1).
    later |= {"parallel", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph"}
    later |= {"reshard_after_forward", "fsdp_prefetch"}
    # Every LoopConfig field (the table's own levers) is the seed's or one of those.
    assert later <= FIELD_LEVERS
    assert set(space.params) | set(space.fixed) == FIELD_LEVERS - later
    # Nor is a lever module's lever (`offered` searches it in the full-based spaces, not here):
    # every lever the space does not name, in the table as it is now, keeps its default.
    others = set(field_names()) - set(space.params) - set(space.fixed)
    assert others == later | (set(field_names()) - FIELD_LEVERS)
    configs = _ask_many(space, 5)
    assert all(c.get(name) == LEVERS[name].default for c in configs for name in others)
    assert space == streams_space()


def test_full_space_is_the_streams_space_plus_four_settings() -> None:
    space = load_space("full")
    assert space == full_space()
    # The lever table's order: LoopConfig's fields, then each lever module's lever that declares
    # `offered` values, searched over those that compile nothing (this space's trials do not).
    offered = {
        name: values
        for name, lever in LEVERS.items()
        if len(values := tuple(v for v in lever.offered if lever.option(v).cost != "compile")) > 1
    }
    assert "loss" not in offered and LEVERS["loss"].offered  # its other value is a compile
    assert list(space.params) == [
        "num_streams",
        "sync_interval",
        "sync_mode",
        "prefetch_depth",
        "pin_memory",
        "num_workers",
        "cuda_graph",
        *offered,
    ]
    assert set(offered) <= set(LEVERS) - FIELD_LEVERS
    for name, values in offered.items():
        assert space.params[name] == Choice(values=values), name
    assert space.params["cuda_graph"] == Choice(values=(False, True))
    assert space.params["prefetch_depth"] == IntRange(low=0, high=4)
    assert space.params["pin_memory"] == Choice(values=(False, True))
    assert space.params["num_workers"] == Choice(values=(0, 1, 2, 4))
    assert space.fixed == {"non_blocking": True}
    assert space.notes == ()


@pytest.mark.parametrize("name", ["streams", "full"])
def test_suggest_with_a_real_study_stays_inside_the_space(name: str) -> None:
    space = load_space(name)
    configs = _ask_many(space, 30)
    for config in configs:
        _inside(config, space)
        for field, value in space.fixed.items():
            assert config.get(field) == value
    # the search really varies every searched setting
    for field in space.params:
        assert len({c.get(field) for c in configs}) > 1, field


def test_suggest_uses_the_param_names_and_field_order() -> None:
    space = load_space("full")
    study = optuna.create_study()
    trial = study.ask()
    space.suggest(trial)
    study.tell(trial, 1.0)
    frozen = study.trials[0]
    assert list(frozen.params) == list(space.params)
    assert frozen.distributions == space.distributions()


def test_distributions_match_the_specs() -> None:
    dists = load_space("full").distributions()
    assert dists["num_streams"] == optuna.distributions.IntDistribution(2, 4, log=False)
    assert dists["sync_interval"] == optuna.distributions.IntDistribution(1, 100, log=True)
    assert dists["sync_interval"].log is True  # type: ignore[attr-defined]
    assert dists["prefetch_depth"] == optuna.distributions.IntDistribution(0, 4)
    assert dists["sync_mode"] == optuna.distributions.CategoricalDistribution(
        ("event", "synchronize", "query")
    )
    assert dists["num_workers"] == optuna.distributions.CategoricalDistribution((0, 1, 2, 4))
    assert set(dists) == set(load_space("full").params)


@pytest.mark.parametrize("name", ["streams", "full"])
def test_config_from_params_rebuilds_what_suggest_made(name: str) -> None:
    space = load_space(name)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    made = []
    for _ in range(15):
        trial = study.ask()
        made.append(space.suggest(trial))
        study.tell(trial, 0.0)
    rebuilt = [space.config_from_params(t.params) for t in study.trials]
    assert rebuilt == made


def test_config_from_params_rejects_params_of_another_space() -> None:
    space = load_space("streams")
    good = {"num_streams": 2, "sync_interval": 5, "sync_mode": "event"}
    assert space.config_from_params(good) == LoopConfig(
        num_streams=2, sync_interval=5, sync_mode="event", pin_memory=True, non_blocking=True
    )
    with pytest.raises(SpaceError) as err:
        space.config_from_params({**good, "cuda_graph": True})
    assert err.value.field == "cuda_graph"
    with pytest.raises(SpaceError) as err:
        space.config_from_params({"num_streams": 2, "sync_mode": "event"})
    assert err.value.field == "sync_interval"
    with pytest.raises(SpaceError) as err:
        space.config_from_params({**good, "num_streams": 1})
    assert err.value.field == "num_streams"
    with pytest.raises(SpaceError) as err:
        space.config_from_params({**good, "sync_mode": "spin"})
    assert err.value.field == "sync_mode"


@pytest.mark.parametrize("name", ["streams", "full"])
def test_to_dict_from_dict_round_trips_through_json(name: str) -> None:
    space = load_space(name, fix=["num_streams=3"], cuda=False)
    text = json.dumps(space.to_dict())
    back = SearchSpace.from_dict(json.loads(text))
    assert back == space
    assert back.to_dict() == space.to_dict()
    assert isinstance(back.params["sync_mode"], Choice)
    assert back.notes == space.notes


def test_from_dict_is_checked() -> None:
    data = load_space("streams").to_dict()
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_dict({**data, "colour": "red"})
    assert err.value.field == "colour"
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_dict({**data, "params": {**data["params"], "num_streams": 3}})
    assert err.value.field == "num_streams"
    with pytest.raises(SpaceError) as err:
        SearchSpace.from_dict({**data, "fixed": {**data["fixed"], "sync_mode": "event"}})
    assert err.value.field == "sync_mode"  # both searched and fixed


def test_search_space_constructor_checks_its_specs() -> None:
    with pytest.raises(SpaceError) as err:
        SearchSpace(name="x", params={"num_streams": IntRange(low=0, high=2)}, fixed={})
    assert err.value.field == "num_streams"
    with pytest.raises(SpaceError) as err:
        SearchSpace(name="x", params={}, fixed={"streams": 2})
    assert err.value.field == "streams"


def test_an_empty_space_suggests_the_fixed_config() -> None:
    space = SearchSpace(name="x", params={}, fixed={"num_streams": 2})
    study = optuna.create_study()
    assert space.suggest(study.ask()) == LoopConfig(num_streams=2)
    assert space.distributions() == {}


# ----------------------------------------------------------------------------- space files


def test_a_space_file_with_choices_ranges_and_scalars(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "num_streams": [1, 2],
            "sync_interval": {"low": 2, "high": 64, "log": True},
            "prefetch_depth": {"low": 0, "high": 2},
            "sync_mode": "query",
            "pin_memory": True,
            "non_blocking": [True],
        },
    )
    space = load_space(path)
    assert space.name == path
    assert space.params == {
        "num_streams": Choice(values=(1, 2)),
        "sync_interval": IntRange(low=2, high=64, log=True),
        "prefetch_depth": IntRange(low=0, high=2, log=False),
        "non_blocking": Choice(values=(True,)),
    }
    assert space.fixed == {"sync_mode": "query", "pin_memory": True}
    configs = _ask_many(space, 30, seed=1)
    for config in configs:
        _inside(config, space)
        assert config.sync_mode == "query"
        assert config.pin_memory is True
        assert config.num_workers == 0  # not listed: the LoopConfig default
        assert config.cuda_graph is False
    assert {c.num_streams for c in configs} == {1, 2}
    assert space.distributions()["sync_interval"] == optuna.distributions.IntDistribution(
        2, 64, log=True
    )
    assert SearchSpace.from_dict(json.loads(json.dumps(space.to_dict()))) == space


def test_an_empty_space_file_gives_the_pytorch_default(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, {}))
    assert space.params == {} and space.fixed == {}
    assert space.suggest(optuna.create_study().ask()) == LoopConfig()


BAD_FILES: list[tuple[str, Any, str]] = [
    ("unknown key", {"num_streams": [1, 2], "streams": [1, 2]}, "streams"),
    ("top level is a list", [{"num_streams": [1, 2]}], "space"),
    ("top level is a number", 3, "space"),
    ("empty list", {"sync_mode": []}, "sync_mode"),
    ("duplicate choices", {"num_workers": [0, 2, 2]}, "num_workers"),
    ("range on sync_mode", {"sync_mode": {"low": 1, "high": 2}}, "sync_mode"),
    ("range on a bool", {"pin_memory": {"low": 0, "high": 1}}, "pin_memory"),
    ("low > high", {"num_streams": {"low": 3, "high": 2}}, "num_streams"),
    ("log with low 0", {"prefetch_depth": {"low": 0, "high": 4, "log": True}}, "prefetch_depth"),
    ("float bound", {"sync_interval": {"low": 1.5, "high": 8}}, "sync_interval"),
    ("bool bound", {"num_streams": {"low": True, "high": 3}}, "num_streams"),
    ("string bound", {"num_streams": {"low": "1", "high": 3}}, "num_streams"),
    ("log not a bool", {"sync_interval": {"low": 1, "high": 8, "log": "yes"}}, "sync_interval"),
    ("extra range key", {"sync_interval": {"low": 1, "high": 8, "step": 2}}, "sync_interval"),
    ("range without high", {"sync_interval": {"low": 1}}, "sync_interval"),
    ("choice out of range", {"num_streams": [1, 5]}, "num_streams"),
    ("choice of the wrong type", {"pin_memory": [False, "yes"]}, "pin_memory"),
    ("unknown sync mode", {"sync_mode": ["event", "spin"]}, "sync_mode"),
    ("bool as an int choice", {"num_workers": [0, True]}, "num_workers"),
    ("range end out of range", {"num_streams": {"low": 1, "high": 5}}, "num_streams"),
    ("range start out of range", {"num_workers": {"low": -1, "high": 2}}, "num_workers"),
    ("bad scalar", {"prefetch_depth": 9}, "prefetch_depth"),
    ("null scalar", {"cuda_graph": None}, "cuda_graph"),
    ("duplicate key", '{"num_streams": [1], "num_streams": [2]}', "num_streams"),
    ("invalid JSON", '{"num_streams": [1, 2],}', "space"),
]


@pytest.mark.parametrize(
    ("content", "field"), [(c, f) for _, c, f in BAD_FILES], ids=[i for i, _, _ in BAD_FILES]
)
def test_an_invalid_space_file_names_the_setting(tmp_path: Path, content: Any, field: str) -> None:
    with pytest.raises(SpaceError) as err:
        load_space(_write(tmp_path, content))
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}=")


def test_unknown_key_lists_the_field_names(tmp_path: Path) -> None:
    with pytest.raises(SpaceError) as err:
        load_space(_write(tmp_path, {"streams": 2}))
    for name in field_names():
        assert name in err.value.allowed


def test_a_missing_space_file(tmp_path: Path) -> None:
    with pytest.raises(SpaceError) as err:
        load_space(str(tmp_path / "nope.json"))
    assert err.value.field == "space"


@pytest.mark.parametrize("spec", ["", "fast", "space.yaml", "Full"])
def test_an_unknown_space_name(spec: str) -> None:
    with pytest.raises(SpaceError) as err:
        load_space(spec)
    assert err.value.field == "space"
    assert err.value.allowed == "auto, streams, full, compile, scale or a .json file"


# ----------------------------------------------------------------------------- pins


def test_parse_fix_converts_by_field_type() -> None:
    pins = parse_fix(
        [
            "num_streams=3",
            "sync_interval = 10",
            "sync_mode=query",
            "pin_memory=TRUE",
            "non_blocking=no",
            "cuda_graph=1",
            "num_workers=0",
        ]
    )
    assert pins == {
        "num_streams": 3,
        "sync_interval": 10,
        "sync_mode": "query",
        "pin_memory": True,
        "non_blocking": False,
        "cuda_graph": True,
        "num_workers": 0,
    }
    assert type(pins["num_streams"]) is int and type(pins["pin_memory"]) is bool
    assert parse_fix([]) == {}
    assert parse_fix(["pin_memory=Yes", "cuda_graph=False", "non_blocking=0"]) == {
        "pin_memory": True,
        "cuda_graph": False,
        "non_blocking": False,
    }


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ("num_streams", "fix"),
        ("", "fix"),
        ("streams=2", "streams"),
        ("=2", "fix"),  # the name missing: it had been "''='2' is invalid"
        ("modules=x", "modules"),
        ("num_streams=two", "num_streams"),
        ("num_streams=2.0", "num_streams"),
        ("num_streams=9", "num_streams"),
        ("sync_interval=0", "sync_interval"),
        ("sync_mode=spin", "sync_mode"),
        ("pin_memory=maybe", "pin_memory"),
        ("cuda_graph=2", "cuda_graph"),
    ],
)
def test_parse_fix_errors_name_the_item(item: str, field: str) -> None:
    with pytest.raises(SpaceError) as err:
        parse_fix([item])
    assert err.value.field == field


def test_a_misspelt_pin_names_the_closest_setting() -> None:
    with pytest.raises(SpaceError, match=r"a LoopConfig field \(did you mean num_streams\?\)"):
        parse_fix(["streams=2"])
    with pytest.raises(SpaceError) as err:
        parse_fix(["zzzz=2"])  # nothing close: the list alone
    assert "did you mean" not in str(err.value) and "num_streams" in str(err.value)


def test_modules_is_said_to_hold_the_lever_modules_values() -> None:
    """`modules` is a LoopConfig keyword: "allowed a LoopConfig field" denied it (a probe)."""
    with pytest.raises(SpaceError, match=r"allowed a lever's own name \(modules holds the lever"):
        parse_fix(["modules=x"])


def test_parse_fix_rejects_a_setting_pinned_twice() -> None:
    with pytest.raises(SpaceError) as err:
        parse_fix(["num_streams=2", "num_streams=3"])
    assert err.value.field == "num_streams"


def test_pins_move_settings_from_the_search_to_fixed() -> None:
    space = load_space("full", fix=["num_streams=2", "sync_mode=event", "non_blocking=false"])
    assert "num_streams" not in space.params and "sync_mode" not in space.params
    assert space.fixed == {
        "num_streams": 2,
        "sync_mode": "event",
        "non_blocking": False,
    }
    # The rest of the full space is still searched, as it was.
    assert set(space.params) == set(load_space("full").params) - {"num_streams", "sync_mode"}
    assert len(space.params) == len(load_space("full").params) - 2
    for config in _ask_many(space, 10):
        assert (config.num_streams, config.sync_mode, config.non_blocking) == (2, "event", False)
    # a pin may leave the built-in range: it replaces the search
    assert load_space("streams", fix=["num_streams=1"]).fixed["num_streams"] == 1


def test_pins_apply_to_space_files(tmp_path: Path) -> None:
    path = _write(tmp_path, {"num_workers": [0, 2], "sync_mode": "event"})
    space = load_space(path, fix=["num_workers=4", "sync_mode=query"])
    assert space.params == {}
    assert space.fixed == {"num_workers": 4, "sync_mode": "query"}


def test_a_pin_over_the_users_own_space_is_said(tmp_path: Path) -> None:
    """The pin wins over a space file or mapping (above), which went unsaid (a session's note,
    2026-12-04): one line per setting the space searched, or fixed to another value."""
    from tuner.search.spaces.own import pins_over

    own = {"num_workers": [0, 2], "sync_mode": "event", "num_streams": {"low": 1, "high": 3}}
    path = _write(tmp_path, own)
    fix = ["num_workers=4", "sync_mode=query", "prefetch_depth=1"]
    assert pins_over(path, fix) == [
        f"pinned num_workers=4: the pin wins over space {path!r}, which searched 0, 2",
        f"pinned sync_mode='query': the pin wins over space {path!r}, which fixed it to 'event'",
    ]
    # The same value as the space's fixed one, or a setting it does not name: nothing to say.
    assert pins_over(own, {"sync_mode": "event", "num_streams": 2}) == [
        "pinned num_streams=2: the pin wins over space 'custom', which searched 1..3"
    ]
    # A named space is there to be narrowed by pins.
    assert pins_over("full", fix) == []


# ----------------------------------------------------------------------------- CPU mode


def test_cpu_mode_drops_cuda_graph_with_a_note() -> None:
    space = load_space("full", cuda=False)
    assert "cuda_graph" not in space.params
    assert space.fixed["cuda_graph"] is False
    # The other levers of the space with values its `refuse_on` refuses on a CPU (none among
    # LoopConfig's fields: a lever module's, `offered` with a CUDA-only value): one left with
    # its default alone leaves the space without a note (a CPU study stored before the lever
    # was offered resumes), one left with more is narrowed with a note.
    refused = {
        name: tuple(v for v in spec.values if not LEVERS[name].refusal(v, "cpu"))
        for name, spec in load_space("full").params.items()
        if name != "cuda_graph"
        and isinstance(spec, Choice)
        and any(LEVERS[name].refusal(v, "cpu") for v in spec.values)
    }
    assert not set(refused) & FIELD_LEVERS
    alone = {name for name, kept in refused.items() if kept == (LEVERS[name].default,)}
    assert "float8_head" in alone  # a CUDA-only value beside its default
    assert not alone & (set(space.params) | set(space.fixed))
    assert space.notes[0] == "cuda_graph fixed to false: no CUDA device"
    assert [note.split()[0] for note in space.notes[1:]] == [n for n in refused if n not in alone]
    assert all(note.endswith("refused on cpu") for note in space.notes[1:])
    # A space of one's own names what it asked for: the lever fixed to its default, noted.
    own = load_space({"num_streams": [1, 2], "float8_head": ["bf16", "float8"]}, cuda=False)
    assert own.fixed["float8_head"] == "bf16" and "float8_head" not in own.params
    assert own.notes == ("float8_head float8 left out: refused on cpu",)
    assert "cuda_graph" not in space.distributions()
    assert all(not c.cuda_graph for c in _ask_many(space, 10))
    assert load_space("full", cuda=True).notes == ()
    # nothing to drop: no note
    assert load_space("streams", cuda=False) == load_space("streams")


def test_a_space_whose_every_searched_setting_needs_a_gpu_is_refused_on_a_cpu() -> None:
    """Dropping them left nothing searched, and every trial ran the plain default unsaid."""
    for given, named in (
        ({"cuda_graph": [True, False]}, "cuda_graph fixed to false: no CUDA device"),
        ({"float8_head": ["bf16", "float8"]}, "float8_head float8 left out: refused on cpu"),
    ):
        with pytest.raises(SpaceError, match="a space with a setting a CPU searches") as err:
            load_space(given, cuda=False)
        assert err.value.field == "space" and err.value.value == list(given)
        assert named in str(err.value)
        assert load_space(given, cuda=True).params  # a GPU searches it
    # One setting left to search is enough; a space that searched nothing stays as it was.
    assert list(load_space({"cuda_graph": [True, False], "num_streams": [1, 2]}, cuda=False).params)
    assert not load_space({"num_streams": 2}, cuda=False).params


def test_a_pinned_value_refused_on_a_cpu_names_the_values_that_run_there() -> None:
    """`--fix attention=flash` on a CPU had said "allowed attention='flash' is a CUDA kernel":
    the refusal's sentence where the values allowed go (a probe, 2026-12-06)."""
    for name, item in LEVERS.items():
        refused = [v for v in item.values() if item.refusal(v, "cpu") is not None]
        if not refused or name in FIELD_LEVERS:
            continue
        runs = [v for v in item.values() if item.refusal(v, "cpu") is None]
        with pytest.raises(SpaceError) as err:
            load_space("full", fix=(f"{name}={refused[0]}",), cuda=False)
        assert err.value.field == name
        said = str(err.value)
        assert said.startswith(f"{name}={refused[0]!r} is invalid: allowed {runs[0]!r}"), said
        assert said.endswith(f"on cpu: {item.refusal(refused[0], 'cpu')}"), said


def test_cpu_mode_rejects_a_required_graph(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="CUDA graphs need a CUDA device") as err:
        load_space("full", fix=["cuda_graph=true"], cuda=False)
    assert err.value.field == "cuda_graph"
    with pytest.raises(SpaceError) as err:
        load_space(_write(tmp_path, {"cuda_graph": True}), cuda=False)
    assert err.value.field == "cuda_graph"
    with pytest.raises(SpaceError) as err:
        load_space(_write(tmp_path, {"cuda_graph": [True]}), cuda=False)
    assert err.value.field == "cuda_graph"
    # A graph pinned off leaves no note of its own: only the other levers' CPU refusals, if any.
    cpu_notes = load_space("full", cuda=False).notes
    assert load_space("full", fix=["cuda_graph=false"], cuda=False).notes == cpu_notes[1:]
    assert cpu_notes[0] == "cuda_graph fixed to false: no CUDA device"


# ----------------------------------------------------------------------------- simplicity, ids


def _every_config() -> list[LoopConfig]:
    return [
        LoopConfig(
            num_streams=streams,
            sync_interval=interval,
            sync_mode=mode,  # type: ignore[arg-type]
            prefetch_depth=prefetch,
            pin_memory=pin,
            non_blocking=nb,
            num_workers=workers,
            cuda_graph=graph,
        )
        for streams in (1, 2, 3, 4)
        for interval in (1, 10)
        for mode in SYNC_MODES
        for prefetch in (0, 2)
        for pin in (False, True)
        for nb in (False, True)
        for workers in (0, 2)
        for graph in (False, True)
    ]


def test_simplicity_key_puts_the_pytorch_default_first() -> None:
    configs = _every_config()
    ranked = sorted(configs, key=simplicity_key)
    assert ranked[0] == LoopConfig()
    assert all(simplicity_key(LoopConfig()) < simplicity_key(c) for c in ranked[1:])


def test_simplicity_key_follows_the_documented_order() -> None:
    base = LoopConfig(num_streams=2, sync_interval=10, sync_mode="event")

    def simpler(a: LoopConfig, b: LoopConfig) -> bool:
        return simplicity_key(a) < simplicity_key(b)

    assert simpler(base, base.replace(num_streams=3, cuda_graph=False))
    assert simpler(base.replace(cuda_graph=True), base.replace(num_streams=3))  # streams first
    assert simpler(base, base.replace(cuda_graph=True))  # equal streams: no graph first
    assert simpler(base.replace(prefetch_depth=4), base.replace(cuda_graph=True))
    assert simpler(base.replace(num_workers=4), base.replace(prefetch_depth=1))
    assert simpler(base.replace(sync_mode="query"), base.replace(num_workers=1))
    assert simpler(base.replace(sync_mode="synchronize"), base)
    assert simpler(base, base.replace(sync_mode="query"))
    assert simpler(base.replace(sync_mode="synchronize", pin_memory=True), base)
    assert simpler(base.replace(non_blocking=True), base.replace(pin_memory=True))
    assert simpler(base.replace(sync_interval=100), base.replace(non_blocking=True))
    assert simpler(base.replace(sync_interval=1), base)
    assert "synchronize < event < query" in SIMPLICITY_ORDER
    # Compilation first: a tie never asks for a compile, or a rebuilt optimizer, for nothing.
    assert simpler(base.replace(num_streams=4, cuda_graph=True), base.replace(compile="default"))
    assert simpler(base.replace(optimizer="fused"), base.replace(compile="default"))
    assert simpler(base.replace(num_streams=4), base.replace(optimizer="foreach"))
    assert simpler(base.replace(optimizer="foreach"), base.replace(optimizer="fused"))


def test_config_key_is_stable_and_distinguishes_configs() -> None:
    configs = _every_config()
    keys = {config_key(c) for c in configs}
    assert len(keys) == len(configs)
    key = config_key(LoopConfig(num_streams=2, sync_mode="event"))
    assert key == config_key(LoopConfig(sync_mode="event", num_streams=2))
    assert len(key) == 12 and all(ch in "0123456789abcdef" for ch in key)
    # pinned: sha1 of the sorted compact JSON of LoopConfig(); a changed form breaks every cache
    assert config_key(LoopConfig()) == "53b15d1b156a"


def test_spec_type_alias_covers_both_specs() -> None:
    specs: list[Spec] = [Choice(values=[1, 2]), IntRange(low=1, high=2)]  # type: ignore[arg-type]
    assert specs[0] == Choice(values=(1, 2))  # any sequence is stored as a tuple


def test_the_compile_space_searches_the_compiler_levers_and_drops_cuda_ones_on_a_cpu() -> None:
    on_gpu = load_space("compile")
    assert on_gpu.params["compile"] == Choice(
        values=("none", "default", "max-autotune-no-cudagraphs", "reduce-overhead")
    )
    assert on_gpu.params["optimizer"] == Choice(values=("as-built", "foreach", "fused"))
    # Not the compiled loss: without `compile_scope` searched, a draw of it beside a compiled
    # model would run that model again (`Lever.inert`).
    assert "loss" not in on_gpu.params
    assert set(on_gpu.params) - {"compile", "optimizer"} == set(load_space("full").params)
    on_cpu = load_space("compile", cuda=False)
    assert "reduce-overhead" not in on_cpu.params["compile"].values  # type: ignore[union-attr]
    assert "cuda_graph" not in on_cpu.params and on_cpu.fixed["cuda_graph"] is False
    assert any("reduce-overhead" in note for note in on_cpu.notes)
    with pytest.raises(SpaceError, match="compile='reduce-overhead'"):
        load_space("compile", fix=("compile=reduce-overhead",), cuda=False)


def test_a_combination_the_harness_refuses_is_an_error_when_suggested() -> None:
    space = load_space("compile")
    graph_over_graphs = {
        name: spec.values[0] if isinstance(spec, Choice) else spec.low
        for name, spec in space.params.items()
    }
    graph_over_graphs |= {"cuda_graph": True, "compile": "reduce-overhead"}
    with pytest.raises(ConfigError, match="compile"):
        space.suggest(optuna.trial.FixedTrial(graph_over_graphs))
    graph_over_graphs["compile"] = "default"
    assert space.suggest(optuna.trial.FixedTrial(graph_over_graphs)).compile == "default"


def test_only_the_default_space_on_a_gpu_gets_a_default_search_budget() -> None:
    auto = load_space("auto", cuda=True).name
    assert search_budget(None, auto) == AUTO_SEARCH_BUDGET_S == 240.0
    assert search_budget(30.0, auto) == 30.0
    assert search_budget(None, load_space("scale", cuda=True).name) == AUTO_SCALE_BUDGET_S == 480.0
    assert search_budget(60.0, load_space("scale", cuda=True).name) == 60.0
    assert search_budget(None, load_space("compile", cuda=True).name) is None
    assert search_budget(None, load_space("auto", cuda=False).name) is None


def test_the_default_space_is_compile_without_autotune_on_a_gpu_and_full_on_a_cpu() -> None:
    assert DEFAULT_SPACE == "auto" and RunOptions(workload="mlp", preset="tiny").space == "auto"
    auto, compile_ = load_space("auto", cuda=True), load_space("compile", cuda=True)
    assert auto.name == "auto" and compile_.name == "compile"
    assert auto.params["compile"] == Choice(values=("none", "default", "reduce-overhead"))
    assert "max-autotune-no-cudagraphs" in compile_.params["compile"].values  # type: ignore[union-attr]
    assert {k: v for k, v in auto.params.items() if k != "compile"} == {
        k: v for k, v in compile_.params.items() if k != "compile"
    }
    assert load_space("auto", cuda=False) == load_space("full", cuda=False)
    pinned = load_space("auto", fix=("compile=default",), cuda=True)
    assert pinned.fixed["compile"] == "default" and "compile" not in pinned.params
    with pytest.raises(SpaceError, match="auto, streams, full, compile"):
        load_space("fastest")


def test_a_long_planned_run_brings_max_autotune_into_the_default_gpu_space() -> None:
    def modes(train_steps: int | None) -> tuple[object, ...]:
        space = load_space("auto", cuda=True, train_steps=train_steps)
        assert space.name == "auto"  # the default budget still applies
        return space.params["compile"].values  # type: ignore[union-attr]

    autotune = "max-autotune-no-cudagraphs"
    assert autotune not in modes(None)
    assert autotune not in modes(AUTOTUNE_TRAIN_STEPS - 1)
    assert autotune in modes(AUTOTUNE_TRAIN_STEPS)
    assert load_space("auto", cuda=False, train_steps=10**6) == load_space("full", cuda=False)


def test_simplicity_key_reads_the_lever_tables_ranks_as_it_wrote_them_out() -> None:
    # The ranks the tie rule used before the lever table held them: a tie must break the same way.
    config = LoopConfig(
        parallel="ddp",
        compile="max-autotune-no-cudagraphs",
        optimizer="fused",
        num_streams=3,
        prefetch_depth=2,
        num_workers=4,
        sync_mode="query",
        pin_memory=True,
        sync_interval=10,
        bucket_cap_mb=50,
        static_graph=True,
    )
    assert simplicity_key(config) == (1, 2, 2, 3, 0, 2, 4, 2, 1, 0, 10, 1, 0, 1, 0, 0)
    assert simplicity_key(LoopConfig(parallel="fsdp2", reshard_after_forward=False))[-2] == 1
    assert simplicity_key(LoopConfig(cuda_graph=True, compile="default"))[:5] == (0, 1, 0, 1, 1)
