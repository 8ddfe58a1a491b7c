"""Seeds aggregated per setting: the statistics and figures behind ``nitro report SWEEP_DIR``.

One seed of an RL run says little (returns on Hopper spread by thousands between seeds), so a
claim is a statement about a setting across seeds: its mean and its interquartile mean (IQM,
the mean of the middle half, robust to the one seed that collapsed or took off) with 95 %
bootstrap intervals, and paired differences against a baseline setting over the seeds both ran
(a seed's luck partly cancels in the difference), the final return's also with a Student t
interval. On a grid of several axes a baseline (and a front) may name the value of one axis
only: each setting is then set beside the one that shares its values on every other axis, so
a scaler on Walker2d is never measured against a baseline's Hopper runs (``counterpart``). The
bootstrap is numpy only, seeded, 10,000 resamples, so the same rows always give the same
intervals.

Which quantiles of the bootstrap distribution make the interval (``interval``): the plain
percentile interval (2.5 % and 97.5 %) resamples only the values seen, so at a few seeds it is
narrower than 95 %: on the paired differences of the boosting studies it covered the true mean
84 % of the time at 5 seeds and 90 % at 10 (perf/boost_intervals.py measures it). The default,
``expanded``, is the expanded percentile interval (Hesterberg, 2015): the same bootstrap
distribution read at the quantiles alpha'/2 and 1 - alpha'/2 with
alpha'/2 = Phi(-sqrt(n / (n - 1)) * t_{0.975, n - 1}), which widens it to what a Student t
interval would allow at n seeds while keeping the bootstrap's shape, so it serves the IQM too
(measured coverage 92 % at 5 seeds, 95 % at 10; Student t 94 % and 95 %).

Curves: each seed's evaluation returns are interpolated onto a common grid of env steps,
dollars or simulated seconds, from the latest first evaluation among the seeds to the earliest
last one (every point of a band is backed by every seed), and drawn as the mean with the 95 %
bootstrap interval of the mean as a band (2,000 resamples per point: the table's intervals use 10,000).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plugins.experiments.report import (
    RunData,
    figure,
    load_run,
    run_colors,
    save_figure,
    time_axis,
    time_unit,
    usd_unit,
)
from plugins.experiments.sweep import percent_of_budget, split_top

RESAMPLES = 10_000
#: Resamples per point of a curve's band: a band is read by eye, and 2,000 draws put its edges
#: within a small fraction of the band's width while keeping a 100-run report to seconds.
BAND_RESAMPLES = 2_000
LEVEL = 0.95
BOOT_SEED = 0
#: How a bootstrap distribution is read into an interval (module docstring): ``expanded``, the
#: default, or ``percentile``, which the published boosting studies were tabled with.
INTERVALS = ("expanded", "percentile")
INTERVAL = "expanded"
#: Metric key -> (table heading, format). The ``*_to_target`` ones exist with ``--target``.
METRICS: dict[str, tuple[str, str]] = {
    "final_eval_return": ("final eval", ".1f"),
    "best_eval_return": ("best eval", ".1f"),
    "cost_usd": ("cost $", ".5f"),
    "sim_time_s": ("sim time s", ".1f"),
    "env_steps": ("env steps", ",.0f"),
    "mean_actors": ("mean N", ".1f"),
    "budget_spent": ("budget spent", ".3f"),
    "cost_to_target_usd": ("cost to target $", ".5f"),
    "sim_time_to_target_s": ("sim time to target s", ".1f"),
    "env_steps_to_target": ("env steps to target", ",.0f"),
}
#: What the paired-difference table shows (all metrics are in the JSON).
DIFF_SHOWN = ("final_eval_return", "best_eval_return", "cost_to_target_usd",
              "sim_time_to_target_s")


@dataclass
class Group:
    """The runs of one setting, one per seed."""

    label: str
    runs: list[RunData]


# -- grouping ----------------------------------------------------------------------------------


def groups_from_sweep(sweep_dir: Path) -> tuple[list[Group], list[str]]:
    """Settings of ``sweep.json`` with their runs that ended (a run still going or interrupted
    has no place in a statistic: it is named in the notes instead)."""
    manifest = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    groups, notes = [], []
    for label, entry in manifest.get("settings", {}).items():
        runs = []
        for seed, run in sorted(entry.get("runs", {}).items(), key=lambda kv: int(kv[0])):
            run_dir = sweep_dir / run["dir"]
            if _ended(run_dir):
                runs.append(load_run(run_dir))
            else:
                notes.append(f"{label} seed {seed}: not finished ({run_dir}), left out")
        groups.append(Group(label, runs))
    return groups, notes


def _ended(run_dir: Path) -> bool:
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    reason = str(summary.get("stop_reason", ""))
    return not (reason.startswith("signal") or reason == "cancelled")


def group_runs(run_dirs: Sequence[Path], key: str) -> list[Group]:
    """Plain run directories grouped by ``parent`` (a sweep's layout), ``scaler`` or ``name``."""
    by: dict[str, list[RunData]] = {}
    for path in run_dirs:
        run = load_run(path)
        label = {"parent": path.resolve().parent.name, "scaler": run.scaler,
                 "name": run.name}[key]
        by.setdefault(label, []).append(run)
    return [Group(label, runs) for label, runs in by.items()]


def merge(groups: Sequence[Group]) -> list[Group]:
    """Groups of one label from several sweeps become one (a seed twice is an error)."""
    merged: dict[str, Group] = {}
    for g in groups:
        into = merged.setdefault(g.label, Group(g.label, []))
        seen = {r.seed for r in into.runs}
        for run in g.runs:
            if run.seed in seen:
                raise ValueError(f"setting {g.label!r} has seed {run.seed} twice "
                                 f"({run.path})")
            into.runs.append(run)
    return list(merged.values())


# -- settings on a grid ------------------------------------------------------------------------


def label_parts(label: str) -> list[str]:
    """A setting's label as its grid axes' values: ``nitro sweep`` joins one value per axis
    with ``,`` (a TOML value's own commas, inside brackets or quotes, stay in it)."""
    return split_top(label, ",")


def counterpart(labels: Sequence[str], label: str, spec: str) -> str | None:
    """The setting that is ``label`` with the values ``spec`` names in place of its own on
    their axes, or None where the grid holds no such setting.

    A comparison on a grid of several axes is only fair within the values of the other axes:
    against ``fixed8``, ``nitro,env.id=Walker2d-v5`` is set beside
    ``fixed8,env.id=Walker2d-v5``, not beside the Hopper runs of ``fixed8``. A value's axis is
    where it stands in the labels of ``label``'s shape (a sweep puts each axis in one place);
    a ``spec`` that is a whole label is every same-shaped setting's counterpart."""
    mine = label_parts(label)
    shaped = [parts for parts in map(label_parts, labels) if len(parts) == len(mine)]
    for value in label_parts(spec):
        axis = next((i for parts in shaped for i, v in enumerate(parts) if v == value), None)
        if axis is None:
            return None
        mine[axis] = value
    joined = ",".join(mine)
    return joined if joined in labels else None


def baselines(labels: Sequence[str], spec: str) -> dict[str, str]:
    """Each setting's baseline under ``--baseline spec``: its ``counterpart``, or ``spec``
    itself where that is a setting of another shape. A baseline has none of its own."""
    found = {}
    for label in labels:
        base = counterpart(labels, label, spec) or (spec if spec in labels else None)
        if base is not None and base != label:
            found[label] = base
    if spec not in labels and not any(counterpart(labels, label, spec) for label in labels):
        raise ValueError(f"--baseline {spec!r} is not a setting, nor the values of one on some "
                         f"of the grid's axes (settings: {', '.join(labels)})")
    return found


# -- per-seed rows -----------------------------------------------------------------------------

#: A target return: one for every run, or one per task (``env.id``) for a grid over tasks
#: whose returns share no scale (Hopper's 1,000 is Swimmer's never).
Target = float | dict[str, float] | None


def task_of(run: RunData) -> str:
    """The run's ``env.id`` ("" where its plan has none)."""
    return str((run.plan.get("env") or {}).get("id", ""))


def target_for(run: RunData, target: Target) -> float | None:
    """The target return that applies to ``run`` (None: its task has none)."""
    return target.get(task_of(run)) if isinstance(target, dict) else target


def target_text(target: Target) -> str:
    """A target as a table heading says it."""
    if isinstance(target, dict):
        return ", ".join(f"{task} {value:g}" for task, value in target.items())
    return f"{target:g}"


def seed_row(label: str, run: RunData, target: Target) -> dict[str, Any]:
    """One run as the numbers a claim is built from (``None`` where it has none)."""
    s = run.summary
    evals = [v for v in run.eval_return if v is not None]
    budget = (run.plan.get("stop") or {}).get("budget_usd")
    cost = s.get("cost_usd", run.cost_usd[-1] if run.cost_usd else None)
    row: dict[str, Any] = {
        "setting": label, "seed": run.seed, "run_dir": str(run.path),
        "scaler": run.scaler, "stop_reason": s.get("stop_reason"),
        "rounds": s.get("rounds", len(run.rounds)),
        "env_steps": s.get("env_steps", run.env_steps[-1] if run.env_steps else None),
        "final_eval_return": s.get("final_eval_return", evals[-1] if evals else None),
        "best_eval_return": s.get("best_eval_return", max(evals, default=None)),
        "cost_usd": cost,
        "budget_usd": budget,
        "budget_spent": cost / budget if budget and cost is not None else None,
        "sim_time_s": s.get("sim_time_s", run.sim_time_s[-1] if run.sim_time_s else None),
        "wall_s": s.get("wall_s"),
        "mean_actors": float(np.mean(run.actors)) if run.actors else None,
    }
    if target is not None:
        goal = target_for(run, target)
        hit = None if goal is None else next(
            (i for i, v in enumerate(run.eval_return) if v is not None and v >= goal), None)
        if isinstance(target, dict):
            row["target"] = goal
        row["reached_target"] = None if goal is None else hit is not None
        row["cost_to_target_usd"] = None if hit is None else run.cost_usd[hit]
        row["sim_time_to_target_s"] = None if hit is None else run.sim_time_s[hit]
        row["env_steps_to_target"] = None if hit is None else run.env_steps[hit]
    return row


# -- statistics --------------------------------------------------------------------------------


def iqm(sorted_values: np.ndarray) -> np.ndarray:
    """Interquartile mean along the last axis of sorted values: a quarter cut from each end,
    rounded down (scipy's ``trim_mean(x, 0.25)``), so below four values it is the mean."""
    n = sorted_values.shape[-1]
    cut = int(0.25 * n)
    return sorted_values[..., cut:n - cut].mean(axis=-1)


def tails(n: int, interval: str = INTERVAL) -> tuple[float, float]:
    """The percentiles of a bootstrap distribution over ``n`` seeds that bound its 95 %
    interval: 2.5 and 97.5 for ``percentile``; for ``expanded`` alpha'/2 and 1 - alpha'/2 with
    alpha'/2 = Phi(-sqrt(n / (n - 1)) * t_{0.975, n - 1}) (module docstring)."""
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(INTERVALS)}, got {interval!r}")
    if interval == "percentile" or n < 2:
        tail = (1 - LEVEL) / 2 * 100
    else:
        z = math.sqrt(n / (n - 1)) * t975(n - 1)
        tail = 0.5 * math.erfc(z / math.sqrt(2)) * 100
    return tail, 100 - tail


