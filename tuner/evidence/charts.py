"""The report's charts (plotly): speedups over the baselines, trials over time, throughput by
setting, the Pareto front and the profiles' breakdown of a step."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState

from trainers import field_names
from tuner.evidence.page import (
    BASELINE_COLOURS,
    BASELINE_ORDER,
    BREAKDOWN_COLOURS,
    PLOT_CONFIG,
    STATE_COLOURS,
    _e,
    _state,
    _throughput,
)
from tuner.evidence.trace import BREAKDOWN
from tuner.store import keys
from tuner.store import storage as studies


class _Plots:
    """Turns figures into `<div class="plot">` blocks; plotly.js itself is in the page head."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def div(self, name: str, fig: go.Figure, *, height: int = 420, small: bool = False) -> str:
        self.names.append(name)
        legend_below = fig.layout.legend.orientation == "h"
        fig.update_layout(
            height=height,
            template="plotly_white",
            margin={"l": 60, "r": 20, "t": 50, "b": 110 if legend_below else 50},
        )
        if legend_below:
            fig.update_layout(legend={"y": -0.3, "yanchor": "top"})
        config = PLOT_CONFIG | ({"displayModeBar": False} if small else {})
        body = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            config=config,
            div_id=f"plot-{name}",
            default_width="100%",
        )
        return f'<div class="plot" data-plot="{_e(name)}">{body}</div>'


def _speedup(rec: Mapping[str, Any] | None, plots: _Plots) -> str:
    head = '<section id="speedup"><h2>Speedup over the baselines</h2>'
    speedups = (rec or {}).get("speedup") or {}
    if not speedups:
        return head + (
            '<p class="missing">No speedup: the study has no recommendation.</p></section>'
        )
    names = list(speedups)
    medians = [speedups[n]["median"] for n in names]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=medians,
            marker_color=[BASELINE_COLOURS.get(n, "#7f7f7f") for n in names],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [speedups[n]["ci95"][1] - speedups[n]["median"] for n in names],
                "arrayminus": [speedups[n]["median"] - speedups[n]["ci95"][0] for n in names],
            },
            text=[f"{m:.2f}x" for m in medians],
            textposition="outside",
            hovertemplate="%{x}: %{y:.3f}x<extra></extra>",
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    fig.update_layout(
        title=f"Recommended config ({(rec or {}).get('source')}) over each "
        "baseline, median with 95 % CI",
        yaxis_title="speedup (x)",
        showlegend=False,
    )
    return head + plots.div("speedup", fig, height=380) + "</section>"


