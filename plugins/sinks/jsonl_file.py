"""The ``jsonl`` sink: chosen events as JSON lines, for tools that read a run while it trains.

Each line is one event's ``to_dict()`` in strict JSON (NaN and infinity as null, numpy scalars
as numbers), so ``jq`` and any JSON reader take it. The run directory's ``events.jsonl`` is the
engine's journal of every event; this file holds only the types the plan chose.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from kernel.roles import PluginContext
from kernel.schema import defaults
from plugins.descriptors.observe import JSONL_CONFIG
from plugins.sinks.metrics import FileSink


class JsonlSink(FileSink):
    """Chosen event types as JSON lines in a file of the run directory (``rounds.jsonl``)."""

    def __init__(self, ctx: PluginContext):
        cfg = {**defaults(JSONL_CONFIG), **ctx.config}
        self.path = ctx.run_dir / cfg["path"]
        self.types = set(cfg["events"])
        self.file: TextIO | None = None

    async def start(self, ctx: PluginContext) -> None:
        self.file = self.path.open("a", encoding="utf-8")

    async def handle(self, event: Any) -> None:
        if self.file is not None and ("*" in self.types or type(event).__name__ in self.types):
            from kernel.jsonsafe import json_safe as _json_safe

            self.file.write(json.dumps(_json_safe(event.to_dict())) + "\n")
