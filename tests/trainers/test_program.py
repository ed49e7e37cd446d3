"""Programs as workloads (`trainers.program`): real processes on the CPU. The example program
(`examples/program/plain_loop.py`, a plain PyTorch loop using `Reporter`), and small
programs written here that break the protocol one way each."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainers import ConfigError, LoopConfig, RunArgs, WorkloadError
from trainers.program import (
    Program,
    ProgramFailed,
    ProgramStopped,
    find_program,
    load_registry,
    program_parity,
    run_program,
)
from trainers.program.reporting import Reporter

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "examples" / "program" / "programs.json"


@pytest.fixture(scope="module")
def plain() -> Program:
    return load_registry(REGISTRY)["plain-mlp"]


def test_the_example_program_reports_every_loss_and_window(plain: Program) -> None:
    seen: list[int] = []
    result = run_program(
        plain,
        "tiny",
        LoopConfig(sync_interval=4),
        RunArgs(steps=12, warmup=3, windows=3, device="cpu"),
        on_window=lambda index, window: seen.append(index) is None,
    )
    assert seen == [0, 1, 2] and [w.steps for w in result.windows] == [4, 4, 4]
    assert result.loss_check["complete"] and len(result.losses) == 15
    assert result.samples_per_batch == 16 and result.workload == "program:plain-mlp"
    assert result.n_syncs == 3  # 15 steps, a sync every 4
    # Its losses do not depend on when the host reads them.
    again = run_program(
        plain, "tiny", LoopConfig(sync_interval=1), RunArgs(steps=12, warmup=3, windows=3)
    )
    assert again.losses == result.losses and again.n_syncs == 15


def test_a_pruned_run_stops_the_program_after_the_window(plain: Program) -> None:
    result = run_program(
        plain,
        "tiny",
        LoopConfig(),
        RunArgs(steps=40, warmup=2, windows=4, device="cpu"),
        on_window=lambda index, window: False,
    )
    assert result.stopped_early and len(result.windows) == 1


def test_settings_and_presets_a_program_lacks_are_refused_before_it_runs(plain: Program) -> None:
    with pytest.raises(ConfigError, match=r"^num_streams=2 is invalid: allowed 1: program 'plain"):
        run_program(plain, "tiny", LoopConfig(num_streams=2), RunArgs(steps=4, windows=1))
    with pytest.raises(WorkloadError, match=r"preset='huge' is invalid for program 'plain-mlp'"):
        run_program(plain, "huge", LoopConfig(), RunArgs(steps=4, windows=1))


def test_the_gate_judges_a_programs_losses_within_its_envelope(plain: Program) -> None:
    args = RunArgs(steps=6, seed=0, device="cpu")
    verdict, envelope = program_parity(plain, "tiny", LoopConfig(sync_interval=3), args)
    assert verdict["passed"] and verdict["test"] == "equivalence"
    assert len(envelope["reference"]) == 6 and len(envelope["perturbed"]) == 4
    # The perturbed runs moved: the envelope is measured, not assumed.
    assert any(p != envelope["reference"] for p in envelope["perturbed"])
    # A reused envelope runs only the config.
    started = time.perf_counter()
    again, same = program_parity(plain, "tiny", LoopConfig(num_workers=1), args, envelope=envelope)
    assert again["passed"] and same == envelope
    assert time.perf_counter() - started < 60


def fake(tmp_path: Path, body: str, *, timeout_s: float = 30.0) -> Program:
    """A program of a few lines of Python (no torch: quick to start)."""
    script = tmp_path / "fake.py"
    script.write_text(
        "import json, os, sys, time\n"
        "out = open(os.environ['STREAMTUNE_REPORT'], 'a')\n"
        "def say(**line):\n"
        "    out.write(json.dumps(line) + '\\n'); out.flush()\n" + textwrap.dedent(body)
    )
    return Program(
        name="fake",
        command=(sys.executable, str(script)),
        cwd=tmp_path,
        presets=("tiny",),
        settings=(),
        timeout_s=timeout_s,
    )


START = "say(event='start', protocol=1, samples_per_batch=4, device='cpu')\n"
GOOD = START + (
    "say(event='loss', step=0, losses=[1.0, 0.9, 0.8])\n"
    "say(event='window', index=0, steps=1, seconds=0.01)\n"
    "say(event='window', index=1, steps=1, seconds=0.01)\n"
    "say(event='end')\n"
)


WINDOW_1 = "say(event='window', index=1, steps=1, seconds=0.01)\n"
BROKEN = {
    "exit": (
        GOOD + "sys.stderr.write('boom: CUDA out of memory'); sys.exit(3)\n",
        "exited with status 3; stderr: boom: CUDA out of memory",
    ),
    "json": (START + "out.write('{not json\\n'); out.flush()\n", "malformed report line"),
    "order": ("say(event='loss', step=0, loss=1.0)\n", "the first line must be the start event"),
    "protocol": (START.replace("protocol=1", "protocol=2"), "protocol 2, expected 1"),
    "window-size": (
        GOOD.replace("index=1, steps=1", "index=1, steps=5"),
        "window 1 has 5 steps, expected 1",
    ),
    "loss-order": (
        GOOD.replace("step=0, losses", "step=1, losses"),
        "loss of step 1 extracted out of order",
    ),
    "missing-window": (GOOD.replace(WINDOW_1, ""), "1 of 2 windows reported"),
    "no-end": (GOOD.replace("say(event='end')\n", ""), "no end event"),
    "seconds": (GOOD.replace(WINDOW_1, WINDOW_1.replace("0.01", "-1")), "window 1 took -1"),
    "seconds-tiny": (
        GOOD.replace(WINDOW_1, WINDOW_1.replace("0.01", "1e-300")),
        "window 1 took 1e-300 s for 1 steps, under 1 us a step",
    ),
    # Read as they came, these had ended the tuner's final round with a TypeError, failed
    # every run with int()'s ValueError naming nothing, or been taken (2.5 steps, "0.01" s).
    "peak": (
        GOOD.replace("event='end'", "event='end', peak_memory_bytes='big'"),
        "peak_memory_bytes must be an integer >= 0, not 'big'",
    ),
    "n-syncs": (
        GOOD.replace("event='end'", "event='end', n_syncs='lots'"),
        "n_syncs must be an integer >= 0, not 'lots'",
    ),
    "wait": (
        GOOD.replace("event='end'", "event='end', sync_wait_ms=-1"),
        "sync_wait_ms must be a number >= 0, not -1",
    ),
    "steps-float": (
        GOOD.replace("index=1, steps=1", "index=1, steps=1.0"),
        "window 1 needs an integer steps and a number seconds",
    ),
    "seconds-text": (
        GOOD.replace(WINDOW_1, WINDOW_1.replace("0.01", "'0.01'")),
        "window 1 needs an integer steps and a number seconds",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("body", "message"), list(BROKEN.values()), ids=list(BROKEN))
def test_a_program_that_breaks_the_protocol_fails_with_the_reason(
    tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(ProgramFailed, match="program 'fake'") as info:
        run_program(
            fake(tmp_path, body), "tiny", LoopConfig(), RunArgs(steps=2, warmup=1, windows=2)
        )
    assert message in str(info.value)


def test_the_protocol_is_met_by_a_few_lines_and_a_hung_program_times_out(tmp_path: Path) -> None:
    result = run_program(
        fake(tmp_path, GOOD), "tiny", LoopConfig(), RunArgs(steps=2, warmup=1, windows=2)
    )
    assert result.losses == [1.0, 0.9, 0.8] and len(result.windows) == 2
    hung = fake(tmp_path, START + "time.sleep(60)\n", timeout_s=1.0)
    started = time.perf_counter()
    with pytest.raises(ProgramFailed, match="timed out after 1 s"):
        run_program(hung, "tiny", LoopConfig(), RunArgs(steps=2, warmup=1, windows=2))
    assert time.perf_counter() - started < 30


def test_a_stop_asked_between_windows_stops_a_hung_program_at_once(tmp_path: Path) -> None:
    """A cancelled job's program had run on to its next window or its timeout (600 s by
    default): a stop is asked at every poll of its report, and the whole group is stopped."""
    hung = fake(
        tmp_path,
        START + "open('p', 'w').write(str(os.getpid()))\nos.rename('p', 'pid')\ntime.sleep(60)\n",
        timeout_s=60.0,
    )
    started = time.perf_counter()

    def should_stop() -> bool:
        return (tmp_path / "pid").exists() and time.perf_counter() - started > 0.3

    with pytest.raises(ProgramStopped, match="stopped on request after 0 of 2 windows"):
        run_program(
            hung, "tiny", LoopConfig(), RunArgs(steps=2, warmup=1, windows=2),
            should_stop=should_stop,
        )  # fmt: skip
    assert time.perf_counter() - started < 20
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid").read_text()), 0)
    # A stop never asked for leaves a run that delivers as it was.
    done = run_program(
        fake(tmp_path, GOOD), "tiny", LoopConfig(), RunArgs(steps=2, warmup=1, windows=2),
        should_stop=lambda: False,
    )  # fmt: skip
    assert len(done.windows) == 2 and not done.stopped_early


def test_the_program_gets_its_settings_and_the_commands_placeholders(tmp_path: Path) -> None:
    body = START + (
        "say(event='loss', step=0, losses=[float(os.environ['STREAMTUNE_SYNC_INTERVAL']),"
        " float(sys.argv[1] == 'tiny'), float(os.environ['STREAMTUNE_PIN_MEMORY'] == 'true')])\n"
        "say(event='window', index=0, steps=2, seconds=0.5)\n"
        "say(event='end', n_syncs=7)\n"
    )
    program = fake(tmp_path, body)
    program = Program(
        **{
            **program.__dict__,
            "command": (*program.command, "{preset}"),
            "settings": ("sync_interval", "pin_memory"),
        }
    )
    result = run_program(
        program,
        "tiny",
        LoopConfig(sync_interval=9, pin_memory=True),
        RunArgs(steps=2, warmup=1, windows=1),
    )
    assert result.losses == [9.0, 1.0, 1.0] and result.n_syncs == 7
    assert result.windows[0].step_ms == pytest.approx(250.0)


def test_registry_errors_name_the_entry_and_field(tmp_path: Path) -> None:
    path = tmp_path / "programs.json"
    cases = [
        ({"programs": {}}, r"^programs=\{\} is invalid: allowed an object of named programs"),
        ({"programs": {"a": {"presets": ["x"]}}}, r"^programs.a.command=None is invalid"),
        ({"programs": {"a": {"command": ["x"]}}}, r"^programs.a.presets=\[\] is invalid"),
        (
            {"programs": {"a": {"command": ["x"], "presets": ["t"], "settings": ["streams"]}}},
            r"^programs.a.settings=\['streams'\] is invalid: allowed a list of LoopConfig fields",
        ),
        (
            {"programs": {"a": {"command": ["x"], "presets": ["t"], "timeout_s": 0}}},
            r"^programs.a.timeout_s=0 is invalid",
        ),
        (
            {"programs": {"a": {"command": ["x"], "presets": ["t"], "shell": True}}},
            r"^programs.a.shell=True is invalid: allowed one of command, presets",
        ),
    ]
    for data, message in cases:
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=message):
            load_registry(path)
    with pytest.raises(WorkloadError, match="no program registry: set TUNER_PROGRAMS"):
        find_program("program:plain-mlp", environ={})
    with pytest.raises(WorkloadError, match=r"allowed program:plain-mlp$"):
        find_program("program:nope", environ={"TUNER_PROGRAMS": str(REGISTRY)})
    assert find_program("program:plain-mlp", environ={"TUNER_PROGRAMS": str(REGISTRY)}).cwd == (
        REGISTRY.parent
    )


def test_the_reporter_reads_its_run_from_the_environment(tmp_path: Path) -> None:
    assert not Reporter.active({})
    with pytest.raises(ConfigError, match=r"^STREAMTUNE_REPORT=None is invalid: allowed set by"):
        Reporter.from_env({})
    env = {
        "STREAMTUNE_REPORT": str(tmp_path / "r.jsonl"),
        "STREAMTUNE_WARMUP": "2",
        "STREAMTUNE_STEPS": "7",
        "STREAMTUNE_WINDOWS": "3",
        "STREAMTUNE_DEVICE": "cpu",
        "STREAMTUNE_PRECISION": "",
        "STREAMTUNE_SEED": "0",
        "STREAMTUNE_PRESET": "tiny",
        "STREAMTUNE_SYNC_INTERVAL": "6",
        "STREAMTUNE_PERTURB_SEED": "",
    }
    reporter = Reporter.from_env(env)
    assert reporter.config == LoopConfig(sync_interval=6) and reporter.window_sizes() == [3, 2, 2]
    assert reporter.perturb_seed is None and reporter.precision is None
    with pytest.raises(ConfigError, match=r"^STREAMTUNE_STEPS='x' is invalid: allowed an integer"):
        Reporter.from_env({**env, "STREAMTUNE_STEPS": "x"})


def test_registry_errors_name_the_file_and_reach_inside_lists(tmp_path: Path) -> None:
    path = tmp_path / "programs.json"
    cases = [
        ({"programs": {"a": {"command": ["x", 3], "presets": ["t"]}}}, r"^programs.a.command="),
        ({"programs": {"a": {"command": ["x"], "presets": ["t"], "env": {"K": 1}}}}, "env="),
        ({"programs": {"a": {"command": ["x"], "presets": ["t"], "timeout_s": True}}}, "timeout"),
        ({"programs": {"a": ["x"]}}, r"^programs.a=\['x'\] is invalid: allowed an object with"),
        (["not", "an", "object"], r"^programs=None is invalid"),
    ]
    for data, message in cases:
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=message) as raised:
            load_registry(path)
        assert str(path) in str(raised.value)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"^TUNER_PROGRAMS=.* a JSON file"):
        load_registry(path)
    with pytest.raises(ConfigError, match="an existing registry file"):
        load_registry(tmp_path / "missing.json")
    # A folder and a file not in UTF-8 had ended the run with a traceback.
    with pytest.raises(ConfigError, match=r"^TUNER_PROGRAMS=.* a registry file it can read \("):
        load_registry(tmp_path)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"^TUNER_PROGRAMS=.* a UTF-8 JSON file"):
        load_registry(path)
    path.write_text(json.dumps({"programs": {"a": {"command": ["x"], "presets": ["t"]}}}))
    (program,) = load_registry(path).values()
    assert program.timeout_s == 600.0 and program.settings == () and program.cwd == tmp_path


def test_registry_entries_that_would_fail_every_run_are_refused_at_load(tmp_path: Path) -> None:
    """An unknown `{placeholder}`, a bad or protocol-owned variable, a missing folder and a name
    a study's cannot hold passed the load and failed each run at its start (or were overridden
    without a word)."""
    path = tmp_path / "programs.json"
    entry = {"command": ["{python}", "p.py", '{"json": 1}', "--seed={seed}"], "presets": ["t"]}
    cases = [
        ({"command": ["{python}", "{presets}"]}, r"^programs.a.command=.*unknown placeholders: "),
        ({"env": {"A B": "1"}}, r"^programs.a.env=.*'A B' is not a variable name"),
        ({"env": {"STREAMTUNE_SEED": "1"}}, r"^programs.a.env=.*STREAMTUNE_SEED is the protocol"),
        ({"env": {"X": "a\0b"}}, r"^programs.a.env=.*the value of X holds a NUL"),
        ({"cwd": "missing"}, r"^programs.a.cwd='missing' is invalid: allowed an existing folder"),
        ({"command": ["{python}", "p.py\0"]}, r"^programs.a.command=.*a NUL character"),
        ({"command": [""]}, r"^programs.a.command=.*an empty program"),
        ({"presets": [""]}, r"^programs.a.presets=.*a non-empty name without NUL"),
    ]
    for change, message in cases:
        path.write_text(json.dumps({"programs": {"a": entry | change}}))
        with pytest.raises(ConfigError, match=message):
            load_registry(path)
    for name in ("a b", "a/b", "-a"):  # a study is named after it: these had collapsed
        path.write_text(json.dumps({"programs": {name: entry}}))
        with pytest.raises(ConfigError, match=r"^programs=.*allowed letters, digits, '\.'"):
            load_registry(path)
    (tmp_path / "sub").mkdir()
    path.write_text(json.dumps({"programs": {"a": entry | {"cwd": "sub", "env": {"X_1": "y"}}}}))
    program = load_registry(path)["a"]
    assert program.cwd == tmp_path / "sub" and program.command[2] == '{"json": 1}'
