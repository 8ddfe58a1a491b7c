"""Issue 8: Nitro against Stable-Baselines3 and Ray RLlib PPO on the same tasks, same machine.

Tasks: CartPole-v1 to a 10-episode deterministic eval mean of 475 (time and env steps; 10
seeds), and Hopper-v5 for 300k env steps (time, env steps/s, final 10-episode deterministic
return; 10 seeds). Nitro runs through its CLI with ``plans/cartpole.toml`` and
``plans/hopper.toml``; each peer runs in its own venv (``perf/peers/setup.sh``) through
``perf/peers/<peer>_run.py``. SB3 runs in the three layouts a user would pick: its defaults
(``sb3``), one torch thread (``sb3_1t``), and ``SubprocVecEnv`` with 2 env processes and one
torch thread (``sb3_subproc``, the layout closest to Nitro's 2 actor processes); the table names
the strongest of them. Every run keeps its whole-process time (spawn to exit) beside the
library's own run clock. Runs alternate between implementations seed by seed so background load
hits all alike. The per-run rows go into ``perf/results/compare_peers.json``; the tables are
rendered from them (``render``), with ratios only over the same seeds on both sides.

    python perf/compare_peers.py                    # the full comparison (hours on 2 cores)
    python perf/compare_peers.py --quick            # 1 seed, Hopper 20k steps: a smoke run
    python perf/compare_peers.py --tasks cartpole --impls nitro sb3_subproc --merge
    python perf/compare_peers.py --render           # print the tables of the stored runs
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

NAME = "compare_peers"
PEERS = c.PERF / "peers"
PEER_PY = {"sb3": PEERS / ".venv-sb3" / "bin" / "python",
           "sb3_1t": PEERS / ".venv-sb3" / "bin" / "python",
           "sb3_subproc": PEERS / ".venv-sb3" / "bin" / "python",
           "rllib": PEERS / ".venv-rllib" / "bin" / "python"}
#: ``sb3`` runs with the library's defaults (torch takes every core for its intra-op threads);
#: ``sb3_1t`` is SB3 with one torch thread, the setting Nitro's learner picks for small MLPs.
#: ``sb3_subproc`` steps its envs in 2 worker processes (``SubprocVecEnv``) beside the learner,
#: as Nitro samples with 2 actor processes: the same process layout on the same cores.
IMPLS = ("nitro", "sb3", "sb3_1t", "sb3_subproc", "rllib")
PEER_SCRIPT = {"sb3": "sb3_run.py", "sb3_1t": "sb3_run.py", "sb3_subproc": "sb3_run.py",
               "rllib": "rllib_run.py"}
PEER_ARGS = {"sb3_1t": ["--threads", "1"],
             "sb3_subproc": ["--threads", "1", "--vec", "subproc", "--procs", "2"]}
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


#: (label, row key, better): per task, the headline (whole process: what a user waits for,
#: and the one clock that starts at the same point for every library) first. ``better`` None:
#: shown per implementation, not divided (evaluation is overhead each library spends its way).
METRICS = {
    "cartpole": [("process s to 475 (headline)", "process_s", "lower"),
                 ("run s to 475 (own clock)", "wall_s", "lower"),
                 ("eval s inside the run", "eval_s", None),
                 ("env steps to 475", "env_steps", "lower")],
    "hopper": [("process s (headline)", "process_s", "lower"),
               ("run s, training (own clock)", "wall_s", "lower"),
               ("env steps/s (run clock)", "sps", "higher"),
               ("final eval return", "final_eval_return", "higher")],
}
TASK_TITLES = {"cartpole": "CartPole-v1 to a 10-episode eval mean of 475",
               "hopper": "Hopper-v5, fixed env-step budget"}
SB3_LAYOUTS = ("sb3", "sb3_1t", "sb3_subproc")
#: What differs from Nitro's settings, printed beside each implementation's numbers.
DIFFERENCES = {
    "nitro": "pipelined rounds; run clock starts once the worker pool is up",
    "sb3": "DummyVecEnv (envs in the learner's process), torch threads = all cores",
    "sb3_1t": "DummyVecEnv, one torch thread",
    "sb3_subproc": "SubprocVecEnv: 2 env processes (one env each, longer fragments, the "
                   "same samples per update), one torch thread",
    "rllib": "own eval runner (algo.evaluate); default init, not orthogonal; Hopper: "
             "observation normalisation only; gymnasium 1.2.2",
}


#: Fewest seeds both sides must share before a ratio is computed on them.
MIN_COMMON_SEEDS = 3


def common_seeds(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Both sides cut to the seeds both finished with a value of ``key``, and a note naming
    those seeds when that dropped any: a ratio is then taken over the same seeds on both sides
    (seed luck cancels) instead of being refused because one side ran more seeds."""
    a, b = c.by_seed(ours, key), c.by_seed(theirs, key)
    shared = set(a) & set(b)
    if len(shared) < MIN_COMMON_SEEDS or shared == set(a) == set(b):
        return ours, theirs, ""
    keep = [r for r in c.ok_rows(ours) if r["seed"] in shared]
    return keep, [r for r in c.ok_rows(theirs) if r["seed"] in shared], \
        f" (seeds {c.seed_list(shared)})"