def bootstrap_ci(values: Sequence[float], stat: str = "mean", resamples: int = RESAMPLES,
                 seed: int = BOOT_SEED, interval: str = INTERVAL) -> tuple[float, float] | None:
    """Bootstrap 95 % interval of the mean or IQM over seeds (None below two)."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(resamples, x.size))]
    stats = samples.mean(axis=1) if stat == "mean" else iqm(np.sort(samples, axis=1))
    lo, hi = np.percentile(stats, tails(x.size, interval))
    return float(lo), float(hi)


#: Student t's 0.975 quantile for 1-30 degrees of freedom (the usual table, 3 decimals).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student t's 0.975 quantile: the table to 30 degrees of freedom, beyond it the
    Cornish-Fisher expansion around the normal's 1.96 (within 0.001 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def t_interval(diffs: list[float]) -> tuple[float, float] | None:
    """Student t 95 % interval of the mean (None below two values), beside the bootstrap's
    for paired differences: the classical interval, for a reader who trusts no resampling."""
    x = np.asarray(diffs, dtype=float)
    if x.size < 2:
        return None
    half = t975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return float(x.mean()) - half, float(x.mean()) + half


def describe(values: Sequence[float | None], interval: str = INTERVAL) -> dict[str, Any]:
    """n, mean and IQM with their intervals, over the values that exist."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"n": 0, "mean": None, "mean_ci": None, "iqm": None, "iqm_ci": None}
    return {"n": len(vals), "mean": float(np.mean(vals)),
            "mean_ci": bootstrap_ci(vals, interval=interval),
            "iqm": float(iqm(np.sort(np.asarray(vals)))),
            "iqm_ci": bootstrap_ci(vals, "iqm", interval=interval)}


