"""``python -m kernel report RUN_DIR [RUN_DIR ...] [--out DIR]``: figures and a summary table.

Everything is read back from what a run leaves behind (``events.jsonl``, ``summary.json``,
``plan.toml``), so a report can be drawn for finished, crashed or cancelled runs, on a machine
that never ran them. Several runs overlay on the same axes, one colour each, labelled by name,
scaler and seed: the comparison a boosting study needs (scalers against each other, seeds of
one scaler). One figure answers one question; every axis says its unit.

Given a sweep directory (``nitro sweep``) or ``--group-by``, seeds are aggregated per setting
instead (``plugins/experiments/aggregate.py``): a claim about boosting is a claim across seeds.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("plugins.experiments.report")


@dataclass
class RunData:
    """One run's series, aligned per round (``None`` where a round has no value)."""

    path: Path
    name: str
    scaler: str
    seed: int | None
    simulated: bool
    summary: dict[str, Any]
    rounds: list[int] = field(default_factory=list)
    env_steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    sim_time_s: list[float] = field(default_factory=list)
    cost_usd: list[float] = field(default_factory=list)
    round_cost_usd: list[float] = field(default_factory=list)
    actors: list[int] = field(default_factory=list)
    eval_return: list[float | None] = field(default_factory=list)
    score: list[float | None] = field(default_factory=list)
    #: Seconds per round spent in probes other than the evaluation (the Hessian probe, ...), as
    #: the round's bill counted them: where the bill splits the learner's time into
    #: ``learner_usd`` and ``probe_usd`` (the ``aws`` model), the probe's share of the round's
    #: simulated time, which under a time model is the modelled probe, not this machine's;
    #: otherwise the measured seconds.
    probe_s: list[float] = field(default_factory=list)
    label: str = ""
    plan: dict[str, Any] = field(default_factory=dict)

    def points(self, xs: Sequence[float]) -> tuple[list[float], list[float]]:
        """(x, eval return) at the rounds that measured one."""
        pairs = [(x, y) for x, y in zip(xs, self.eval_return, strict=True) if y is not None]
        return [p[0] for p in pairs], [p[1] for p in pairs]


class ReportError(Exception):
    """A run directory that cannot be read; the message names the file."""


#: The events a report reads. A boosted run writes several events per actor per round, so the
#: kind is matched in the line's first characters and the rest is never decoded: a sweep of a
#: hundred runs reports in seconds.
_WANTED = ("RunStarted", "ScaleDecided", "CostCharged", "RoundFinished", "ProbeMeasured")
_KIND = re.compile(r'^\{"event": "(\w+)"')


def event_kind(line: str) -> str | None:
    """The kind of an events.jsonl line, read from its first characters without decoding it."""
    head = _KIND.match(line)
    return None if head is None else head.group(1)


def load_run(path: Path) -> RunData:
    events_path = path / "events.jsonl"
    if not events_path.is_file():
        raise ReportError(f"{path}: no events.jsonl (is this a run directory?)")
    plan: dict[str, Any] = {}
    if (path / "plan.toml").is_file():
        plan = tomllib.loads((path / "plan.toml").read_text(encoding="utf-8"))
    summary: dict[str, Any] = {}
    if (path / "summary.json").is_file():
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    run = RunData(
        path=path,
        name=str(plan.get("run", {}).get("name", summary.get("name", path.name))),
        scaler=str(plan.get("scaler", {}).get("name", "?")),
        seed=plan.get("run", {}).get("seed"),
        simulated=bool(plan.get("actors", {}).get("simulate", False)),
        summary=summary,
        plan=plan,
    )
    started: float | None = None
    stop_evals: dict[int, float] = {}
    scores: dict[int, float | None] = {}
    round_cost: dict[int, float] = {}
    probe_s: dict[int, float] = {}
    probe_share: dict[int, float] = {}
    with events_path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            kind = event_kind(line)
            if kind is not None and kind not in _WANTED:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                # A run killed mid-write leaves a partial last line; the rest is still good.
                log.warning("report_bad_line", file=str(events_path), line=number)
                continue
            kind = event.get("event")
            if kind == "RunStarted" and started is None:
                started = float(event["ts"])
            elif kind == "ScaleDecided":
                scores[int(event["round"])] = event.get("detail", {}).get("score")
            elif kind == "ProbeMeasured" and event.get("probe") == "eval":
                value = event.get("values", {}).get("eval_return")
                if value is not None:
                    stop_evals[int(event["round"])] = float(value)
            elif kind == "ProbeMeasured":
                r = int(event["round"])
                probe_s[r] = probe_s.get(r, 0.0) + float(event.get("probe_s") or 0.0)
            elif kind == "CostCharged":
                r = int(event["round"])
                round_cost[r] = float(event.get("round_usd", 0.0))
                share = probe_share_of(event.get("items") or {})
                if share is not None:
                    probe_share[r] = share
            elif kind == "RoundFinished":
                r = int(event["round"])
                if run.rounds and r <= run.rounds[-1]:
                    # A resumed run replays from its checkpoint: keep the newest rounds.
                    keep = next(i for i, old in enumerate(run.rounds) if old >= r)
                    for series in _series(run):
                        del series[keep:]
                run.rounds.append(r)
                run.env_steps.append(int(event["env_steps"]))
                run.wall_s.append(float(event["ts"]) - (started or float(event["ts"])))
                before = run.sim_time_s[-1] if run.sim_time_s else 0.0
                run.sim_time_s.append(float(event.get("sim_time_s") or 0.0))
                run.cost_usd.append(float(event.get("cost_usd") or 0.0))
                run.round_cost_usd.append(round_cost.get(r, 0.0))
                run.actors.append(int(event["actors"]))
                value = event.get("eval_return")
                run.eval_return.append(None if value is None else float(value))
                run.score.append(scores.get(r))
                measured, share = probe_s.pop(r, 0.0), probe_share.pop(r, None)
                run.probe_s.append(measured if share is None
                                   else share * max(0.0, run.sim_time_s[-1] - before))
    # The evaluation at stop comes after its round's RoundFinished (which has no return):
    # it belongs to that round's point, at the run's final steps, dollars and time.
    for i, r in enumerate(run.rounds):
        if run.eval_return[i] is None and r in stop_evals:
            run.eval_return[i] = stop_evals[r]
    return run


