"""Human-readable output for the CLI (rich). JSON output never goes through here."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from trainers import RunResult
from trainers.workloads import Family
from tuner.evidence.progress import short_config
from tuner.evidence.recommendation import (
    CPU_RUN_NOTE,
    Recommendation,
    memory_text,
    utilisation_text,
)
from tuner.store.phases import LABELS
from tuner.store.storage import DEFAULT_STORAGE, masked


def _bytes(n: int | None) -> str:
    if n is None:
        return "n/a (CPU)"
    return f"{n / 2**20:,.1f} MiB"


def run_summary(console: Console, result: RunResult) -> None:
    st = result.step_time_ms
    table = Table(show_header=False, box=None)
    table.add_row("workload", f"{result.workload} / {result.preset} on {result.device}")
    table.add_row("config", ", ".join(f"{k}={v}" for k, v in result.config.items()))
    table.add_row(
        "step time",
        f"{st['median']:.3f} ms median (p10 {st['p10']:.3f}, "
        f"p90 {st['p90']:.3f}) over {len(result.windows)} windows",
    )
    table.add_row(
        "throughput",
        f"{result.samples_per_s:,.1f} samples/s"
        + (f", {result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else ""),
    )
    table.add_row(
        "host syncs",
        f"{result.n_syncs} blocking ({result.sync_wait_ms:.2f} ms), {result.n_polls} polls",
    )
    table.add_row("peak memory", _bytes(result.peak_memory_bytes))
    check = result.loss_check
    table.add_row(
        "losses",
        f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}; "
        f"{check['n_extracted']}/{check['expected']} extracted, "
        f"in order: {check['in_order']}, each once: {check['each_once']}",
    )
    console.print(table)
    if result.effective.get("note"):
        console.print(f"[yellow]note:[/yellow] {result.effective['note']}")


def _interval(entry: dict[str, Any], unit: str = "") -> str:
    low, high = entry["ci95"]
    return f"{entry['median']:,.2f}{unit} (95% CI {low:,.2f}-{high:,.2f})"


def speedup_text(entry: dict[str, Any]) -> str:
    """A ratio and its interval; one whose interval holds 1.00x says it is no measured
    difference (a 5.30x with a 95 % CI of 0.48-11.84 beside a recommended default would read as
    a contradiction otherwise)."""
    low, high = entry["ci95"]
    shown = _interval(entry, "x")
    if low <= 1.0 <= high:
        return f"{shown}: a tie, the interval includes 1.00x"
    return shown


NOISY_SPREAD = 0.2
"""A 95 % CI wider than this share of its median (the throughput's, or a ratio's) is reported:
quiet GPUs give 1-4 %, a busy 2-core CPU gave 0.28-38.33x (2026-12-02)."""


def noise_text(rec: Recommendation) -> str | None:
    """A warning where the final round's intervals are too wide to rank by, else None: the
    decision follows the intervals, but a tie or a win at such a width says little."""
    entries = [rec.throughput.to_dict()] if rec.throughput is not None else []
    entries += [speedup.to_dict() for speedup in rec.speedup.values()]
    widths = [
        (high - low) / entry["median"]
        for entry in entries
        for low, high in [entry["ci95"]]
        if entry["median"] > 0
    ]
    if not widths or max(widths) <= NOISY_SPREAD:
        return None
    return (
        f"a 95 % CI spans {max(widths):.0%} of its median (above {NOISY_SPREAD:.0%}): the "
        "speed varied while measuring (other work on this machine?), so the configs inside it "
        "were not told apart; run again on a quiet machine, or with more --final-rounds"
    )


def tie_text(names: Sequence[str], rule: str | None) -> str:
    """The tie row: which configs tie, that a tie is a difference inside the 95 % CIs, and the
    rule by which the simpler config wins it."""
    return (
        f"{', '.join(names)}: their 95 % CIs overlap, so no difference between them was measured "
        f"and the simplest wins ({rule})"
    )


def phase_times(time: Mapping[str, Any] | None) -> str | None:
    """One line: the study's wall time and each phase's seconds (`tuner.store.phases`), largest
    first, phases that took (next to) no time left out; None for a study recorded before phases
    were."""
    if not time:
        return None
    phases = {k: float(v or 0.0) for k, v in (time.get("phases") or {}).items()}
    # A phase that would read "0.0 s" is left out with those that took no time.
    shown = sorted(((s, k) for k, s in phases.items() if f"{s:.1f}" != "0.0"), reverse=True)
    parts = ", ".join(f"{LABELS.get(k, k)} {s:.1f} s" for s, k in shown)
    sessions = int(time.get("sessions") or 1)
    across = f" over {sessions} sessions" if sessions > 1 else ""
    return f"{float(time.get('wall_s') or 0.0):.1f} s{across}: {parts or 'nothing recorded'}"


def search_text(search: Mapping[str, Any] | None) -> str | None:
    """One line: how a screening search spent its trials (`Recommendation.search`), and what
    was reused instead of run again (compile artefacts, the gate's references and verdicts,
    profiles); None where there is nothing to say."""
    if not search:
        return None
    parts: list[str] = []
    if search.get("screening"):
        parts.append(
            f"{search.get('predicted', 0)} predicted ({search.get('skipped_memory', 0)} not run: "
            f"would not fit; {search.get('skipped_slower', 0)} not run: predicted slower), "
            f"{search.get('screened_out', 0)} screened out, {search.get('gated', 0)} gated"
        )
        if search.get("skipped_tie"):
            parts.append(f"{search['skipped_tie']} not run: a lever change predicted to tie")
        if search.get("skipped_same"):
            parts.append(f"{search['skipped_same']} not run: a config an earlier job measured")
        for name in ("fit", "order"):
            checked = int(search.get(f"{name}_checked") or 0)
            if checked:
                parts.append(f"{name} predicted right {search.get(f'{name}_right', 0)}/{checked}")
    loaded = int((search.get("compile_artifacts") or {}).get("loaded") or 0)
    if loaded:
        parts.append(f"{loaded} compile artefacts of an earlier job loaded")
    reused = search.get("reference_reused") or []
    if reused:
        parts.append(
            "the gate's reference and envelope reused from an earlier job on this model, shape, "
            "precision and machine"
        )
    trials = search.get("trials_copied") or {}
    if trials.get("trials"):
        parts.append(
            f"{trials['trials']} trials copied from the earlier study {trials.get('from')}, "
            "not measured again"
        )
    verdicts = int(search.get("verdicts_reused") or 0)
    if verdicts:
        parts.append(f"{verdicts} gate verdicts reused from an earlier job")
    copied = search.get("profiles_copied") or []
    if copied:
        parts.append(f"profiles of {', '.join(copied)} copied, not taken again")
    return "; ".join(parts) or None


def _label_table() -> Table:
    """Two columns, labels and text. A cell's long word (a failure's file path) is folded onto
    the next line, not cut with an ellipsis: "workloads.py:6..." had lost its line number."""
    table = Table(show_header=False, box=None)
    table.add_column()
    table.add_column(overflow="fold")
    return table


def recommendation(console: Console, rec: Recommendation, *, storage: str | None = None) -> None:
    """The summary of `rec`; `storage` (--storage's URL, or None) goes in its export command."""
    table = _label_table()
    table.add_row("study", f"{rec.study} ({rec.workload} / {rec.preset} on {rec.hardware})")
    spent = phase_times(rec.time)
    if rec.config is None:
        table.add_row("recommendation", f"none: {rec.reason}")
        # Each config that failed, with its cause: what the user has to fix (issue 56).
        for name, why in rec.failures.items():
            table.add_row(f"{name} failed", _first_line(why))
        _space_rows(table, rec)
        if spent is not None:
            table.add_row("time", spent)
        console.print(table)
        return
    # The settings that differ from the PyTorch default, in words; every field is in the export.
    table.add_row("recommended", f"{rec.source}: {short_config(rec.config)}")
    if rec.precisions:
        # The study chose the precision too: name it, and what it was chosen among.
        table.add_row(
            "precision",
            f"{rec.trained_precision} (searched {', '.join(rec.precisions)}; reference "
            f"{rec.study_fields.get('precision')})",
        )
    command = export_command(rec, storage)
    # A library model's study name runs to 200 characters: wrapped in the table's cell it could
    # not be copied (stdout not a terminal is 80 wide), so a long one goes on a line of its own.
    long = len(command) + 24 > console.width  # less the labels (18), padding and a margin
    table.add_row("train with it", "the command below, on one line" if long else command)
    if rec.explanation:
        table.add_row("why", rec.explanation)
    if rec.parity is not None:
        table.add_row(
            "correctness", f"{rec.parity.get('test', 'exact')}: {rec.parity.get('reason', '-')}"
        )
    _measured_rows(table, rec)
    if rec.was_tie:
        table.add_row("tie", tie_text([t.name for t in rec.ties], rec.tie_rule))
    counts = rec.trial_counts
    interrupted = f", {counts.interrupted} interrupted" if counts.interrupted else ""
    table.add_row(
        "trials",
        f"{counts.complete} complete, {counts.failed} failed, "
        f"{counts.pruned} pruned{interrupted}; {rec.gpu_seconds:.1f} "
        "device-seconds",
    )
    _search_rows(table, rec)
    if spent is not None:
        table.add_row("time", spent)
    on_cpu = rec.hardware == "cpu"
    if on_cpu:
        for label, text in cpu_rows(rec):
            table.add_row(label, text)
    console.print(table)
    if long:
        console.print(command, soft_wrap=True, highlight=False, markup=False)
    note = _note(rec, on_cpu)
    if note:
        console.print(f"[yellow]note:[/yellow] {note}")


def _note(rec: Recommendation, on_cpu: bool) -> str | None:
    """The note to print. On a CPU the rows say its CPU note, and more; not what follows it (a
    memory cap that could not act there had been hidden with it: a probe, 2026-12-07)."""
    if not on_cpu or rec.note is None:
        return rec.note
    return rec.note.removeprefix(CPU_RUN_NOTE).removeprefix("; ")


def _search_rows(table: Table, rec: Recommendation) -> None:
    screened = search_text(rec.search)
    if screened is not None:
        table.add_row("search", screened)
    _space_rows(table, rec)


def _space_rows(table: Table, rec: Recommendation) -> None:
    """What the space left out or pinned, and why (`tuner.search.spaces`): said as the run
    began, and here for `best` and a service job's client, which saw no progress line."""
    for i, note in enumerate((rec.search or {}).get("space_notes") or ()):
        table.add_row("" if i else "space", note)


def export_command(rec: Recommendation, storage: str | None) -> str:
    """The command that exports `rec`'s config as a script (a program's: as the variables it
    reads), with the `storage` given by --storage (without it, the command would look in
    ./tuner.db), its password as `***`."""
    program = str(rec.study_fields.get("workload") or "").startswith("program:")
    fmt = "env" if program else "python"
    command = f"python -m tuner export --study {shlex.quote(rec.study)} --format {fmt}"
    if storage is not None and storage != DEFAULT_STORAGE:
        command += f" --storage {shlex.quote(masked(storage))}"
    return command


def _first_line(text: str) -> str:
    """A failure's cause on one line: its first line, at most 300 characters."""
    line = (text.strip().splitlines() or ["(no message)"])[0]
    return line if len(line) <= 300 else line[:297] + "..."


def _measured_rows(table: Table, rec: Recommendation) -> None:
    """The recommendation's measurements: throughput, speedups, utilisation, memory, floor."""
    if rec.throughput is not None:
        table.add_row("throughput", _interval(rec.throughput.to_dict(), " samples/s"))
    for name, speedup in rec.speedup.items():
        table.add_row(f"vs {name}", speedup_text(speedup.to_dict()))
    # A baseline that failed has no speedup row: its reason says why (at 1.1B parameters, 16 x
    # 2048 tokens, both baselines' eager steps ran out of memory where the compiled step fit).
    for name, why in rec.failures.items():
        if name not in rec.speedup:
            # Its first line (a failed rank's stderr had filled 30 lines); all of it in --json.
            table.add_row(f"vs {name}", f"failed in the final round: {_first_line(why)}")
    noise = noise_text(rec)
    if noise is not None:
        table.add_row("noise", noise)
    use = utilisation_text(rec.utilisation)
    if use is not None:
        table.add_row("model FLOPs", use)
    memory = memory_text(rec.peak_memory_bytes, rec.device_memory_bytes)
    if memory is not None:
        table.add_row("peak memory", memory)
    # A floor slower than the step (a record from before issue 28) is no floor: not shown.
    if rec.floor is not None and rec.step_ms is not None and rec.floor.step_ms <= rec.step_ms:
        table.add_row(
            "graph floor",
            f"{rec.floor.step_ms:.3f} ms/step; the recommended "
            f"step is {rec.step_ms:.3f} ms (floor/step "
            f"{rec.floor.ratio:.2f})",
        )


def gpu_command(rec: Recommendation) -> str:
    """The command that asks the same question of a GPU (the first one, `--device auto`)."""
    workload = str(rec.workload or "transformer")
    # Quoted: a program's name or a model's argument may hold spaces (pasted, it was split).
    if workload.startswith("program:"):
        words = ["python -m tuner run --program", shlex.quote(workload.removeprefix("program:"))]
    else:
        words = ["python -m tuner run --workload", shlex.quote(workload)]
    words += ["--preset", shlex.quote(str(rec.preset or "small"))]
    for key, value in (rec.study_fields.get("model_args") or {}).items():
        words.append(f"--model-arg {shlex.quote(f'{key}={value}')}")
    precision = rec.study_fields.get("precision")
    if rec.precisions:
        words.append(f"--precisions {','.join(rec.precisions)}")
        if precision != rec.precisions[0]:
            words.append(f"--precision {precision}")
    elif precision and precision != "fp32":
        words.append(f"--precision {precision}")
    words += _question_flags(rec.study_fields)
    if rec.max_memory_bytes is not None:
        words.append(f"--max-memory {int(rec.max_memory_bytes)}")
    return " ".join(words)


def _question_flags(fields: Mapping[str, Any]) -> list[str]:
    """The pins, objectives and seed of the study's question, as `run` takes them: without
    them the command asked another question (the default seed's weights and data, pins left to
    the search)."""
    words = []
    for key, value in (fields.get("fix") or {}).items():
        shown = str(value).lower() if isinstance(value, bool) else value
        words.append(f"--fix {shlex.quote(f'{key}={shown}')}")
    objectives = list(fields.get("objectives") or ["throughput"])
    if objectives != ["throughput"]:
        words.append(f"--objectives {','.join(objectives)}")
    if fields.get("seed"):
        words.append(f"--seed {int(fields['seed'])}")
    if (fields.get("nproc_per_node") or 1) > 1:
        words.append(f"--nproc-per-node {int(fields['nproc_per_node'])}")
    return words


def cpu_rows(rec: Recommendation) -> list[tuple[str, str]]:
    """What a CPU run can and cannot tell, and what to run on a GPU (issue 29)."""
    return [
        (
            "a CPU run tells",
            "that the workload trains under every config tried, which of them passed the "
            "correctness gate (the PyTorch loop's losses), and what each costs on this CPU",
        ),
        (
            "it cannot tell",
            "which config is fastest on a GPU: stream, event and pinned-memory settings have no "
            "effect on a CPU and CUDA graphs do not run there, so differences between configs "
            "here come from the CPU (its load, DataLoader workers) and say nothing about a GPU",
        ),
        ("on a GPU, run", gpu_command(rec)),
    ]


STUDY_COLUMNS = (
    "study",
    "workload",
    "preset",
    "model args",
    "hardware",
    "complete/failed/pruned",
    "best samples/s",
)


def study_table(console: Console, rows: list[dict[str, Any]]) -> None:
    """The studies as a table on a terminal; elsewhere (a pipe, a file) one tab-separated line
    each, names in full: a table fitted to a width would cut them, and `best --study` needs
    the whole name."""
    cells = []
    for row in rows:
        t = row["trials"]
        best = "-" if row["best_throughput"] is None else f"{row['best_throughput']:,.1f}"
        if row.get("best_from"):
            best += f" ({row['best_from']})"
        cells.append(
            (
                row["study"],
                str(row["workload"]),
                str(row["preset"]),
                " ".join(f"{k}={v}" for k, v in (row.get("model_args") or {}).items()) or "-",
                str(row["hardware"]),
                f"{t['complete']}/{t['failed']}/{t['pruned']}",
                best,
            )
        )
    if not rows:
        console.print("no studies in this storage")
    elif not console.is_terminal:
        # Written as they are: rich would expand the tabs into spaces.
        console.file.write("".join("\t".join(line) + "\n" for line in [STUDY_COLUMNS, *cells]))
    else:
        table = Table(*STUDY_COLUMNS)
        for cell in cells:
            table.add_row(*cell)
        console.print(table)


def model_table(console: Console, families: Sequence[Family]) -> None:
    """`python -m tuner models`: each family, its presets and its options with what is allowed."""
    for family in families:
        console.print(f"[bold]{family.usage}[/bold]: {family.description}")
        # What each preset sets over the defaults below (tiny is batch 2, image 32 for an image
        # model, where the table's defaults say 128 and 224).
        sets = {
            name: ", ".join(f"{key} {value}" for key, value in values.items())
            for name, values in family.presets.items()
        }
        shown = [f"{name} ({sets[name]})" if sets[name] else name for name in family.presets]
        console.print(f"  presets: {'; '.join(shown)}", markup=False, highlight=False)
        table = Table("option", "type", "default", "allowed", "what", box=None, padding=(0, 2))
        for spec in family.options:
            if spec.choices is not None:
                allowed = ", ".join(str(c) for c in spec.choices)
            elif spec.low is not None or spec.high is not None:
                low = "" if spec.low is None else spec.low
                high = "" if spec.high is None else spec.high
                allowed = f"{low}..{high}"
            else:
                allowed = "-"
            table.add_row(spec.name, spec.kind, str(spec.default), allowed, spec.help)
        console.print(table)
