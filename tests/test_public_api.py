"""The packages' public names are a decision: adding or removing one fails here until this list
is changed with it (httpx pins its `__all__` the same way)."""

from __future__ import annotations

import importlib

import pytest

import trainers
import tuner

TRAINERS = {
    "DEVICE_PATTERN",
    "RunArgs",
    "DEVICES_ALLOWED",
    "CACHE_DIR_VARIABLE",
    "ENV_PREFIX",
    "prepare_optimizer",
    "probe_levers",
    "Probed",
    "warmup_cosine",
    "architecture_digest",  # what model a study measured (the exported script checks it)
    "BUILTIN",
    "COMPILE_MODES",
    "INERT",  # which settings mean nothing beside which (tuner refuses such pins)
    "CaptureError",
    "ConfigError",
    "Envelope",
    "FitResult",
    "Floor",
    "GRAPH_RTOL",
    "KEPT_CODE_DROPPED",  # how a compile note naming why kept code was dropped begins
    "LEVERS",  # the lever table: each LoopConfig field's values and facts, declared once
    "Lever",
    "compile_modes",
    "one_of",
    "records_graphs",
    "LoopConfig",
    "MATMUL_PRECISION",
    "MATMUL_PRECISIONS",
    "MatmulPrecision",
    "OPTIMIZERS",
    "PRECISIONS",
    "PRESETS",
    "ParityVerdict",
    "Precision",
    "PrecisionSpec",
    "REFERENCE",
    "ReusedBuilds",
    "RunResult",
    "SYNC_MODES",
    "TIE_ORDER",  # the levers the tie rule compares, most decisive first
    "Trainer",
    "TrainerError",
    "Twin",
    "UnsupportedOnDevice",
    "Utilisation",
    "usable_cores",
    "utilisation",
    "Window",
    "WindowCallback",
    "Workload",
    "WorkloadError",
    "canonical",
    "catalog",
    "check_matmul_precision",
    "check_parity",
    "check_precision_here",
    "tf32_unused",
    "check_precisions",
    "check_setting",
    "checkpoint_file",  # where fit writes the checkpoint of a step (`{step}` in the path)
    "compile_cache_dir",
    "compiles",
    "config_from_env",
    "count_recompute_flops",
    "a_field",
    "did_you_mean",
    "field_names",
    "fingerprint",
    "fingerprint_key",
    "gate",
    "graph_floor",
    "has_blocks",
    "load_config",
    "load_precision",
    "workload_from_parts",
    "invalid_reason",
    "keeping_compiled",  # several configs keep their compiled code side by side (the final round)
    "keeps_code",
    "load_workload",
    "matmul_precision_for",
    "parse_precision",
    "min_warmup",
    "parity_losses",
    "required_test",
    "resolve_device",
    "resolve_factory",
    "run",
    "set_matmul_precision",
    "split_batch",
    "workload_key",
}
GATE = {
    "DETERMINISMS",
    "Determinism",
    "GATE_ARGS",
    "GATE_DETERMINISM",
    "Reproducibility",
    "comparable_floor",
    "eager_reproducibility",
    "envelope_seeds",
    "exact_length",
    "first_difference",
    "floor_applies",
    "forget",
    "remember",
    "Envelope",
    "Equivalence",
    "FAULTS",
    "FAULT_KINDS",
    "FLOOR_ULPS",
    "FaultKind",
    "Floor",
    "GRAPH_RTOL",
    "GateTest",
    "MULTIPLE",
    "PARITY_STEPS",
    "PERTURBATIONS",
    "SPREADS",
    "SEEDS_DETERMINISM",
    "ParityVerdict",
    "Perturbation",
    "Trajectory",
    "Twin",
    "WINDOW",
    "check_parity",
    "gate",
    "graph_floor",
    "judge",
    "parity_losses",
    "planted",
    "reference_determinism",
    "required_test",
    "rounding_eps",
    "spread_for",
    "trajectory",
    "twin_of",
    "TWIN_KINDS",
    "TwinKind",
    "config_determinism",
    "loop_twin_of",
    "twin_kind",
}
PROGRAM = {
    "MAX_NPROC",
    "NCCL_ENV",
    "check_nproc",
    "run_distributed",
    "PREFIX",
    "PROTOCOL",
    "Program",
    "ProgramFailed",
    "REGISTRY_VARIABLE",
    "ReportReader",
    "Reporter",
    "find_program",
    "load_registry",
    "program_env",
    "program_parity",
    "run_program",
}
WORKLOADS = {
    "BUILTIN",
    "Batch",
    "BoundFactory",
    "LIBRARY_PREFIXES",
    "Family",
    "OptionSpec",
    "PRESETS",
    "ReusedBuilds",
    "SyntheticBatches",
    "Workload",
    "WorkloadFactory",
    "adam",
    "adamw",
    "catalog",
    "check_preset",
    "disable_dropout",
    "load_workload",
    "lookup",
    "resolve_factory",
    "workload_key",
}
TUNER = {
    "BASELINES",
    "GpuBusy",
    "Interrupted",
    "JobConflict",
    "JobNotFound",
    "JobSpec",
    "JobStore",
    "NoRecommendation",
    "Recommendation",
    "RunOptions",
    "SearchSpace",
    "SpaceError",
    "SpecError",
    "Stopped",
    "StudyNotFound",
    "StudyReader",
    "TooManyQueued",
    "TrialCounts",
    "TunerError",
    "Worker",
    "WorkerSettings",
    "WorkloadRegistry",
    "count_trials",
    "list_studies",
    "load_config",
    "load_precision",
    "load_space",
    "recommendation",
    "run_study",
    "space_from_mapping",
}


def test_trainers_exports_exactly_its_public_names() -> None:
    assert set(trainers.__all__) == TRAINERS
    assert all(hasattr(trainers, name) for name in trainers.__all__)


def test_tuner_exports_exactly_its_public_names() -> None:
    assert set(tuner.__all__) == TUNER
    assert all(hasattr(tuner, name) for name in tuner.__all__)
    assert len(tuner.__all__) == len(set(tuner.__all__))


@pytest.mark.parametrize(
    ("front", "names"),
    [("trainers.gate", GATE), ("trainers.program", PROGRAM), ("trainers.workloads", WORKLOADS)],
)
def test_each_trainers_front_exports_exactly_its_public_names(front: str, names: set[str]) -> None:
    # By module name: the attribute `trainers.gate` is the function `gate` the front re-exports.
    package = importlib.import_module(front)
    assert set(package.__all__) == names
    assert all(hasattr(package, name) for name in package.__all__)
