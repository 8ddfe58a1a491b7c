"""Sinks: observers of the bus that write what users read."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from kernel import events as ev
from kernel.roles import PluginContext


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


class ConsoleSink:
    """One line per round on stdout: round, actors, env steps, returns, cost, wall time."""

    def __init__(self, ctx: PluginContext, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.limits = ctx.plan["stop"]
        self.t0 = time.perf_counter()

    async def handle(self, event: Any) -> None:
        if isinstance(event, ev.RoundFinished):
            max_rounds = self.limits.get("max_rounds")
            max_steps = self.limits.get("max_env_steps")
            line = (
                f"round {event.round:>4}{'/' + str(max_rounds) if max_rounds else ''}"
                f"  actors {event.actors:>3}"
                f"  steps {event.env_steps:>9,}{'/' + format(max_steps, ',') if max_steps else ''}"
                f"  eval {_fmt(event.eval_return):>8}"
                f"  train {_fmt(event.episode_return_mean):>8}"
                f"  cost ${event.cost_usd:.4f}"
                f"  round {event.round_s:5.2f}s"
                f"  wall {time.perf_counter() - self.t0:7.1f}s"
            )
            self.stream.write(line + "\n")
            self.stream.flush()
        elif isinstance(event, ev.RunStopped):
            self.stream.write(
                f"stopped: {event.reason} after {event.rounds} rounds, "
                f"{event.env_steps:,} env steps, {event.wall_s:.1f}s\n"
            )
            self.stream.flush()


class JsonlSink:
    """Chosen event types as JSON lines in a file of the run directory (``rounds.jsonl``)."""

    def __init__(self, ctx: PluginContext):
        self.path = ctx.run_dir / ctx.config.get("path", "rounds.jsonl")
        self.types = set(ctx.config.get("events", ["RoundFinished"]))
        self.file: TextIO | None = None

    async def start(self, ctx: PluginContext) -> None:
        self.file = self.path.open("a", encoding="utf-8")

    async def handle(self, event: Any) -> None:
        if self.file is not None and ("*" in self.types or type(event).__name__ in self.types):
            from kernel.engine import _json_safe

            self.file.write(json.dumps(_json_safe(event.to_dict())) + "\n")

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    async def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
