"""Boosting against fixed fan-outs: Hopper-v5 PPO under one simulated-dollar budget.

Runs each scaler (nitro, fixed at the start count, fixed at N_max, random, gns) over several
seeds with the local backend in simulate mode (time and dollars of N concurrent Lambdas),
prints a table (final and best eval return, cost, simulated time, mean actors) and writes a
plot of eval return against simulated dollars and simulated seconds.

    .venv/bin/python perf/boost_vs_fixed.py --quick          # a few minutes, smoke-size
    .venv/bin/python perf/boost_vs_fixed.py --seeds 1 2 3    # the full comparison

Each scaler pays only for the probes it needs (nitro: hessian; gns: gns); all pay for eval.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel.engine import Engine  # noqa: E402

SCALERS = ("nitro", "fixed", "fixed_max", "random", "gns")


def base_plan(quick: bool) -> dict[str, Any]:
    path = ROOT / "plans" / "hopper.toml"
    plan = tomllib.loads(path.read_text()) if path.exists() else {
        "run": {"name": "hopper"},
        "env": {"id": "Hopper-v5", "normalize_obs": True, "normalize_reward": True},
        "algo": {"name": "ppo", "update_epochs": 10, "num_minibatches": 32},
        "transport": {"kind": "memory"},
    }
    plan["env"]["num_envs"] = 2
    plan["actors"] = {"backend": "local", "count": 2, "min": 1, "max": 4 if quick else 16,
                      "steps": 64 if quick else 256, "simulate": True, "workers": 2}
    plan["stop"] = {"max_env_steps": 1_000_000}
    plan["sinks"] = []
    plan["cost"] = {"name": "aws"}
    if quick:
        plan["algo"].update(update_epochs=2, num_minibatches=4)
    return plan


def plan_for(base: dict[str, Any], scaler: str, seed: int, budget: float, quick: bool,
             max_rounds: int | None) -> dict[str, Any]:
    plan = copy.deepcopy(base)
    plan["run"].update(name=f"boost-{scaler}-s{seed}", seed=seed)
    plan["stop"]["budget_usd"] = budget
    if max_rounds is not None:
        plan["stop"]["max_rounds"] = max_rounds
    actors = plan["actors"]
    probes: list[dict[str, Any]] = [{"name": "eval", "every": 2 if quick else 10,
                                     "episodes": 2 if quick else 10}]
    if scaler == "nitro":
        plan["scaler"] = {"name": "nitro"}
        probes.insert(0, {"name": "hessian", "samples": 512 if quick else 2048})
    elif scaler == "gns":
        plan["scaler"] = {"name": "gns"}
        probes.insert(0, {"name": "gns", "samples": 1024 if quick else 4096})
    elif scaler == "fixed_max":
        actors["count"] = actors["max"]  # from round 1 on (round 1 always runs actors.count)
        plan["scaler"] = {"name": "fixed"}
    else:
        plan["scaler"] = {"name": scaler}
    plan["probes"] = probes
    return plan


def run_one(plan: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    engine = Engine.from_plan(plan, out_dir=out_dir)
    summary = asyncio.run(engine.run())
    curve = []
    with (out_dir / "events.jsonl").open() as fh:
        for line in fh:
            event = json.loads(line)
            if event["event"] == "RoundFinished" and event.get("eval_return") is not None:
                curve.append((event["cost_usd"], event["sim_time_s"], event["eval_return"]))
    summary["curve"] = curve
    return summary


def mean_std(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    head = (f"{'scaler':<10} {'seeds':>5} {'final eval':>16} {'best eval':>16} {'cost $':>10} "
            f"{'sim s':>8} {'mean N':>7} {'env steps':>10} {'stop':>10}")
    lines = [head, "-" * len(head)]
    for scaler, runs in results.items():
        actors = [statistics.mean(r["actors_per_round"]) for r in runs if r["actors_per_round"]]
        stops = sorted({r["stop_reason"] for r in runs})
        lines.append(
            f"{scaler:<10} {len(runs):>5} "
            f"{mean_std([r['final_eval_return'] for r in runs]):>16} "
            f"{mean_std([r['best_eval_return'] for r in runs]):>16} "
            f"{statistics.mean(r['cost_usd'] for r in runs):>10.5f} "
            f"{statistics.mean(r['sim_time_s'] for r in runs):>8.1f} "
            f"{statistics.mean(actors) if actors else 0:>7.2f} "
            f"{statistics.mean(r['env_steps'] for r in runs):>10.0f} {','.join(stops):>10}"
        )
    return "\n".join(lines)


def plot(results: dict[str, list[dict[str, Any]]], path: Path, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cost, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (scaler, runs) in enumerate(results.items()):
        for j, run in enumerate(runs):
            if not run["curve"]:
                continue
            cost, sim, ret = zip(*run["curve"], strict=True)
            label = scaler if j == 0 else None
            ax_cost.plot(cost, ret, color=colors[i % len(colors)], alpha=0.8, label=label)
            ax_time.plot(sim, ret, color=colors[i % len(colors)], alpha=0.8, label=label)
    ax_cost.axvline(budget, color="grey", linestyle="--", linewidth=1)
    ax_cost.set_xlabel("simulated cost (USD)")
    ax_time.set_xlabel("simulated time (s)")
    for ax in (ax_cost, ax_time):
        ax.set_ylabel("eval return (undiscounted, per episode)")
        ax.grid(alpha=0.3)
    ax_cost.legend()
    fig.suptitle(f"Hopper-v5 PPO under a ${budget:g} budget: boosting vs fixed fan-out")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke-size run (a few minutes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--budget", type=float, default=None, help="simulated USD per run")
    parser.add_argument("--scalers", nargs="+", default=list(SCALERS), choices=SCALERS)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "boost_vs_fixed")
    args = parser.parse_args()
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
    budget = args.budget or (0.0005 if args.quick else 0.05)
    max_rounds = 30 if args.quick else None
    base = base_plan(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    for scaler in args.scalers:
        for seed in seeds:
            plan = plan_for(base, scaler, seed, budget, args.quick, max_rounds)
            t_run = time.perf_counter()
            summary = run_one(plan, args.out / f"{scaler}-s{seed}")
            results.setdefault(scaler, []).append(summary)
            print(f"{scaler:<10} seed {seed}: {summary['rounds']} rounds, "
                  f"final eval {summary['final_eval_return']}, cost ${summary['cost_usd']:.5f}, "
                  f"stop {summary['stop_reason']}, {time.perf_counter() - t_run:.1f} s wall",
                  flush=True)
    print()
    print(table(results))
    png = args.out / "boost_vs_fixed.png"
    plot(results, png, budget)
    (args.out / "results.json").write_text(json.dumps(
        {k: [{kk: vv for kk, vv in r.items()} for r in v] for k, v in results.items()},
        indent=1, default=str))
    wall = time.perf_counter() - t0
    print(f"\nplot: {png}\nwall: {wall:.0f} s")
    sys.path.insert(0, str(ROOT / "perf"))
    import common  # perf's own helpers, only for run_all's results page

    common.write_result("boost_vs_fixed", {
        "title": "Boosting against fixed fan-outs (issue 4)",
        "markdown": (f"Hopper-v5 PPO, simulated cloud, budget ${budget:g} per run, seeds "
                     f"{', '.join(map(str, seeds))}, {wall:.0f} s wall in all. Plot: "
                     f"`{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}`.\n\n"
                     f"```\n{table(results)}\n```"),
    })


if __name__ == "__main__":
    main()
