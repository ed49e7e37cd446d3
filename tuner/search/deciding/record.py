"""How a search spent its trials, for the recommendation (`Recommendation.search`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from tuner.evidence import profiles
from tuner.search.gating.parity import ParityCache
from tuner.search.proposing.predict import tally
from tuner.store import keys


def search_record(
    study: optuna.Study,
    trials: Sequence[optuna.trial.FrozenTrial],
    attrs: dict[str, Any],
    *,
    screening: bool,
    ended: dict[str, str] | None,
    parity_cache: ParityCache,
) -> dict[str, Any]:
    """The trials by how they were spent (`tuner.search.proposing.predict.tally`), what ended
    them (`ended`: `by` one of request, trials, timeout, patience, and the line that said so;
    None where this process ran none), how many distinct candidates the gate judged, and what
    was reused from an earlier job or another worker of this one."""
    candidates = {t.user_attrs.get(keys.CONFIG_KEY) for t in trials}
    gated = sum(
        1
        for key in attrs
        if key.startswith(keys.PARITY_PREFIX) and key.removeprefix(keys.PARITY_PREFIX) in candidates
    )
    return tally(trials) | {
        "screening": screening,
        "ended": ended,
        "gated": gated,
        "reference_reused": sorted(parity_cache.reused_envelopes),
        # What this process did not run again: verdicts an earlier job reached, profiles an
        # earlier study or another worker of this job took (`Search._profile`).
        "verdicts_reused": parity_cache.reused,
        "trials_copied": attrs.get(keys.TRIALS_COPIED),
        "profiles_copied": sorted(
            name
            for name, found in profiles.study_profiles(study).items()
            if found.get("shared_from") is not None and not found.get("seconds")
        ),
    }
