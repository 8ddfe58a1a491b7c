"""The ``csv`` sink: one row per round, for spreadsheets and pandas.

The columns are fixed when the file is opened (a CSV cannot grow columns), so probe values that
appear only every k rounds are empty in between rather than shifting columns. The prototype's
columns come first; ``columns`` adds any probe, metric or scaler-detail key by name.
"""

from __future__ import annotations

import csv
import math
from typing import Any, TextIO

from kernel import events as ev
from kernel.roles import PluginContext

#: (column, where it is read from). Keys in tuples are alternatives, the first present wins
#: (probes name the Hessian ratio and gradient noise scale their own way).
BASE_COLUMNS: list[tuple[str, str, tuple[str, ...]]] = [
    ("round", "event", ("round",)),
    ("duration_s", "event", ("round_s",)),
    ("actors", "event", ("actors",)),
    ("envs_per_actor", "plan", ()),
    ("episodes", "event", ("episodes",)),
    ("round_env_steps", "event", ("round_env_steps",)),
    ("env_steps", "event", ("env_steps",)),
    ("learner_s", "event", ("learner_s",)),
    ("actor_s", "event", ("actor_s",)),
    ("probe_s", "event", ("probe_s",)),
    ("eval_return_max", "probes", ("eval_return_max",)),
    ("eval_return_mean", "event", ("eval_return",)),
    ("eval_return_min", "probes", ("eval_return_min",)),
    ("train_return_mean", "event", ("episode_return_mean",)),
    ("loss", "metrics", ("loss",)),
    ("round_cost_usd", "cost", ()),
    ("cost_usd", "event", ("cost_usd",)),
    ("hessian_ratio", "probes", ("hessian_ratio", "rho", "hessian_rho")),
    ("boost_score", "scale", ("score",)),
    ("gns", "probes", ("gns", "gradient_noise_scale", "b_simple")),
    ("next_actors", "scale_actors", ()),
    ("sim_time_s", "event", ("sim_time_s",)),
    ("wall_s", "wall", ()),
]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return value


class CsvSink:
    """Rows appended and flushed per round; a resumed run appends to the same file."""

    def __init__(self, ctx: PluginContext):
        self.path = ctx.run_dir / ctx.config.get("path", "rounds.csv")
        self.extra = [str(c) for c in ctx.config.get("columns", [])]
        self.envs_per_actor = ctx.plan.get("env", {}).get("num_envs")
        self.header = [name for name, _, _ in BASE_COLUMNS] + [
            c for c in self.extra if c not in {n for n, _, _ in BASE_COLUMNS}
        ]
        self.file: TextIO | None = None
        self.writer: Any = None
        self._started_ts: float | None = None
        # ScaleDecided and CostCharged of a round are published before its RoundFinished.
        self._scale: dict[int, ev.ScaleDecided] = {}
        self._cost: dict[int, float] = {}

    async def start(self, ctx: PluginContext) -> None:
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self.file = self.path.open("a", encoding="utf-8", newline="")
        self.writer = csv.writer(self.file)
        if fresh:
            self.writer.writerow(self.header)
            self.file.flush()

    async def handle(self, event: Any) -> None:
        if isinstance(event, ev.RunStarted):
            self._started_ts = event.ts
        elif isinstance(event, ev.ScaleDecided):
            self._scale[event.round] = event
        elif isinstance(event, ev.CostCharged):
            self._cost[event.round] = event.round_usd
        elif isinstance(event, ev.RoundFinished) and self.writer is not None:
            self.writer.writerow([_cell(v) for v in self.row(event)])
            assert self.file is not None
            self.file.flush()
            self._scale.pop(event.round, None)
            self._cost.pop(event.round, None)

    def row(self, event: ev.RoundFinished) -> list[Any]:
        scale = self._scale.get(event.round)
        sources: dict[str, Any] = {
            "event": {k: getattr(event, k) for k in event.__dataclass_fields__},
            "probes": event.probes,
            "metrics": event.metrics,
            "scale": scale.detail if scale is not None else {},
        }
        out: list[Any] = []
        for _name, source, keys in BASE_COLUMNS:
            if source == "plan":
                out.append(self.envs_per_actor)
            elif source == "cost":
                out.append(self._cost.get(event.round))
            elif source == "scale_actors":
                out.append(scale.actors if scale is not None else None)
            elif source == "wall":
                out.append(None if self._started_ts is None else event.ts - self._started_ts)
            else:
                table = sources[source]
                out.append(next((table[k] for k in keys if table.get(k) is not None), None))
        for key in self.header[len(BASE_COLUMNS):]:
            value = None
            for table in (event.probes, event.metrics, sources["scale"]):
                if table.get(key) is not None:
                    value = table[key]
                    break
            out.append(value)
        return out

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    async def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
