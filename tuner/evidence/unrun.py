"""Why a trial ended unrun or unmeasured in full, from its record: the CLI's trial lines, the
service's trial rows and the benchmarks' records give the same line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.store import keys


def pruned_reason(attrs: Mapping[str, Any]) -> str | None:
    """Why a trial with these user attributes ended unrun or unmeasured in full, in one line: its
    screen's figure against the incumbent's, its prediction's skip, the pruner's stop, or the
    copied trial that had measured its config (`tuner.search.proposing.screen.measured_before`;
    None: none of these)."""
    record = attrs.get(keys.SCREEN)
    if isinstance(record, dict) and record.get("outcome") == "lost":
        against = record.get("incumbent") or {}
        return (
            f"{record.get('value', 0.0):,.1f} samples/s over {record.get('windows')} windows, "
            f"more than {record.get('margin', 0.0):.0%} below trial {against.get('trial')}'s "
            f"{against.get('throughput', 0.0):,.1f}: not gated"
        )
    found = attrs.get(keys.PREDICTION)
    if isinstance(found, dict) and found.get("skip") in ("memory", "slower", "tie"):
        return f"not run: {found.get('reason')}"
    if attrs.get(keys.STOPPED):
        return "stopped at a window: the job was cancelled or its worker stopped (not counted)"
    pruned = attrs.get(keys.PRUNED_AT)
    if isinstance(pruned, dict):
        window = int(pruned.get("window", 0)) + 1  # stored 0-based, as Optuna's step
        return (
            f"{pruned.get('throughput', 0.0):,.1f} samples/s at window {window}, below the "
            "fastest quarter of the earlier trials there: stopped by the pruner"
        )
    if isinstance(attrs.get(keys.SAME_AS), int):
        return (
            f"not run: trial {attrs[keys.SAME_AS]}, copied from an earlier job, measured this "
            "config (the final round measures the contenders side by side)"
        )
    return None
