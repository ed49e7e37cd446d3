from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import trainers
from trainers import PRESETS, Workload, WorkloadError, load_workload
from trainers.workloads import disable_dropout
from trainers.workloads.transformer import PAD
from trainers.workloads.transformer import PRESETS as TRANSFORMER_SHAPES


@pytest.mark.parametrize("name", ["transformer", "mlp", "convnet"])
def test_every_builtin_has_tiny_small_large(name: str) -> None:
    assert {"tiny", "small", "large"} <= set(PRESETS[name])


def test_transformer_presets_match_gpu_facts() -> None:
    # The first measured shapes (H100, 2026-11-22): small = d_model 256, 2+2 layers, ff 1024,
    # vocab 1000, batch 64, seq 32; medium = 512, 4+4, 2048, 8000, 64, 64; large = 1024, 4+4,
    # 4096, 16000, 32, 128.
    expected = {
        "small": (256, 2, 2, 1024, 1000, 64, 32),
        "medium": (512, 4, 4, 2048, 8000, 64, 64),
        "large": (1024, 4, 4, 4096, 16000, 32, 128),
    }
    for preset, shape in expected.items():
        s = TRANSFORMER_SHAPES[preset]
        assert (
            s.d_model,
            s.encoder_layers,
            s.decoder_layers,
            s.ff,
            s.vocab,
            s.batch,
            s.seq,
        ) == shape


def test_same_seed_same_weights_and_data_other_seed_differs() -> None:
    a, b, c = (load_workload("transformer", "tiny", seed=s) for s in (0, 0, 1))
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert torch.equal(a.dataset[3][0], b.dataset[3][0])
    assert not torch.equal(a.dataset[3][0], c.dataset[3][0])


def test_reverse_task_targets_are_the_reversed_source() -> None:
    src, tgt_in, tgt_out = load_workload("transformer", "tiny").dataset[0]
    for row in range(src.shape[0]):
        valid = src[row][src[row] != PAD]
        assert valid.numel() >= src.shape[1] // 2
        n = valid.numel()
        assert torch.equal(tgt_out[row][:n], valid.flip(0))
        assert (tgt_out[row][n:] == PAD).all()
        assert torch.equal(tgt_in[row][1:], tgt_out[row][:-1])


def test_disable_dropout_covers_attention() -> None:
    model = load_workload("transformer", "tiny").model
    assert disable_dropout(model) > 0
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert all(
        m.dropout == 0.0 for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)
    )
    assert disable_dropout(model) == 0


def test_user_factory_by_module_path() -> None:
    workload = load_workload("examples.my_workload:build", "tiny")
    assert isinstance(workload, Workload)
    assert workload.name == "my_workload"


def test_a_factory_of_parts_is_named_as_the_user_named_it() -> None:
    # `workload_from_parts` names its workload "custom / custom" unless told: `tuner train`
    # printed that, not the factory and the preset it was asked for.
    workload = load_workload("examples.my_model:build", "tiny")
    assert (workload.name, workload.preset) == ("examples.my_model:build", "tiny")


@pytest.mark.parametrize(
    ("name", "preset", "field", "match"),
    [
        ("resnet", "tiny", "workload", "allowed transformer, mlp, convnet"),
        ("transformer", "huge", "preset", "allowed tiny, small, medium, large"),
        ("no_such_module_xyz:build", "tiny", "workload", "cannot import"),
        ("examples.my_workload:nope", "tiny", "workload", "no callable 'nope'"),
        ("examples.my_workload:build", "huge", "preset", "preset='huge'"),
        ("tests.trainers.helpers:not_a_workload", "tiny", "workload", "not a Workload"),
        # A misspelt name or library prefix gets the closest names, not only the list.
        ("transfomer", "tiny", "workload", r"is invalid \(did you mean transformer\?\)"),
        ("examples.my_model.build", "tiny", "workload", r"mean examples.my_model:build\?\)"),
        ("torchvison:resnet18", "tiny", "workload", r"\(did you mean torchvision:resnet18\?\)"),
        ("tim:resnet10t", "tiny", "workload", r"'tim' \(did you mean timm:resnet10t\?\)"),
        # A user's module not found from here is not a misspelt library (a probe, 2026-12-06).
        ("mm:build", "tiny", "workload", r"cannot import 'mm': No module named 'mm' \(a mod"),
        ("hff:causal-lm", "tiny", "workload", r"'hff' \(did you mean hf:causal-lm\?\)"),
        ("tv:resnet18", "tiny", "workload", r"'tv' \(did you mean torchvision:resnet18\?\)"),
        ("HF:causal-lm", "tiny", "workload", r"'HF' \(did you mean hf:causal-lm\?\)"),
    ],
)
def test_bad_workload_inputs(name: str, preset: str, field: str, match: str) -> None:
    with pytest.raises(WorkloadError, match=match) as info:
        load_workload(name, preset)
    assert info.value.field == field


