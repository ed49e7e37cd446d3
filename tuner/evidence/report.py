"""`python -m tuner report`: one self-contained HTML page about a study.

The page holds the recommendation and its ties, the speedup over each baseline with its 95 % CI,
the throughput of every trial in the order they ran (baseline re-measurements beside them), the
throughput by each setting, the Pareto front of a two-objective study, and the time breakdown of
the profiled baselines against the recommended config (stacked bars, from `tuner.evidence.trace`),
and where the tuning time went: the study's phases and each trial's (`tuner.store.phases`).

Self-contained: plotly.js is inlined once in the page's head, every figure is drawn from it, and
nothing is fetched from the network. Each plot is a `<div class="plot" data-plot="NAME">`.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import plotly.offline

from tuner.errors import NoRecommendation
from tuner.evidence.charts import (
    _breakdown_figure,
    _by_setting,
    _pareto,
    _Plots,
    _profile_order,
    _speedup,
    _trials_over_time,
)
from tuner.evidence.page import (
    CSS,
    _bytes,
    _config_text,
    _e,
    _interval,
    _num,
    _state,
    _table,
)
from tuner.evidence.profiles import read_recommendation, stored_verdicts, study_profiles
from tuner.evidence.recommendation import memory_text, utilisation_text
from tuner.evidence.verdicts import explain, verdict
from tuner.store import keys, reading
from tuner.store import storage as studies
from tuner.store.counting import count_trials
from tuner.store.phases import LABELS, PHASES, study_time

# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------


def _summary(study: optuna.Study, meta: Mapping[str, Any], rec: Mapping[str, Any] | None) -> str:
    counts = count_trials(study.get_trials(deepcopy=False)).to_dict()
    protocol = meta.get("protocol") or {}
    rows = [
        ("workload", f"{_e(meta.get('workload'))} / {_e(meta.get('preset'))}"),
        ("hardware", f"{_e(meta.get('hardware'))} ({_e(meta.get('device'))})"),
        ("objectives", _e(", ".join(meta.get("objectives") or ["throughput"]))),
        ("protocol", _e(", ".join(f"{k}={v}" for k, v in protocol.items())) or "-"),
        ("matmul precision", _e(meta.get("matmul_precision", "-"))),
        ("precision", _e(_precision_text(meta))),
        (
            "trials",
            f"{counts['complete']} complete, {counts['failed']} failed, "
            f"{counts['pruned']} pruned, {counts['interrupted']} interrupted, "
            f"{counts['running']} running",
        ),
    ]
    if rec and rec.get("gpu_seconds") is not None:
        rows.append(("device time", f"{rec['gpu_seconds']:,.1f} s"))
    table = _table(["", ""], [(f"<b>{_e(k)}</b>", v) for k, v in rows])
    return f'<section id="summary">{table}</section>'


def _precision_text(meta: Mapping[str, Any]) -> str:
    """The study's precision, and the ones it searched when it searched several."""
    precision = str(meta.get("precision") or "fp32")
    searched = meta.get("precisions")
    if not searched:
        return precision
    return f"searched {', '.join(searched)}; reference {precision}"


def _explanation(rec: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]]) -> str | None:
    if rec.get("explanation"):
        return str(rec["explanation"])
    if profiles:
        return explain(rec, stored_verdicts(profiles))
    return None


def _recommendation(
    rec: Mapping[str, Any] | None, profiles: Mapping[str, Mapping[str, Any]]
) -> str:
    parts = ['<section id="recommendation"><h2>Recommendation</h2>']
    if rec is None:
        parts.append(
            # Said for both makers of a study: a service job's page had advised the CLI alone.
            '<p class="missing">No recommendation yet: the run has not reached its final round '
            "(it runs, or it stopped first). The command a stopped run printed ('to resume "
            "it: ...'), or <code>python -m tuner run --study NAME</code> with the workload, "
            "preset and settings it was made with, finishes it (<code>--study NAME</code> alone "
            "names another workload, which the study refuses); a stopped service job is "
            "submitted again.</p></section>"
        )
        return "".join(parts)
    line = _explanation(rec, profiles)
    if line:
        parts.append(f'<p class="explanation">{_e(line)}</p>')
    if rec.get("config") is None:
        parts.append(f'<p class="missing">No config recommended: {_e(rec.get("reason"))}</p>')
    else:
        parts.append(_recommended(rec))
    parts += [_ties(rec), _final_round(rec), "</section>"]
    return "".join(parts)


