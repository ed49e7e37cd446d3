"""The training harness: a training loop whose concurrency settings are explicit and measured.

Knows nothing of Optuna or HTTP; `tuner` and `api` build on it.
"""

from trainers.config import REFERENCE, SYNC_MODES, LoopConfig, field_names
from trainers.errors import (
    CaptureError,
    ConfigError,
    TrainerError,
    UnsupportedOnDevice,
    WorkloadError,
)
from trainers.floor import Floor, graph_floor
from trainers.loop import WindowCallback, resolve_device, run
from trainers.measure import RunResult, Window, fingerprint, fingerprint_key
from trainers.parity import GRAPH_RTOL, ParityVerdict, check_parity, parity_losses
from trainers.workloads import BUILTIN, PRESETS, Workload, load_workload, resolve_factory

__all__ = [
    "BUILTIN",
    "GRAPH_RTOL",
    "PRESETS",
    "REFERENCE",
    "SYNC_MODES",
    "CaptureError",
    "ConfigError",
    "Floor",
    "LoopConfig",
    "ParityVerdict",
    "RunResult",
    "TrainerError",
    "UnsupportedOnDevice",
    "Window",
    "WindowCallback",
    "Workload",
    "WorkloadError",
    "check_parity",
    "field_names",
    "fingerprint",
    "fingerprint_key",
    "graph_floor",
    "load_workload",
    "parity_losses",
    "resolve_device",
    "resolve_factory",
    "run",
]
