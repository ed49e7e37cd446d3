"""Small pieces the HTML report is made of: escaped text, figures, intervals, tables, a trial's
state and throughput, and the colours and style shared by the report and its charts."""

from __future__ import annotations

import html
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.store import keys

BASELINE_ORDER = ("pytorch-default", "seed-baseline")


STATE_COLOURS = {
    "complete": "#1f77b4",
    "pruned": "#ff7f0e",
    "failed": "#d62728",
    "running": "#7f7f7f",
    "waiting": "#7f7f7f",
}


BASELINE_COLOURS = {"pytorch-default": "#2ca02c", "seed-baseline": "#9467bd"}


BREAKDOWN_COLOURS = {
    "kernels": "#1f77b4",
    "h2d_exposed": "#ff7f0e",
    "other_gpu": "#bcbd22",
    "idle_sync": "#d62728",
    "idle_host": "#c7c7c7",
    "data": "#17becf",
    "optimizer": "#9467bd",
    "host": "#8c8c8c",
    "sync": "#d62728",
}


PLOT_CONFIG = {"displaylogo": False, "responsive": True}


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { margin-top: 2.2rem; font-size: 1.25rem;
     border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .55rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } table.verdicts td:nth-child(3) { min-width: 16rem; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.explanation { font-size: 1.1rem; background: #eef5ff; border-left: 4px solid #1f77b4;
               padding: .5rem .8rem; }
.note { background: #fff8e5; border-left: 4px solid #e0a800; padding: .4rem .8rem; }
.missing { color: #666; font-style: italic; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(21rem, 1fr)); gap: .8rem; }
.plot { min-height: 200px; } .meta { color: #555; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _interval(entry: Mapping[str, Any] | None, unit: str = "", digits: int = 1) -> str:
    if not entry:
        return "-"
    low, high = entry["ci95"]
    return f"{entry['median']:,.{digits}f}{unit} (95 % CI {low:,.{digits}f}-{high:,.{digits}f})"


def _bytes(n: int | float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def _table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Sequence[int] = (),
    cls: str = "",
) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _config_text(config: Mapping[str, Any] | None) -> str:
    if not config:
        return "-"
    return ", ".join(f"{_e(k)}={_e(v)}" for k, v in config.items())


def _state(trial: FrozenTrial) -> str:
    return {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
        TrialState.RUNNING: "running",
        TrialState.WAITING: "waiting",
    }[trial.state]


def _throughput(trial: FrozenTrial) -> float | None:
    """A trial's throughput: its objective value, or the median of a pruned trial's windows."""
    if trial.state == TrialState.COMPLETE and trial.values:
        return float(trial.values[0])
    median = trial.user_attrs.get("median")
    if isinstance(median, int | float):
        return float(median)
    windows = trial.user_attrs.get(keys.WINDOWS)
    if isinstance(windows, list) and windows:
        return float(statistics.median(windows))
    return None