def probe_share_of(items: dict[str, Any]) -> float | None:
    """The probe's share of the time a bill charged at the learner's price, or None when the
    bill does not split it (the ``prototype`` model, a run without a learner item)."""
    if "probe_usd" not in items or "learner_usd" not in items:
        return None
    probe, learner = float(items["probe_usd"]), float(items["learner_usd"])
    return probe / (probe + learner) if probe + learner > 0 else 0.0


def _series(run: RunData) -> list[list[Any]]:
    return [run.rounds, run.env_steps, run.wall_s, run.sim_time_s, run.cost_usd,
            run.round_cost_usd, run.actors, run.eval_return, run.score, run.probe_s]


def label_runs(runs: list[RunData]) -> None:
    """``name (scaler, seed N)``; the directory name is added where labels would collide."""
    for run in runs:
        seed = "" if run.seed is None else f", seed {run.seed}"
        run.label = f"{run.name} ({run.scaler}{seed})"
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.label} [{run.path.name}]"


# -- figures ---------------------------------------------------------------------------------


def _figure(title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Any, path: Path, legend_ax: Any = None, handles: Any = None) -> Path:
    import matplotlib.pyplot as plt

    if handles:
        (legend_ax or fig.axes[0]).legend(handles=handles, fontsize="small", loc="best",
                                          framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def figure(title: str) -> tuple[Any, Any]:
    """A titled figure with one gridded axis, for other report modules."""
    return _figure(title)


def save_figure(fig: Any, path: Path, handles: Any = None) -> Path:
    """Lay out, write and close a figure (legend from ``handles`` when given)."""
    return _save(fig, path, handles=handles)


def run_colors(n: int) -> list[Any]:
    """Distinct colours for n runs: matplotlib's cycle while it lasts (10), then evenly spaced
    hues of one colour map, so the 11th run never wears the 1st one's colour."""
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if n <= len(cycle):
        return list(cycle[:n])
    cmap = plt.get_cmap("tab20" if n <= 20 else "turbo")
    return [cmap(i / (n - 1) if n > 20 else i) for i in range(n)]


def usd_unit(runs: list[RunData]) -> tuple[float, str]:
    """One unit for every cost axis of a report: cents while the dearest run stays under a
    dollar (ticks like 0.0025 dollars are hard to read), dollars above."""
    top = max((max(run.cost_usd, default=0.0) for run in runs), default=0.0)
    return (100.0, "US cents") if top < 1 else (1.0, "US$")


def _eval_figure(runs: list[RunData], xs_of: Any, xlabel: str, title: str, path: Path,
                 xscale: float = 1.0) -> Path:
    fig, ax = _figure(title)
    handles = []
    for run, color in zip(runs, run_colors(len(runs)), strict=True):
        x, y = run.points([v * xscale for v in xs_of(run)])
        (line,) = ax.plot(x, y, marker="o", markersize=3, color=color, label=run.label)
        handles.append(line)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("eval return (mean over eval episodes)")
    ax.set_xlim(left=0)
    return _save(fig, path, handles=handles)


def time_axis(runs: list[RunData]) -> tuple[Any, str, str]:
    """Simulated time when any run simulated the cloud (wall time there is the laptop's)."""
    if any(run.simulated for run in runs):
        return (lambda r: r.sim_time_s), "simulated time", "sim"
    return (lambda r: r.wall_s), "wall-clock time", "wall"


def time_unit(runs: list[RunData], xs_of: Any) -> tuple[float, str]:
    longest = max((max(xs_of(r), default=0.0) for r in runs), default=0.0)
    if longest >= 2 * 3600:
        return 1 / 3600, "h"
    if longest >= 300:
        return 1 / 60, "min"
    return 1.0, "s"


def actors_figure(runs: list[RunData], path: Path) -> Path:
    """Actors (top) and the score that sized them (bottom), both drawn at the round they
    applied to: the scaler decides after round r, for round r + 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_score = [run for run in runs if any(s is not None for s in run.score)]
    rows = 2 if with_score else 1
    fig, axes = plt.subplots(rows, 1, sharex=True, figsize=(8, 6 if rows == 2 else 4.5),
                             dpi=110, height_ratios=[2, 1] if rows == 2 else None,
                             squeeze=False)
    ax = axes[0][0]
    ax.set_title("Actors per round" + (" and the boost score behind them" if rows == 2 else ""))
    handles = []
    for run, color in zip(runs, run_colors(len(runs)), strict=True):
        if not run.rounds:
            continue
        # Centred steps: each round's count spans that round only, and the line ends at the
        # last round the run played.
        (line,) = ax.step(run.rounds, run.actors, where="mid", color=color, label=run.label)
        handles.append(line)
    ax.set_ylabel("actors in the round")
    ax.set_ylim(bottom=0)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    if rows == 2:
        score_ax = axes[1][0]
        for run, color in zip(runs, run_colors(len(runs)), strict=True):
            last = run.rounds[-1] if run.rounds else 0
            # The score after the last round sized a round that never ran: not drawn.
            points = [(r + 1, s) for r, s in zip(run.rounds, run.score, strict=True)
                      if s is not None and r < last]
            if points:
                score_ax.plot([p[0] for p in points], [p[1] for p in points], marker=".",
                              color=color)
        score_ax.set_ylabel("boost score (0-1)")
        score_ax.set_ylim(-0.05, 1.05)
        score_ax.grid(True, alpha=0.3)
    axes[-1][0].set_xlabel("round")
    axes[-1][0].xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, path, handles=handles)


def cost_figure(runs: list[RunData], path: Path) -> Path:
    fig, ax = _figure("Cost per round")
    scale, unit = usd_unit(runs)
    handles = []
    for run, color in zip(runs, run_colors(len(runs)), strict=True):
        costs = [c * scale for c in run.round_cost_usd]
        (line,) = ax.step(run.rounds, costs, where="mid", color=color, label=run.label)
        handles.append(line)
    ax.set_xlabel("round")
    ax.set_ylabel(f"cost of the round ({unit})")
    ax.set_ylim(bottom=0)
    return _save(fig, path, handles=handles)


def write_figures(runs: list[RunData], out: Path) -> list[Path]:
    """The figures the runs have data for: runs without any evaluation get no return figures
    (empty axes with made-up ranges would read as data)."""
    out.mkdir(parents=True, exist_ok=True)
    time_of, time_name, time_key = time_axis(runs)
    scale, unit = time_unit(runs, time_of)
    usd_scale, usd_label = usd_unit(runs)
    figures = []
    if any(value is not None for run in runs for value in run.eval_return):
        figures += [
            _eval_figure(runs, lambda r: r.env_steps, "environment steps",
                         "Eval return against environment steps",
                         out / "return_vs_env_steps.png"),
            _eval_figure(runs, time_of, f"{time_name} ({unit})",
                         f"Eval return against {time_name}",
                         out / f"return_vs_{time_key}_time.png", xscale=scale),
            _eval_figure(runs, lambda r: r.cost_usd, f"cumulative cost ({usd_label})",
                         "Eval return against cost", out / "return_vs_cost.png",
                         xscale=usd_scale),
        ]
    else:
        log.info("report_no_evaluation", runs=len(runs), skipped="return figures")
    return [*figures, actors_figure(runs, out / "actors_per_round.png"),
            cost_figure(runs, out / "cost_per_round.png")]


# -- table -----------------------------------------------------------------------------------


def _num(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def summary_table(runs: list[RunData]) -> str:
    header = ("run", "rounds", "env steps", "best eval", "final eval", "cost $", "wall s",
              "stop")
    rows = []
    for run in runs:
        s = run.summary
        evals = [v for v in run.eval_return if v is not None]
        rows.append((
            run.label,
            str(s.get("rounds", run.rounds[-1] if run.rounds else 0)),
            _num(s.get("env_steps", run.env_steps[-1] if run.env_steps else 0), ","),
            _num(s.get("best_eval_return", max(evals, default=None)), ".1f"),
            _num(s.get("final_eval_return", evals[-1] if evals else None), ".1f"),
            _num(s.get("cost_usd", run.cost_usd[-1] if run.cost_usd else None), ".4f"),
            _num(s.get("wall_s", run.wall_s[-1] if run.wall_s else None), ".1f"),
            str(s.get("stop_reason", "(no summary)")),
        ))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    left = {0, 7}

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


# -- command ---------------------------------------------------------------------------------


def report(run_dirs: Sequence[Path], out: Path) -> tuple[list[Path], str]:
    runs = [load_run(Path(d)) for d in run_dirs]
    label_runs(runs)
    return write_figures(runs, out), summary_table(runs)
