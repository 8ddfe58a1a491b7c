"""Plugins that are slow on purpose at one moment of a run's lifecycle, for the signal tests.

Each writes the file named by ``NITRO_SLOW_MARKER`` when its slow part begins, so a test knows
when to send its signal, then blocks for ``NITRO_SLOW_SECONDS`` (default 5):

- ``slow_state`` (scaler): the fixed scaler whose ``state()`` is slow — the final checkpoint,
  which saves it, then takes that long;
- ``slow_start`` (scaler): the fixed scaler whose ``start`` awaits that long — start-up does;
- ``slow_close`` (probe): measures nothing, and its ``close`` awaits that long, writing
  ``NITRO_SLOW_MARKER`` + ``.closing`` first — closing the started plugins does.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from kernel.registry import Plugin
from plugins.scalers import FixedScaler


def _begin() -> float:
    Path(os.environ["NITRO_SLOW_MARKER"]).write_text(str(os.getpid()))
    return float(os.environ.get("NITRO_SLOW_SECONDS", "5"))


class SlowStateScaler(FixedScaler):
    def state(self) -> dict[str, Any]:
        time.sleep(_begin())  # in the checkpoint's worker thread, as a large state would be
        return {}


class SlowStartScaler(FixedScaler):
    async def start(self, ctx: Any) -> None:
        await asyncio.sleep(_begin())


class SlowCloseProbe:
    def __init__(self, ctx: Any):
        pass

    def measure(self, ctx: Any) -> dict[str, float]:
        return {}

    async def close(self) -> None:
        Path(os.environ["NITRO_SLOW_MARKER"] + ".closing").write_text(str(os.getpid()))
        await asyncio.sleep(float(os.environ.get("NITRO_SLOW_SECONDS", "5")) / 60)


PLUGINS = [
    Plugin("slow_state", "scaler", SlowStateScaler, "Fixed, with a slow state() (tests)."),
    Plugin("slow_start", "scaler", SlowStartScaler, "Fixed, with a slow start (tests)."),
    Plugin("slow_close", "probe", SlowCloseProbe, "Nothing, closed slowly (tests)."),
]
