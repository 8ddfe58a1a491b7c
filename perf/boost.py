"""Does boosting pay? The boosting experiment in one command, on top of ``nitro sweep`` and
``nitro report``.

Two protocols, each a grid of named settings (scalers, fixed fan-outs) x seeds x tasks x cost
models, every run a simulated-cloud PPO run (local actors billed as concurrent Lambdas):

- ``paper``: the paper's protocol. 50 rounds; round 1 at 16 actors, then N in [8, 64]; one env
  per actor, 512 steps per actor (a round's batch is N x 512). Run under the honest cost model
  (``aws``, learner priced as the paper's GPU instance by default) and billed a second time,
  from the same rounds, by the prototype's (``prototype``: round time x $3.74/h, Lambda never
  billed), so the paper's claims can be read beside what they become when Lambda is billed.
  No budget stops a run of this protocol, so its training does not depend on the bill: the
  prototype's bill is read off the ``aws`` runs (``plugins.cost.prototype.bill_of_rounds``)
  instead of training everything twice; ``--costs aws-gpu prototype`` runs both anyway.
- ``budget``: equal budget. The same actors and batch per actor; every run stops when its dollar
  budget cannot pay for another round. Reward at budget, and cost and simulated time to a target
  return.

Durations (``--clock``): ``measured`` bills what this machine took, so a run's dollars depend
on what else ran beside it; ``model`` bills from the time model fitted on measured runs
(``perf/boost_budget.py fit``, constants in perf/results/time_model_<task>.json; Walker2d-v5
takes Hopper's, and a task with none is calibrated before its first run), the same for the same work under any load; ``model_cuda`` keeps that model's
actor seconds (Lambdas run on CPUs) and times the learner and the probe as measured on an H200
(``perf/gpu_check.py``), the paper's regime of a GPU learner whose update costs about the same at
any N. Defaults: ``model_cuda`` for the paper protocol, ``model`` for the budget protocol
(priced as a CPU learner), ``measured`` for ``--quick`` (CartPole has no fitted model).

Evaluation runs at stop always and every ``--eval-every`` rounds; its time is measured but not
charged, so a run with more rounds does not pay for more evaluations.

    python perf/boost.py --quick                         # CI size: CartPole, 1 seed, minutes
    python perf/boost.py --protocol paper --tasks Hopper-v5 --seeds 1-10 --jobs 2
    python perf/boost.py --protocol budget --settings nitro decay_only fixed16 hydrozoa
    python perf/boost.py --protocol paper --collect      # re-aggregate what is on disk

Runs go to ``runs/boost/<protocol>[-<clock>]/<task>/<cost>/<setting>/seed-<s>``; rerunning the same
command resumes (finished runs are skipped). Raw per-seed rows, with the machine, versions, load
and command, go to ``perf/results/boost_<protocol>.json`` (``--quick``: under the run folder,
never over the published results, unless ``NITRO_PERF_RESULTS`` says where).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import common as c

sys.path.insert(0, str(c.ROOT))

from plugins.cost.prototype import bill_of_rounds  # noqa: E402
from plugins.experiments.aggregate import (  # noqa: E402
    Group,
    band_figures,
    front_figures,
    front_markdown,
    fronts,
    groups_from_sweep,
    markdown,
    seed_row,
    summarize,
)
from plugins.experiments.report import RunData, event_kind  # noqa: E402
from plugins.experiments.sweep import (  # noqa: E402
    MANIFEST,
    Interrupted,
    Setting,
    SweepError,
    sweep,
    toml_value,
)

#: Cost configurations by name: the ``[cost]`` table a run is billed with.
COSTS: dict[str, dict[str, Any]] = {
    "aws-cpu": {"name": "aws", "learner": "cpu"},
    "aws-gpu": {"name": "aws", "learner": "gpu"},
    "prototype": {"name": "prototype"},
}
#: Cost models read off another's runs when a protocol has no budget: (label, runs read).
READ_OFF = {"prototype": "aws-gpu"}
#: Target returns for cost- and time-to-target: about what PPO reaches on these tasks at the
#: paper's scale; pass ``--target`` to change them.
TARGETS = {"Hopper-v5": 1000.0, "Walker2d-v5": 1000.0, "Humanoid-v5": 500.0,
           "CartPole-v1": 100.0}
#: Dollar budgets per run of the budget protocol (aws, CPU learner): about what fixed16 spends
#: in the paper protocol's 50 rounds. Calibrate with ``--budget`` after a paper run.
BUDGETS = {"Hopper-v5": 0.01, "Walker2d-v5": 0.01, "Humanoid-v5": 0.03, "CartPole-v1": 0.0003}
#: The setting every other one is compared with, seed by seed.
BASELINE = "fixed16"


@dataclass(frozen=True)
class Protocol:
    """The scale of one protocol: every number here is a command-line parameter."""

    name: str
    tasks: tuple[str, ...]
    settings: tuple[str, ...]
    costs: tuple[str, ...]
    seeds: str
    rounds: int  # paper: rounds per run; budget: a cap the budget is meant to stop before
    start_actors: int
    min_actors: int
    max_actors: int
    steps_per_actor: int
    eval_every: int
    eval_episodes: int


SCALER_SETTINGS = ("nitro", "prototype", "decay_only", "no_boost", "hydrozoa", "kungfu",
                   "gns", "random", "min", "max")
PAPER = Protocol("paper", ("Hopper-v5", "Walker2d-v5", "Humanoid-v5"),
                 ("nitro", "prototype", "decay_only", "no_boost", "hydrozoa", "kungfu",
                  "fixed8", "fixed16", "fixed32", "fixed64"),
                 ("aws-gpu",), "1-5", 50, 16, 8, 64, 512, 5, 10)
BUDGET = Protocol("budget", PAPER.tasks,
                  ("nitro", "prototype", "decay_only", "no_boost", "hydrozoa",
                   "fixed8", "fixed16", "fixed32", "fixed64"),
                  ("aws-cpu",), "1-5", 2000, 16, 8, 64, 512, 5, 10)
PROTOCOLS = {"paper": PAPER, "budget": BUDGET}
#: ``--quick``: one tiny task, one seed, a few rounds of a few actors; fixedN is rescaled.
QUICK = {"tasks": ("CartPole-v1",), "seeds": "1", "rounds": 3, "start_actors": 2,
         "min_actors": 1, "max_actors": 4, "steps_per_actor": 64, "eval_every": 100,
         "eval_episodes": 2}
QUICK_FIXED = {"fixed8": "fixed1", "fixed16": "fixed2", "fixed32": "fixed4", "fixed64": None}
#: ``--quick`` budget runs: CartPole's $0.0003 pays for 50-160 rounds (N = 4 to 1), so every
#: run stops by the budget, as an equal-budget comparison must; this cap is only a safety.
QUICK_BUDGET_ROUNDS = 400


#: Settings that run a scaler with its Hessian probe changed: (scaler, the probe's keys).
#: ``prototype_fullbatch`` measures rho on the round's whole batch, as the paper did, where the
#: ``hessian`` probe's default is a fixed subsample of 2,048 samples whatever N is.
PROBE_SETTINGS = {"prototype_fullbatch": ("prototype", {"samples": 0})}


def setting(name: str, p: Protocol = PAPER) -> Setting:
    """A named setting: a scaler by its plugin name, ``fixedN`` (N actors every round), or a
    scaler with another probe (``PROBE_SETTINGS``; its evaluation as the protocol ``p``'s)."""
    if name in SCALER_SETTINGS:
        return Setting(name, (f"scaler.name={toml_value(name)}",))
    if name in PROBE_SETTINGS:
        scaler, hessian = PROBE_SETTINGS[name]
        probes = [{"name": "eval", "every": p.eval_every, "episodes": p.eval_episodes},
                  {"name": "hessian", **hessian}]
        return Setting(name, (f"scaler.name={toml_value(scaler)}",
                              f"probes={toml_value(probes)}"))
    if name.startswith("fixed") and name[5:].isdigit():
        n = int(name[5:])
        return Setting(name, ('scaler.name="fixed"', f"actors.count={n}"))
    raise SweepError(f"unknown setting {name!r}: a scaler ({', '.join(SCALER_SETTINGS)}), "
                     f"{', '.join(PROBE_SETTINGS)} or fixedN")


#: Each protocol's default clock (see the module's docstring).
CLOCKS = {"paper": "model_cuda", "budget": "model"}


def clock_costs(clock: str, task: str) -> dict[str, Any]:
    """The ``[cost]`` keys that make a run bill from the time model (none for ``measured``)."""
    if clock == "measured":
        return {}
    import boost_budget as study

    fitted = study.model_path(task)
    if not fitted.exists():
        if task not in PAPER.tasks:  # the MuJoCo tasks take Hopper's model
            raise SweepError(f"no time model for {task} ({fitted}): fit one with "
                             f"perf/boost_budget.py fit --task {task}, or pass --clock measured")
        fitted = study.model_path("Hopper-v5")  # a MuJoCo step of the same order (study 6)
    constants = json.loads(fitted.read_text(encoding="utf-8"))["constants"]
    if clock == "model_cuda":  # the learner of both protocols: 10 epochs x 32 minibatches
        constants = {**constants, **study.cuda_learner_constants("Hopper-v5", "count")}
    return {"time_model": "model", **constants}


def base_plan(p: Protocol, task: str, cost: str, budget: float | None, mode: str,
              workers: int, clock: str = "measured") -> dict[str, Any]:
    """The plan every setting of one task and cost model starts from."""
    mujoco = task != "CartPole-v1"
    stop: dict[str, Any] = {"max_rounds": p.rounds}
    if budget is not None:
        stop["budget_usd"] = budget
    algo: dict[str, Any] = {"name": "ppo"}
    if mujoco:  # CleanRL's MuJoCo PPO, as plans/hopper.toml
        algo.update(learning_rate=3e-4, update_epochs=10, num_minibatches=32, gamma=0.99,
                    gae_lambda=0.95, clip_coef=0.2, ent_coef=0.0, vf_coef=0.5,
                    max_grad_norm=0.5)
    else:
        algo.update(learning_rate=2.5e-4, ent_coef=0.01, update_epochs=2, num_minibatches=2)
    return {
        "sinks": [],
        "run": {"name": f"boost-{p.name}-{task.split('-')[0].lower()}", "mode": mode},
        "stop": stop,
        "env": {"id": task, "num_envs": 1, "normalize_obs": mujoco, "normalize_reward": mujoco},
        "algo": algo,
        "actors": {"backend": "local", "count": p.start_actors, "min": p.min_actors,
                   "max": p.max_actors, "steps": p.steps_per_actor, "simulate": True,
                   "workers": workers},
        "transport": {"kind": "memory"},
        "scaler": {"name": "fixed"},
        "cost": {**COSTS[cost], **clock_costs(clock, task)},
        "probes": [{"name": "eval", "every": p.eval_every, "episodes": p.eval_episodes}],
        "checkpoint": {"enabled": False},
    }


def write_plan(plan: dict[str, Any], path: Path) -> Path:
    """Write the folder's plan, unless runs were already made there from another one: the
    sweep would refuse to resume anyway, and overwriting first would leave the kept runs beside
    a plan they were not made from."""
    import tomli_w

    path.parent.mkdir(parents=True, exist_ok=True)
    text = tomli_w.dumps(plan)
    if path.is_file():
        if path.read_text(encoding="utf-8") == text:
            return path
        if (path.parent / MANIFEST).is_file():
            raise SweepError(f"{path.parent} holds runs made from another plan: {path} differs "
                             "from this command's (another --workers, --clock or protocol "
                             "option?); use the same options or another --out")
    path.write_text(text, encoding="utf-8")
    return path


# -- the experiment ----------------------------------------------------------------------------


def prepare(p: Protocol, args: argparse.Namespace, out: Path) -> None:
    """Check every task before the first run, so a bad one fails before hours of others: a
    registered gymnasium id, a budget for the budget protocol, and a time model for a modelled
    clock, which a task not studied yet gets from its calibration runs here (a few minutes,
    measured, so best on an idle machine; then kept in perf/results/ for every later run)."""
    import gymnasium as gym

    for task in p.tasks:
        try:
            gym.spec(task)
        except gym.error.Error as exc:
            raise SweepError(f"task {task!r} is not a registered gymnasium id ({exc})") from None
        if p.name == "budget" and args.budget is None and task not in BUDGETS:
            raise SweepError(f"no default budget for {task} (defaults: "
                             f"{', '.join(BUDGETS)}): pass --budget USD")
    if args.clock == "measured":
        return
    import boost_budget as study

    for task in p.tasks:
        try:
            clock_costs(args.clock, task)
        except SweepError:
            c.log(f"{task} has no time model: fitting one on its calibration runs first")
            try:
                study.calibrate(task, out / "calibration")
            except (RuntimeError, ValueError) as exc:
                raise SweepError(f"calibrating {task}'s time model failed: {exc}") from None


def run_protocol(p: Protocol, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Sweep every task x cost model (unless ``--collect``); return every per-seed row."""
    rows: list[dict[str, Any]] = []
    settings = [setting(s, p) for s in p.settings]
    workers = args.workers if args.workers is not None else (0 if args.jobs == 1 else 1)
    for task in p.tasks:
        budget = (args.budget if args.budget is not None else BUDGETS.get(task)) \
            if p.name == "budget" else None
        target = args.target if args.target is not None else TARGETS.get(task)
        for cost in p.costs:
            sweep_dir = out / task / cost
            if not args.collect:  # collecting reads what is on disk, whatever options made it
                plan = write_plan(base_plan(p, task, cost, budget, args.mode, workers,
                                            args.clock), sweep_dir / "plan.toml")
                c.log(f"{p.name} {task} {cost}: {len(settings)} settings x seeds {p.seeds}")
                sweep(str(plan), _seeds(p.seeds), [], [], sweep_dir, args.jobs,
                      command=c.command_line(), report=c.log, extra_settings=settings)
            if not (sweep_dir / "sweep.json").is_file():
                continue
            groups, notes = groups_from_sweep(sweep_dir)
            for note in notes:
                c.log(note)
            wanted = {s.label for s in settings}
            groups = [g for g in groups if g.label in wanted and g.runs]
            if args.slim:
                for g in groups:
                    for run in g.runs:
                        slim(run.path)
            for g in groups:
                for run in g.runs:
                    rows.append({"task": task, "cost": cost, "target": target,
                                 **seed_row(g.label, run, target)})
            for label, source in READ_OFF.items():
                if budget is None and cost == source and label not in p.costs:
                    rows += [{"task": task, "cost": f"{label} (read off {source})",
                              "target": target, **seed_row(g.label, rebilled(run), target)}
                             for g in groups for run in g.runs]
            if args.figures and groups:
                band_figures(groups, sweep_dir / "report", c.STUDY_INTERVAL)
                front_report(groups, sweep_dir / "report")
    return rows


def front_report(groups: list[Group], out: Path) -> None:
    """Every other setting's curves against the front of the fixed counts (their pointwise
    best), in return against dollars and simulated time: ``front.md`` and its figures."""
    front = [g.label for g in groups if g.label.startswith("fixed")]
    if not front or len(front) == len(groups):
        return
    found = fronts(groups, front, c.STUDY_INTERVAL)
    text = front_markdown(found)
    if not text:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "front.md").write_text(text + "\n", encoding="utf-8")
    front_figures(found, [r for g in groups for r in g.runs], out)
    c.log(f"front of {', '.join(front)}: {out / 'front.md'}")


#: What a kept run's events.jsonl holds after ``--slim``: what the report reads, and the stop.
KEPT_EVENTS = ("RunStarted", "ScaleDecided", "CostCharged", "RoundFinished", "ProbeMeasured",
               "RunStopped")


def slim(run_dir: Path) -> None:
    """Drop a finished run's per-invocation events (nine in ten lines of a boosted run), so a
    protocol's runs can be kept in the repository and later sessions add seeds beside them:
    the rows, curves and read-off bills need none of them."""
    path = run_dir / "events.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if event_kind(line) in KEPT_EVENTS]
    if len(kept) < len(lines):
        tmp = path.with_suffix(".slim")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(path)


def rebilled(run: RunData) -> RunData:
    """The same run with the prototype's bill: what the paper's cost model would have charged
    for these very rounds (their simulated time, the Hessian probe left out)."""
    usd = bill_of_rounds(run.sim_time_s, run.probe_s)
    summary = {**run.summary, "cost_usd": usd[-1] if usd else 0.0}
    return replace(run, cost_usd=usd, summary=summary)


def _seeds(text: str) -> list[int]:
    from plugins.experiments.sweep import parse_seeds

    return parse_seeds(text)


def render(data: dict[str, Any]) -> str:
    """The page's section, recomputed from the stored rows: one table per task and cost
    model, settings against the baseline seed by seed."""
    rows = data.get("rows", [])
    p = data.get("protocol", {})
    parts = [
        f"Protocol `{p.get('name')}`: N in [{p.get('min_actors')}, {p.get('max_actors')}], "
        f"round 1 at {p.get('start_actors')}, {p.get('steps_per_actor')} steps per actor, one "
        f"env per actor, "
        + _stop_text(p, data.get("budgets") or {})
        + f"; mode {data.get('mode')}; durations {CLOCK_WORDS.get(data.get('clock', 'measured'))}"
        f". Evaluation ({p.get('eval_episodes')} episodes, every "
        f"{p.get('eval_every')} rounds and at stop) is measured but not charged. Mean and IQM "
        "with 95 % bootstrap intervals over seeds (10,000 resamples); differences are paired "
        f"by seed against `{data.get('baseline')}`."]
    for task in dict.fromkeys(r["task"] for r in rows):
        for cost in dict.fromkeys(r["cost"] for r in rows if r["task"] == task):
            mine = [r for r in rows if r["task"] == task and r["cost"] == cost]
            labels = list(dict.fromkeys(r["setting"] for r in mine))
            base = data.get("baseline") if data.get("baseline") in labels else None
            target = mine[0].get("target")
            summary = summarize(mine, labels, target, base, c.STUDY_INTERVAL)
            parts.append(f"### {task}, cost model `{cost}`"
                         + (f", target return {target:g}" if target is not None else "")
                         + f"\n\n{markdown(summary)}")
    if not rows:
        parts.append("(no finished runs)")
    return "\n\n".join(parts)


CLOCK_WORDS = {"measured": "as measured on this machine",
               "model": "from the time model fitted on this machine's runs",
               "model_cuda": "from the time model, the learner and the probe timed on an H200"}


def _stop_text(p: dict[str, Any], budgets: dict[str, float]) -> str:
    if not budgets:
        return f"{p.get('rounds')} rounds"
    each = ", ".join(f"{task} ${usd:g}" for task, usd in budgets.items())
    return f"stop at the budget ({each}; at most {p.get('rounds')} rounds)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="paper")
    parser.add_argument("--quick", action="store_true",
                        help="CI size: CartPole-v1, one seed, 3 rounds of 1-4 actors")
    parser.add_argument("--tasks", nargs="+", help="gymnasium ids (default: the protocol's)")
    parser.add_argument("--settings", nargs="+",
                        help=f"scalers ({', '.join(SCALER_SETTINGS)}), "
                        f"{', '.join(PROBE_SETTINGS)} or fixedN")
    parser.add_argument("--costs", nargs="+", choices=sorted(COSTS),
                        help="cost models run (default paper: aws-gpu, with the prototype's bill "
                             "read off its runs; budget: aws-cpu)")
    parser.add_argument("--seeds", help="1-10, 1,2,5 (default: 1-5; quick: 1)")
    parser.add_argument("--rounds", type=int,
                        help="paper: rounds per run (50); budget: a cap (2000)")
    parser.add_argument("--steps-per-actor", type=int, help="env steps per actor (512)")
    parser.add_argument("--start-actors", type=int, help="round 1's actors (16)")
    parser.add_argument("--min-actors", type=int, help="fewest actors (8)")
    parser.add_argument("--max-actors", type=int, help="most actors (64)")
    parser.add_argument("--eval-every", type=int, help="rounds between evaluations (5)")
    parser.add_argument("--eval-episodes", type=int, help="episodes per evaluation (10)")
    parser.add_argument("--budget", type=float, help="budget protocol: USD per run "
                        "(default per task: " + ", ".join(f"{k} {v:g}" for k, v in
                                                          BUDGETS.items()) + ")")
    parser.add_argument("--target", type=float, help="target return for cost/time to target "
                        "(default per task: " + ", ".join(f"{k} {v:g}" for k, v in
                                                          TARGETS.items()) + ")")
    parser.add_argument("--mode", choices=("sync", "pipelined"), default="sync",
                        help="round mode (sync: every run replays; default sync)")
    parser.add_argument("--clock", choices=tuple(CLOCK_WORDS),
                        help="durations billed: measured, model or model_cuda (default: "
                             "paper model_cuda, budget model, --quick measured)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--workers", type=int,
                        help="actors.workers per run (default: one per core with --jobs 1, "
                             "else 1)")
    parser.add_argument("--out", type=Path, help="runs folder (default runs/boost/<protocol>"
                                                  "[-quick])")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing: aggregate and store what is on disk")
    parser.add_argument("--slim", action="store_true",
                        help="drop finished runs' per-invocation events (to keep the runs in "
                             "git, e.g. under perf/boost_runs/)")
    parser.add_argument("--no-figures", dest="figures", action="store_false",
                        help="skip the band figures under each sweep's report/")
    args = parser.parse_args()
    p = protocol_from(args)
    if args.clock is None:
        args.clock = "measured" if args.quick else CLOCKS[p.name]
    suffix = "" if args.clock == "measured" else "_" + args.clock
    out = args.out or c.ROOT / "runs" / "boost" / (p.name + suffix.replace("_", "-")
                                                   + ("-quick" if args.quick else ""))
    t0 = time.perf_counter()
    try:
        if not args.collect:
            prepare(p, args, out)
        rows = run_protocol(p, args, out)
    except SweepError as exc:
        sys.stderr.write(f"boost: {exc}\n")
        return 2
    except Interrupted:
        sys.stderr.write("boost: interrupted; rerun the same command to resume\n")
        return 130
    data = {
        "title": f"Boosting: the {p.name} protocol" + (" (quick)" if args.quick else ""),
        "quick": args.quick,
        "protocol": {k: v for k, v in vars(p).items()},
        "mode": args.mode,
        "clock": args.clock,
        "baseline": BASELINE if not args.quick else QUICK_FIXED[BASELINE],
        "budgets": ({t: (args.budget if args.budget is not None else BUDGETS.get(t))
                     for t in p.tasks} if p.name == "budget" else {}),
        "runs_dir": str(out),
        "wall_s": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    published = not args.quick or "NITRO_PERF_RESULTS" in os.environ
    results = c.RESULTS if published else out / "results"
    name = f"boost_{p.name}{suffix}"
    data = merged_with_stored(results / f"{name}.json", data)
    data["markdown"] = render(data)
    path = c.write_result(name, data, results=results)
    print(data["markdown"])
    print(f"\nwrote {path} ({len(data['rows'])} runs, {len(rows)} from this command, "
          f"{data['wall_s']:.0f} s)")
    return 0


#: What makes two results of one protocol comparable: its scale, mode and clock (not which
#: tasks, settings, seeds or cost models a command ran).
SCALE_KEYS = ("rounds", "start_actors", "min_actors", "max_actors", "steps_per_actor",
              "eval_every", "eval_episodes")


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["task"], row["cost"], row["setting"], row["seed"]


def merged_with_stored(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the rows of the stored result that this command did not remake, so a
    command that runs one task, setting or seed adds to the protocol's results instead of
    replacing them. A stored result of another scale, mode or clock is not mixed in: it is
    kept beside, renamed with its date, and the new result starts afresh."""
    if not path.exists():
        return data
    old = json.loads(path.read_text(encoding="utf-8"))

    def scale(d: dict[str, Any]) -> tuple[Any, ...]:
        p = d.get("protocol", {})
        return (*(p.get(k) for k in SCALE_KEYS), d.get("mode"), d.get("clock"))

    if scale(old) != scale(data):
        kept = path.with_name(f"{path.stem}.replaced-{old.get('when', 'earlier')}.json"
                              .replace(" ", "_").replace(":", ""))
        path.replace(kept)
        c.log(f"{path.name} held another scale, mode or clock: kept as {kept.name}")
        return data
    made = {row_key(r) for r in data["rows"]}
    carried = [r for r in old.get("rows", []) if row_key(r) not in made]
    if not carried:
        return data
    c.log(f"kept {len(carried)} rows of {path.name} that this command did not remake")
    return {**data, "rows": carried + data["rows"],
            "budgets": {**old.get("budgets", {}), **data.get("budgets", {})},
            "carried_over": sorted({f"{r['task']} {r['setting']}" for r in carried})}


def protocol_from(args: argparse.Namespace) -> Protocol:
    """The protocol's preset, then ``--quick``, then each explicit flag."""
    base = vars(PROTOCOLS[args.protocol]).copy()
    if args.quick:
        base.update(QUICK)
        base["settings"] = tuple(QUICK_FIXED.get(s, s) for s in base["settings"]
                                 if QUICK_FIXED.get(s, s))
        if args.protocol == "budget":
            base["rounds"] = QUICK_BUDGET_ROUNDS
    for key in ("rounds", "steps_per_actor", "start_actors", "min_actors", "max_actors",
                "eval_every", "eval_episodes", "seeds"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    for key in ("tasks", "settings", "costs"):
        if getattr(args, key):
            base[key] = tuple(getattr(args, key))
    return Protocol(**base)


if __name__ == "__main__":
    sys.exit(main())
