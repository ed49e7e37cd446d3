"""The search's trials keep compiled code side by side (`tuner.search.search.SEARCH_KEPT`): a real
CPU study (real Optuna, SQLite, compiles) whose third trial runs the first's graphs after a
trial of other arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tuner.tiny import load, options, sqlite_url
from tuner.search.options import LocalSlots
from tuner.search.study import open_search
from tuner.store import keys
from tuner.store.phases import COMPILE


@pytest.mark.slow
def test_trials_after_one_of_other_arithmetic_run_the_code_kept_from_before(
    tmp_path: Path,
) -> None:
    """Trials keep up to `SEARCH_KEPT` configs' compiled code side by side: after a compiled
    fp32 trial and a compiled bf16 one (other graphs), each later trial of either precision,
    with other loop settings (the same graphs), compiles nothing, as the final round's entry
    of a leader after its variants does not. Screened, so that no gate runs in this process
    between them (on a GPU the gate has a process of its own)."""
    opts = options(
        sqlite_url(tmp_path),
        "kept",
        trials=5,
        precisions=("fp32", "bf16-autocast"),
        fix=("num_workers=0", "compile=default"),
        screen="on",
    )
    search = open_search(opts)
    try:
        for precision, sync in (("fp32", 1), ("bf16-autocast", 1), ("fp32", 2)):
            search.study.enqueue_trial({"precision": precision, "sync_interval": sync})
        search.run_trials(LocalSlots(5))
    finally:
        search.close()
    trials = load(opts.storage, opts.study).get_trials()
    ran = [t for t in trials if keys.TIME in t.user_attrs]
    assert len(ran) == 5
    firsts = {t.params["precision"]: t.number for t in reversed(ran)}
    assert set(firsts) == {"fp32", "bf16-autocast"}
    for trial in ran:
        compiled = trial.user_attrs[keys.TIME].get(COMPILE, 0.0)
        if trial.number in firsts.values():
            assert compiled > 0, trial.number  # each precision compiled its graphs once
        else:
            assert compiled == 0.0, trial.number  # and ran them kept after