def _recommended(rec: Mapping[str, Any]) -> str:
    """The recommended config and its figures, one row each."""
    rows = [
        ("recommended", f"{_e(rec.get('source'))}: {_config_text(rec['config'])}"),
        ("throughput", _e(_interval(rec.get("throughput"), " samples/s"))),
        ("step time", f"{_e(_num(rec.get('step_ms'), 3))} ms"),
        (
            "peak memory",
            _e(
                memory_text(rec.get("peak_memory_bytes"), rec.get("device_memory_bytes"))
                or _bytes(None)
            ),
        ),
    ]
    if rec.get("reference_precision") is not None:
        # A study that searched precisions: the one chosen, against its reference.
        rows.insert(
            1,
            (
                "precision",
                _e(f"{rec.get('precision')} (reference {rec.get('reference_precision')})"),
            ),
        )
    use = utilisation_text(rec.get("utilisation"))
    if use is not None:
        rows.append(("model FLOPs", _e(use)))
    for name, entry in (rec.get("speedup") or {}).items():
        rows.append((f"vs {name}", _e(_interval(entry, "x", 2))))
    floor = rec.get("floor")
    # A floor slower than the step (a record from before the floor followed the study's
    # precision) is no floor: not shown.
    if floor and floor["ratio"] <= 1.0:
        rows.append(
            (
                "CUDA-graph floor",
                f"{floor['step_ms']:.3f} ms/step (floor/step {floor['ratio']:.2f})",
            )
        )
    rows.append(("decided by", _e(rec.get("reason", "-"))))
    gate = rec.get("parity")
    if gate:
        rows.append(("correctness", _e(f"{gate.get('test', 'exact')}: {gate.get('reason', '-')}")))
    return _table(["", ""], [(f"<b>{_e(k)}</b>", v) for k, v in rows])


def _ties(rec: Mapping[str, Any]) -> str:
    ties = rec.get("ties") or []
    if not ties:
        return '<h3>Ties</h3><p class="missing">No other config tied with the recommended one.</p>'
    return (
        "<h3>Ties</h3>"
        f"<p>Configs whose 95 % CI overlaps the best one's (or within "
        f"{_e(_num(100 * float(rec.get('tie_margin') or 0), 0))} % of it); the "
        f"simplest wins: {_e(rec.get('tie_rule', ''))}.</p>"
        + _table(
            ["name", "config", "throughput (samples/s)", "peak memory"],
            [
                (
                    _e(t["name"]),
                    _config_text(t.get("config")),
                    _e(_interval(t.get("throughput"))),
                    _e(_bytes(t.get("peak_memory_bytes"))),
                )
                for t in ties
            ],
            numeric=(2,),
            cls="ties",
        )
    )


def _final_round(rec: Mapping[str, Any]) -> str:
    parts = []
    final = rec.get("final_round") or []
    if final:
        parts.append("<h3>Final round (interleaved re-measurement)</h3>")
        parts.append(
            _table(
                ["name", "config", "throughput (samples/s)", "windows"],
                [
                    (
                        # An entry in another precision than the study's says which.
                        _e(m["name"] + (f" ({m['precision']})" if m.get("precision") else "")),
                        _config_text(m.get("config")),
                        _e(_interval(m.get("throughput"))),
                        _e(m.get("samples", "-")),
                    )
                    for m in final
                ],
                numeric=(2, 3),
            )
        )
    if rec.get("failures"):
        parts.append(
            _table(
                ["failed in the final round", "reason"],
                [(_e(k), _e(v)) for k, v in rec["failures"].items()],
            )
        )
    return "".join(parts)


def _breakdown(
    study: optuna.Study, profiles: Mapping[str, Mapping[str, Any]], plots: _Plots
) -> str:
    head = '<section id="breakdown"><h2>Where the time goes</h2>'
    if not profiles:
        return head + (
            '<p class="missing">No profiles stored in this study: run it with '
            "profiling on (<code>--profile baselines</code> or <code>--profile "
            "all</code>) to see the time breakdown of the baselines against the "
            "recommended config.</p></section>"
        )
    names = _profile_order(profiles)
    verdicts = stored_verdicts(profiles)
    table = _table(
        [
            "config",
            "verdict",
            "why",
            "step ms (profiled)",
            "step ms (unprofiled)",
            "GPU busy %",
            "launch ms/step",
            "H2D ms/step",
            "H2D overlapped %",
            "sync ms/step",
            "kernels/step",
            "trace artifact",
        ],
        [_profile_row(n, profiles[n], verdicts[n]) for n in names],
        numeric=tuple(range(3, 11)),
        cls="verdicts",
    )
    notes = sorted({str(p["note"]) for p in profiles.values() if p.get("note")})
    note = "".join(f'<p class="note">{_e(n)}</p>' for n in notes)
    figure = plots.div("breakdown", _breakdown_figure(profiles, names))
    return head + note + figure + table + _trial_profiles(study) + "</section>"


def _percent(fraction: float | None) -> str:
    return _e(_num(None if fraction is None else 100 * fraction, 0))


def _profile_row(name: str, p: Mapping[str, Any], v: Any) -> tuple[str, ...]:
    return (
        _e(name),
        f"<b>{_e(v.kind)}</b>",
        _e(v.explanation),
        _e(_num(p.get("step_ms"), 3)),
        _e(_num(p.get("unprofiled_step_ms"), 3)),
        _percent(p.get("gpu_busy_fraction")),
        _e(_num(p.get("launch_ms_per_step"), 3)),
        _e(_num(p.get("h2d_ms_per_step"), 3)),
        _percent(p.get("h2d_overlap_fraction")),
        _e(_num(p.get("sync_ms_per_step"), 3)),
        _e(_num(p.get("kernels_per_step"), 1)),
        _e(_trace_cell(p)),
    )


