"""What a batch's envelope must be before the learner sees it: every field that crosses the
data plane type-, range- and consistency-checked (the learner's ``check_batch`` checks the data
itself). Anyone who can write to the transport can send a batch, so a forged field is a counted
rejection with its reason — never an exception out of a round, a negative charge, or a step
count that defeats the stop rules.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernel.roles import Batch, Receipt

#: Ceiling on any duration an actor reports: AWS Lambda's longest function timeout.
MAX_INVOCATION_MS = 900_000.0
#: Ceiling on the env steps one batch may claim (the learner checks the exact T x E).
MAX_BATCH_ENV_STEPS = 1 << 31


class BatchRejected(ValueError):
    """A batch field that is missing, of the wrong type, or out of range."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def check_envelope(body: Batch) -> tuple[str, int, Receipt]:
    """Type-, range- and consistency-check the envelope of a batch (the learner checks
    its data); return its request id, version and the receipt it carries."""
    rid = _field(body, "request_id", str)
    if not 0 < len(rid) <= 256:
        raise BatchRejected("invalid_batch", "request_id is empty or too long")
    _field(body, "run_id", str)
    version = _count(body, "version", 0, 1 << 62)
    env_steps = _count(body, "env_steps", 1, MAX_BATCH_ENV_STEPS)
    returns = _field(body, "episode_returns", np.ndarray)
    if returns.ndim != 1 or returns.dtype.kind not in "fiu" or returns.size > env_steps \
            or not np.isfinite(returns).all():
        raise BatchRejected("invalid_batch", "episode_returns is not a finite vector no "
                            "longer than env_steps")
    lengths = body.get("episode_lengths")
    if lengths is not None and not (
            isinstance(lengths, np.ndarray) and lengths.shape == returns.shape
            and lengths.dtype.kind in "iu" and (lengths >= 1).all()):
        raise BatchRejected("invalid_batch", "episode_lengths does not match the returns")
    meta = body.get("receipt", {})
    if not isinstance(meta, dict):
        raise BatchRejected("invalid_receipt", "receipt is not a table")
    episodes = _count(meta, "episodes", 0, env_steps, default=0, reason="invalid_receipt")
    receipt = Receipt(
        request_id=rid, ok=True, version=version, env_steps=env_steps, episodes=episodes,
        duration_ms=_ms(meta, "duration_ms"),
        billed_ms=math.ceil(_ms(meta, "billed_ms") or _ms(meta, "duration_ms")),
        init_ms=_ms(meta, "init_ms"),
        cold_start=_field(meta, "cold_start", bool, default=False, reason="invalid_receipt"),
        bytes_pushed=_count(meta, "bytes_pushed", 0, 1 << 40, default=0,
                            reason="invalid_receipt"),
    )
    return rid, version, receipt


def _field(table: dict[str, Any], key: str, kind: type, *, default: Any = ...,
           reason: str = "invalid_batch") -> Any:
    value = table.get(key, default)
    if value is ... or not isinstance(value, kind) or (kind is not bool and
                                                       isinstance(value, bool)):
        raise BatchRejected(reason, f"{key} is missing or not a {kind.__name__}")
    return value


def _count(table: dict[str, Any], key: str, lo: int, hi: int, *, default: Any = ...,
           reason: str = "invalid_batch") -> int:
    value = _field(table, key, int, default=default, reason=reason)
    if not lo <= value <= hi:
        raise BatchRejected(reason, f"{key} = {value} is outside [{lo}, {hi}]")
    return value


def _ms(meta: dict[str, Any], key: str) -> float:
    value = meta.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0.0 <= float(value) <= MAX_INVOCATION_MS:
        raise BatchRejected("invalid_receipt", f"receipt {key} = {value!r} is not a duration "
                            f"in [0, {MAX_INVOCATION_MS:.0f}] ms")
    return float(value)
