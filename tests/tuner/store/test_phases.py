"""`tuner.store.phases`: sessions of one study add up, idle is what no phase covers."""

from __future__ import annotations

from tuner.store.phases import IDLE, PHASES, study_time, with_idle


def test_idle_is_the_wall_time_no_phase_covers() -> None:
    shown = with_idle(10.0, {"measure": 6.0, "compile": 1.5})
    assert set(shown) == {*PHASES, IDLE}
    assert shown["idle"] == 2.5 and shown["gate_twin"] == 0.0
    assert sum(shown.values()) == 10.0


def test_sessions_of_a_study_add_up() -> None:
    attrs = {
        "time/b": {"started": "2026-01-02", "wall_s": 4.0, "phases": {"measure": 3.0}},
        "time/a": {"started": "2026-01-01", "wall_s": 6.0, "phases": {"measure": 1.0}},
        "baseline/x": {"seconds": 99.0},
        "profile/recommended": {"seconds": 2.5, "verdict": "gpu-bound"},
        "profile/seed-baseline": {"error": "out of memory"},
    }
    total = study_time(attrs)
    assert total is not None
    assert total["wall_s"] == 10.0 and total["sessions"] == 2
    assert total["phases"]["measure"] == 4.0 and total["phases"]["idle"] == 6.0
    # Each stored profile's own seconds; a failed one has none.
    assert total["profiles"] == {"recommended": 2.5}


def test_a_study_recorded_before_phases_has_none() -> None:
    assert study_time({"recommendation": {}}) is None
