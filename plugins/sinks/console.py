"""The console sink: what a user watches while a run trains.

The console shows a live progress display (rich) when stdout is a terminal and plain lines
otherwise, so logs, CI output and pipes stay greppable. What both paths show comes from one
``RunProgress``, which folds events into the numbers a user watches; rendering is separate.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from kernel import events as ev
from kernel.plan import STOP
from kernel.roles import PluginContext
from kernel.schema import defaults
from plugins.descriptors.observe import CONSOLE_CONFIG
from plugins.sinks.metrics import env_steps_per_s


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


@dataclass(slots=True)
class RunProgress:
    """The run as a user watches it, folded from events (no rendering, no clocks but ``ts``)."""

    max_rounds: int | None = None
    max_env_steps: int | None = None
    budget_usd: float | None = None
    target_return: float | None = None
    round: int = 0
    env_steps: int = 0
    cost_usd: float = 0.0
    actors: int = 0
    #: Invocations started in the current round and not yet finished.
    in_flight: int = 0
    last_eval: float | None = None
    best_eval: float | None = None
    last_train: float | None = None
    last_episode_length: float | None = None
    env_steps_per_s: float | None = None
    round_s: float = 0.0
    started_ts: float | None = None
    stopped: str | None = None
    last_round: ev.RoundFinished | None = field(default=None, repr=False)

    @classmethod
    def from_plan(cls, plan: dict[str, Any]) -> RunProgress:
        """The resolved plan's stop rules; a hand-made ``stop`` table (a test) is completed
        from the kernel's declaration of the section, not from a copy of its defaults here."""
        stop = {**defaults(STOP), **plan["stop"]}
        return cls(max_rounds=stop["max_rounds"], max_env_steps=stop["max_env_steps"],
                   budget_usd=stop["budget_usd"], target_return=stop["target_return"])

    def observe(self, event: Any) -> None:
        if isinstance(event, ev.RunStarted):
            self.started_ts = event.ts
            self.round = event.resumed_from_round
        elif isinstance(event, ev.RoundStarted):
            self.actors = event.actors
            self.in_flight = event.actors
        elif isinstance(event, ev.InvocationFinished):
            self.in_flight = max(0, self.in_flight - 1)
        elif isinstance(event, ev.GatherFinished):
            self.in_flight = 0  # late actors are left behind: no longer counted by the round
        elif isinstance(event, ev.RoundFinished):
            self.round = event.round
            self.env_steps = event.env_steps
            self.cost_usd = event.cost_usd
            self.round_s = event.round_s
            self.last_train = event.episode_return_mean
            self.last_episode_length = event.episode_length_mean
            self.env_steps_per_s = env_steps_per_s(event)
            if event.eval_return is not None:
                self.last_eval = event.eval_return
                if self.best_eval is None or event.eval_return > self.best_eval:
                    self.best_eval = event.eval_return
            self.last_round = event
        elif isinstance(event, ev.RunStopped):
            self.stopped = event.reason
            self.in_flight = 0

    def wall_s(self, now: float | None = None) -> float:
        if self.started_ts is None:
            return 0.0
        return (time.time() if now is None else now) - self.started_ts


#: Columns of the plain round line: (header, width). The widths hold 9999 rounds of 9999,
#: 999.99M steps and $999.99, so a line never passes 79 columns (an 80-column terminal).
ROUND_COLUMNS: tuple[tuple[str, int], ...] = (
    ("round", 9), ("actors", 6), ("steps", 7), ("return", 7), ("len", 6), ("eval", 7),
    ("sps", 6), ("cost", 8), ("wall", 7),
)
#: The header is repeated every this many round lines, so a log's tail still says what is what.
HEADER_EVERY = 25


def compact_count(n: float) -> str:
    """9,999 then 999.9k then 999.99M: counts in at most 7 characters."""
    if n < 10_000:
        return f"{n:,.0f}"
    if round(n / 1e3, 1) < 1000:  # compare as printed: 999,990 is 1.00M, not 1000.0k
        return f"{n / 1e3:.1f}k"
    if round(n / 1e6, 2) < 1000:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e9:.2f}G"


def format_usd(value: float) -> str:
    """Dollars at a precision that shows a cheap round's cost: $0.0025, $1.23, $1,234."""
    if abs(value) < 1:
        return f"${value:.4f}"
    if abs(value) < 1000:
        return f"${value:.2f}"
    return f"${value:,.0f}"


def format_seconds(seconds: float) -> str:
    if seconds < 600:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _short(value: float | None) -> str:
    """A return or length in at most 7 characters: one decimal below 1,000, none above."""
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"


def round_header() -> str:
    return "  ".join(name.rjust(width) for name, width in ROUND_COLUMNS)


