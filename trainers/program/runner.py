"""Programs as workloads: a training program run as it is, one process per run, measured through
a small protocol (version 1): settings in through environment variables, measurements out as
JSON lines in a file.

In, for every run (`program_env`):
- `STREAMTUNE_<FIELD>` for every `LoopConfig` field (the `env` export's names and values:
  `STREAMTUNE_NUM_STREAMS=2`, `STREAMTUNE_CUDA_GRAPH=true`, ...);
- `STREAMTUNE_WARMUP`, `STREAMTUNE_STEPS`, `STREAMTUNE_WINDOWS`: untimed steps, then timed steps
  split into that many windows (`trainers.measure.window_sizes`);
- `STREAMTUNE_DEVICE` (cpu, cuda or cuda:N), `STREAMTUNE_PRECISION` (empty: fp32), `STREAMTUNE_SEED`
  (initial weights and data), `STREAMTUNE_PRESET`;
- `STREAMTUNE_PERTURB_SEED` and `STREAMTUNE_PERTURB_EPS` (empty unless the correctness gate
  measures its noise envelope): multiply every weight by 1 + s * eps, s a random sign per element
  drawn from that seed, before the first step (`trainers.gate.trajectories.Perturbation`);
- `STREAMTUNE_REPORT`: the file to append the JSON lines to.
The program's command comes from the registry (`load_registry`); `{python}` (this Python),
`{preset}`, `{device}`, `{steps}`, `{warmup}`, `{windows}` and `{seed}` in it are replaced.

Out, one JSON object per line, in this order:
- `{"event": "start", "protocol": 1, "samples_per_batch": N, "device": "cuda:0",
  "fingerprint": {...}}` (`tokens_per_sample` optional);
- `{"event": "loss", "step": i, "loss": x}` for every step, warm-up included, in step order,
  whenever the program has them (`"losses": [...]` with `"step"` the first one also works);
- `{"event": "window", "index": j, "steps": n, "seconds": s}` after each timed window, its wall
  time measured with a device sync at both ends, as the built-in loop does;
- `{"event": "end", "n_syncs": K}` (optional counters: `n_syncs`, `sync_wait_ms`,
  `peak_memory_bytes`).
A window is read as soon as its line is written: a pruned run's program is stopped there
(SIGTERM, then SIGKILL). A program that exits non-zero, writes a malformed line, skips a step or
a window, or runs past its timeout is a failed run whose reason quotes the end of its stderr.

`trainers.program.Reporter` is the Python side of the protocol; `examples/program/` holds a
plain PyTorch program that uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainers.config import LoopConfig
from trainers.core import resolve_device
from trainers.errors import ConfigError, TrainerError, WorkloadError
from trainers.harvest import LossLedger
from trainers.measure import RunResult, Window, check_counts, window_sizes
from trainers.settings import ENV_PREFIX

PROTOCOL = 1
PREFIX = "program:"
REGISTRY_VARIABLE = "TUNER_PROGRAMS"
DEFAULT_TIMEOUT_S = 600.0
STDERR_TAIL = 2000
POLL_S = 0.02
GRACE_S = 5.0
_PLACEHOLDERS = ("python", "preset", "device", "steps", "warmup", "windows", "seed")


class ProgramFailed(TrainerError):
    """A program run that did not deliver: exit status, malformed report, timeout."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Program:
    """One registered program: what to run and what it implements."""

    name: str
    command: tuple[str, ...]
    cwd: Path
    presets: tuple[str, ...]
    settings: tuple[str, ...]
    """The LoopConfig fields the program implements; every other field must keep its default."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    def check(self, preset: str, config: LoopConfig | None = None) -> None:
        """WorkloadError for a preset it does not have; ConfigError for a setting it ignores."""
        if preset not in self.presets:
            raise WorkloadError(
                f"preset={preset!r} is invalid for program {self.name!r}: allowed "
                + ", ".join(self.presets),
                field="preset",
            )
        if config is None:
            return
        refused = self.lacking(config.to_dict())
        if refused is not None:
            raise ConfigError(*refused)

    def lacking(self, values: Mapping[str, Any]) -> tuple[str, Any, str] | None:
        """The first of `values` set to other than its default that the program does not
        implement, as (field, value, what is allowed); None if there is none."""
        defaults = LoopConfig().to_dict()
        for field, value in values.items():
            if field not in self.settings and value != defaults[field]:
                return (
                    field,
                    value,
                    f"{defaults[field]!r}: program {self.name!r} does not implement {field} "
                    f"(it implements {', '.join(self.settings) or 'none'})",
                )
        return None


def load_registry(path: str | os.PathLike[str]) -> dict[str, Program]:
    """The programs of a registry file, a JSON object:

        {"programs": {"NAME": {"command": ["python", "train.py", "--preset", "{preset}"],
                               "presets": ["tiny", "small"], "settings": ["sync_interval"],
                               "cwd": ".", "env": {}, "timeout_s": 600}}}

    `cwd` (default: the file's folder) is relative to the file. Each bad entry is a ConfigError
    naming it.
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(REGISTRY_VARIABLE, str(path), "an existing registry file") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(REGISTRY_VARIABLE, str(path), f"a JSON file ({exc})") from exc
    entries = data.get("programs") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ConfigError("programs", entries, "an object of named programs")
    fields = set(LoopConfig().to_dict())
    programs: dict[str, Program] = {}
    for name, entry in entries.items():
        where = f"programs.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(where, entry, "an object with command, presets and settings")
        unknown = set(entry) - {"command", "presets", "settings", "cwd", "env", "timeout_s"}
        if unknown:
            raise ConfigError(
                f"{where}.{sorted(unknown)[0]}",
                entry[sorted(unknown)[0]],
                "one of command, presets, settings, cwd, env, timeout_s",
            )
        command = entry.get("command")
        if not _strings(command) or not command:
            raise ConfigError(f"{where}.command", command, "a non-empty list of strings")
        presets = entry.get("presets", [])
        if not _strings(presets) or not presets:
            raise ConfigError(f"{where}.presets", presets, "a non-empty list of preset names")
        settings = entry.get("settings", [])
        if not _strings(settings) or not set(settings) <= fields:
            raise ConfigError(
                f"{where}.settings", settings, f"a list of LoopConfig fields: {', '.join(fields)}"
            )
        env = entry.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ConfigError(f"{where}.env", env, "an object of string variables")
        timeout = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"{where}.timeout_s", timeout, "a number of seconds > 0")
        cwd = entry.get("cwd", ".")
        if not isinstance(cwd, str):
            raise ConfigError(f"{where}.cwd", cwd, "a folder path")
        programs[name] = Program(
            name=name,
            command=tuple(command),
            cwd=(file.parent / cwd).resolve(),
            presets=tuple(presets),
            settings=tuple(settings),
            env=dict(env),
            timeout_s=float(timeout),
        )
    return programs


