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
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import common as c
import numpy as np
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
    md += returns_comparison(results, impls)
    errors = [f"- {task} {r['impl']} seed {r['seed']}: `{r['error'].splitlines()[-1]}`"
              for task, by_impl in results.items() for runs in by_impl.values() for r in runs
              if "error" in r]
    if errors:
        md += "\n\nFailed runs:\n" + "\n".join(errors)
    return md, ratios


def mean_difference(ours: list[float], theirs: list[float], draws: int = 20_000,
                    seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``ours`` minus mean of ``theirs`` and a 95% percentile-bootstrap interval.

    Hopper's final return at 300k steps spreads ~3x between seeds of one library, so a ratio of
    medians cannot say whether one library learns worse; the interval says whether the seeds
    measured can tell the difference from zero (resampling seeds, each side separately).
    """
    rng = np.random.default_rng(seed)
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    boot = (rng.choice(a, (draws, a.size)).mean(axis=1)
            - rng.choice(b, (draws, b.size)).mean(axis=1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(a.mean() - b.mean()), float(lo), float(hi)


def returns_comparison(results: dict[str, dict[str, list[dict[str, Any]]]], impls: list[str]
                       ) -> str:
    """One line per peer: Nitro's mean final Hopper return against the peer's, with the
    bootstrap interval of the difference, and what that allows us to say."""
    runs = results.get("hopper", {})

    def returns(impl: str) -> list[float]:
        return [r["final_eval_return"] for r in runs.get(impl, [])
                if "error" not in r and r.get("final_eval_return") is not None]

    ours = returns("nitro")
    lines = []
    for peer in (i for i in impls if i != "nitro"):
        theirs = returns(peer)
        if len(ours) < 2 or len(theirs) < 2:
            continue
        diff, lo, hi = mean_difference(ours, theirs)
        verdict = ("Nitro higher" if lo > 0 else "Nitro lower" if hi < 0
                   else "not distinguishable from zero")
        lines.append(f"- nitro − {peer}: {diff:+,.0f} (95% interval {lo:+,.0f} to {hi:+,.0f}; "
                     f"means {np.mean(ours):,.0f} over {len(ours)} seeds vs "
                     f"{np.mean(theirs):,.0f} over {len(theirs)}): {verdict}")
    if not lines:
        return ""
    return ("\n\nHopper final eval return, difference of the means (bootstrap over seeds):\n"
            + "\n".join(lines))


def impl_versions(impls: list[str]) -> dict[str, str | None]:
    """``impl:package`` -> version, of the interpreter each implementation runs in."""
    out = {f"nitro:{p}": v for p, v in c.versions().items()}
    for impl in impls:
        if impl != "nitro":
            packages = ("torch", "gymnasium", "mujoco",
                        "ray" if impl == "rllib" else "stable-baselines3")
            out |= {f"{impl}:{p}": v
                    for p, v in c.versions(str(PEER_PY[impl]), packages).items()}
    return out


def unmergeable(stored: dict[str, Any], machine: dict[str, Any],
                versions: dict[str, str | None]) -> str | None:
    """Why runs measured now must not share a table with the stored ones (None: they may).

    Wall times from another CPU, or from other library versions, are different numbers."""
    then = stored.get("machine", {})
    for key in ("cpu", "cores"):
        if then.get(key) != machine.get(key):
            return f"the stored runs were measured on {key} {then.get(key)!r}, this is {machine.get(key)!r}"
    changed = [f"{k} {stored['versions'][k]} -> {v}" for k, v in versions.items()
               if k in stored.get("versions", {}) and stored["versions"][k] != v]
    if changed:
        return "versions differ from the stored runs': " + ", ".join(changed)
    return None


def run_history(stored: dict[str, Any]) -> list[dict[str, Any]]:
    """The commands whose runs make up the stored table, oldest first (results stored before
    the history was kept name only their last command)."""
    if "history" in stored:
        return list(stored["history"])
    return [{"when": stored.get("when"), "command": stored.get("command"),
             "loadavg": stored.get("machine", {}).get("loadavg")}]


def merged(stored: dict[str, Any], results: dict[str, dict[str, list[dict[str, Any]]]],
           seeds_for: dict[str, list[int]]) -> tuple[dict, list[str], dict[str, list[int]]]:
    """This run's runs over the stored ones, seed by seed: more seeds for some libraries, or
    Nitro rerun after a change while the peers' runs stand (each run keeps its command)."""
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
    parser.add_argument("--render", action="store_true",
                        help="run nothing: rewrite the table from the stored runs")
    args = parser.parse_args()
    stored_path = c.RESULTS / "compare_peers.json"
    stored = (json.loads(stored_path.read_text(encoding="utf-8"))
              if (args.merge or args.render) and stored_path.exists() else None)
    if args.render:
        if stored is None:
            parser.error(f"--render: no stored runs at {stored_path}")
        args.merge, args.tasks, args.impls = True, [], []
        args.hopper_steps = args.hopper_steps or stored["hopper_steps"]
        args.note = args.note or stored.get("note", "")
    history = run_history(stored) if stored else []
    if not args.render:
        history.append({"when": c.now(), "command": c.command_line(),
                        "loadavg": [round(x, 2) for x in os.getloadavg()]})
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

    if args.render:
        machine, versions = stored["machine"], stored["versions"]
    else:
        machine, versions = c.machine(), impl_versions(impls)
        if stored is not None:
            why = unmergeable(stored, machine, versions)
            if why:
                parser.error(f"--merge: {why}; run without --merge to start a new table")

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
    if stored is not None:
        results, impls, seeds_for = merged(stored, results, seeds_for)
    md, ratios = table(results, impls)
    note = f"\n\n{args.note}" if args.note else ""
    if args.merge:
        md += "\n\nRuns per implementation (merged with stored runs): " + "; ".join(
            f"{task} {impl} seeds {[r['seed'] for r in runs]}"
            for task, cells in results.items() for impl, runs in cells.items()) + "."
        md += "\n\nRuns merged into this table, in order:\n" + "\n".join(
            f"- {h['when']} (load {h.get('loadavg')}): `{h['command']}`" for h in history)
    md += (f"\n\nHopper budget {args.hopper_steps:,} env steps; Hopper seeds "
           f"{seeds_for['hopper']}, CartPole seeds {seeds_for['cartpole']}. `sb3` is SB3 with its defaults (torch's intra-op "
           "threads on every core), `sb3_1t` the same with one torch thread. Goal (issue 8): "
           "Nitro at least 2x faster in wall time than SB3 (ratio <= 0.5) and ahead of RLlib "
           "(ratio < 1), with equal or better returns. Settings and every difference between "
           f"the libraries: `perf/peers/README.md`.{note}")
    print(md)
    c.write_result("compare_peers", {
        "title": "Nitro vs Stable-Baselines3 vs RLlib: PPO on CartPole and Hopper (issue 8)",
        "quick": args.quick, "seeds": seeds_for, "hopper_steps": args.hopper_steps,
        "results": results, "ratios": ratios, "markdown": md,
        "versions": versions, "machine": machine,
        "note": args.note, "history": history,
        # the table's newest measurement, not the time it was rewritten (--render)
        "when": history[-1]["when"], "command": history[-1]["command"],
    })
    from run_all import write_results

    write_results({})
    return 0


if __name__ == "__main__":
    sys.exit(main())