def seed_differences(rows: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]],
                     metric: str) -> list[tuple[Any, float]]:
    """(seed, setting - baseline) for each seed both have a value of ``metric`` for."""
    theirs = {r["seed"]: r.get(metric) for r in base if r.get(metric) is not None}
    return [(r["seed"], float(r[metric]) - float(theirs[r["seed"]])) for r in rows
            if r.get(metric) is not None and r["seed"] in theirs]


def paired(rows: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]],
           metric: str, interval: str = INTERVAL) -> dict[str, Any]:
    """Mean of (setting - baseline) over the seeds both have a value for, with its interval."""
    pairs = seed_differences(rows, base, metric)
    diffs = [d for _, d in pairs]
    return {"n": len(diffs), "seeds": [s for s, _ in pairs],
            "mean": float(np.mean(diffs)) if diffs else None,
            "mean_ci": bootstrap_ci(diffs, interval=interval), "mean_ci_t": t_interval(diffs)}


def aggregate(groups: Sequence[Group], target: Target = None,
              baseline: str | None = None, interval: str = INTERVAL) -> dict[str, Any]:
    """Rows per seed, statistics per setting, differences against the baseline."""
    if isinstance(target, dict):
        tasks = {task_of(r) for g in groups for r in g.runs}
        unknown = sorted(set(target) - tasks)
        if unknown:
            raise ValueError(f"--target names {', '.join(map(repr, unknown))}, which no run "
                             f"trained on (tasks: {', '.join(sorted(tasks))})")
    rows = [seed_row(g.label, run, target) for g in groups for run in
            sorted(g.runs, key=lambda r: (r.seed is None, r.seed or 0))]
    return summarize(rows, [g.label for g in groups], target, baseline, interval)


