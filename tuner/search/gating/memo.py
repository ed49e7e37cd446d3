"""The gate's verdicts (and profiles) shared between studies of one workload on one machine.

A user's second job on the same model (another study: a new name, other trial counts, another
search budget) asks the gate the same questions as the first: the reference's losses, their
noise envelope, and a verdict for each lever corner. Measured on an H100 (GPT-2 124M, bf16, the
default job at 73b9fe6, `docs/benchmarks/default-job-h100-2026-11-25-gpt2.*`), the warm job spent
155 s of its 377 s in the gate, re-checking the configs the cold job had checked minutes before.

A verdict is a function of its inputs: the code that trains (the `trainers` package and the gate's
runners here), the workload and its shape, the study's precision and matmul precision, the gate's
steps and seed, the number of processes, and the machine (`trainers.fingerprint`: GPU, driver,
CUDA, torch, Python, CPU; on a CPU also the thread count). Not which GPU of a node a process
sees, nor a GPU machine's core count: a repeat job on another machine of the same kind finds it.
`memo_name` hashes all of them into the name of an Optuna study in the
same storage (so PostgreSQL workers share it as they share studies) that holds the verdicts, keyed
as the study's own cache keys them (`tuner.search.gating.parity`), and the envelope. Any change to
any input is another name: nothing stale is read. A scope (`RunOptions.scope`: the service's
job owner) is an input too, so one owner's jobs never read another's verdicts or profiles.

Left out on purpose:
- a user's own `package.module:factory` workload and a registered program: their code can change
  in files this process cannot see (the factory's imports, a program's binary). Their verdicts
  stay cached within one study, as before.
- a verdict the gate could not reach (its run raised, for example out of memory because another
  process held the GPU): that is a fact about the moment, not about the config.
- a verdict judged against another envelope than the memo's (a study resumed after the code or
  the machine changed keeps its own stored envelope): it holds for that envelope only.

The same memo study holds the profiles taken after deciding (`tuner.search.deciding.profiling.
SharedProfiles`): the baselines' and the recommended config's, keyed by config and profile
settings. They depend on the same inputs as a verdict.

`TUNER_GATE_MEMO=off` turns the sharing off: every study then checks and profiles every config
again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import optuna
import torch

import trainers
from trainers.workloads import BUILTIN, LIBRARY_PREFIXES
from tuner.search.identity import named_files
from tuner.search.options import RunOptions
from tuner.store.keys import MEMO_PREFIX

MEMO_ENV = "TUNER_GATE_MEMO"
FORMAT = 1
"""Version of the memo's key; raise it when what a verdict depends on changes shape."""
_LIBRARIES = ("torchvision", "timm", "transformers", "torchao", "triton")
_GATE_CODE = (
    "gating/gate.py",
    "gating/isolated.py",
    "gating/dpgate.py",
    "gating/parity.py",
    "gating/program.py",
    "children.py",
    "deciding/profile_child.py",
)
"""The gate's runners in `tuner.search` and what hands them their settings (the rest of the
gate is in `trainers`), and the profiles' child (profiles are shared through the memo too),
relative to `tuner/search`."""
_ENV_PREFIXES = (
    "TORCH",
    "PYTORCH_",
    "CUBLAS",
    "CUDNN",
    "NVIDIA_TF32",
    "NCCL_",
    "OMP_",
    "MKL_",
    "CUDA_",
)
"""Environment variables that can change what a run computes (TF32 override, cuBLAS
workspace, Inductor's and NCCL's choices, thread counts); cache locations are left out below."""


def memo_enabled() -> bool:
    return os.environ.get(MEMO_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def shareable(workload: str) -> bool:
    """A built-in workload or a library model: code this package or a versioned library owns."""
    return workload in BUILTIN or workload.partition(":")[0] in LIBRARY_PREFIXES


@functools.cache
def code_digest() -> str:
    """SHA-256 of every source file that decides a verdict: `trainers/` and the gate's runners."""
    digest = hashlib.sha256()
    root = Path(trainers.__file__).resolve().parent
    here = Path(__file__).resolve().parents[1]  # tuner/search
    files = sorted(root.rglob("*.py")) + [here / name for name in _GATE_CODE]
    for path in files:
        digest.update(str(path.relative_to(path.parents[1])).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _library_versions() -> dict[str, str | None]:
    """The model libraries, Triton, and the CUDA libraries pip installs beside torch (their
    wheels, `nvidia-*`, can be upgraded without torch), by installed version."""
    versions: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("nvidia-"):
            versions[name.lower()] = dist.version
    versions["cudnn"] = str(torch.backends.cudnn.version())
    return versions


_WHICH_DEVICE = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
"""Which GPU a process sees, not what it computes (the fingerprint names the GPU's model): each
worker of `run --gpus N` sees its own (`tuner.service.pool`), and with these in the key each
had a memo of its own, so the finalizer did not find the profiles its helpers had taken (on 4
H100s, `llama-1b`, 2026-11-28: 139 s profiling again) and no later job found their verdicts."""


def _environment() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_ENV_PREFIXES)
        and not k.endswith(("CACHE_DIR", "_CACHE"))
        and k not in _WHICH_DEVICE
    }


_STARTED_WITH = _environment()
"""The environment as this process started (read at import, before any study runs): the gate
sets some of these itself (`CUBLAS_WORKSPACE_CONFIG` for its deterministic kernels, where the
user set none), and what it sets is the same for every study."""


def memo_inputs(options: RunOptions, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Everything a verdict of this study depends on beside the config (see the module doc)."""
    return {
        "format": FORMAT,
        "code": code_digest(),
        "libraries": _library_versions(),
        "workload": options.workload,
        "preset": options.preset,
        "model_args": dict(sorted(options.model_args.items())),
        "precision": options.precision,
        "matmul_precision": options.matmul_precision,
        "parity_steps": options.parity_steps,
        "precision_parity_steps": options.precision_parity_steps,
        "precision_tolerance": options.precision_tolerance,
        "seed": options.protocol.seed,
        "nproc_per_node": options.nproc_per_node,
        "fingerprint": fingerprint,
        # The CPU gate runs in this process: its thread count changes the order of reductions.
        # A GPU's gate computes on the GPU, and a machine's core count (the default thread
        # count) must not keep a repeat job on another machine of the same GPU from its memo.
        "threads": torch.get_num_threads() if fingerprint.get("device_type") == "cpu" else None,
        "environment": _STARTED_WITH,
        # Only where set: an unscoped memo keeps the name it had before scopes, and an owner's
        # name is hashed with the rest, never stored.
        **({} if options.scope is None else {"scope": options.scope}),
        # A file a model argument names, by its contents (`config=my.json` edited: another
        # model under the same path); only where there is one, so other memos keep their names.
        **({"model_files": files} if (files := named_files(dict(options.model_args))) else {}),
    }


def memo_name(options: RunOptions, fingerprint: dict[str, Any]) -> str | None:
    """The shared verdicts' study name; None where they are not shared (see the module doc)."""
    if not memo_enabled() or not shareable(options.workload):
        return None
    text = json.dumps(memo_inputs(options, fingerprint), sort_keys=True, default=str)
    return MEMO_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def open_memo(
    storage: optuna.storages.BaseStorage, options: RunOptions, fingerprint: dict[str, Any]
) -> optuna.Study | None:
    """The memo study of `options` on this machine (created empty the first time), or None."""
    name = memo_name(options, fingerprint)
    if name is None:
        return None
    return optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