def _trials_over_time(study: optuna.Study, plots: _Plots) -> str:
    head = (
        '<section id="trials"><h2>Throughput of every trial</h2><p>In the order the trials '
        "ran; failed trials sit at 0; the baselines' re-measurements (drift) are drawn at "
        "the trial count when they ran.</p>"
    )
    fig = go.Figure()
    trials = study.get_trials(deepcopy=False)
    for state, colour in STATE_COLOURS.items():
        chosen = [t for t in trials if _state(t) == state]
        if not chosen:
            continue
        ys = [_throughput(t) for t in chosen]
        texts = []
        for t in chosen:
            when = (
                t.datetime_complete.isoformat(sep=" ", timespec="seconds")
                if (t.datetime_complete)
                else "-"
            )
            reason = t.user_attrs.get(keys.FAILURE_REASON)
            texts.append(
                f"trial {t.number} ({state}, {when})<br>"
                + _e(", ".join(f"{k}={v}" for k, v in t.params.items()))
                + (f"<br>{_e(str(reason)[:200])}" if reason else "")
            )
        fig.add_trace(
            go.Scatter(
                x=[t.number for t in chosen],
                y=[0.0 if y is None else y for y in ys],
                mode="markers",
                name=state,
                text=texts,
                marker={
                    "color": colour,
                    "size": 9,
                    "symbol": "x" if state == "failed" else "circle",
                },
                hovertemplate="%{text}<br>%{y:,.1f} samples/s<extra></extra>",
            )
        )
    _add_baselines(fig, study)
    if not fig.data:
        return head + '<p class="missing">The study has no trials yet.</p></section>'
    fig.update_layout(
        title="Median window throughput per trial",
        xaxis_title="trial",
        xaxis={"dtick": max(1, len(trials) // 10), "rangemode": "tozero"},
        yaxis_title="samples/s",
        legend={"orientation": "h"},
    )
    return head + plots.div("trials-over-time", fig) + "</section>"


def _add_baselines(fig: go.Figure, study: optuna.Study) -> None:
    """Each baseline's measurements during the search, at the trial count when they ran."""
    baselines = studies.entries(study, keys.BASELINE_PREFIX)
    by_name: dict[str, list[tuple[int, float]]] = {}
    for key, entry in baselines.items():
        if isinstance(entry, dict) and isinstance(entry.get("median"), int | float):
            by_name.setdefault(key.split("/", 1)[0], []).append(
                (int(entry.get("at_trial", 0)), float(entry["median"]))
            )
    for name, points in sorted(by_name.items()):
        points.sort()
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines+markers",
                name=f"baseline {name}",
                line={"dash": "dash", "color": BASELINE_COLOURS.get(name, "#555")},
                hovertemplate=f"{_e(name)} at trial %{{x}}: %{{y:,.1f}} samples/s<extra></extra>",
            )
        )


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def _by_setting(study: optuna.Study, plots: _Plots) -> str:
    head = (
        '<section id="settings"><h2>Throughput by setting</h2><p>Complete trials, one panel '
        "per <code>LoopConfig</code> field; a panel with one value is a setting the study "
        "did not vary.</p>"
    )
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if isinstance(t.user_attrs.get(keys.CONFIG), dict) and _throughput(t) is not None
    ]
    if not complete:
        return head + '<p class="missing">No complete trial yet.</p></section>'
    divs = []
    for field in field_names():
        pairs = [
            (t.user_attrs[keys.CONFIG].get(field), _throughput(t), t.number)
            for t in complete
            if field in t.user_attrs[keys.CONFIG]
        ]
        if not pairs:
            continue
        values = sorted({p[0] for p in pairs}, key=_sort_key)
        fig = go.Figure()
        for value in values:
            chosen = [p for p in pairs if p[0] == value]
            fig.add_trace(
                go.Box(
                    x=[json.dumps(value)] * len(chosen),
                    y=[p[1] for p in chosen],
                    name=json.dumps(value),
                    boxpoints="all",
                    jitter=0.3,
                    pointpos=0,
                    text=[f"trial {p[2]}" for p in chosen],
                    marker={"size": 6},
                    hovertemplate="%{text}: %{y:,.1f} samples/s<extra></extra>",
                )
            )
        title = field if len(values) > 1 else f"{field} (fixed at {json.dumps(values[0])})"
        fig.update_layout(
            title=title, showlegend=False, yaxis_title="samples/s", xaxis={"type": "category"}
        )
        divs.append(plots.div(f"setting-{field}", fig, height=300, small=True))
    return head + f'<div class="grid">{"".join(divs)}</div></section>'


def _pareto(study: optuna.Study, plots: _Plots) -> str:
    head = '<section id="pareto"><h2>Pareto front</h2>'
    if len(study.directions) != 2:
        return head + (
            '<p class="missing">One objective (throughput): no Pareto front. Run with '
            "<code>--objectives throughput,memory</code> for one.</p></section>"
        )
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return head + '<p class="missing">No complete trial yet.</p></section>'
    fig = optuna.visualization.plot_pareto_front(
        study, target_names=["throughput (samples/s)", "peak memory (bytes)"]
    )
    fig.update_layout(title="Throughput against peak memory (front: best trials)")
    return head + plots.div("pareto", fig) + "</section>"


def _profile_order(names: Iterable[str]) -> list[str]:
    names = list(names)
    first = [n for n in (*BASELINE_ORDER, keys.PROFILE_RECOMMENDED) if n in names]
    return first + sorted(n for n in names if n not in first)


def _breakdown_figure(profiles: Mapping[str, Mapping[str, Any]], names: list[str]) -> go.Figure:
    """One stacked bar per profiled config: a step split into disjoint parts."""
    parts = [
        k for k in BREAKDOWN if any(k in (profiles[n].get("breakdown_ms") or {}) for n in names)
    ]
    fig = go.Figure()
    for key in parts:
        fig.add_trace(
            go.Bar(
                name=BREAKDOWN[key],
                x=names,
                y=[(profiles[n].get("breakdown_ms") or {}).get(key, 0.0) for n in names],
                marker_color=BREAKDOWN_COLOURS.get(key),
                hovertemplate="%{x}: %{y:.3f} ms per step<extra>" + _e(BREAKDOWN[key]) + "</extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        title="One profiled step, split into disjoint parts",
        yaxis_title="ms per step",
        legend={"orientation": "h"},
    )
    return fig