def round_line(event: ev.RoundFinished, progress: RunProgress) -> str:
    """The one line per round of the plain console, under ``round_header``'s columns."""
    max_rounds = progress.max_rounds
    sps = env_steps_per_s(event)
    cells = (
        f"{event.round}/{max_rounds}" if max_rounds else str(event.round),
        str(event.actors),
        compact_count(event.env_steps),
        _short(event.episode_return_mean),
        _short(event.episode_length_mean),
        _short(event.eval_return),
        "-" if sps is None else compact_count(sps),
        format_usd(event.cost_usd),
        format_seconds(progress.wall_s(event.ts)),
    )
    return "  ".join(cell.rjust(width)
                     for cell, (_, width) in zip(cells, ROUND_COLUMNS, strict=True))


def stop_line(event: ev.RunStopped) -> str:
    return (f"stopped: {event.reason} after {event.rounds} rounds, "
            f"{event.env_steps:,} env steps, {event.wall_s:.1f}s")


class ConsoleSink:
    """Live progress on a terminal; one plain line per round otherwise, never both.

    ``progress = "auto"`` (default) picks the live display only when the stream is a TTY.
    The live display refreshes from rich's own thread at a few hertz (wall time, actors in
    flight) and once more as each round finishes, so it never shows an older round than the
    one just done (rounds of a small env are shorter than the refresh period). ``handle``
    otherwise only folds the event into ``RunProgress``: a burst of events costs a few
    attribute writes each.
    """

    def __init__(self, ctx: PluginContext, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.progress = RunProgress.from_plan(ctx.plan)
        mode = {**defaults(CONSOLE_CONFIG), **ctx.config}["progress"]
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.live_mode = mode == "live" or (mode == "auto" and is_tty)
        self._live: Any = None
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}
        self._lines = 0

    async def start(self, ctx: PluginContext) -> None:
        if self.live_mode:
            self._start_live()

    # -- plain path ----------------------------------------------------------------------------

    def _write(self, line: str) -> None:
        if self._live is not None:
            self._live.console.print(line, highlight=False, markup=False)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    async def handle(self, event: Any) -> None:
        self.progress.observe(event)
        if isinstance(event, ev.RoundFinished):
            if self._live is not None:
                self._live.refresh()
                return
            if self._lines % HEADER_EVERY == 0:
                self._write(round_header())
            self._lines += 1
            self._write(round_line(event, self.progress))
        elif isinstance(event, ev.RunStopped):
            self._stop_live()
            self._write(stop_line(event))

    # -- live path -----------------------------------------------------------------------------

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        console = Console(file=self.stream, force_terminal=True)
        self._bars = Progress(
            TextColumn("{task.description:<10}"), BarColumn(bar_width=30),
            TaskProgressColumn(), TextColumn("{task.fields[detail]}"),
            console=console, auto_refresh=False,
        )
        p = self.progress
        if p.max_rounds is not None:
            self._tasks["rounds"] = self._bars.add_task("rounds", total=p.max_rounds, detail="")
        if p.max_env_steps is not None:
            self._tasks["steps"] = self._bars.add_task("env steps", total=p.max_env_steps,
                                                       detail="")
        if p.budget_usd is not None:
            self._tasks["budget"] = self._bars.add_task("budget", total=p.budget_usd, detail="")
        # Rich's refresh thread calls _render a few times a second; it only reads RunProgress.
        self._live = Live(console=console, get_renderable=self._render, refresh_per_second=4,
                          transient=False, redirect_stdout=True, redirect_stderr=True)
        self._live.start()

    def _render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        p, bars, t = self.progress, self._bars, self._tasks
        if "rounds" in t:
            bars.update(t["rounds"], completed=p.round, detail=f"{p.round} / {p.max_rounds}")
        if "steps" in t:
            bars.update(t["steps"], completed=p.env_steps,
                        detail=f"{p.env_steps:,} / {p.max_env_steps:,}")
        if "budget" in t:
            bars.update(t["budget"], completed=min(p.cost_usd, p.budget_usd or 0.0),
                        detail=f"{format_usd(p.cost_usd)} / {format_usd(p.budget_usd or 0.0)}")
        target = f" (target {p.target_return:g})" if p.target_return is not None else ""
        sps = "-" if p.env_steps_per_s is None else compact_count(p.env_steps_per_s)
        actors = Text.assemble(
            ("actors    ", "dim"), f"{p.in_flight} in flight of {p.actors}",
            ("   last round ", "dim"), f"{p.round_s:.2f}s", ("   sps ", "dim"), sps,
            ("   cost ", "dim"), format_usd(p.cost_usd),
            ("   wall ", "dim"), format_seconds(p.wall_s()),
        )
        returns = Text.assemble(
            ("eval      ", "dim"), f"{_fmt(p.last_eval)} (best {_fmt(p.best_eval)}){target}",
            ("   return ", "dim"), _fmt(p.last_train),
            ("   len ", "dim"), _fmt(p.last_episode_length),
        )
        return Group(bars.get_renderable(), actors, returns)

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def flush(self) -> None:
        if self._live is None:
            self.stream.flush()

    async def close(self) -> None:
        self._stop_live()