def spent_range(rows: Sequence[dict[str, Any]]) -> list[float] | None:
    """[least, most] share of its budget a run spent (None: no run had a budget). The extremes,
    not a mean: an equal-budget comparison holds only if every run spent nearly all of its
    budget, and none more."""
    spent = [float(r["budget_spent"]) for r in rows if r.get("budget_spent") is not None]
    return [min(spent), max(spent)] if spent else None


def summarize(rows: Sequence[dict[str, Any]], labels: Sequence[str], target: Target,
              baseline: str | None, interval: str = INTERVAL) -> dict[str, Any]:
    """Statistics from per-seed rows alone, so a stored result is re-rendered from its rows."""
    base_of = baselines(labels, baseline) if baseline is not None else {}
    metrics = [m for m in METRICS if target is not None or "to_target" not in m]
    settings: dict[str, Any] = {}
    for label in labels:
        mine = [r for r in rows if r["setting"] == label]
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in mine],
            "stop_reasons": sorted({str(r["stop_reason"]) for r in mine}),
            "metrics": {m: describe([r.get(m) for r in mine], interval) for m in metrics},
        }
        if target is not None:
            entry["reached_target"] = sum(bool(r.get("reached_target")) for r in mine)
        entry["budget_spent_range"] = spent_range(mine)
        if label in base_of:
            base = [r for r in rows if r["setting"] == base_of[label]]
            entry["baseline"] = base_of[label]
            entry["vs_baseline"] = {m: paired(mine, base, m, interval) for m in metrics}
        settings[label] = entry
    return {"target": target, "baseline": baseline,
            "bootstrap": {"resamples": RESAMPLES, "level": LEVEL, "seed": BOOT_SEED,
                          "method": ("expanded percentile" if interval == "expanded" else "percentile")
                          + ", seeds resampled with replacement",
                          "interval": interval},
            "settings": settings, "rows": list(rows)}


# -- Markdown ----------------------------------------------------------------------------------


def _cell(stat: dict[str, Any], which: str, spec: str) -> str:
    value, ci = stat.get(which), stat.get(f"{which}_ci")
    if value is None:
        return "-"
    text = format(value, spec)
    return text if ci is None else f"{text} [{format(ci[0], spec)}, {format(ci[1], spec)}]"


def _spent_cell(span: Sequence[float] | None) -> str:
    if not span:
        return "-"
    lo, hi = (percent_of_budget(v) for v in span)
    return f"{lo} %" if lo == hi else f"{lo}–{hi} %"


