"""Plain-data views of run records for formats that lack some of Python's values.

The engine's journal and summary, the JSON-lines sink and the resolved plan written as TOML all
need the same two conversions; they live here so no module reaches into another's privates.
"""

from __future__ import annotations

import math
from typing import Any


def drop_none(value: Any) -> Any:
    """TOML has no null: unset optional keys are left out of the resolved plan."""
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) for v in value]
    return value


def json_safe(value: Any) -> Any:
    """Strict JSON has no NaN or infinity (a reader such as ``jq`` rejects them) and no numpy
    scalars: non-finite floats become null, numpy scalars their Python value, keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return json_safe(value.item())
    return value
