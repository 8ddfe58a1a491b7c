"""Issue 2 (b): env steps per second of the local actor backend against raw env stepping.

Nitro side: a real run (CLI, local backend, the real handler with policy inference) of Hopper-v5,
2 actors x 8 envs x 512 steps per round, fixed scaler, no probes. From ``events.jsonl`` the
actors' rate is the sum of ``InvocationFinished.env_steps`` over the sum of ``duration_ms``
(one actor's steps per second of its own time, i.e. per core), plus the whole run's env steps
over its wall time (learner included). Baseline: a ``SyncVectorEnv`` of 8 Hopper-v5 stepped with
random actions in one process (one core), measured just before and just after the Nitro run and
averaged, and the same with as many raw processes at once as there are actors (the actors'
contention for cores). Goal: actor steps/s >= 0.8 x raw under the same contention.

    python perf/local_sps.py            # 6 rounds
    python perf/local_sps.py --quick    # 3 rounds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common as c

GOAL = 0.8
ENV_ID = "Hopper-v5"


def raw_sps(env_id: str, num_envs: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """Random-action stepping of an in-process vector env, built the way Nitro's actors build
    theirs (SAME_STEP autoreset, ``copy=False``), timed after the first reset."""
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs, copy=False,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    n = max(1, steps // num_envs)
    t0 = time.perf_counter()
    for _ in range(n):
        envs.step(envs.action_space.sample())
    dt = time.perf_counter() - t0
    envs.close()
    return {"env_steps": n * num_envs, "seconds": dt, "sps": n * num_envs / dt}


def write_plan(path: Path, rounds: int, actors: int, num_envs: int, steps: int) -> None:
    import tomli_w

    plan = {
        "run": {"name": "local-sps", "seed": 1},
        "stop": {"max_rounds": rounds},
        "env": {"id": ENV_ID, "num_envs": num_envs, "normalize_obs": True,
                "normalize_reward": True},
        "algo": {"name": "ppo", "learning_rate": 3e-4},
        "actors": {"backend": "local", "count": actors, "steps": steps},
        "transport": {"kind": "memory"},
        "scaler": {"name": "fixed"},
        "probes": [],
        "sinks": [],
    }
    path.write_text(tomli_w.dumps(plan), encoding="utf-8")


def run_nitro(plan: Path, out: Path, timeout: float) -> dict[str, Any]:
    cmd = [c.PY, "-m", "kernel", "run", str(plan), "--out", str(out)]
    proc = c.run(cmd, timeout=timeout)
    if not (out / "summary.json").exists():
        raise RuntimeError(f"nitro run failed (rc={proc.rc}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    inv = [e for e in map(json.loads, (out / "events.jsonl").read_text().splitlines())
           if e.get("event") == "InvocationFinished" and e.get("ok")]
    warm = [e for e in inv if not e.get("cold_start")]

    def rate(items: list[dict[str, Any]]) -> float | None:
        ms = sum(e["duration_ms"] for e in items)
        return sum(e["env_steps"] for e in items) / (ms / 1000) if ms else None

    rounds = [e for e in map(json.loads, (out / "events.jsonl").read_text().splitlines())
              if e.get("event") == "RoundFinished"]
    return {
        "rc": proc.rc, "process_s": proc.process_s, "stop_reason": summary["stop_reason"],
        "rounds": summary["rounds"], "env_steps": summary["env_steps"],
        "wall_s": summary["wall_s"], "run_sps": summary["env_steps"] / summary["wall_s"],
        "invocations": len(inv), "cold_starts": len(inv) - len(warm),
        "actor_sps": rate(inv), "actor_sps_warm": rate(warm),
        "actor_s": sum(r.get("actor_s", 0.0) for r in rounds),
        "learner_s": sum(r.get("learner_s", 0.0) for r in rounds),
        "command": " ".join(cmd),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--note", default="", help="a remark saved with the result")
    parser.add_argument("--raw-only", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_only:  # the baseline, in its own process like the actors
        print(json.dumps(raw_sps(ENV_ID, args.num_envs, args.raw_only)))
        return 0
    rounds = args.rounds or (3 if args.quick else 6)
    raw_steps = args.num_envs * args.steps * max(2, rounds)

    raw_cmd = [c.PY, __file__, "--raw-only", str(raw_steps), "--num-envs", str(args.num_envs)]

    def raw() -> dict[str, Any]:
        return c.run(raw_cmd, timeout=args.timeout).last_json()

    def raw_concurrent(n: int) -> list[float]:
        """Per-process rates of n raw processes at once: the same core contention as n actors."""
        procs = [subprocess.Popen(raw_cmd, cwd=c.ROOT, stdout=subprocess.PIPE, text=True)
                 for _ in range(n)]
        return [json.loads(p.communicate(timeout=args.timeout)[0].strip().splitlines()[-1])
                ["sps"] for p in procs]

    c.log(f"raw SyncVectorEnv x{args.num_envs}, {raw_steps} steps (before)")
    before = raw()
    with tempfile.TemporaryDirectory(prefix="nitro-local-sps-") as tmp:
        plan = Path(tmp) / "plan.toml"
        write_plan(plan, rounds, args.actors, args.num_envs, args.steps)
        c.log(f"nitro: {args.actors} actors x {args.num_envs} envs x {args.steps} steps, "
              f"{rounds} rounds")
        nitro = run_nitro(plan, Path(tmp) / "run", args.timeout)
    c.log("raw (after)")
    after = raw()
    c.log(f"raw, {args.actors} processes at once")
    raw_rates = raw_concurrent(args.actors)
    raw_conc = sum(raw_rates) / len(raw_rates)
    raw_mean = (before["sps"] + after["sps"]) / 2
    ratios = {
        "actor_sps": c.ratio(nitro["actor_sps"], raw_mean),
        "actor_sps_warm": c.ratio(nitro["actor_sps_warm"], raw_mean),
        "run_sps": c.ratio(nitro["run_sps"], raw_mean),
        "actor_sps_vs_concurrent_raw": c.ratio(nitro["actor_sps"], raw_conc),
    }
    table = c.md_table(
        ["measure", "env steps/s", "/ raw"],
        [["raw SyncVectorEnv x8, random actions (mean of before/after)", raw_mean, 1.0],
         ["  before / after", f"{c.fmt(before['sps'])} / {c.fmt(after['sps'])}", None],
         [f"raw, per process, {args.actors} processes at once (same contention as the actors)",
          raw_conc, c.ratio(raw_conc, raw_mean)],
         [f"Nitro actor (env steps / invocation time, {nitro['invocations']} invocations)",
          nitro["actor_sps"], ratios["actor_sps"]],
         ["Nitro actor, warm invocations only", nitro["actor_sps_warm"],
          ratios["actor_sps_warm"]],
         ["Nitro actor / raw with the same contention", None,
          ratios["actor_sps_vs_concurrent_raw"]],
         [f"Nitro whole run ({nitro['env_steps']} steps / {c.fmt(nitro['wall_s'])} s wall, "
          f"{args.actors} actors + learner)", nitro["run_sps"], ratios["run_sps"]]])
    # The goal uses the same-contention baseline: on a quiet machine it equals the one-process
    # rate, and on a busy one it does not blame the actors for cores other jobs took.
    goal_ratio = ratios["actor_sps_vs_concurrent_raw"]
    verdict = "met" if (goal_ratio or 0) >= GOAL else "NOT met"
    note = f" {args.note}" if args.note else ""
    md = (f"{table}\n\nGoal: actor env steps/s >= {GOAL} x raw stepping under the same "
          f"contention ({args.actors} raw processes at once): ratio {c.fmt(goal_ratio)} — "
          f"**{verdict}** (against one raw process alone: {c.fmt(ratios['actor_sps'])}). Each "
          f"actor and each raw process steps on one core, so these are per-core rates; on a "
          f"quiet machine both baselines agree. The whole-run rate adds the "
          f"learner (actor time {c.fmt(nitro['actor_s'])} s, learner time "
          f"{c.fmt(nitro['learner_s'])} s).{note}")
    print(md)
    c.write_result("local_sps", {
        "title": f"Local actor backend env steps/s on {ENV_ID} vs raw SyncVectorEnv (issue 2b)",
        "quick": args.quick, "raw_before": before, "raw_after": after, "raw_sps": raw_mean,
        "raw_concurrent_sps": raw_conc,
        "nitro": nitro, "ratios": ratios, "goal": GOAL, "goal_ratio": goal_ratio,
        "goal_met": verdict == "met", "markdown": md, "note": args.note,
        # every measurement as made, so each figure above can be recomputed
        "rows": [{"measure": "raw_before", **before}, {"measure": "raw_after", **after},
                 *({"measure": "raw_concurrent", "process": i, "sps": r}
                   for i, r in enumerate(raw_rates, 1)), {"measure": "nitro", **nitro}],
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