def markdown(agg: dict[str, Any]) -> str:
    """The per-setting table (and the paired one with a baseline), as Markdown."""
    target = agg["target"]
    head = ["setting", "seeds", "final eval mean [95% CI]", "final eval IQM [95% CI]",
            "best eval IQM", "cost $", "sim time s", "env steps", "mean N", "stop"]
    if target is not None:
        head[-1:-1] = [f"reached {target_text(target)}", "cost to target $ [95% CI]",
                       "sim time to target s [95% CI]"]
    budgeted = any(e.get("budget_spent_range") for e in agg["settings"].values())
    if budgeted:
        head[-1:-1] = ["budget spent"]
    lines = [_row(head), _rule(len(head))]
    for label, e in agg["settings"].items():
        m = e["metrics"]
        cells = [label, str(len(e["seeds"])), _cell(m["final_eval_return"], "mean", ".1f"),
                 _cell(m["final_eval_return"], "iqm", ".1f"),
                 _cell({"iqm": m["best_eval_return"]["iqm"]}, "iqm", ".1f"),
                 _cell({"mean": m["cost_usd"]["mean"]}, "mean", ".5f"),
                 _cell({"mean": m["sim_time_s"]["mean"]}, "mean", ".1f"),
                 _cell({"mean": m["env_steps"]["mean"]}, "mean", ",.0f"),
                 _cell({"mean": m["mean_actors"]["mean"]}, "mean", ".1f"),
                 ", ".join(e["stop_reasons"])]
        if target is not None:
            cells[-1:-1] = [f"{e['reached_target']}/{len(e['seeds'])}",
                            _cell(m["cost_to_target_usd"], "mean", ".5f"),
                            _cell(m["sim_time_to_target_s"], "mean", ".1f")]
        if budgeted:
            cells[-1:-1] = [_spent_cell(e.get("budget_spent_range"))]
        lines.append(_row(cells))
    text = "\n".join(lines)
    if agg["baseline"] is not None:
        text += "\n\n" + _diff_table(agg)
    return text


#: What the paired table says of its intervals, by how the bootstrap was read.
INTERVAL_NOTES = {
    "expanded": "bootstrap intervals at the expanded quantiles, near 95 % coverage at ten "
                "seeds; the t interval beside them is the classical one",
    "percentile": "plain percentile-bootstrap intervals, narrower than 95 % at a few seeds; "
                  "the t interval beside them is the wider, honest one",
}


def _interval_of(agg: dict[str, Any]) -> str:
    """The interval a result was made with (results stored before it was recorded used the
    plain percentile one)."""
    return str(agg.get("bootstrap", {}).get("interval", "percentile"))


def _diff_table(agg: dict[str, Any]) -> str:
    shown = [m for m in DIFF_SHOWN if agg["target"] is not None or "to_target" not in m]
    final = "final_eval_return"
    # On a grid whose baseline names one axis's value, each row says which setting it is
    # paired with (older stored results name none: all against the one baseline).
    against = any(e.get("baseline", agg["baseline"]) != agg["baseline"]
                  for e in agg["settings"].values())
    head = ["setting", *(["against"] if against else []), "pairs",
            f"Δ {METRICS[final][0]} [95% CI]", f"Δ {METRICS[final][0]}, t [95% CI]",
            *(f"Δ {METRICS[m][0]} [95% CI]" for m in shown if m != final)]
    whom = (f"its counterpart under {agg['baseline']} (the same values on the other axes)"
            if against else agg["baseline"])
    lines = [f"Paired by seed, setting − {whom} (mean of the differences; "
             "an interval that excludes 0 is a difference the seeds support; "
             f"{INTERVAL_NOTES[_interval_of(agg)]}):", "", _row(head), _rule(len(head))]
    for label, e in agg["settings"].items():
        if "vs_baseline" not in e:
            continue
        d = e["vs_baseline"]
        spec = "+" + METRICS[final][1]
        ci_t = d[final].get("mean_ci_t")
        lines.append(_row([label, *([e["baseline"]] if against else []), str(d[final]["n"]),
                           _cell(d[final], "mean", spec),
                           "-" if ci_t is None else
                           f"[{format(ci_t[0], spec)}, {format(ci_t[1], spec)}]",
                           *(_cell(d[m], "mean", "+" + METRICS[m][1]) + _pairs(d[m], d)
                             for m in shown if m != final)]))
    return "\n".join(lines)


def _pairs(stat: dict[str, Any], d: dict[str, Any]) -> str:
    n = stat["n"]
    return "" if n == d["final_eval_return"]["n"] else f" ({n} pairs)"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _rule(n: int) -> str:
    return "|" + "|".join(["---"] + ["---:"] * (n - 1)) + "|"


# -- the fixed-N front -------------------------------------------------------------------------


#: How a front table names its axes.
AXIS_NAMES = {"dollars": "dollars", "sim_time": "simulated time", "wall_time": "wall-clock time"}


