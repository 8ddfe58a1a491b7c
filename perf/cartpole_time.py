"""Issue 2 (a): wall time for ``plans/cartpole.toml`` to reach 475 against a minimal PPO loop.

Both sides run as subprocesses, seed by seed, alternating (so background load hits both alike):
Nitro through its CLI (``python -m kernel run plans/cartpole.toml --set run.seed=S --out DIR``,
whose ``summary.json`` gives ``wall_s`` and ``env_steps``), and ``perf/ppo_minimal.py`` with the
same hyperparameters and the same stop rule (10-episode deterministic eval every 5 updates >=
475). Goal: Nitro's median wall time within 1.5x of the minimal loop's.

    python perf/cartpole_time.py             # 3 seeds
    python perf/cartpole_time.py --quick     # 1 seed
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import common as c

GOAL = 1.5
PLAN = c.ROOT / "plans" / "cartpole.toml"


def run_nitro(seed: int, out: Path, timeout: float, plan: Path = PLAN) -> dict[str, Any]:
    cmd = [c.PY, "-m", "kernel", "run", str(plan), "--set", f"run.seed={seed}",
           "--out", str(out)]
    proc = c.run(cmd, timeout=timeout)
    summary_path = out / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(f"nitro seed {seed}: no summary.json (rc={proc.rc}):\n"
                           f"{proc.stderr[-2000:]}")
    s = json.loads(summary_path.read_text())
    return {
        "impl": "nitro", "seed": seed, "rc": proc.rc, "stop_reason": s["stop_reason"],
        "reached": s["stop_reason"] == "target_return",
        "wall_s": s["wall_s"], "process_s": proc.process_s, "env_steps": s["env_steps"],
        "sps": s["env_steps"] / s["wall_s"] if s["wall_s"] else None,
        "final_eval_return": s["final_eval_return"], "rounds": s["rounds"],
        "command": " ".join(cmd),
    }


def run_minimal(seed: int, timeout: float, threads: int) -> dict[str, Any]:
    cmd = [c.PY, str(c.PERF / "ppo_minimal.py"), "--seed", str(seed), "--threads", str(threads)]
    proc = c.run(cmd, timeout=timeout)
    r = proc.last_json()
    return {
        "impl": "ppo_minimal", "seed": seed, "rc": proc.rc,
        "stop_reason": "target_return" if r["reached"] else "max_env_steps",
        "reached": r["reached"], "wall_s": r["wall_s"], "process_s": proc.process_s,
        "env_steps": r["env_steps"], "sps": r["sps"], "final_eval_return": r["final_eval_return"],
        "rounds": r["updates"], "command": " ".join(cmd),
    }


def summarise(rows: list[dict[str, Any]], impl: str) -> dict[str, Any]:
    mine = [r for r in rows if r["impl"] == impl]
    keys = ("wall_s", "process_s", "env_steps", "sps")
    return {
        "seeds": len(mine), "reached": sum(r["reached"] for r in mine),
        **{f"median_{k}": c.median([r[k] for r in mine]) for k in keys},
        **{f"range_{k}": c.span([r[k] for r in mine]) for k in keys},
    }


def report(rows: list[dict[str, Any]], load_note: str) -> tuple[str, dict[str, Any]]:
    nitro, base = summarise(rows, "nitro"), summarise(rows, "ppo_minimal")
    ratios = {
        "wall_s": c.ratio(nitro["median_wall_s"], base["median_wall_s"]),
        "process_s": c.ratio(nitro["median_process_s"], base["median_process_s"]),
        "env_steps": c.ratio(nitro["median_env_steps"], base["median_env_steps"]),
        "sps": c.ratio(nitro["median_sps"], base["median_sps"]),
    }
    per_seed = c.md_table(
        ["impl", "seed", "reached", "env steps", "wall s (run)", "wall s (process)",
         "steps/s", "final eval"],
        [[r["impl"], r["seed"], r["reached"], r["env_steps"], r["wall_s"], r["process_s"],
          r["sps"], r["final_eval_return"]] for r in rows])
    summary = c.md_table(
        ["", "Nitro (median, range)", "minimal PPO (median, range)", "Nitro / minimal"],
        [[label, f"{c.fmt(nitro['median_' + k])} ({c.fmt(nitro['range_' + k])})",
          f"{c.fmt(base['median_' + k])} ({c.fmt(base['range_' + k])})", ratios[k]]
         for label, k in (("wall s to 475 (run)", "wall_s"),
                          ("wall s (whole process)", "process_s"),
                          ("env steps to 475", "env_steps"), ("env steps/s", "sps"))])
    verdict = ("met" if ratios["wall_s"] is not None and ratios["wall_s"] <= GOAL else "NOT met")
    md = (f"{summary}\n\nGoal: Nitro's median wall time to 475 within {GOAL}x of the minimal "
          f"loop's: ratio {c.fmt(ratios['wall_s'])} — **{verdict}**. Steps to 475 vary a lot "
          f"between seeds, so also compare steps/s.{load_note}\n\n<details><summary>per seed"
          f"</summary>\n\n{per_seed}\n\n</details>")
    return md, {"nitro": nitro, "ppo_minimal": base, "ratios": ratios, "goal": GOAL,
                "goal_met": verdict == "met"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--baseline-threads", type=int, default=1,
                        help="torch threads of the minimal loop (0: torch's default). 1 by "
                             "default: for a 64x64 net per-step inference on 2 threads is much "
                             "slower on a busy 2-core machine, and the bar should be the "
                             "stronger loop")
    parser.add_argument("--note", default="", help="a remark saved with the result")
    args = parser.parse_args()
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nitro-cartpole-time-") as tmp:
        for seed in seeds:
            c.log(f"nitro seed {seed}")
            rows.append(run_nitro(seed, Path(tmp) / f"nitro-{seed}", args.timeout))
            c.log(f"  {rows[-1]['wall_s']:.1f} s, {rows[-1]['env_steps']} steps")
            c.log(f"ppo_minimal seed {seed}")
            rows.append(run_minimal(seed, args.timeout, args.baseline_threads))
            c.log(f"  {rows[-1]['wall_s']:.1f} s, {rows[-1]['env_steps']} steps")
    note = f" {args.note}" if args.note else ""
    md, stats = report(rows, note + f" Minimal loop: torch threads = "
                       f"{args.baseline_threads or 'default'}.")
    print(md)
    c.write_result("cartpole_time", {
        "title": "CartPole-v1 to 475: Nitro vs a minimal PPO loop (issue 2a)",
        "quick": args.quick, "seeds": seeds, "rows": rows, "markdown": md, **stats,
        "versions": c.versions(), "note": args.note, "baseline_threads": args.baseline_threads,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
