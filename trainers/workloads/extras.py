"""The optional model libraries (torchvision, timm, transformers): imported only when a workload
of theirs is built, so `import trainers` stays as light as torch, and named with the extra that
installs them when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from trainers.errors import WorkloadError

EXTRA = "models"
INSTALL = f'pip install "streamtune[{EXTRA}]"'


def require(module: str, *, workload: str) -> ModuleType:
    """Import `module` for `workload`, or say which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise WorkloadError(
            f"workload={workload!r} needs {module}, which cannot be imported ({exc}): {INSTALL}",
            field="workload",
        ) from exc