def front_gap(groups: Sequence[Group], front: Sequence[str], label: str,
              xs_of: Callable[[RunData], Sequence[float]], points: int = 100,
              resamples: int = RESAMPLES, seed: int = BOOT_SEED,
              interval: str = INTERVAL) -> dict[str, Any] | None:
    """How far ``label``'s mean curve sits above (+) or below (-) the front of the ``front``
    settings' mean curves (their pointwise best), along one axis.

    A claim that a rule "sits on or beyond the front of the fixed counts" is a statement about
    whole curves, not final points: at every dollar (or second) the rule has spent, is its
    return at least what the best fixed count had reached by then? Curves are paired by seed
    (the seeds every compared setting ran), each seed's evaluations interpolated linearly onto
    a common grid from the latest first evaluation to the latest last one; a run that ended
    before a point keeps the return it ended with (what its user holds at that point). At each
    point the front is the fixed count whose mean is highest there; the intervals resample
    seeds (jointly across settings) for that choice. Choosing the best-looking of several
    noisy means favours the front, so a gap is, if anything, biased against ``label``;
    recomputing the max in every resample instead would make the statistic a max of means,
    whose percentile interval need not even contain the estimate.
    """
    by_label = {g.label: g for g in groups}
    missing = [name for name in (*front, label) if name not in by_label]
    if missing:
        raise ValueError(f"front: no setting named {', '.join(map(repr, missing))} "
                         f"(settings: {', '.join(by_label)})")
    compared = [label, *front]
    common = set.intersection(*({r.seed for r in by_label[name].runs} for name in compared))
    seeds = sorted(s for s in common if s is not None)
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for name in compared:
        runs = {r.seed: r for r in by_label[name].runs}
        curves[name] = []
        for s in seeds:
            x, y = runs[s].points(list(xs_of(runs[s])))
            if not x:
                return None
            curves[name].append((np.asarray(x, float), np.asarray(y, float)))
    if len(seeds) < 2:
        return None
    lo = max(x[0] for c in curves.values() for x, _ in c)
    hi = max(x[-1] for c in curves.values() for x, _ in c)
    if hi <= lo:
        return None
    grid = np.linspace(lo, hi, points)
    values = {name: np.stack([np.interp(grid, x, y) for x, y in c])
              for name, c in curves.items()}
    n = len(seeds)
    front_means = np.stack([values[name].mean(axis=0) for name in front])
    leader = front_means.argmax(axis=0)
    # Per seed, the rule's return minus the leading fixed count's at each point: the gap is
    # then a mean over seeds, and its bootstrap a plain one.
    leading = np.stack([values[name] for name in front])[leader, :, np.arange(points)].T
    per_seed = values[label] - leading
    gap = per_seed.mean(axis=0)
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)
    boot_gap = counts @ per_seed / n
    q = tails(n, interval)
    mean_lo, mean_hi = np.percentile(boot_gap.mean(axis=1), q)
    point_lo, point_hi = np.percentile(boot_gap, q, axis=0)
    return {
        "setting": label, "front": list(front), "seeds": seeds, "grid": [float(lo), float(hi)],
        "mean_gap": float(gap.mean()), "mean_gap_ci": (float(mean_lo), float(mean_hi)),
        "share_on_or_above": float(np.mean(gap >= 0)),
        "share_above": float(np.mean(point_lo > 0)),
        "share_below": float(np.mean(point_hi < 0)),
        "front_share": {name: float(np.mean(leader == i)) for i, name in enumerate(front)},
        "curve": {"x": grid.tolist(), "gap": gap.tolist(), "lo": point_lo.tolist(),
                  "hi": point_hi.tolist()},
    }


def fronts(groups: Sequence[Group], front: Sequence[str],
           interval: str = INTERVAL) -> dict[str, dict[str, Any]]:
    """``front_gap`` of every other setting against dollars (the axis an equal-budget claim
    is about) and time (the one boosting should save: simulated where the runs simulated the
    cloud, else wall-clock): {axis: {setting: gap}}.

    ``front`` names settings, or values of one axis of a grid: each setting is then measured
    against the front its ``counterpart`` settings make (the same values on the other axes);
    a setting whose counterparts are not all on the grid has no row."""
    labels = [g.label for g in groups]
    missing = [name for name in front
               if not any(counterpart(labels, label, name) for label in labels)]
    if missing:
        raise ValueError(f"front: no setting named {', '.join(map(repr, missing))} "
                         f"(settings: {', '.join(labels)})")
    members = {label: [counterpart(labels, label, name) for name in front]
               for label in labels}
    compared = {label: [m for m in found if m is not None] for label, found in members.items()
                if None not in found and label not in found}
    runs = [r for g in groups for r in g.runs]
    time_of, _, time_key = time_axis(runs)
    axes: dict[str, Callable[[RunData], Sequence[float]]] = {
        "dollars": lambda r: r.cost_usd, f"{time_key}_time": time_of}
    out: dict[str, dict[str, Any]] = {}
    for axis, xs_of in axes.items():
        out[axis] = {}
        for label, its_front in compared.items():
            gap = front_gap(groups, its_front, label, xs_of, interval=interval)
            if gap is not None:
                out[axis][label] = {**gap, "front_names": list(front)}
    return out


