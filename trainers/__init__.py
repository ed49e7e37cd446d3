"""The training harness: a training loop whose concurrency settings are explicit and measured.

Knows nothing of Optuna or HTTP; `tuner` and `api` build on it.
"""

from trainers.blocks import has_blocks
from trainers.compilation import (
    CACHE_DIR_VARIABLE,
    compile_cache_dir,
    compiles,
    keeps_code,
    usable_cores,
)
from trainers.config import (
    COMPILE_MODES,
    OPTIMIZERS,
    REFERENCE,
    SYNC_MODES,
    LoopConfig,
    canonical,
    check_setting,
    field_names,
    invalid_reason,
)
from trainers.core import DEVICE_PATTERN, DEVICES_ALLOWED, min_warmup, resolve_device, split_batch
from trainers.dynamo_state import DROPPED as KEPT_CODE_DROPPED
from trainers.errors import (
    CaptureError,
    ConfigError,
    TrainerError,
    UnsupportedOnDevice,
    WorkloadError,
)
from trainers.fit import FitResult, Trainer, checkpoint_file, warmup_cosine, workload_from_parts
from trainers.flops import Utilisation, count_recompute_flops, utilisation
from trainers.gate import (
    GRAPH_RTOL,
    Envelope,
    Floor,
    ParityVerdict,
    Twin,
    check_parity,
    gate,
    graph_floor,
    parity_losses,
    required_test,
)
from trainers.kept_code import keeping_compiled
from trainers.levers import (
    LEVERS,
    TIE_ORDER,
    Lever,
    compile_modes,
    one_of,
    records_graphs,
)
from trainers.loop import WindowCallback, run
from trainers.measure import RunResult, Window, fingerprint, fingerprint_key
from trainers.optim import prepare_optimizer
from trainers.precision import (
    MATMUL_PRECISION,
    MATMUL_PRECISIONS,
    PRECISIONS,
    MatmulPrecision,
    Precision,
    PrecisionSpec,
    check_matmul_precision,
    check_precision_here,
    check_precisions,
    matmul_precision_for,
    parse_precision,
    set_matmul_precision,
)
from trainers.probe import Probed, probe_levers
from trainers.runargs import RunArgs
from trainers.tuned import ENV_PREFIX, config_from_env, load_config, load_precision
from trainers.workloads import (
    BUILTIN,
    PRESETS,
    ReusedBuilds,
    Workload,
    catalog,
    load_workload,
    resolve_factory,
    workload_key,
)

__all__ = [
    "BUILTIN",
    "CACHE_DIR_VARIABLE",
    "COMPILE_MODES",
    "DEVICES_ALLOWED",
    "DEVICE_PATTERN",
    "ENV_PREFIX",
    "GRAPH_RTOL",
    "KEPT_CODE_DROPPED",
    "LEVERS",
    "MATMUL_PRECISION",
    "MATMUL_PRECISIONS",
    "OPTIMIZERS",
    "PRECISIONS",
    "PRESETS",
    "REFERENCE",
    "SYNC_MODES",
    "TIE_ORDER",
    "CaptureError",
    "ConfigError",
    "Envelope",
    "FitResult",
    "Floor",
    "Lever",
    "LoopConfig",
    "MatmulPrecision",
    "ParityVerdict",
    "Precision",
    "PrecisionSpec",
    "Probed",
    "ReusedBuilds",
    "RunArgs",
    "RunResult",
    "Trainer",
    "TrainerError",
    "Twin",
    "UnsupportedOnDevice",
    "Utilisation",
    "Window",
    "WindowCallback",
    "Workload",
    "WorkloadError",
    "canonical",
    "catalog",
    "check_matmul_precision",
    "check_parity",
    "check_precision_here",
    "check_precisions",
    "check_setting",
    "checkpoint_file",
    "compile_cache_dir",
    "compile_modes",
    "compiles",
    "config_from_env",
    "count_recompute_flops",
    "field_names",
    "fingerprint",
    "fingerprint_key",
    "gate",
    "graph_floor",
    "has_blocks",
    "invalid_reason",
    "keeping_compiled",
    "keeps_code",
    "load_config",
    "load_precision",
    "load_workload",
    "matmul_precision_for",
    "min_warmup",
    "one_of",
    "parity_losses",
    "parse_precision",
    "prepare_optimizer",
    "probe_levers",
    "records_graphs",
    "required_test",
    "resolve_device",
    "resolve_factory",
    "run",
    "set_matmul_precision",
    "split_batch",
    "usable_cores",
    "utilisation",
    "warmup_cosine",
    "workload_from_parts",
    "workload_key",
]