def find_program(name: str, environ: Mapping[str, str] | None = None) -> Program:
    """The program `name` ("program:NAME" or "NAME") of the registry in $TUNER_PROGRAMS."""
    variables = os.environ if environ is None else environ
    short = name.removeprefix(PREFIX)
    path = variables.get(REGISTRY_VARIABLE)
    if not path:
        raise WorkloadError(
            f"workload={name!r}: no program registry: set {REGISTRY_VARIABLE} to a registry "
            "file on this machine (see trainers/program/runner.py)",
            field="workload",
        )
    programs = load_registry(path)
    if short not in programs:
        raise WorkloadError(
            f"workload={name!r} is invalid: allowed "
            + ", ".join(f"{PREFIX}{known}" for known in programs),
            field="workload",
        )
    return programs[short]


def program_env(
    program: Program,
    preset: str,
    config: LoopConfig,
    *,
    steps: int,
    warmup: int,
    windows: int,
    device: torch.device,
    precision: str | None,
    seed: int,
    report: Path,
    perturb: tuple[int, float | None] | None = None,
) -> dict[str, str]:
    """The variables a run of `program` gets, on top of this process's environment."""
    values = {
        f"{ENV_PREFIX}{field.upper()}": str(value).lower()
        if isinstance(value, bool)
        else str(value)
        for field, value in config.to_dict().items()
    }
    perturb_seed, perturb_eps = perturb if perturb is not None else (None, None)
    values |= {
        f"{ENV_PREFIX}WARMUP": str(warmup),
        f"{ENV_PREFIX}STEPS": str(steps),
        f"{ENV_PREFIX}WINDOWS": str(windows),
        f"{ENV_PREFIX}DEVICE": str(device),
        f"{ENV_PREFIX}PRECISION": precision or "",
        f"{ENV_PREFIX}SEED": str(seed),
        f"{ENV_PREFIX}PRESET": preset,
        f"{ENV_PREFIX}PERTURB_SEED": "" if perturb_seed is None else str(perturb_seed),
        f"{ENV_PREFIX}PERTURB_EPS": "" if perturb_eps is None else repr(perturb_eps),
        f"{ENV_PREFIX}REPORT": str(report),
    }
    return {**os.environ, **program.env, **values}