@pytest.mark.parametrize("name", [":build", ".my_workload:build", "examples.my_workload:"])
def test_a_factory_without_an_absolute_module_or_a_name_is_refused_in_one_line(name: str) -> None:
    # importlib raised ValueError ("Empty module name") or TypeError (a relative import) here.
    with pytest.raises(WorkloadError, match=r"package\.module:factory, an absolute module") as info:
        load_workload(name, "tiny")
    assert info.value.field == "workload"


def test_a_module_that_does_not_parse_or_exits_on_import_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_syntax_mod.py").write_text("def build(preset, *, seed)\n    pass\n")
    (tmp_path / "exits_on_import_mod.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError, match=r"broken_syntax_mod\.py, line 1\)") as info:
        load_workload("broken_syntax_mod:build", "tiny")
    assert info.value.field == "workload" and "cannot import 'broken_syntax_mod'" in str(info.value)
    with pytest.raises(WorkloadError, match=r"called sys.exit\(3\)") as info:
        load_workload("exits_on_import_mod:build", "tiny")
    assert info.value.field == "workload"
    # A factory that exits when called had ended the tuner with its code and not a word.
    (tmp_path / "exits_in_factory_mod.py").write_text(
        "import sys\ndef build(preset, *, seed):\n    sys.exit(4)\n"
    )
    with pytest.raises(WorkloadError, match=r"the factory called sys.exit\(4\)") as info:
        load_workload("exits_in_factory_mod:build", "tiny")
    assert info.value.field == "workload"


def test_a_module_whose_own_import_fails_is_told_so_not_sent_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package the user's module imports, not installed, had been reported as the module not
    found ("run from the folder that holds it"), which it was (a probe, 2026-12-06)."""
    (tmp_path / "needs_a_dep_mod.py").write_text("import math\nimport not_installed_dep_x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError) as info:
        load_workload("needs_a_dep_mod:build", "tiny")
    said = str(info.value)
    assert f"importing 'needs_a_dep_mod' failed at {tmp_path / 'needs_a_dep_mod.py'}:2: " in said
    assert "No module named 'not_installed_dep_x'" in said and "PYTHONPATH" not in said
    with pytest.raises(WorkloadError, match="run from the folder that holds it"):
        load_workload("no_such_module_anywhere_x:build", "tiny")


def test_a_module_whose_top_level_code_raises_is_one_line_naming_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module that reads a data file or a variable when imported, and fails, had ended the
    tuner with 30 lines of traceback through its own frames (a probe, 2026-12-06)."""
    (tmp_path / "reads_at_import_mod.py").write_text("import os\nDATA = os.environ['NO_SUCH_X']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError) as info:
        load_workload("reads_at_import_mod:build", "tiny")
    said = str(info.value)
    where = f"{tmp_path / 'reads_at_import_mod.py'}:2"
    assert f"importing 'reads_at_import_mod' raised KeyError at {where}: 'NO_SUCH_X'" in said
    assert info.value.field == "workload"


def test_a_factorys_value_error_blames_the_preset_only_where_it_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "image too small" under `--preset small` had been blamed on --preset: the preset's name
    as a substring of the message (a probe, 2026-12-06)."""
    (tmp_path / "value_errors_mod.py").write_text(
        "def build(preset, *, seed):\n"
        "    if preset == 'small':\n"
        "        raise ValueError('the image is too small for this model')\n"
        "    raise ValueError(f'unknown preset {preset!r}')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError, match="too small") as info:
        load_workload("value_errors_mod:build", "small")
    assert info.value.field == "workload"
    with pytest.raises(WorkloadError, match="unknown preset 'huge'") as info:
        load_workload("value_errors_mod:build", "huge")
    assert info.value.field == "preset"


@pytest.mark.parametrize("size", [0, -2, 1.5, True])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused_when_built(size: object) -> None:
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    with pytest.raises(WorkloadError, match=r"batch_size=.* is invalid: allowed an integer >= 1"):
        trainers.workload_from_parts(
            model,
            data,
            lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
            optimizer=torch.optim.SGD,
            batch_size=size,  # type: ignore[arg-type]
        )


def test_a_near_miss_among_an_options_choices_gets_the_closest_names() -> None:
    from trainers.workloads.options import OptionSpec

    arch = OptionSpec(
        name="arch",
        kind="str",
        default="llama",
        help="family",
        choices=("gpt2", "llama", "gpt_neox"),
    )
    with pytest.raises(WorkloadError, match=r"'gptneox' is invalid \(did you mean gpt_neox\?\)"):
        arch.parse("gptneox")
    with pytest.raises(WorkloadError) as info:
        arch.parse("resnet")  # nothing close: the list alone
    assert "did you mean" not in str(info.value) and "one of gpt2, llama, gpt_neox" in str(
        info.value
    )


def test_a_model_option_given_as_a_number_from_python_is_read_as_its_text() -> None:
    from trainers.workloads.options import OptionSpec

    ffn = OptionSpec(name="ffn", kind="int", default=64, help="width", low=1)
    assert ffn.parse(4096) == ffn.parse("4096") == 4096  # type: ignore[arg-type]
    flag = OptionSpec(name="flag", kind="bool", default=False, help="on or off")
    assert flag.parse(True) is True  # type: ignore[arg-type]
    # Anything else is the option's error, naming it, not an AttributeError.
    with pytest.raises(WorkloadError, match=r"model_arg\.ffn=\[1\] is invalid: allowed an integer"):
        ffn.parse([1])  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match=r"model_arg\.ffn='0' is invalid: allowed an integer"):
        ffn.parse(0)  # type: ignore[arg-type]


SEEDLESS = """
import torch
from torch.utils.data import TensorDataset
from trainers import workload_from_parts

def _parts(model):
    data = TensorDataset(torch.ones(8, 4), torch.ones(8, 2))
    return workload_from_parts(
        model, data, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), batch_size=4,
        optimizer=torch.optim.SGD,
    )

