"""Does every budget-bound run spend its budget, and never more?

The boosting studies check spend on the settings they compare. This grid goes where they did
not: other MuJoCo tasks, all three round modes (sync, pipelined, async), every kind of scaler
(the paper's rule, the anchored default, the decay alone, the noise-scale rules, schedules,
random and max) and small budgets, each run through the engine with durations measured on this
machine (the harder case: a measured round can cost more than its estimate, a modelled one
cannot). Per run it keeps the fraction of the budget spent and why the run stopped; the goal is
95-100 % for every run that the budget ended. Rows: perf/results/spend_check.json.

    .venv/bin/python perf/spend_check.py run                   # the whole grid (about 1 h)
    .venv/bin/python perf/spend_check.py run --tasks Reacher-v5 --modes async --seeds 7
    .venv/bin/python perf/spend_check.py run --time-model perf/results/time_model_hopper.json \
        --modes pipelined async --out runs/spend_model   # the time model's durations instead
    .venv/bin/python perf/spend_check.py collect DIR [DIR ...]  # rows from finished runs
    .venv/bin/python perf/spend_check.py churn --period 20       # beside a grid: load on, off

``churn`` is the adversary of the allocator under measured durations: it keeps every core busy
for a random 0.5-1.5 periods, then idle for as long, until stopped, so rounds run slower than
the recent ones the estimate was fitted on, at any point of a run, its last rounds included.

``run`` skips runs already finished (resumable) and collects at the end; ``collect`` reads any
run directories made from ``plans/hopper-nitro.toml`` with the settings in their plan.toml.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import common as c

PLAN = c.ROOT / "plans" / "hopper-nitro.toml"
TASKS = ("InvertedDoublePendulum-v5", "Reacher-v5", "Walker2d-v5")
MODES = ("sync", "pipelined", "async")
#: Scaler tables by the name the rows give them.
SCALERS = {
    "prototype": '{name="nitro",rule="window",prototype_compat=true}',
    "nitro": '{name="nitro"}',
    "decay_only": '{name="decay_only"}',
    "kungfu": '{name="kungfu"}',
    "hydrozoa": '{name="hydrozoa"}',
    "random": '{name="random"}',
    "critical_batch": '{name="critical_batch"}',
    "grow": '{name="grow"}',
    "max": '{name="max"}',
}
#: Budgets cycled through the grid: a few dozen rounds each, so the last rounds matter.
BUDGETS = (0.0015, 0.002, 0.0025)
#: The spend every budget-ended run should reach.
LOW, HIGH = 0.95, 1.0


def scaler_label(table: dict[str, Any]) -> str:
    if table.get("name") == "nitro" and table.get("prototype_compat"):
        return "prototype"
    return str(table.get("name"))


def row(run_dir: Path) -> dict[str, Any] | None:
    """What one finished run spent, with the settings read back from its own plan."""
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    plan = tomllib.loads((run_dir / "plan.toml").read_text())
    budget = plan["stop"]["budget_usd"]
    return {
        "task": plan["env"]["id"], "mode": plan["run"]["mode"],
        "clock": plan.get("cost", {}).get("time_model", "measured"),
        "scaler": scaler_label(plan["scaler"]), "budget_usd": budget,
        "seed": plan["run"]["seed"], "cost_usd": summary["cost_usd"],
        "spent": summary["cost_usd"] / budget if budget else None,
        "stop_reason": summary["stop_reason"], "rounds": summary["rounds"],
        "invocations": summary["invocations"],
        "invocations_cancelled": summary["invocations_cancelled"],
        "trained_fraction": summary["trained_fraction"],
        "estimate_miss": summary.get("estimate_miss"),
    }


def collect(dirs: list[Path], name: str = "spend_check", title: str | None = None) -> Path:
    runs = sorted({p.parent for d in dirs for p in d.rglob("summary.json")})
    rows = [r for r in map(row, runs) if r is not None]
    path = c.write_result(name, {
        "title": title or "Budget spend on tasks, modes and scalers the studies did not use "
                          "(issue 16)",
        "rows": rows})
    print(render({"rows": rows}))
    return path


def clock_sets(time_model: Path | None) -> list[str]:
    """Overrides that bill every run from a fitted time model (its constants, as
    ``perf/boost_budget.py fit`` keeps them), or none: measured durations."""
    if time_model is None:
        return []
    return c.time_model_sets(json.loads(time_model.read_text())["constants"])


def run(args: argparse.Namespace) -> None:
    i = 0
    clock = clock_sets(args.time_model)
    for task in args.tasks:
        for mode in args.modes:
            for name in args.scalers:
                budget = BUDGETS[i % len(BUDGETS)]
                seed = args.seeds + i
                i += 1
                folder = args.out / task / mode / name / f"seed-{seed}"
                if (folder / "summary.json").exists():
                    continue
                sets = [f"env.id={task}", f"run.mode={mode}", f"scaler={SCALERS[name]}",
                        f"stop.budget_usd={budget}", f"run.seed={seed}", "sinks=[]",
                        "checkpoint.enabled=false", *clock]
                c.log(f"{task} {mode} {name} ${budget} seed {seed}")
                proc = c.run([c.PY, "-m", "kernel", "run", str(PLAN), "--out", str(folder),
                              "--force", *[a for s in sets for a in ("--set", s)]],
                             timeout=900)
                if proc.rc != 0:
                    c.log(f"  failed (rc {proc.rc}): {proc.stderr[-500:]}")
    collect([args.out], args.name, args.title)


def _burn(until: float) -> None:
    x = 0
    while time.monotonic() < until:
        x += 1


def churn(period: float, seed: int) -> None:
    """Load that switches on and off, until interrupted (see the module docstring)."""
    rng = random.Random(seed)
    cores = os.cpu_count() or 1
    while True:
        busy, idle = (period * rng.uniform(0.5, 1.5) for _ in range(2))
        c.log(f"churn: {cores} cores busy for {busy:.0f} s, then idle for {idle:.0f} s")
        with multiprocessing.Pool(cores) as pool:
            pool.map(_burn, [time.monotonic() + busy] * cores)
        time.sleep(idle)


def render(data: dict[str, Any]) -> str:
    """Per task and mode: how many runs, the range of their spend, how they stopped; every
    budget-ended run outside 95-100 % by name."""
    rows = data["rows"]
    ended = [r for r in rows if r["stop_reason"] == "budget"]
    outside = [r for r in ended if not LOW <= r["spent"] <= HIGH]
    over = [r for r in rows if r["spent"] is not None and r["spent"] > HIGH]
    table = []
    for task in dict.fromkeys(r["task"] for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            group = [r for r in rows if r["task"] == task and r["mode"] == mode]
            if not group:
                continue
            spent = [r["spent"] for r in group]
            reasons = Counter(r["stop_reason"] for r in group)
            table.append([task, mode, len(group), f"{min(spent):.2%}",
                          f"{statistics.median(spent):.2%}", f"{max(spent):.2%}",
                          ", ".join(f"{k} {v}" for k, v in reasons.most_common())])
    lines = [f"{len(ended)} of {len(rows)} runs ended by the budget; "
             f"{len(ended) - len(outside)} of those spent {LOW:.0%}-{HIGH:.0%} of it; "
             f"{len(over)} run(s) spent more than the budget.",
             c.md_table(["task", "mode", "runs", "least spent", "median", "most spent",
                         "stopped by"], table)]
    missed = [r["estimate_miss"] for r in rows if (r.get("estimate_miss") or 1.0) > 1.0]
    if missed:
        lines.append(f"{len(missed)} run(s) had a round charged above its estimate (worst "
                     f"{max(missed):.2f}x).")
    if outside:
        lines.append("Outside 95-100 %: " + "; ".join(
            f"{r['task']} {r['mode']} {r['scaler']} seed {r['seed']} {r['spent']:.2%} "
            f"(${r['budget_usd']})" for r in outside) + ".")
    return "\n\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    result = argparse.ArgumentParser(add_help=False)
    result.add_argument("--name", default="spend_check", help="result name")
    result.add_argument("--title", help="the section's title in RESULTS.md")
    grid = sub.add_parser("run", parents=[result],
                          help="run the grid (finished runs are skipped), then collect")
    grid.add_argument("--tasks", nargs="+", default=list(TASKS))
    grid.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    grid.add_argument("--scalers", nargs="+", choices=list(SCALERS), default=list(SCALERS))
    grid.add_argument("--seeds", type=int, default=101, help="first seed; each run the next")
    grid.add_argument("--out", type=Path, default=c.ROOT / "runs" / "spend_check")
    grid.add_argument("--time-model", type=Path,
                      help="a perf/results/time_model_*.json: durations from its constants")
    gather = sub.add_parser("collect", parents=[result],
                            help="rows from finished run directories")
    gather.add_argument("dirs", nargs="+", type=Path)
    load = sub.add_parser("churn", help="busy, idle, busy, ... on every core, until stopped")
    load.add_argument("--period", type=float, default=20.0, help="mean seconds of each phase")
    load.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.action == "run":
        run(args)
    elif args.action == "churn":
        churn(args.period, args.seed)
    else:
        collect(args.dirs, args.name, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