def _front_names(gap: dict[str, Any]) -> list[str]:
    """The front as the user named it (``fronts``), or its settings' labels."""
    return list(gap.get("front_names", gap["front"]))


def front_markdown(found: dict[str, dict[str, Any]]) -> str:
    """The front table: per axis and setting, the mean gap with its interval and how much of
    the axis the setting spends on, above or below the front."""
    lines = []
    for axis, by_setting in found.items():
        if not by_setting:
            continue
        front = _front_names(next(iter(by_setting.values())))
        lines += [f"Against the front of {', '.join(front)} in return against "
                  f"{AXIS_NAMES[axis]} (mean curve minus the best of their mean curves at "
                  "each point, seeds paired; share of the axis on or above the front, and "
                  "where the interval is wholly above or below):",
                  "", _row(["setting", "seeds", "mean gap [95% CI]", "on or above",
                            "above (CI)", "below (CI)", "front made by"]), _rule(7)]
        for name, g in by_setting.items():
            made = ", ".join(f"{k} {v:.0%}" for k, v in
                             zip(_front_names(g), g["front_share"].values(), strict=True)
                             if v > 0)
            lines.append(_row([name, str(len(g["seeds"])),
                               _cell({"mean": g["mean_gap"], "mean_ci": g["mean_gap_ci"]},
                                     "mean", "+.1f"),
                               f"{g['share_on_or_above']:.0%}", f"{g['share_above']:.0%}",
                               f"{g['share_below']:.0%}", made]))
        lines.append("")
    return "\n".join(lines).rstrip()


# -- figures -----------------------------------------------------------------------------------


def curve_on_grid(groups_runs: Sequence[RunData], xs_of: Callable[[RunData], Sequence[float]],
                  points: int = 100) -> tuple[np.ndarray, np.ndarray] | None:
    """(grid, returns of shape seeds x grid) where every seed has evaluations on both sides."""
    curves = []
    for run in groups_runs:
        x, y = run.points(list(xs_of(run)))
        if x:
            curves.append((np.asarray(x, float), np.asarray(y, float)))
    if not curves:
        return None
    lo = max(c[0][0] for c in curves)
    hi = min(c[0][-1] for c in curves)
    grid = np.linspace(lo, hi, points) if hi > lo else np.asarray([hi])
    return grid, np.stack([np.interp(grid, x, y) for x, y in curves])