def global_rng(preset, *, seed):
    return _parts(torch.nn.Linear(4, 2))  # never reads seed: draws from torch's generator

def own_rng(preset, *, seed):
    gen = torch.Generator().manual_seed(torch.seed())  # a generator of its own, unseeded
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.copy_(torch.randn(2, 4, generator=gen))
    return _parts(model)

KEPT = torch.nn.Linear(4, 2)

def kept(preset, *, seed):
    with torch.no_grad():
        KEPT.weight.add_(1.0)  # stands for the training a run gave it since
    return _parts(KEPT)
"""


def test_a_factory_that_ignores_its_seed_is_seeded_or_refused_naming_the_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory that drew from torch's generator without reading `seed` built other weights at
    each build, and the gate took its own draws for kernels that do not reproduce."""
    (tmp_path / "seedless_mod.py").write_text(SEEDLESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    first = load_workload("seedless_mod:global_rng", "tiny", seed=3).model
    torch.rand(5)  # the generator moves on between builds, as a run moves it
    again = load_workload("seedless_mod:global_rng", "tiny", seed=3).model
    other = load_workload("seedless_mod:global_rng", "tiny", seed=4).model
    assert torch.equal(first.weight, again.weight)
    assert not torch.equal(first.weight, other.weight)
    for name in ("seedless_mod:own_rng", "seedless_mod:kept"):
        load_workload(name, "tiny", seed=3)
        with pytest.raises(WorkloadError, match=r"seed=3\) built other weights") as info:
            load_workload(name, "tiny", seed=3)
        assert info.value.field == "workload" and name in str(info.value)


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("./models/net.py", "models.net:FACTORY"),
        ("models/net.py:build", "models.net:build"),
        ("net.py:build", "net:build"),
        # Dotted from the root had named no module ("tmp.probe.um.um:no_kw"): its folder, then.
        ("/tmp/probe/um/um.py:no_kw", "um:no_kw"),
    ],
)
def test_a_file_path_for_a_workload_is_told_the_module_name(given: str, meant: str) -> None:
    """`./models/net.py` had been offered "did you mean ./models/net:py?" (a probe, 2026-12-06)."""
    with pytest.raises(WorkloadError) as info:
        load_workload(given, "tiny")
    assert f"a module is named, not its file (did you mean {meant}?" in str(info.value)
    assert ("run from /tmp/probe/um, or" in str(info.value)) == given.startswith("/")
    assert info.value.field == "workload"


