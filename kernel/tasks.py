"""Small asyncio pieces of the engine's lifecycle: feeding a sink, finishing a stop path that
must not be cut short, finding the crash inside a task group's exceptions."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from kernel.contract import Bound

log = structlog.get_logger("kernel.engine")


async def drain_into(sink: Bound, sub: Any) -> None:
    """Feed one sink from its queue; a failing sink is logged and unsubscribed, not fatal."""
    try:
        async for event in sub:
            try:
                await sink.handle(event)
            except Exception as exc:
                log.error("sink_failed", sink=sink.name, error=repr(exc))
                return
    finally:
        with contextlib.suppress(Exception):
            result = sink.flush()
            if asyncio.iscoroutine(result):
                await result


async def shielded(stop: Any) -> None:
    """Run the stop path to its end even if the run is cancelled meanwhile (a second Ctrl-C):
    the summary and the final checkpoint are what the user keeps. The cancellation is
    passed on once they are written."""
    task = asyncio.ensure_future(stop)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


def first_of(group: BaseExceptionGroup, kind: type[BaseException]) -> Any:
    for exc in group.exceptions:
        if isinstance(exc, kind):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = first_of(exc, kind)
            if found is not None:
                return found
    return None
