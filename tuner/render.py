"""Human-readable output for the CLI (rich). JSON output never goes through here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainers import RunResult


def _bytes(n: int | None) -> str:
    if n is None:
        return "n/a (CPU)"
    return f"{n / 2**20:,.1f} MiB"


def run_summary(console: Console, result: RunResult) -> None:
    st = result.step_time_ms
    table = Table(show_header=False, box=None)
    table.add_row("workload", f"{result.workload} / {result.preset} on {result.device}")
    table.add_row("config", ", ".join(f"{k}={v}" for k, v in result.config.items()))
    table.add_row("step time", f"{st['median']:.3f} ms median (p10 {st['p10']:.3f}, "
                               f"p90 {st['p90']:.3f}) over {len(result.windows)} windows")
    table.add_row("throughput", f"{result.samples_per_s:,.1f} samples/s"
                  + (f", {result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else ""))
    table.add_row("host syncs", f"{result.n_syncs} blocking ({result.sync_wait_ms:.2f} ms), "
                                f"{result.n_polls} polls")
    table.add_row("peak memory", _bytes(result.peak_memory_bytes))
    check = result.loss_check
    table.add_row("losses", f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}; "
                            f"{check['n_extracted']}/{check['expected']} extracted, "
                            f"in order: {check['in_order']}, each once: {check['each_once']}")
    console.print(table)
    if result.effective.get("note"):
        console.print(f"[yellow]note:[/yellow] {result.effective['note']}")
