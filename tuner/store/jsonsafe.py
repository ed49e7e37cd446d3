"""JSON has no Infinity or NaN: what Optuna's attributes and the API carry must do without."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def json_safe(value: Any) -> Any:
    """A copy of `value` with every non-finite float replaced by None (keys become strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def json_safe_dict(value: Mapping[str, Any]) -> dict[str, Any]:
    """`json_safe` of a mapping, typed as the dict it returns."""
    result: dict[str, Any] = json_safe(value)
    return result
