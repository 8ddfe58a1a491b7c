"""The ``csv`` sink: one row per round, for spreadsheets and pandas.

The columns are fixed when the file is opened (a CSV cannot grow columns), so probe values that
appear only every k rounds are empty in between rather than shifting columns. The fixed columns
come first, named as in every other sink (docs/metrics.md); ``columns`` adds any probe, learner
metric or scaler-detail key by name.
"""

from __future__ import annotations

import csv
import math
from typing import Any, TextIO

from kernel import events as ev
from kernel.roles import PluginContext
from kernel.schema import defaults
from plugins.descriptors.observe import CSV_CONFIG
from plugins.sinks.metrics import FileSink, round_values

#: (column, where it is read from, keys). ``round`` columns are ``plugins.sinks.metrics`` keys, the
#: same names as every other sink; in ``probes`` and ``metrics`` the first key present wins
#: (probes name the Hessian ratio and gradient noise scale their own way).
BASE_COLUMNS: list[tuple[str, str, tuple[str, ...]]] = [
    ("round", "round", ()),
    ("round_s", "round", ()),
    ("actors", "round", ()),
    ("envs_per_actor", "plan", ()),
    ("episodes", "round", ()),
    ("round_env_steps", "round", ()),
    ("env_steps", "round", ()),
    ("env_steps_per_s", "round", ()),
    ("learner_s", "round", ()),
    ("actor_s", "round", ()),
    ("probe_s", "round", ()),
    ("eval_return_max", "round", ()),
    ("eval_return", "round", ()),
    ("eval_return_min", "round", ()),
    ("episode_return_mean", "round", ()),
    ("episode_length_mean", "round", ()),
    ("loss", "metrics", ("loss",)),
    ("round_cost_usd", "round", ()),
    ("cost_usd", "round", ()),
    ("hessian_ratio", "probes", ("hessian_ratio", "rho", "hessian_rho")),
    ("boost_score", "round", ()),
    ("gns", "probes", ("gns", "gradient_noise_scale", "b_simple")),
    ("next_actors", "round", ()),
    ("sim_time_s", "round", ()),
    ("wall_s", "round", ()),
]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return value


class CsvSink(FileSink):
    """Rows appended and flushed per round; a resumed run appends to the same file."""

    def __init__(self, ctx: PluginContext):
        cfg = {**defaults(CSV_CONFIG), **ctx.config}
        self.path = ctx.run_dir / cfg["path"]
        self.extra = [str(c) for c in cfg["columns"]]
        # env is a required section; num_envs is the env provider's key (gymnasium's), which
        # another provider may not declare: its column is then empty.
        self.envs_per_actor = ctx.plan["env"].get("num_envs")
        self.header = [name for name, _, _ in BASE_COLUMNS] + [
            c for c in self.extra if c not in {n for n, _, _ in BASE_COLUMNS}
        ]
        self.file: TextIO | None = None
        self.writer: Any = None
        #: The columns of the file's header line (``header`` unless an older file is resumed).
        self._written = self.header
        self._started_ts: float | None = None
        # ScaleDecided and CostCharged of a round are published before its RoundFinished.
        self._scale: dict[int, ev.ScaleDecided] = {}
        self._cost: dict[int, float] = {}

    async def start(self, ctx: PluginContext) -> None:
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self._written = self.header if fresh else self._existing_header()
        self.file = self.path.open("a", encoding="utf-8", newline="")
        self.writer = csv.writer(self.file)
        if fresh:
            self.writer.writerow(self.header)
            self.file.flush()

    def _existing_header(self) -> list[str]:
        """A resumed run keeps the file's columns, even if they were named or chosen otherwise
        when it was written: rows must line up with the header above them."""
        with self.path.open(encoding="utf-8", newline="") as file:
            return next(csv.reader(file), self.header)

    async def handle(self, event: Any) -> None:
        if isinstance(event, ev.RunStarted):
            self._started_ts = event.ts
        elif isinstance(event, ev.ScaleDecided):
            self._scale[event.round] = event
        elif isinstance(event, ev.CostCharged):
            self._cost[event.round] = event.round_usd
        elif isinstance(event, ev.RoundFinished) and self.writer is not None:
            row = dict(zip(self.header, self.row(event), strict=True))
            self.writer.writerow([_cell(row.get(name)) for name in self._written])
            assert self.file is not None
            self.file.flush()
            self._scale.pop(event.round, None)
            self._cost.pop(event.round, None)

    def row(self, event: ev.RoundFinished) -> list[Any]:
        scale = self._scale.get(event.round)
        values = round_values(event, started_ts=self._started_ts,
                              round_cost_usd=self._cost.get(event.round), scale=scale)
        sources: dict[str, dict[str, Any]] = {"probes": event.probes, "metrics": event.metrics}
        out: list[Any] = []
        for name, source, keys in BASE_COLUMNS:
            if source == "plan":
                out.append(self.envs_per_actor)
            elif source == "round":
                out.append(values[name])
            else:
                table = sources[source]
                out.append(next((table[k] for k in keys if table.get(k) is not None), None))
        detail = scale.detail if scale is not None else {}
        for key in self.header[len(BASE_COLUMNS):]:
            value = None
            for table in (event.probes, event.metrics, detail):
                if table.get(key) is not None:
                    value = table[key]
                    break
            out.append(value)
        return out