def paired_ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str,
                 names: tuple[str, str]) -> tuple[float | None, str]:
    """Ratio of medians over the seeds both sides ran, with its paired interval, as a cell."""
    ours, theirs, note = common_seeds(ours, theirs, key)
    value, cell = c.ratio_text(ours, theirs, key, names)
    return value, cell + (note if value is not None else "")


def strongest_sb3(by_impl: dict[str, list[dict[str, Any]]]) -> tuple[str | None, str]:
    """The SB3 layout a user would pick for speed: the one Nitro is slowest against, by the
    ratio of median process times over the seeds both ran (a ratio, not the layout's own
    median, so that layouts run on different seeds are each compared on Nitro's same seeds)."""
    nitro = by_impl.get("nitro", [])
    eligible, left_out = {}, []
    for impl in SB3_LAYOUTS:
        if impl not in by_impl:
            continue
        value, cell = paired_ratio(nitro, by_impl[impl], "process_s", ("nitro", impl))
        if value is not None:
            eligible[impl] = value
        else:
            left_out.append(f"{impl}: {cell}")
    if not eligible:
        return None, "no SB3 layout shares enough seeds with Nitro" + (
            f" ({'; '.join(left_out)})" if left_out else "")
    best = max(eligible, key=lambda i: eligible[i])
    why = (f"{best}, highest Nitro / layout ratio of process s among "
           f"{', '.join(sorted(eligible))}")
    return best, why + (f"; not eligible: {'; '.join(left_out)}" if left_out else "")


def task_tables(task: str, by_impl: dict[str, list[dict[str, Any]]], impls: list[str]) -> str:
    """One task: each implementation's medians with intervals, then Nitro / peer ratios."""
    metrics = METRICS[task]
    rows = []
    for impl in impls:
        runs = by_impl.get(impl, [])
        if not runs:
            continue
        ok = c.ok_rows(runs)
        cells = [impl, c.seed_list(r["seed"] for r in ok) + f" ({len(ok)}/{len(runs)})"]
        if task == "cartpole":
            cells.append(f"{sum(bool(r.get('reached')) for r in ok)}/{len(runs)}")
        cells += [c.with_interval([r.get(key) for r in ok]) for _, key, _ in metrics]
        rows.append([*cells, DIFFERENCES.get(impl, "")])
    headers = ["impl", "seeds (finished/run)", *(["reached 475"] if task == "cartpole" else []),
               *[label for label, _, _ in metrics], "differs from Nitro"]
    out = [f"### {TASK_TITLES[task]}", "", "Median [95% bootstrap interval over seeds]:", "",
           c.md_table(headers, rows)]
    peers = [i for i in impls if i != "nitro" and by_impl.get(i)]
    best, why = strongest_sb3(by_impl)
    ratio_rows = []
    for peer in peers + ([best] if best else []):
        label = peer if len(ratio_rows) < len(peers) else f"strongest SB3 layout ({best})"
        ratio_rows.append([label, *[paired_ratio(by_impl.get("nitro", []), by_impl[peer], key,
                                                 ("nitro", peer))[1]
                                    for _, key, better in metrics if better]])
    if ratio_rows:
        out += ["", "Nitro / peer: ratio of medians over the same seeds [95% paired-bootstrap "
                "interval]; where one side ran more seeds, over the seeds both ran (named), "
                f"and a dash below {MIN_COMMON_SEEDS} shared seeds:", "",
                c.md_table(["peer", *[f"{label} ({better} is better)"
                                      for label, _, better in metrics if better]], ratio_rows),
                "", f"Strongest SB3 layout for speed: {why}."]
    return "\n".join(out)


