"""A failed invocation that keeps what the platform bills for it.

AWS bills a function error or a timeout for its duration (and a cold start's init for image
functions), and an invocation the caller gave up on runs on, billed, until it ends or times
out. The actor backends raise ``InvocationFailed`` with these numbers attached, so whoever
turns the failure into a receipt can charge it.
"""

from __future__ import annotations

from kernel.roles import InvocationFailed


def failed(request_id: str, reason: str, *, attempts: int = 1, throttles: int = 0,
           duration_ms: float = 0.0, billed_ms: int = 0, init_ms: float = 0.0,
           cancelled: bool = False) -> InvocationFailed:
    """An ``InvocationFailed`` carrying ``duration_ms``, ``billed_ms``, ``init_ms`` and
    ``cancelled`` (the caller stopped waiting; the platform may still be running it)."""
    exc = InvocationFailed(request_id, reason, attempts=attempts, throttles=throttles)
    exc.duration_ms = duration_ms  # type: ignore[attr-defined]
    exc.billed_ms = billed_ms  # type: ignore[attr-defined]
    exc.init_ms = init_ms  # type: ignore[attr-defined]
    exc.cancelled = cancelled  # type: ignore[attr-defined]
    return exc
