"""``nitro report``: the command line of the figures (``plugins/experiments/report.py``, one
figure set per run) and of the seed aggregation (``plugins/experiments/aggregate.py``, settings
across seeds). Registered through the ``nitro.commands`` entry point."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from plugins.experiments import aggregate as agg
from plugins.experiments.report import ReportError, report


def _handle(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.run_dirs]
    sweeps = [d for d in dirs if (d / "sweep.json").is_file()]
    if sweeps or args.group_by:
        return _handle_aggregate(args, dirs, sweeps)
    out = Path(args.out) if args.out else (dirs[0] / "report" if len(dirs) == 1
                                           else Path("report"))
    try:
        figures, table = report(dirs, out)
    except ReportError as exc:
        sys.stderr.write(f"nitro report: {exc}\n")
        return 2
    sys.stdout.write(table + "\n\n")
    for path in figures:
        sys.stdout.write(f"wrote {path}\n")
    return 0


def _handle_aggregate(args: argparse.Namespace, dirs: list[Path], sweeps: list[Path]) -> int:
    """Seeds grouped by setting (a sweep's, or ``--group-by`` over plain run dirs)."""
    try:
        groups: list[agg.Group] = []
        notes: list[str] = []
        for sweep in sweeps:
            found, missing = agg.groups_from_sweep(sweep)
            groups += found
            notes += missing
        plain = [d for d in dirs if d not in sweeps]
        if plain:
            groups += agg.group_runs(plain, args.group_by or "parent")
        groups = [g for g in agg.merge(groups) if g.runs]
        tasks = agg.by_task(groups)
        if isinstance(args.target, float) and len(tasks) > 1:
            notes.append(f"one --target for {len(tasks)} tasks ({', '.join(tasks)}); give "
                         "each its own as ENV_ID=R,ENV_ID=R")
        result = agg.aggregate(groups, args.target, args.baseline, args.interval)
        front = agg.fronts(groups, args.front, args.interval) if args.front else {}
    except (ReportError, ValueError) as exc:
        sys.stderr.write(f"nitro report: {exc}\n")
        return 2
    out = Path(args.out) if args.out else (sweeps[0] if len(sweeps) == 1 else Path(".")) \
        / "report"
    sys.stdout.write(agg.markdown(result) + "\n\n")
    if front:
        sys.stdout.write(agg.front_markdown(front) + "\n\n")
        result["front"] = front
    for note in notes:
        sys.stdout.write(f"note: {note}\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n",
                                   encoding="utf-8")
        sys.stdout.write(f"wrote {args.json}\n")
    if not args.no_figures:
        runs = [r for g in groups for r in g.runs]
        for path in [*agg.band_figures(groups, out, args.interval),
                     *agg.front_figures(front, runs, out)]:
            sys.stdout.write(f"wrote {path}\n")
    return 0


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected setting names separated by commas")
    return names


def _target(text: str) -> float | dict[str, float]:
    """``R``, or ``ENV_ID=R,ENV_ID=R`` for a grid over tasks."""
    try:
        return float(text)
    except ValueError:
        pass
    targets: dict[str, float] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        task, sep, value = item.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not task.strip() or number is None:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected a return (1000) or env id=return pairs "
                "(Hopper-v5=1000,Swimmer-v5=40)")
        targets[task.strip()] = number
    if not targets:
        raise argparse.ArgumentTypeError("expected a return or env id=return pairs")
    return targets


def register(subparsers: Any) -> None:
    """Entry point of the ``nitro.commands`` group."""
    parser = subparsers.add_parser(
        "report", help="figures and a summary table from run directories or sweeps",
        description="Draw PNG figures (eval return against env steps, time and cost; actors "
                    "and boost score per round; cost per round) from run directories, "
                    "overlaying several runs, and print a summary table. Given a sweep "
                    "directory (nitro sweep) or --group-by, aggregate seeds per setting "
                    "instead: mean and IQM with 95 %% bootstrap intervals (10,000 resamples, "
                    "seeded; expanded to t's width at a few seeds, see --interval), paired "
                    "differences against --baseline, a Markdown table, --json rows, and "
                    "curves with bands.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="DIR",
                        help="a run's directory, or a sweep's (with sweep.json): a sweep is "
                             "reported per setting, seeds aggregated")
    parser.add_argument("--out", metavar="DIR",
                        help="where the PNGs go (default RUN_DIR/report for one run or "
                             "SWEEP/report for one sweep, ./report otherwise)")
    parser.add_argument("--group-by", choices=("parent", "scaler", "name"),
                        help="aggregate plain run dirs by their parent folder (a sweep's "
                             "layout), scaler or run name")
    parser.add_argument("--target", type=_target, metavar="R",
                        help="aggregated: cost, simulated time and env steps to the first "
                             "evaluation at or above R; on a grid over tasks, one per task "
                             "(Hopper-v5=1000,Swimmer-v5=40)")
    parser.add_argument("--baseline", metavar="SETTING",
                        help="aggregated: paired differences (by seed) against this setting; "
                             "on a grid of several axes, a value of one axis (fixed8, "
                             "env.id=Hopper-v5) pairs each setting with the one that has "
                             "that value and its own values on the other axes")
    parser.add_argument("--front", type=_names, metavar="A,B,...",
                        help="aggregated: every other setting's mean curve against the "
                             "front (pointwise best) of these settings' mean curves, in "
                             "return against dollars and against simulated time: mean gap "
                             "with its interval, seeds paired, and a figure of the gap; on a "
                             "grid of several axes, values of one axis: each setting against "
                             "the front of its own values on the others")
    parser.add_argument("--json", metavar="FILE",
                        help="aggregated: write per-seed rows and statistics as JSON")
    parser.add_argument("--interval", choices=agg.INTERVALS, default=agg.INTERVAL,
                        help="aggregated: how the bootstrap distribution becomes a 95 %% "
                             "interval. expanded (default): read at quantiles widened as a "
                             "Student t widens at n seeds (Hesterberg's expanded percentile "
                             "interval), near 95 %% coverage at 10 seeds; percentile: 2.5 and "
                             "97.5 %%, narrower than 95 %% at a few seeds (about 90 %% at 10)")
    parser.add_argument("--no-figures", action="store_true",
                        help="aggregated: the table only")
    parser.set_defaults(handler=_handle)