def _trace_cell(p: Mapping[str, Any]) -> str:
    """The trace's file, and the study that profiled it when this one copied it (a profile
    shared between studies of the same inputs: `tuner.search.deciding.profiling.SharedProfiles`)."""
    file = str(p.get("artifact_file") or "-")
    origin = p.get("shared_from")
    return f"{file} (profiled by study {origin})" if origin else file


def _phases(study: optuna.Study) -> str:
    """Where the tuning time went: the study's phases (`tuner.store.phases`) and each trial's."""
    head = '<section id="phases"><h2>Where the tuning time went</h2>'
    spent = study_time(study.user_attrs)
    if spent is None:
        return head + '<p class="missing">This study was recorded before phase times were.</p>'
    wall = float(spent["wall_s"]) or 1.0
    rows = [
        (_e(LABELS[name]), _e(_num(seconds, 1)), _e(_num(100 * seconds / wall, 0)))
        for name, seconds in spent["phases"].items()
    ]
    rows.append(("<b>wall time</b>", _e(_num(spent["wall_s"], 1)), "100"))
    sessions = int(spent["sessions"])
    note = (
        f"<p>{sessions} sessions (runs or workers) worked on this study; their times add up.</p>"
        if sessions > 1
        else ""
    )
    table = _table(["phase", "seconds", "% of wall"], rows, numeric=(1, 2), cls="phases")
    return head + note + table + _trial_phases(study) + "</section>"


def _trial_phases(study: optuna.Study) -> str:
    recorded = [
        (t, t.user_attrs[keys.TIME])
        for t in study.get_trials(deepcopy=False)
        if isinstance(t.user_attrs.get(keys.TIME), dict)
    ]
    if not recorded:
        return ""
    names = [n for n in PHASES if any(n in spent for _, spent in recorded)]
    rows = [
        (_e(t.number), _e(_state(t)), *(_e(_num(spent.get(n), 2)) for n in names))
        for t, spent in recorded
    ]
    header = ["trial", "state", *(f"{LABELS[n]} (s)" for n in names)]
    return "<h3>Each trial</h3>" + _table(
        header, rows, numeric=tuple(range(2, 2 + len(names))), cls="trial-phases"
    )


def _trial_profiles(study: optuna.Study) -> str:
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs.get(keys.PROFILE)
        if isinstance(attrs, dict) and "step_ms" in attrs:
            v = verdict(attrs)
            rows.append(
                (
                    _e(t.number),
                    f"<b>{_e(v.kind)}</b>",
                    _e(v.explanation),
                    _config_text(attrs.get("config")),
                )
            )
    if not rows:
        return ""
    return "<h3>Profiled trials</h3>" + _table(["trial", "verdict", "why", "config"], rows)


def _notes(rec: Mapping[str, Any] | None, meta: Mapping[str, Any]) -> str:
    # The recommendation's note, and what the space left out or pinned and why (stored with
    # the study as it starts, so a running job's page says it too).
    space = meta.get("space")
    notes = list(space.get("notes") or ()) if isinstance(space, Mapping) else []
    if rec and rec.get("note"):
        notes.insert(0, rec["note"])
    if not notes:
        return ""
    paragraphs = "".join(f'<p class="note">{_e(note)}</p>' for note in notes)
    return f'<section id="notes"><h2>Notes</h2>{paragraphs}</section>'


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def build_report(
    study: optuna.Study, *, generated: str | None = None, workload: str | None = None
) -> str:
    """The report page of `study` as one self-contained HTML string. `workload`: the name to
    show for it (the service's: a plug-in's registered name, not the factory path it ran)."""
    meta = study.user_attrs.get(keys.META)
    meta = meta if isinstance(meta, dict) else {}
    try:
        rec: dict[str, Any] | None = read_recommendation(
            study.user_attrs, study.get_trials(deepcopy=False), study.study_name
        ).to_dict()
    except NoRecommendation:
        rec = None
    if workload is not None:
        meta = meta | {"workload": workload}
        rec = None if rec is None else rec | {"workload": workload}
    profiles = study_profiles(study)
    plots = _Plots()
    body = "".join(
        [
            _summary(study, meta, rec),
            _recommendation(rec, profiles),
            _speedup(rec, plots),
            _trials_over_time(study, plots),
            _by_setting(study, plots),
            _pareto(study, plots),
            _breakdown(study, profiles, plots),
            _phases(study),
            _notes(rec, meta),
        ]
    )
    when = generated or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    title = f"streamtune report: {study.study_name}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="streamtune"><title>{_e(title)}</title>'
        f"<style>{CSS}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        f"</head><body><h1>{_e(title)}</h1>"
        f'<p class="meta">generated {_e(when)}; {len(plots.names)} plots</p>'
        f"{body}</body></html>\n"
    )


def write_report(storage_url: str, study_name: str, out_path: str | os.PathLike[str]) -> Path:
    """Write the report of `study_name` in `storage_url` to `out_path`; returns the path."""
    with reading.opened_storage(storage_url) as storage:
        page = build_report(studies.load_study(storage, study_name))
    path = Path(out_path)
    if path.parent != Path():
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
