"""Issue 8: Nitro against Stable-Baselines3 and Ray RLlib PPO on the same tasks, same machine.

Tasks (medians and ranges over seeds): CartPole-v1 to a 10-episode deterministic eval mean
of 475 (wall time, env steps; 5 seeds), and Hopper-v5 (3 seeds) for 300k env steps (wall time without evaluation,
env steps/s, final 10-episode deterministic return). Nitro runs through its CLI with
``plans/cartpole.toml`` and ``plans/hopper.toml`` (``stop.max_env_steps`` set to the budget);
each peer runs in its own venv (``perf/peers/setup.sh``) through ``perf/peers/<peer>_run.py``
(SB3 twice: with its defaults and with one torch thread).
Runs alternate between implementations seed by seed so background load hits all alike. The
table goes into ``perf/results/compare_peers.json`` and ``perf/RESULTS.md``.

    python perf/compare_peers.py                    # the full comparison (about an hour here)
    python perf/compare_peers.py --quick            # 1 seed, Hopper 20k steps: a smoke run
    python perf/compare_peers.py --tasks cartpole --impls nitro sb3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import common as c
from cartpole_time import run_nitro as run_nitro_cartpole

PEERS = c.PERF / "peers"
PEER_PY = {"sb3": PEERS / ".venv-sb3" / "bin" / "python",
           "sb3_1t": PEERS / ".venv-sb3" / "bin" / "python",
           "rllib": PEERS / ".venv-rllib" / "bin" / "python"}
#: ``sb3`` runs with the library's defaults (torch takes every core for its intra-op threads);
#: ``sb3_1t`` is SB3 with one torch thread, the setting Nitro's learner picks for small MLPs —
#: the fairer opponent where 2 threads on tiny minibatches only add contention.
IMPLS = ("nitro", "sb3", "sb3_1t", "rllib")
PEER_SCRIPT = {"sb3": "sb3_run.py", "sb3_1t": "sb3_run.py", "rllib": "rllib_run.py"}
PEER_ARGS = {"sb3_1t": ["--threads", "1"]}
HOPPER_PLAN = c.ROOT / "plans" / "hopper.toml"
#: Used when plans/hopper.toml is missing: the same settings the peers use.
HOPPER_FALLBACK = {
    "run": {"name": "hopper", "seed": 1}, "stop": {"max_env_steps": 300_000},
    "env": {"id": "Hopper-v5", "num_envs": 4, "normalize_obs": True, "normalize_reward": True},
    "algo": {"name": "ppo", "learning_rate": 3e-4, "update_epochs": 10, "num_minibatches": 32,
             "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2, "ent_coef": 0.0,
             "vf_coef": 0.5, "max_grad_norm": 0.5},
    "actors": {"backend": "local", "count": 2, "steps": 256},
    "transport": {"kind": "memory"}, "scaler": {"name": "fixed"},
    "probes": [{"name": "eval", "every": 20, "episodes": 10}], "sinks": [],
}


def hopper_plan(tmp: Path) -> Path:
    if HOPPER_PLAN.exists():
        return HOPPER_PLAN
    import tomli_w

    path = tmp / "hopper.toml"
    path.write_text(tomli_w.dumps(HOPPER_FALLBACK), encoding="utf-8")
    return path


def final_round(plan: Path, steps: int) -> int:
    """The round that reaches ``steps``: where Nitro evaluates, once, as the peers do."""
    import math
    import tomllib

    p = tomllib.loads(plan.read_text(encoding="utf-8"))
    per_round = p["actors"]["count"] * p["env"]["num_envs"] * p["actors"]["steps"]
    return math.ceil(steps / per_round)


def run_nitro_hopper(seed: int, steps: int, out: Path, plan: Path, timeout: float
                     ) -> dict[str, Any]:
    # One evaluation, after the last update (no fan-out overlaps it, so its time subtracts
    # exactly): the peers also evaluate once, after training, outside their clock.
    last = final_round(plan, steps)
    cmd = [c.PY, "-m", "kernel", "run", str(plan), "--set", f"run.seed={seed}",
           "--set", f"stop.max_env_steps={steps}", "--out", str(out),
           "--set", f'probes=[{{name="eval",every={last},episodes=10}}]']
    proc = c.run(cmd, timeout=timeout)
    if not (out / "summary.json").exists():
        raise RuntimeError(f"nitro hopper seed {seed} (rc={proc.rc}):\n{proc.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e.get("event") == "ProbeMeasured" and e.get("probe") == "eval"]
    eval_s = sum(e["probe_s"] for e in evals)
    train_s = s["wall_s"] - eval_s  # peers evaluate once after training, outside their clock
    return {"impl": "nitro", "seed": seed, "rc": proc.rc, "env_steps": s["env_steps"],
            "wall_s": train_s, "wall_with_eval_s": s["wall_s"], "eval_s": eval_s,
            "process_s": proc.process_s, "sps": s["env_steps"] / train_s,
            "final_eval_return": s["final_eval_return"],
            "eval_at_round": evals[-1]["round"] if evals else None, "rounds": s["rounds"],
            "command": " ".join(cmd)}


def run_peer(impl: str, task: str, seed: int, timeout: float, steps: int | None
             ) -> dict[str, Any]:
    cmd = [str(PEER_PY[impl]), str(PEERS / PEER_SCRIPT[impl]), "--task", task,
           "--seed", str(seed), *PEER_ARGS.get(impl, [])]
    if steps:
        cmd += ["--total-timesteps", str(steps)]
    proc = c.run(cmd, timeout=timeout)
    r = proc.last_json()
    r.update(impl=impl, rc=proc.rc, process_s=proc.process_s, command=" ".join(cmd))
    return r


def run_one(impl: str, task: str, seed: int, args: argparse.Namespace, tmp: Path
            ) -> dict[str, Any]:
    try:
        if impl == "nitro" and task == "cartpole":
            return run_nitro_cartpole(seed, tmp / f"nitro-cp-{seed}", args.timeout)
        if impl == "nitro":
            return run_nitro_hopper(seed, args.hopper_steps, tmp / f"nitro-hop-{seed}",
                                    hopper_plan(tmp), args.timeout)
        return run_peer(impl, task, seed, args.timeout,
                        args.hopper_steps if task == "hopper" else None)
    except Exception as exc:  # one failed run is a row in the table, not the end of the study
        return {"impl": impl, "seed": seed, "error": f"{type(exc).__name__}: {exc}"[-1500:]}


METRICS = {
    "cartpole": [("wall s to 475", "wall_s", "lower"), ("process s to 475", "process_s", "lower"),
                 ("env steps to 475", "env_steps", "lower"),
                 ("reached 475 (seeds)", "reached", "higher")],
    "hopper": [("wall s, training", "wall_s", "lower"), ("process s", "process_s", "lower"),
               ("env steps/s", "sps", "higher"), ("final eval return", "final_eval_return",
                                                  "higher")],
}


def table(results: dict[str, dict[str, list[dict[str, Any]]]], impls: list[str]
          ) -> tuple[str, dict[str, Any]]:
    peers = [i for i in impls if i != "nitro"]
    headers = ["task", "measure", *[f"{i} median (range)" for i in impls],
               *[f"nitro / {p}" for p in peers]]
    rows, ratios = [], {}
    for task, by_impl in results.items():
        for label, key, _better in METRICS[task]:
            row: list[Any] = [task, label]
            med: dict[str, Any] = {}
            for impl in impls:
                ok = [r for r in by_impl.get(impl, []) if "error" not in r]
                if key == "reached":
                    med[impl] = sum(bool(r.get("reached")) for r in ok)
                    row.append(f"{med[impl]}/{len(by_impl.get(impl, []))}")
                    continue
                vals = [r.get(key) for r in ok]
                med[impl] = c.median(vals)
                row.append(f"{c.fmt(med[impl])} ({c.fmt(c.span(vals))})")
            for p in peers:
                rt = None if key == "reached" else c.ratio(med.get("nitro"), med.get(p))
                ratios[f"{task}.{key}.nitro/{p}"] = rt
                row.append(rt)
            rows.append(row)
    md = c.md_table(headers, rows)
    errors = [f"- {task} {r['impl']} seed {r['seed']}: `{r['error'].splitlines()[-1]}`"
              for task, by_impl in results.items() for runs in by_impl.values() for r in runs
              if "error" in r]
    if errors:
        md += "\n\nFailed runs:\n" + "\n".join(errors)
    return md, ratios


def merged(results: dict[str, dict[str, list[dict[str, Any]]]], impls: list[str],
           seeds_for: dict[str, list[int]]) -> tuple[dict, list[str], dict[str, list[int]]]:
    """This run's runs over the stored ones, seed by seed: more seeds for some libraries, or
    Nitro rerun after a change while the peers' runs stand (each run keeps its command)."""
    path = c.RESULTS / "compare_peers.json"
    if not path.exists():
        return results, impls, seeds_for
    stored = json.loads(path.read_text(encoding="utf-8"))
    out = {task: dict(cells) for task, cells in stored["results"].items()}
    seeds = {task: list(v) for task, v in stored.get("seeds", {}).items()}
    for task, cells in results.items():
        for impl, runs in cells.items():
            rerun = {r["seed"] for r in runs}
            kept = [r for r in out.setdefault(task, {}).get(impl, []) if r["seed"] not in rerun]
            out[task][impl] = sorted(kept + runs, key=lambda r: r["seed"])
        seeds[task] = sorted(set(seeds.get(task, [])) | set(seeds_for[task]))
    order = [i for i in IMPLS if any(i in cells for cells in out.values())]
    return out, order, seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, Hopper 20k steps")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="Hopper seeds (default 1 2 3; 1 with --quick)")
    parser.add_argument("--cartpole-seeds", type=int, nargs="+", default=None,
                        help="CartPole seeds (default 1-5: steps to 475 vary 4x by seed)")
    parser.add_argument("--tasks", nargs="+", choices=sorted(METRICS),
                        default=["cartpole", "hopper"])
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--hopper-steps", type=int, default=None,
                        help="Hopper budget (default 300k; 20,480 with --quick)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    parser.add_argument("--note", default="", help="a remark saved with the result")
    parser.add_argument("--merge", action="store_true",
                        help="keep the stored runs (perf/results/compare_peers.json) of the "
                             "tasks, implementations and seeds this run does not repeat")
    args = parser.parse_args()
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
    seeds_for = {"hopper": seeds,
                 "cartpole": args.cartpole_seeds or ([1] if args.quick else [1, 2, 3, 4, 5])}
    args.hopper_steps = args.hopper_steps or (20_480 if args.quick else 300_000)
    impls = []
    for impl in args.impls:
        if impl != "nitro" and not PEER_PY[impl].exists():
            c.log(f"{impl}: no venv at {PEER_PY[impl].parent.parent} (run perf/peers/setup.sh);"
                  " skipped")
            continue
        impls.append(impl)

    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="nitro-peers-") as tmp:
        for task in args.tasks:
            results[task] = {i: [] for i in impls}
            for seed in seeds_for[task]:
                for impl in impls:
                    c.log(f"{task} {impl} seed {seed}")
                    r = run_one(impl, task, seed, args, Path(tmp))
                    results[task][impl].append(r)
                    c.log("  " + (r["error"].splitlines()[-1] if "error" in r else
                                  f"{r['wall_s']:.1f} s, {r['env_steps']} steps, "
                                  f"return {r.get('final_eval_return')}"))
    if args.merge:
        results, impls, seeds_for = merged(results, impls, seeds_for)
    md, ratios = table(results, impls)
    note = f"\n\n{args.note}" if args.note else ""
    if args.merge:
        md += "\n\nRuns per implementation (merged with stored runs): " + "; ".join(
            f"{task} {impl} seeds {[r['seed'] for r in runs]}"
            for task, cells in results.items() for impl, runs in cells.items()) + "."
    md += (f"\n\nHopper budget {args.hopper_steps:,} env steps; Hopper seeds "
           f"{seeds_for['hopper']}, CartPole seeds {seeds_for['cartpole']}. `sb3` is SB3 with its defaults (torch's intra-op "
           "threads on every core), `sb3_1t` the same with one torch thread. Goal (issue 8): "
           "Nitro at least 2x faster in wall time than SB3 (ratio <= 0.5) and ahead of RLlib "
           "(ratio < 1), with equal or better returns. Settings and every difference between "
           f"the libraries: `perf/peers/README.md`.{note}")
    print(md)
    versions = {"nitro": c.versions()}
    for impl in impls:
        if impl != "nitro":
            versions[impl] = c.versions(str(PEER_PY[impl]), (
                "torch", "gymnasium", "mujoco", "ray" if impl == "rllib" else "stable-baselines3"))
    c.write_result("compare_peers", {
        "title": "Nitro vs Stable-Baselines3 vs RLlib: PPO on CartPole and Hopper (issue 8)",
        "quick": args.quick, "seeds": seeds_for, "hopper_steps": args.hopper_steps,
        "results": results, "ratios": ratios, "markdown": md,
        "versions": {f"{k}:{p}": v for k, vs in versions.items() for p, v in vs.items()},
        "note": args.note,
    })
    from run_all import write_results

    write_results({})
    return 0


if __name__ == "__main__":
    sys.exit(main())