def test_a_module_in_the_working_folder_named_alone_is_told_to_name_its_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--workload um` beside um.py, and `um:buil` for `um:build`, had been told only the
    built-in names and "has no callable 'buil'" (a probe, 2026-12-06)."""
    (tmp_path / "um_here.py").write_text(
        "def build(preset, *, seed):\n    raise AssertionError('not imported by a hint')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError) as info:
        load_workload("um_here", "tiny")
    assert "is invalid (did you mean um_here:FACTORY? um_here is a module here" in str(info.value)
    with pytest.raises(WorkloadError) as info:
        load_workload("um_here:buil", "tiny")
    assert str(info.value) == (
        "workload='um_here:buil': 'um_here' has no callable 'buil' (did you mean um_here:build?)"
    )
    # In a package of the folder: its factory named, not `pkg:um_in` (a probe, 2026-12-07);
    # an attribute of a module still gets the colon.
    (tmp_path / "pkg_here").mkdir()
    (tmp_path / "pkg_here" / "__init__.py").write_text("")
    (tmp_path / "pkg_here" / "um_in.py").write_text("")
    with pytest.raises(WorkloadError) as info:
        load_workload("pkg_here.um_in", "tiny")
    assert "(did you mean pkg_here.um_in:FACTORY? pkg_here.um_in is a module" in str(info.value)
    with pytest.raises(WorkloadError) as info:
        load_workload("um_here.build", "tiny")
    assert "is invalid (did you mean um_here:build?)" in str(info.value)
    # An installed module is no user's workload: no hint to name a factory in it.
    with pytest.raises(WorkloadError) as info:
        load_workload("pytest", "tiny")
    assert "FACTORY" not in str(info.value) and "did you mean" not in str(info.value)


def test_the_samples_of_a_batch_are_known_without_building_the_model() -> None:
    """What the service checks a process count against when a job is posted."""
    from trainers.workloads import samples_per_batch_of

    built = trainers.load_workload("mlp", "tiny")
    assert samples_per_batch_of("mlp", "tiny") == built.samples_per_batch == 16
    assert samples_per_batch_of("convnet", "small") == 128
    # A library model's `batch` option, its preset's or the one given; no library is imported.
    assert samples_per_batch_of("hf:causal-lm", "llama-1b") == 8
    assert samples_per_batch_of("hf:causal-lm", "llama-1b", {"batch": "6"}) == 6
    assert samples_per_batch_of("timm:resnet10t", "tiny") == 2
    # Unknown without building it, or invalid (building it says why): None.
    assert samples_per_batch_of("mymodels:build", "tiny") is None
    assert samples_per_batch_of("mlp", "huge") is None
    assert samples_per_batch_of("hf:causal-lm", "tiny", {"batch": "many"}) is None


@pytest.mark.parametrize(
    ("kwargs", "field", "start"),
    [
        ({"seed": "0"}, "seed", "seed='0' is invalid: allowed 0 to 4294967295"),
        ({"seed": 1.5}, "seed", "seed=1.5 is invalid"),
        ({"seed": None}, "seed", "seed=None is invalid"),
        ({"seed": True}, "seed", "seed=True is invalid"),
        ({"seed": -1}, "seed", "seed=-1 is invalid"),
        ({"model_args": ["layers=2"]}, "model_arg", "model_args=['layers=2'] is invalid: allowed"),
        ({"name": None}, "workload", "workload=None is invalid: allowed a name (str)"),
        ({"preset": 3}, "preset", "preset=3 is invalid: allowed a name (str)"),
    ],
)
def test_load_workloads_arguments_of_the_wrong_type_are_one_line_naming_them(
    kwargs: dict[str, Any], field: str, start: str
) -> None:
    # Python callers: `seed="0"` had raised "can only concatenate str (not "int") to str".
    given = {"name": "mlp", "preset": "tiny"} | kwargs
    with pytest.raises(WorkloadError) as refused:
        load_workload(given.pop("name"), given.pop("preset"), **given)
    assert refused.value.field == field and str(refused.value).startswith(start)


def test_an_options_range_is_said_as_written() -> None:
    # %g had printed ffn's 1048576 as 1.04858e+06, another number.
    for option, value, allowed in (("ffn", "-1", "0..1048576"), ("vocab", "3", "16..1000000")):
        with pytest.raises(WorkloadError) as refused:
            trainers.workload_key("hf:causal-lm", "tiny", {option: value})
        assert str(refused.value).endswith(f"allowed an integer in {allowed}"), refused.value