def band(values: np.ndarray, resamples: int = BAND_RESAMPLES, seed: int = BOOT_SEED,
         interval: str = INTERVAL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (rows) and the 95 % bootstrap interval of the mean at every column:
    a resample is a multinomial count per seed, so it costs one matrix product."""
    n = values.shape[0]
    mean = values.mean(axis=0)
    if n < 2:
        return mean, mean, mean
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)
    boots = counts @ values / n
    lo, hi = np.percentile(boots, tails(n, interval), axis=0)
    return mean, lo, hi


def by_task(groups: Sequence[Group]) -> dict[str, list[Group]]:
    """The settings per task (``env.id`` of their runs' plans; a setting whose runs differ in
    it stands under ``mixed``): returns of different tasks share no scale."""
    tasks: dict[str, list[Group]] = {}
    for g in groups:
        ids = {str(r.plan.get("env", {}).get("id", "")) for r in g.runs}
        tasks.setdefault(ids.pop() if len(ids) == 1 else "mixed", []).append(g)
    return tasks


def band_figures(groups: Sequence[Group], out: Path,
                 interval: str = INTERVAL) -> list[Path]:
    """Eval return against env steps, dollars and simulated (or wall) time, one band per
    setting, and the final evaluation of every seed per setting; a grid over several tasks
    gets one set per task, in a folder named after it."""
    tasks = by_task(groups)
    if len(tasks) > 1:
        return [path for task, mine in tasks.items()
                for path in band_figures(mine, out / re.sub(r"[^A-Za-z0-9._-]", "_", task),
                                         interval)]
    out.mkdir(parents=True, exist_ok=True)
    runs = [r for g in groups for r in g.runs]
    if not any(v is not None for r in runs for v in r.eval_return):
        return []
    time_of, time_name, time_key = time_axis(runs)
    t_scale, t_unit = time_unit(runs, time_of)
    usd_scale, usd_name = usd_unit(runs)
    axes = [(lambda r: r.env_steps, 1.0, "environment steps", "env_steps"),
            (lambda r: r.cost_usd, usd_scale, f"cumulative cost ({usd_name})", "cost"),
            (time_of, t_scale, f"{time_name} ({t_unit})", f"{time_key}_time")]
    colors = run_colors(len(groups))
    paths = []
    for xs_of, scale, xlabel, key in axes:
        fig, ax = figure(f"Eval return against {xlabel.split(' (')[0]}: mean and 95 % "
                          "interval over seeds")
        handles = []
        for group, color in zip(groups, colors, strict=True):
            curve = curve_on_grid(group.runs, xs_of)
            if curve is None:
                continue
            grid, values = curve
            mean, lo, hi = band(values, interval=interval)
            label = f"{group.label} ({values.shape[0]} seeds)"
            if grid.size == 1:
                line = ax.errorbar(grid * scale, mean, yerr=[mean - lo, hi - mean], fmt="o",
                                   color=color, label=label)
            else:
                (line,) = ax.plot(grid * scale, mean, color=color, label=label)
                ax.fill_between(grid * scale, lo, hi, color=color, alpha=0.2, linewidth=0)
            handles.append(line)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval return (mean over eval episodes)")
        paths.append(save_figure(fig, out / f"bands_return_vs_{key}.png", handles=handles))
    paths.append(final_eval_figure(groups, colors, out / "final_eval_by_setting.png"))
    return paths


def front_figures(found: dict[str, dict[str, Any]], runs: Sequence[RunData],
                  out: Path) -> list[Path]:
    """Each setting's gap to the fixed-N front along each axis, with the pointwise 95 %
    interval as a band: above zero the setting beats every fixed count at that point."""
    out.mkdir(parents=True, exist_ok=True)
    usd_scale, usd_name = usd_unit(list(runs))
    time_of, time_name, time_key = time_axis(list(runs))
    t_scale, t_unit = time_unit(list(runs), time_of)
    xlabels = {"dollars": (usd_scale, f"cumulative cost ({usd_name})"),
               f"{time_key}_time": (t_scale, f"{time_name} ({t_unit})")}
    paths = []
    for axis, by_setting in found.items():
        names = list(by_setting)
        if not names:
            continue
        front = _front_names(by_setting[names[0]])
        scale, xlabel = xlabels[axis]
        fig, ax = figure(f"Return minus the best of {', '.join(front)}\n(mean and 95 % "
                         "interval over paired seeds)")
        ax.axhline(0.0, color="black", linewidth=0.8)
        handles = []
        for name, color in zip(names, run_colors(len(names)), strict=True):
            curve = by_setting[name]["curve"]
            x = np.asarray(curve["x"]) * scale
            (line,) = ax.plot(x, curve["gap"], color=color,
                              label=f"{name} ({len(by_setting[name]['seeds'])} seeds)")
            ax.fill_between(x, curve["lo"], curve["hi"], color=color, alpha=0.15, linewidth=0)
            handles.append(line)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval return − best fixed N's")
        paths.append(save_figure(fig, out / f"front_gap_vs_{axis}.png", handles=handles))
    return paths


def final_eval_figure(groups: Sequence[Group], colors: Sequence[Any], path: Path) -> Path:
    """Each seed's final evaluation as a dot, the IQM and its 95 % interval as a bar."""
    fig, ax = figure("Final eval return per setting: seeds, IQM and 95 % interval")
    for i, (group, color) in enumerate(zip(groups, colors, strict=True)):
        vals = [seed_row(group.label, r, None)["final_eval_return"] for r in group.runs]
        vals = [v for v in vals if v is not None]
        if not vals:
            continue
        jitter = np.linspace(-0.15, 0.15, len(vals)) if len(vals) > 1 else [0.0]
        ax.scatter(np.asarray(jitter) + i, vals, color=color, alpha=0.6, s=14)
        stat = describe(vals)
        ci = stat["iqm_ci"] or (stat["iqm"], stat["iqm"])
        ax.errorbar([i + 0.3], [stat["iqm"]], yerr=[[stat["iqm"] - ci[0]], [ci[1] - stat["iqm"]]],
                    fmt="D", color=color, capsize=4)
    ax.set_xticks(range(len(groups)), [g.label for g in groups], rotation=30, ha="right")
    ax.set_ylabel("final eval return")
    return save_figure(fig, path)
