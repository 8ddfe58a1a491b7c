"""The in-memory transport: the embedded default, no server.

Weights stay in a dict of the newest few versions; batches arrive through ``deliver`` (the
local backend hands back what its workers returned) and wait in a queue. The bytes are the same
codec payloads Redis would carry, so the learner-side checks are the same.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from kernel.roles import PluginContext
from kernel.schema import defaults
from plugins.descriptors.core import MEMORY_CONFIG


class MemoryTransport:
    def __init__(self, ctx: PluginContext):
        self.keep_versions = int({**defaults(MEMORY_CONFIG), **ctx.config}["keep_versions"])
        self._weights: OrderedDict[int, bytes] = OrderedDict()
        self._batches: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._ids = itertools.count(1)

    def public_spec(self) -> dict[str, Any]:
        return {"kind": "inline"}

    async def publish_weights(self, version: int, payload: bytes) -> None:
        self._weights[version] = payload
        while len(self._weights) > self.keep_versions:
            self._weights.popitem(last=False)

    async def weights_payload(self, version: int) -> bytes | None:
        return self._weights.get(version)

    async def deliver(self, payload: bytes) -> None:
        self._batches.put_nowait((str(next(self._ids)), payload))

    async def next_batch(self, timeout: float) -> tuple[str, bytes] | None:
        try:
            return await asyncio.wait_for(self._batches.get(), timeout)
        except TimeoutError:
            return None

    async def ack(self, message_ids: Sequence[str]) -> None:
        """Nothing to do: a queued batch is gone once read."""

    async def close(self) -> None:
        self._weights.clear()
