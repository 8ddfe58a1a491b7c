"""Issue 2 (a): time for ``plans/cartpole.toml`` to reach 475 against a minimal PPO loop.

Both sides run as subprocesses, seed by seed, alternating (so background load hits both alike):
Nitro through its CLI (``python -m kernel run plans/cartpole.toml --set run.seed=S --out DIR``,
whose ``summary.json`` gives the run's own clock and env steps), and ``perf/ppo_minimal.py``
with the same hyperparameters and the same stop rule (10-episode deterministic eval every 5
updates >= 475). Each row also keeps the whole process's time, from spawn to exit, imports and
start-up included: what a user waits for, and the headline here, since the two run clocks
start at different points (Nitro's once its worker pool is up). Steps to 475 spread several
fold between seeds, so the default is 10 seeds, medians carry 95% bootstrap intervals over
seeds, and a ratio is only shown over the same seeds on both sides. Goal: Nitro's median time
to 475 within 1.5x of the minimal loop's.

    python perf/cartpole_time.py             # 10 seeds
    python perf/cartpole_time.py --quick     # 2 seeds
    python perf/cartpole_time.py --render    # print the table of the stored rows
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
#: Seeds below which the verdict is flagged as resting on seed luck.
MIN_SEEDS = 10
PLAN = c.ROOT / "plans" / "cartpole.toml"
IMPLS = ("nitro", "ppo_minimal")
#: (label, row key): the headline first.
MEASURES = [("process s to 475 (whole process, headline)", "process_s"),
            ("run s to 475 (each side's own clock)", "wall_s"),
            ("env steps to 475", "env_steps"), ("env steps/s (run clock)", "sps")]


def eval_seconds(out: Path) -> float | None:
    """Seconds Nitro's eval probes took (from the run's events), None without events."""
    path = out / "events.jsonl"
    if not path.exists():
        return None
    events = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return sum(e.get("probe_s", 0.0) for e in events
               if e.get("event") == "ProbeMeasured" and e.get("probe") == "eval")


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
        "eval_s": eval_seconds(out), "command": " ".join(cmd),
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
        "rounds": r["updates"], "eval_s": r.get("eval_s"), "command": " ".join(cmd),
    }


def impl_rows(rows: list[dict[str, Any]], impl: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["impl"] == impl]


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Nitro / minimal of the medians, per measure, over the same seeds (None if they differ)."""
    nitro, base = impl_rows(rows, "nitro"), impl_rows(rows, "ppo_minimal")
    return {key: c.seed_ratio(nitro, base, key)[0] for _, key in MEASURES}


def render(data: dict[str, Any]) -> str:
    """The section's Markdown, from the stored per-seed rows only."""
    rows = data["rows"]
    nitro, base = impl_rows(rows, "nitro"), impl_rows(rows, "ppo_minimal")
    table = []
    for label, key in MEASURES:
        _, cell = c.ratio_text(nitro, base, key, ("nitro", "ppo_minimal"))
        table.append([label, c.with_interval([r.get(key) for r in c.ok_rows(nitro)]),
                      c.with_interval([r.get(key) for r in c.ok_rows(base)]), cell])
    table.append(["reached 475 (seeds)",
                  f"{sum(bool(r.get('reached')) for r in nitro)}/{len(nitro)}",
                  f"{sum(bool(r.get('reached')) for r in base)}/{len(base)}", "—"])
    summary = c.md_table(["", "Nitro: median [95% interval]", "minimal PPO: median [95% interval]",
                          "Nitro / minimal [95% interval]"], table)
    headline, reason = c.seed_ratio(nitro, base, "process_s", ("nitro", "ppo_minimal"))
    run_ratio, _ = c.seed_ratio(nitro, base, "wall_s", ("nitro", "ppo_minimal"))
    verdict = ("not judged: " + reason if reason else "met" if headline <= GOAL else "NOT met")
    per_seed = c.md_table(
        ["impl", "seed", "reached", "env steps", "run s", "process s", "eval s", "steps/s",
         "final eval"],
        [[r["impl"], r["seed"], r.get("reached"), r.get("env_steps"), r.get("wall_s"),
          r.get("process_s"), r.get("eval_s"), r.get("sps"),
          r.get("final_eval_return", r.get("error"))] for r in rows])
    seeds = sorted({r["seed"] for r in rows})
    few = (f" **Only {len(seeds)} seed{'s' if len(seeds) != 1 else ''}**: fewer than the {MIN_SEEDS} this verdict needs (the "
           "time to 475 spreads several fold between seeds); re-measure with "
           "`python perf/cartpole_time.py`." if len(seeds) < MIN_SEEDS else "")
    threads = data.get("baseline_threads")
    note = f" {data['note']}" if data.get("note") else ""
    return (
        f"{summary}\n\nSeeds {c.seed_list(seeds)}.{few} Intervals are 95% "
        "percentile bootstraps over seeds (ratios resample the seeds in pairs). Goal: Nitro's "
        f"median time to 475 within {GOAL}x of the minimal loop's, whole process: ratio "
        f"{c.fmt(headline)} — **{verdict}** (on each side's own run clock: "
        f"{c.fmt(run_ratio)}; Nitro's starts once its worker pool is up). Minimal loop: torch "
        f"threads = {threads or 'default'}.{note}\n\n<details><summary>per seed</summary>\n\n"
        f"{per_seed}\n\n</details>")


def run_one(impl: str, seed: int, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run as a row; a failed run is a row with ``error``, not the end of the study."""
    try:
        if impl == "nitro":
            return run_nitro(seed, tmp / f"nitro-{seed}", args.timeout)
        return run_minimal(seed, args.timeout, args.baseline_threads)
    except Exception as exc:
        return {"impl": impl, "seed": seed, "error": f"{type(exc).__name__}: {exc}"[-1500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="default 1-10 (1-2 with --quick)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--baseline-threads", type=int, default=1,
                        help="torch threads of the minimal loop (0: torch's default). 1 by "
                             "default: for a 64x64 net per-step inference on 2 threads is much "
                             "slower on a busy 2-core machine, and the bar should be the "
                             "stronger loop")
    parser.add_argument("--note", default="", help="a remark saved with the result")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: print the table of the stored rows")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads((c.RESULTS / "cartpole_time.json").read_text())))
        return 0
    seeds = args.seeds or ([1, 2] if args.quick else list(range(1, 11)))

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nitro-cartpole-time-") as tmp:
        for seed in seeds:
            for impl in IMPLS:
                c.log(f"{impl} seed {seed}")
                rows.append(run_one(impl, seed, Path(tmp), args))
                r = rows[-1]
                c.log("  " + (r["error"].splitlines()[-1] if "error" in r else
                              f"{r['process_s']:.1f} s process, {r['env_steps']} steps"))
    data = {"title": "CartPole-v1 to 475: Nitro vs a minimal PPO loop (issue 2a)",
            "quick": args.quick, "seeds": seeds, "rows": rows, "ratios": ratios(rows),
            "goal": GOAL, "note": args.note, "baseline_threads": args.baseline_threads}
    print(render(data))
    c.write_result("cartpole_time", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
