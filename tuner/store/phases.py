"""Where a study's time went: the phase names, and the one rule that adds them up.

Each process that works on a study (`python -m tuner run`, a resumed run, each worker of a job)
records one session (`keys.TIME_PREFIX` + its id): its wall time and the seconds of each phase.
The phases are disjoint parts of that wall time; `idle` is what no phase covers (building the
workload, opening the study, the sampler, writes to the storage). A trial's own share is on the
trial (`keys.TIME`): its compile, measurement, gate parts and profile.

- compile: the warm-up steps in which Dynamo and Inductor compiled, beyond a normal step
  (`RunResult.compile_s`), of every measured run (trials, baselines, final rounds);
- gate_reference, gate_envelope: the gate's reference run and its perturbed copies, once per
  study (a program measures its reference inside its envelope: all of it is gate_envelope);
- gate_twin: a config's twin, for the configs whose test needs one: its eager twin (one run; its
  second, where the config does not replay the first, and the reproducibility probe count as
  gate_config) or its loop twin (its loop settings on the reference's arithmetic, and the
  reference strict where the envelope's is not);
- gate_config: the config's own gate run and the judgement;
- measure: the measurements of trials and baselines, compile excluded, and the levers' probes
  (`tuner.search.proposing.levers.Prober`);
- final_round: the final round's measurements (compile excluded) and the graph floor;
- profile: profiling the baselines, the recommended config and (`--profile all`) trials.

Sessions of one study add up (`study_time`): with several workers at once, wall time is the sum
of theirs (worker-seconds), not the time on a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tuner.store import keys

COMPILE = "compile"
GATE_REFERENCE = "gate_reference"
GATE_ENVELOPE = "gate_envelope"
GATE_TWIN = "gate_twin"
GATE_CONFIG = "gate_config"
MEASURE = "measure"
FINAL_ROUND = "final_round"
PROFILE = "profile"
IDLE = "idle"
GATE_PHASES = (GATE_REFERENCE, GATE_ENVELOPE, GATE_TWIN, GATE_CONFIG)
PHASES = (COMPILE, *GATE_PHASES, MEASURE, FINAL_ROUND, PROFILE)
"""Every recorded phase, in the order they are shown; `IDLE` is derived."""
LABELS = {
    COMPILE: "compile",
    GATE_REFERENCE: "gate: reference",
    GATE_ENVELOPE: "gate: envelope",
    GATE_TWIN: "gate: twin",
    GATE_CONFIG: "gate: config run",
    MEASURE: "measurement",
    FINAL_ROUND: "final round",
    PROFILE: "profiling",
    IDLE: "idle",
}


def with_idle(wall_s: float, phases: Mapping[str, float]) -> dict[str, float]:
    """Every phase (0.0 where none was recorded) and `idle`: the wall time no phase covers."""
    shown = {name: float(phases.get(name, 0.0) or 0.0) for name in PHASES}
    shown[IDLE] = max(0.0, wall_s - sum(shown.values()))
    return shown


def sessions(study_attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The study's stored sessions, oldest first."""
    found = [
        v for k, v in study_attrs.items() if k.startswith(keys.TIME_PREFIX) and isinstance(v, dict)
    ]
    return sorted(found, key=lambda s: str(s.get("started", "")))


def study_time(study_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """`{"wall_s", "phases": {phase: s, ..., "idle": s}, "sessions", "profiles"}` over every
    session of the study; None for a study recorded before phases were. `profiles`: each stored
    profile's own seconds (`keys.PROFILE_PREFIX`; its run and trace, not the child process's start
    or the model's build, which the `profile` phase includes), 0 for one copied from an earlier
    study: at 1.1B the phase took 147-249 s, and this says which profile took it."""
    found = sessions(study_attrs)
    if not found:
        return None
    profiles = {
        key.removeprefix(keys.PROFILE_PREFIX): float(value.get("seconds") or 0.0)
        for key, value in study_attrs.items()
        if key.startswith(keys.PROFILE_PREFIX) and isinstance(value, Mapping) and "seconds" in value
    }
    return total(found) | {"profiles": profiles}


def total(found: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    wall = 0.0
    summed = dict.fromkeys(PHASES, 0.0)
    count = 0
    for session in found:
        count += 1
        wall += float(session.get("wall_s") or 0.0)
        for name, seconds in (session.get("phases") or {}).items():
            if name in summed:
                summed[name] += float(seconds or 0.0)
    return {"wall_s": wall, "phases": with_idle(wall, summed), "sessions": count}
