"""A user's mistakes get one line and exit status 2, never a traceback: a factory of the wrong
signature or one that raises (its cause, with the file and line it was raised at), a bare path as
`--storage` (told its `sqlite:///` URL), and `studies` read by a script (full names). And the
summary's speedup rows say when an interval is a tie."""

from __future__ import annotations

import html
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tuner
from tests.tuner.test_cli_run import REPO, run_main, without_progress
from tests.tuner.tiny import RUN_FLAGS, sqlite_url
from tuner.__main__ import main
from tuner.evidence.render import speedup_text, tie_text
from tuner.evidence.report import write_report

FACTORIES = textwrap.dedent(
    """\
    import trainers


    def no_seed(preset):
        return trainers.load_workload("mlp", preset)


    def raises(preset, *, seed):
        folder = "/nowhere/data"
        raise FileNotFoundError(f"no data in {folder}")


    def refuses(preset, *, seed):
        raise ValueError(f"preset {preset!r} is not one of mine")


    import torch
    import torch.nn.functional as F

    KEPT = torch.nn.Linear(8, 3)  # one model for every call: trained by the first run


    def kept(preset, *, seed):
        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        loss = lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])
        adam = trainers.workloads.adam()
        return trainers.workload_from_parts(KEPT, data, loss, optimizer=adam, batch_size=8)
    """
)
RAISES_LINE = 10  # the `raise FileNotFoundError` line above, counted from 1


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    module = tmp_path / f"userfactories_{tmp_path.name.replace('-', '_')}.py"
    module.write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_a_factory_without_seed_is_one_line(
    factories: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = [f if f != "mlp" else f"{factories.stem}:no_seed" for f in RUN_FLAGS]
    code, _, err = run_main(capsys, "run", *flags, "--storage", sqlite_url(tmp_path))
    assert code == 2
    line = _one_error_line(err)
    assert "factory(preset, *, seed)" in line and "unexpected keyword argument 'seed'" in line


def test_a_factory_that_raises_is_its_cause_and_where(
    factories: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = [f if f != "mlp" else f"{factories.stem}:raises" for f in RUN_FLAGS]
    code, _, err = run_main(capsys, "run", *flags, "--storage", sqlite_url(tmp_path))
    assert code == 2
    line = _one_error_line(err)
    assert "FileNotFoundError: no data in /nowhere/data" in line
    assert f"({factories}:{RAISES_LINE})" in line


def test_a_factory_refusing_its_preset_names_the_preset(
    factories: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = [f if f != "mlp" else f"{factories.stem}:refuses" for f in RUN_FLAGS]
    code, _, err = run_main(capsys, "run", *flags, "--storage", sqlite_url(tmp_path))
    assert code == 2
    line = _one_error_line(err)
    assert line.startswith("error: --preset: ") and "is not one of mine" in line


def test_a_factory_that_keeps_its_model_ends_the_job_in_one_line(
    factories: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A model built once at import trains on at each build: the gate's second build refuses it,
    and the job ends on that cause. It had failed every config alike and ended "no config passed
    parity" (exit 1), the cause only in progress lines, which `--quiet` and `best` leave out."""
    flags = [f if f != "mlp" else f"{factories.stem}:kept" for f in RUN_FLAGS]
    code, _, err = run_main(capsys, "run", *flags, "--storage", sqlite_url(tmp_path), "--quiet")
    assert code == 2
    line = _one_error_line(err)
    assert "built other weights" in line and "a model kept between calls" in line


def test_a_raising_factory_in_a_subprocess_prints_no_traceback(
    factories: Path, tmp_path: Path
) -> None:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(factories.parent), str(REPO)])}
    flags = [f if f != "mlp" else f"{factories.stem}:raises" for f in RUN_FLAGS]
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "run", *flags, "--storage", sqlite_url(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert out.returncode == 2
    assert "FileNotFoundError" in _one_error_line(without_progress(out.stderr))


@pytest.mark.parametrize("path", ["tuner.db", "/tmp/some folder/tuner.db"])
def test_a_bare_path_as_storage_is_told_its_url(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    code, _, err = run_main(capsys, "studies", "--storage", path)
    assert code == 2
    line = _one_error_line(err)
    assert f"--storage sqlite:///{path}" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_named_by_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_main(capsys, "train", "--workload", "mlp", "--device", "cuda")
    assert code == 2
    line = _one_error_line(err)
    assert line.startswith("error: --device: device='cuda': CUDA is not available here"), line


def test_serve_with_a_bare_path_is_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "api", "--storage", "jobs.db", "--no-worker"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert "--storage sqlite:///jobs.db" in _one_error_line(out.stderr)


def test_serve_with_a_registry_file_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    """`worker` said it in one line; `serve` printed ConfigError's traceback (an operator's
    probe, 2026-12-05)."""
    missing = tmp_path / "programs.json"
    out = subprocess.run(
        [sys.executable, "-m", "api", "--storage", sqlite_url(tmp_path), "--no-worker"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=os.environ | {"TUNER_PROGRAMS": str(missing)},
    )
    assert out.returncode == 2, out.stderr
    line = _one_error_line(out.stderr)
    assert line.startswith(f"error: TUNER_PROGRAMS='{missing}' is invalid"), line


def test_studies_prints_full_names_outside_a_terminal(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    name = "a-study-name-long-enough-that-a-table-of-eighty-columns-would-cut-it-short"
    flags = [*RUN_FLAGS, "--trials", "1", "--study", name, "--storage", storage, "--quiet"]
    made = subprocess.run(
        [sys.executable, "-m", "tuner", "run", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert made.returncode == 0, made.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "tuner", "studies", "--storage", storage],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split("\t")[0] == "study"
    assert row.split("\t")[:3] == [name, "mlp", "tiny"]


def test_a_speedup_whose_interval_holds_one_says_it_is_a_tie() -> None:
    tie = speedup_text({"median": 5.30, "ci95": [0.48, 11.84]})
    assert tie.startswith("5.30x (95% CI 0.48-11.84)") and "a tie" in tie
    assert "tie" not in speedup_text({"median": 1.08, "ci95": [1.05, 1.49]})
    assert "tie" not in speedup_text({"median": 0.5, "ci95": [0.4, 0.6]})
    row = tie_text(["pytorch-default", "trial-2"], "fewer streams")
    assert "no difference between them was measured" in row and "simplest wins" in row


def test_a_model_args_error_is_named_by_its_flag() -> None:
    # `--model-arg batch=four` was said as `--workload: model_arg.batch='four' is invalid`.
    import trainers
    from tuner.cli import flag_error

    said = flag_error(
        trainers.WorkloadError(
            "model_arg.batch='four' is invalid: allowed an integer", field="model_arg.batch"
        )
    )
    assert said == "--model-arg: model_arg.batch='four' is invalid: allowed an integer"
    assert flag_error(trainers.WorkloadError("no model", field=None)) == "--workload: no model"


def test_a_space_this_model_leaves_empty_is_one_line_before_any_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`activation_checkpointing: [none, blocks]` on a model without repeated blocks searched
    nothing: the job ran two trials of the default and "succeeded" (a service client's probe)."""
    space = tmp_path / "space.json"
    space.write_text('{"activation_checkpointing": ["none", "blocks"]}')
    args = ("run", *RUN_FLAGS, "--trials", "2", "--storage", sqlite_url(tmp_path))
    args = (*args, "--space", str(space))
    code, _, err = run_main(capsys, *args)
    assert code == 2
    line = _one_error_line(err)
    assert "space=['activation_checkpointing'] is invalid" in line, line
    assert "the model has no repeated blocks" in line and "Workload(blocks=...)" in line, line
    assert "baseline" not in err  # refused before the first measurement


def test_a_space_left_with_a_searched_setting_is_kept() -> None:
    from tuner.errors import SpaceError
    from tuner.search.spaces.pinned import ONE_CONFIG, check_left
    from tuner.search.spaces.space import Choice, SearchSpace

    left = SearchSpace(name="own", params={"pin_memory": Choice(values=(False, True))}, fixed={})
    assert check_left(["activation_checkpointing", "pin_memory"], left, 0) is left
    nothing = SearchSpace(name="own", params={}, fixed={})
    # Nothing was asked (`{}`): measured, and said, as a space of one-value settings is.
    assert check_left([], nothing, 0).notes == (ONE_CONFIG,)
    emptied = SearchSpace(name="own", params={}, fixed={}, notes=("old", "why"))
    with pytest.raises(SpaceError, match=r"can search \(why\)"):
        check_left(["pin_memory"], emptied, 1)


def test_a_space_whose_settings_each_have_one_value_is_said_and_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`{"num_streams": [1]}` measured one config in every trial without a word (a probe,
    2026-12-06); it is kept, since pooling one config's windows is a use, and said."""
    from tuner.search.spaces.pinned import ONE_CONFIG, check_left
    from tuner.search.spaces.space import Choice, IntRange, SearchSpace

    for params in (
        {},  # `{}`: nothing listed, the default loop in every trial, had gone unsaid
        {"num_streams": Choice(values=(1,))},
        {"sync_interval": IntRange(low=3, high=3), "num_streams": Choice(values=(2,))},
    ):
        one = SearchSpace(name="own", params=params, fixed={})  # type: ignore[arg-type]
        noted = check_left(list(params), one, 0)
        assert noted.notes == (ONE_CONFIG,) and noted.params == one.params
        assert check_left(list(params), noted, 0).notes == (ONE_CONFIG,)  # said once
    two = SearchSpace(name="own", params={"num_streams": Choice(values=(1, 2))}, fixed={})
    assert check_left(["num_streams"], two, 0) is two
    space = tmp_path / "space.json"
    space.write_text('{"num_streams": [1]}')
    storage = sqlite_url(tmp_path)
    args = ("run", *RUN_FLAGS, "--trials", "2", "--storage", storage, "--study", "one")
    assert main([*args, "--space", str(space)]) == 0
    err = capsys.readouterr().err  # the progress lines: run_main leaves them out
    assert err.count("no setting left has two values to search") == 1, err
    # Said where a client that saw no progress line looks too (a probe, 2026-12-06: a service
    # job's client read it nowhere): the recommendation, `best`, the report.
    rec = tuner.recommendation(storage, "one")
    assert rec.search is not None and rec.search["space_notes"] == [ONE_CONFIG]
    code, out, _ = run_main(capsys, "best", "--study", "one", "--storage", storage)
    assert code == 0 and "space" in out and "no setting left has two" in out, out
    report = write_report(storage, "one", tmp_path / "r.html").read_text()
    assert '<section id="notes">' in report and html.escape(ONE_CONFIG) in report


def test_a_failing_baseline_is_said_when_it_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline's failure had been said only in the summary, after every trial (a probe,
    2026-12-06: both DDP baselines failed on unused parameters, unsaid until the end)."""
    from tests.tuner.tiny import WORKLOADS

    flags = [f for f in RUN_FLAGS if f != "mlp"]
    flags.insert(flags.index("--workload") + 1, f"{WORKLOADS}:raises_in_loss")
    args = ("run", *flags, "--trials", "1", "--storage", sqlite_url(tmp_path))
    assert main(list(args)) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "baseline pytorch-default failed: " in line]
    assert len(lines) == 1 and "cuda: RuntimeError at" in lines[0], err
    assert err.index("failed: cuda: RuntimeError") < err.index("trial 0"), err


def test_a_program_and_another_workload_together_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--program p --workload mlp` had run the program and dropped --workload without a word."""
    code, _, err = run_main(
        capsys, "run", "--program", "p", "--workload", "mlp", "--storage", sqlite_url(tmp_path)
    )
    assert code == 2
    assert _one_error_line(err) == (
        "error: --program: 'p' with --workload 'mlp': allowed one of them "
        "(--program NAME is --workload program:NAME)"
    )


def test_the_printed_gpu_command_survives_a_shell() -> None:
    """A program's name or a model argument with a space was printed bare: pasted, the shell
    split it into other arguments (a user's probe, 2026-12-06)."""
    import shlex

    from trainers import LoopConfig
    from tuner.evidence.recommendation import Recommendation
    from tuner.evidence.render import gpu_command

    rec = Recommendation.from_dict(
        {
            "study": "s",
            "config": LoopConfig().to_dict(),
            "trial_counts": {},
            "workload": "program:odd name/x",
            "preset": "tiny",
            "model_args": {"config": "/my models/c.json"},
            "fix": {"sync_mode": "event", "note": "a b"},
            "nproc_per_node": 2,
            "max_memory_bytes": 2**30,
        }
    )
    words = shlex.split(gpu_command(rec))
    assert words[words.index("--program") + 1] == "odd name/x"
    assert words[words.index("--model-arg") + 1] == "config=/my models/c.json"
    assert [words[i + 1] for i, w in enumerate(words) if w == "--fix"] == [
        "sync_mode=event",
        "note=a b",
    ]
    assert words[words.index("--nproc-per-node") + 1] == "2"
    assert words[words.index("--max-memory") + 1] == str(2**30)


def test_the_printed_gpu_command_asks_the_same_question(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It had kept only the workload, preset, model arguments and precision: the pins, the
    objectives and the seed were gone (a probe, 2026-12-07). Its flags, given back to `run` on
    the same storage and study, resume the study rather than being refused as another
    question; the pins the device forced (cuda_graph=false on a CPU) are not among them."""
    import json
    import shlex

    from tuner.evidence.recommendation import Recommendation
    from tuner.evidence.render import gpu_command

    url = sqlite_url(tmp_path)
    question = ("--fix", "sync_mode=event", "--fix", "pin_memory=true", "--seed", "3")
    question += ("--objectives", "throughput,memory")
    first = ("--study", "q", "--trials", "1", "--storage", url, "--json")
    code, out, err = run_main(capsys, "run", *RUN_FLAGS, *question, *first)
    assert code == 0, err
    words = shlex.split(gpu_command(Recommendation.from_dict(json.loads(out))))
    given = words[4:]  # after `python -m tuner run`
    for flag, value in zip(question[::2], question[1::2], strict=True):
        assert value in [b for a, b in itertools.pairwise(given) if a == flag]
    assert "cuda_graph=false" not in given
    # The rest of the tiny run's flags (its timing and parity steps); its own pin is printed.
    pairs = zip(RUN_FLAGS[::2], RUN_FLAGS[1::2], strict=True)
    kept = [w for pair in pairs if pair[0] not in ("--workload", "--preset", "--fix") for w in pair]
    code, out, err = run_main(capsys, "run", *given, *kept, "--study", "q", "--storage", url)
    assert code == 0, err  # resumed: the same question


def test_a_config_file_model_arg_is_kept_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model-arg config=llama.json` was stored and exported as typed: the exported script
    and the summary's commands ran only from the folder the study was tuned in (a user's probe,
    2026-12-06). A name that is no file is left for the adapter's "no such file"."""
    from tuner.search.textargs import parse_model_args

    (tmp_path / "llama.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    parsed = parse_model_args(["config=llama.json", "layers=1", "arch=llama"])
    assert parsed == {
        "config": str(tmp_path.resolve() / "llama.json"),
        "layers": "1",
        "arch": "llama",
    }
    assert parse_model_args(["config=missing.json"]) == {"config": "missing.json"}