def ratios_of(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, float | None]:
    """Every Nitro / peer ratio the tables show (None where refused), for scripts to read."""
    out = {}
    for task, by_impl in results.items():
        for peer in (i for i in by_impl if i != "nitro"):
            for _, key, better in METRICS[task]:
                if better is None:
                    continue
                out[f"{task}.{key}.nitro/{peer}"] = paired_ratio(
                    by_impl.get("nitro", []), by_impl[peer], key, ("nitro", peer))[0]
    return out


def render(data: dict[str, Any]) -> str:
    """The section's Markdown, from the stored per-run rows only."""
    results = data["results"]
    impls = [i for i in IMPLS if any(i in cells for cells in results.values())]
    parts = [task_tables(task, by_impl, impls) for task, by_impl in results.items()
             if by_impl]
    md = "\n\n".join(parts) + returns_comparison(results, impls)
    errors = [f"- {task} {r['impl']} seed {r['seed']}: `{r['error'].splitlines()[-1]}`"
              for task, by_impl in results.items() for runs in by_impl.values() for r in runs
              if "error" in r]
    if errors:
        md += "\n\nFailed runs:\n" + "\n".join(errors)
    history = data.get("history") or run_history(data)
    md += "\n\nRuns that make up this table, in order:\n" + "\n".join(
        f"- {h['when']} (load {h.get('loadavg')}): `{h['command']}`" for h in history)
    seeds = data.get("seeds", {})
    note = f"\n\n{data['note']}" if data.get("note") else ""
    md += (f"\n\nHopper budget {data.get('hopper_steps', 0):,} env steps. Seeds asked for: "
           + "; ".join(f"{t} {c.seed_list(v)}" for t, v in seeds.items()) + ". "
           "Process s runs from spawn to exit (imports, start-up, evaluation included) and is "
           "the same clock for every library; each library's run clock starts at a different "
           "point, so its ratio is secondary. Goal (issue 8): Nitro at least 2x faster than "
           "SB3 (ratio <= 0.5) and ahead of RLlib (ratio < 1), with equal or better returns. "
           f"Settings and every difference between the libraries: `perf/peers/README.md`.{note}")
    return md


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
                        help="Hopper seeds (default 1-10; 1 with --quick)")
    parser.add_argument("--cartpole-seeds", type=int, nargs="+", default=None,
                        help="CartPole seeds (default 1-10: steps to 475 vary 4x by seed)")
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
                        help="run nothing: print the tables of the stored runs")
    parser.add_argument("--name", default=NAME,
                        help=f"result file under perf/results/ (default {NAME}); another name "
                             "keeps a table measured on another machine beside the first, "
                             "since runs from different CPUs never share a table")
    args = parser.parse_args()
    if not args.name.startswith(NAME):
        parser.error(f"--name must start with {NAME!r} (that is how the page finds its renderer)")
    stored_path = c.RESULTS / f"{args.name}.json"
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
    seeds = args.seeds or ([1] if args.quick else list(range(1, 11)))
    # only the tasks this run measures: the page says which seeds were asked for
    asked = {"hopper": seeds,
             "cartpole": args.cartpole_seeds or ([1] if args.quick else list(range(1, 11)))}
    seeds_for = {task: asked[task] for task in args.tasks}
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
            # the stored runs of implementations not rerun keep their versions on the page
            versions = {**stored.get("versions", {}), **versions}

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
    title = "Nitro vs Stable-Baselines3 vs RLlib: PPO on CartPole and Hopper (issue 8)"
    if args.name != NAME:
        title += f", {machine['cpu']}"
    data = {
        "title": title,
        "quick": args.quick, "seeds": seeds_for, "hopper_steps": args.hopper_steps,
        "results": results, "ratios": ratios_of(results), "versions": versions,
        "machine": machine, "note": args.note, "history": history,
        # the table's newest measurement, not the time it was rewritten (--render)
        "when": history[-1]["when"], "command": history[-1]["command"],
    }
    print(render(data))
    if not args.render:
        c.write_result(args.name, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