def run_program(
    program: Program,
    preset: str,
    config: LoopConfig,
    *,
    steps: int = 50,
    warmup: int = 10,
    windows: int = 5,
    device: str | torch.device = "auto",
    on_window: Callable[[int, Window], bool] | None = None,
    precision: str | None = None,
    seed: int = 0,
    perturb: tuple[int, float | None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> RunResult:
    """Run `program` once under `config` and read its report, as `trainers.run` would measure
    a built-in workload. ProgramFailed when it does not deliver (see the module doc).

    on_start(samples_per_batch) is called when the program's start line is read, before its
    first window."""
    program.check(preset, config)
    check_counts(steps=steps, warmup=warmup, windows=windows)
    dev = resolve_device(device)
    with tempfile.TemporaryDirectory(prefix="streamtune-program-") as folder:
        report = Path(folder) / "report.jsonl"
        report.touch()
        stderr_path = Path(folder) / "stderr.txt"
        env = program_env(
            program,
            preset,
            config,
            steps=steps,
            warmup=warmup,
            windows=windows,
            device=dev,
            precision=precision,
            seed=seed,
            report=report,
            perturb=perturb,
        )
        fill = {
            "python": sys.executable,
            "preset": preset,
            "device": str(dev),
            "steps": str(steps),
            "warmup": str(warmup),
            "windows": str(windows),
            "seed": str(seed),
        }
        command = [_fill(part, fill) for part in program.command]
        reader = _Report(program.name, warmup + steps, window_sizes(steps, windows), on_start)
        with stderr_path.open("wb") as stderr:
            try:
                process = subprocess.Popen(
                    command,
                    cwd=program.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ProgramFailed(f"program {program.name!r} could not start: {exc}") from exc
            try:
                stopped = _follow(process, report, reader, on_window, program.timeout_s)
            except BaseException:
                _stop(process)
                raise
        tail = stderr_path.read_bytes()[-STDERR_TAIL:].decode("utf-8", "replace").strip()
        if reader.error is not None:
            raise ProgramFailed(f"program {program.name!r}: {reader.error}; stderr: {tail}")
        if not stopped and process.returncode != 0:
            raise ProgramFailed(
                f"program {program.name!r} exited with status {process.returncode}; stderr: {tail}"
            )
        if not stopped:
            missing = reader.missing()
            if missing is not None:
                raise ProgramFailed(f"program {program.name!r}: {missing}; stderr: {tail}")
    return reader.result(program, preset, config, warmup=warmup, stopped=stopped, dev=dev)


def _fill(part: str, values: Mapping[str, str]) -> str:
    for key in _PLACEHOLDERS:
        part = part.replace("{" + key + "}", values[key])
    return part


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _follow(
    process: subprocess.Popen[bytes],
    report: Path,
    reader: _Report,
    on_window: Callable[[int, Window], bool] | None,
    timeout_s: float,
) -> bool:
    """Read the report as it grows until the program exits; True if it was stopped early."""
    deadline = time.monotonic() + timeout_s
    offset = 0
    pending = b""
    with report.open("rb") as handle:
        while True:
            exited = process.poll() is not None
            handle.seek(offset)
            chunk = handle.read()
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                window = reader.feed(line)
                if reader.error is not None:
                    _stop(process)
                    return False
                if window is not None and on_window is not None:
                    index, measured = window
                    if not on_window(index, measured) and index + 1 < len(reader.sizes):
                        _stop(process)
                        return True
            if exited:
                if pending.strip():
                    reader.feed(pending)
                return False
            if time.monotonic() > deadline:
                _stop(process)
                reader.error = reader.error or f"timed out after {timeout_s:.0f} s"
                return False
            time.sleep(POLL_S)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the program's process group, SIGKILL after a grace period."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class _Report:
    """The program's lines, checked one at a time against the protocol."""

    def __init__(
        self,
        name: str,
        total_steps: int,
        sizes: Sequence[int],
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self.name = name
        self.on_start = on_start
        self.total_steps = total_steps
        self.sizes = list(sizes)
        self.ledger = LossLedger()
        self.windows: list[Window] = []
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.error: str | None = None

    def feed(self, raw: bytes) -> tuple[int, Window] | None:
        if self.error is not None or not raw.strip():
            return None
        try:
            line = json.loads(raw)
            return self._event(line)
        except (ValueError, TypeError, KeyError, TrainerError) as exc:
            self.error = f"malformed report line {raw[:200]!r}: {exc}"
            return None

    def _event(self, line: Any) -> tuple[int, Window] | None:
        if not isinstance(line, dict):
            raise ValueError("not a JSON object")
        event = line["event"]
        if self.start is None and event != "start":
            raise ValueError("the first line must be the start event")
        if event == "start":
            if self.start is not None:
                raise ValueError("a second start event")
            if line.get("protocol") != PROTOCOL:
                raise ValueError(f"protocol {line.get('protocol')!r}, expected {PROTOCOL}")
            samples = line["samples_per_batch"]
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
                raise ValueError("samples_per_batch must be an integer >= 1")
            self.start = line
            if self.on_start is not None:
                self.on_start(samples)
        elif event == "loss":
            values = line["losses"] if "losses" in line else [line["loss"]]
            floats = [float(v) for v in values]
            self.ledger.take(int(line["step"]), floats)
            if len(self.ledger.losses) > self.total_steps:
                raise ValueError(f"more than {self.total_steps} losses")
        elif event == "window":
            index = int(line["index"])
            if index != len(self.windows) or index >= len(self.sizes):
                raise ValueError(f"window {index} out of order")
            steps, seconds = int(line["steps"]), float(line["seconds"])
            if steps != self.sizes[index]:
                raise ValueError(f"window {index} has {steps} steps, expected {self.sizes[index]}")
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"window {index} took {seconds!r} s")
            window = Window(steps=steps, wall_ms=seconds * 1e3, gpu_ms=None)
            self.windows.append(window)
            return index, window
        elif event == "end":
            self.end = line
        else:
            raise ValueError(f"unknown event {event!r}")
        return None

    def missing(self) -> str | None:
        if self.start is None:
            return "no start event"
        if len(self.windows) != len(self.sizes):
            return f"{len(self.windows)} of {len(self.sizes)} windows reported"
        if len(self.ledger.losses) != self.total_steps:
            return f"{len(self.ledger.losses)} of {self.total_steps} losses reported"
        if self.end is None:
            return "no end event"
        return None

    def result(
        self,
        program: Program,
        preset: str,
        config: LoopConfig,
        *,
        warmup: int,
        stopped: bool,
        dev: torch.device,
    ) -> RunResult:
        assert self.start is not None
        end = self.end or {}
        steps = sum(w.steps for w in self.windows)
        return RunResult(
            config=config.to_dict(),
            workload=f"{PREFIX}{program.name}",
            preset=preset,
            device=str(self.start.get("device", dev)),
            effective={"program": program.name, "settings": list(program.settings)},
            warmup_steps=warmup,
            steps=steps,
            stopped_early=stopped,
            losses=list(self.ledger.losses),
            loss_check=self.ledger.proof(warmup + steps),
            n_syncs=int(end.get("n_syncs", 0)),
            n_polls=int(end.get("n_polls", 0)),
            sync_wait_ms=float(end.get("sync_wait_ms", 0.0)),
            windows=list(self.windows),
            samples_per_batch=int(self.start["samples_per_batch"]),
            tokens_per_sample=self.start.get("tokens_per_sample"),
            peak_memory_bytes=end.get("peak_memory_bytes"),
            fingerprint=dict(self.start.get("fingerprint") or {}),
        )


PERTURBATIONS = 4
"""K, the perturbed reference runs of a program's noise envelope (as `trainers.gate.envelope`)."""


def program_parity(
    program: Program,
    preset: str,
    config: LoopConfig,
    *,
    steps: int,
    seed: int,
    device: str | torch.device,
    precision: str | None,
    envelope: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The correctness gate for a program: its losses under `config` against its losses under the
    PyTorch idiom (`REFERENCE`), judged within the envelope of K reference runs from perturbed
    weights (`trainers.gate.judge`). The program's losses are all the gate sees, so every
    config takes the equivalence test (no bit-for-bit test: the twin configs of
    `trainers.gate.parity` are the harness's own).

    envelope: the reference and perturbed losses of an earlier call (the second value it
    returned), measured once per study.
    """
    from trainers.config import REFERENCE
    from trainers.gate.envelope import rounding_eps
    from trainers.gate.equivalence import judge
    from trainers.precision import MATMUL_PRECISION

    def losses(run_config: LoopConfig, perturb: tuple[int, float | None] | None) -> list[float]:
        result = run_program(
            program,
            preset,
            run_config,
            steps=steps,
            warmup=0,
            windows=1,
            device=device,
            precision=precision,
            seed=seed,
            perturb=perturb,
        )
        return result.losses

    if envelope is None or envelope.get("steps") != steps or envelope.get("seed") != seed:
        eps = rounding_eps(precision, MATMUL_PRECISION[precision or "fp32"])  # type: ignore[arg-type]
        envelope = {
            "program": program.name,
            "preset": preset,
            "steps": steps,
            "seed": seed,
            "precision": precision,
            "reference": losses(REFERENCE, None),
            "perturbed": [
                losses(REFERENCE, (seed * 1000 + k, eps)) for k in range(1, PERTURBATIONS + 1)
            ],
        }
    reference = list(envelope["reference"])
    ours = reference if config == REFERENCE else losses(config, None)
    verdict = judge(ours, reference, [list(p) for p in envelope["perturbed"]])
    return (
        {
            "passed": verdict.passed,
            "test": "equivalence",
            "reason": verdict.reason,
            "max_rel_deviation": verdict.ratio,
            "equivalence": verdict.to_dict(),
        },
        dict(envelope),
    )
