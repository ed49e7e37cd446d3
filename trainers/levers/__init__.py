"""The levers: each setting of the training loop declared once, with every fact the rest of the
tree needs (`trainers.levers.declare`), in one table (`LEVERS`).

`trainers.levers.table` declares the `LoopConfig` fields; a lever added since is one module that
declares it and registers it. Everything else reads the table: `LoopConfig` validates each
setting with `Lever.check` and refuses a device with `Lever.refuse_on`; the step enters each
`Lever.around_forward` context around the forward (`trainers.core.forward_contexts`); the
search space takes each setting's kind, default and `offered` values from it; a config's stored
key leaves out the levers with `added` >= 1 while at their default; the API's request models,
the CLI's `--fix` and the help texts list `LEVERS` with each `label`.

How to add a lever
------------------
1. Write one module (for a lever of the loop, `trainers/levers/<name>.py`) that declares it:

       ATTENTION = Lever(
           name="attention",
           label="the SDPA backend around the forward",
           kind="str",
           default="default",          # the PyTorch idiom: what a config without it meant
           added=4,                    # >= 1: stored configs keep their keys
           options=ranked(("default", "none", "exact", 0), ("cudnn", "none", "equivalence", 0)),
           refuse_on=lambda value, device: (
               "attention='cudnn' needs a CUDA device" if value == "cudnn" and device != "cuda"
               else None
           ),
           around_forward=lambda value: (
               sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if value == "cudnn" else nullcontext()
           ),
           offered=("default", "cudnn"),  # searched by the built-in spaces (empty: not)
       )
       register(ATTENTION)

   and import it at the end of this file (`from trainers.levers import attention`), so the
   table holds it wherever `trainers` is imported. Every fact of `Option` and `Lever.added` is
   required: a declaration that forgets one fails at import.
2. Read it as `config.get("attention")`; `LoopConfig.from_dict`, `replace` and `to_dict` carry
   it (it lives in `LoopConfig.modules`, not as a field, so no other file changes).
3. A rule that refuses a value beside other levers' values is the lever's `conflicts`; in a
   precision, its `refuse_in`; for a model that cannot take it, its `refuse_for` (the search's
   second stage reads all three through `trainers.invalid_reason` before it enqueues a
   variant; a sampled trial that breaks the last two fails in one line). A microbenchmark of
   the work it changes at the model's shapes is its `probe` (`attention.py`, `loss.py`). A change to
   the model for the run (and its undo) is its `transform` (`trainers/levers/loss.py` has
   `conflicts`, `refuse_for` and `transform`). An effect of another kind (an optimizer option)
   has its one spot in `trainers.core.Engine`.
4. Nothing else: tests/trainers/test_lever_module.py declares one in a test and shows the
   config, the API, `--fix`, the space, a run and the stored keys take it.
"""

from __future__ import annotations

from trainers.levers.declare import (
    FIELD_LEVERS,
    Cost,
    DeviceRule,
    ForwardContext,
    Kind,
    Lever,
    Numerics,
    Option,
    Span,
    Value,
    flag,
    ranked,
    register,
    registered,
    unregister,
)
from trainers.levers.table import (
    DECLARED,
    LEVERS,
    MAX_BUCKET_CAP_MB,
    MAX_PREFETCH,
    MAX_STREAMS,
    MAX_SYNC_INTERVAL,
    MAX_WORKERS,
    TIE_ORDER,
    Checkpointing,
    CompileMode,
    CompileScope,
    OptimizerChoice,
    Parallel,
    SyncMode,
    compile_modes,
    defaults_where,
    lever,
    one_of,
    records_graphs,
)

__all__ = [
    "DECLARED",
    "FIELD_LEVERS",
    "LEVERS",
    "MAX_BUCKET_CAP_MB",
    "MAX_PREFETCH",
    "MAX_STREAMS",
    "MAX_SYNC_INTERVAL",
    "MAX_WORKERS",
    "TIE_ORDER",
    "Checkpointing",
    "CompileMode",
    "CompileScope",
    "Cost",
    "DeviceRule",
    "ForwardContext",
    "Kind",
    "Lever",
    "Numerics",
    "OptimizerChoice",
    "Option",
    "Parallel",
    "Span",
    "SyncMode",
    "Value",
    "compile_modes",
    "defaults_where",
    "flag",
    "lever",
    "one_of",
    "ranked",
    "records_graphs",
    "register",
    "registered",
    "unregister",
]

# The lever modules: each registers its lever in the table as it is imported (the docstring's
# "How to add a lever").
from trainers.levers import (
    attention,  # noqa: F401  (registers `attention`)
    float8_head,  # noqa: F401  (registers `float8_head`)
    float8_linears,  # noqa: F401  (registers `float8_linears`; its transform after float8_head's)
    kernels,  # noqa: F401  (registers `kernels`)
    loss,  # noqa: F401  (registers `loss`)
)
