"""Does the curvature say when a bigger round pays? The premise of boosting, tested directly.

Boosting spends more actors in the rounds where "extra samples help most", and reads those
rounds off a signal (the Hessian's rho, in the paper; the gradient noise scale, in the
critical-batch-size literature; the round number, for a decay). Every equal-budget study so
far compares whole rules, where a real effect could drown in everything else a rule changes.
This asks the premise itself, at one parameter point at a time:

A Hopper-v5 run in the paper's protocol (one env and 512 steps per actor, 10 epochs of 32
minibatches, decoupled PPO) trains at a fixed 16 actors, with the ``hessian`` and ``gns``
probes every round. Every ``--every`` rounds the run branches: from the current learner (a
copy of its model, optimiser and normalisation statistics), one round of ``--small`` actors
and one of ``--big`` actors are sampled fresh and trained on, ``--replicates`` times each,
and every branch's policy is evaluated on the same ``--episodes`` deterministic episodes (the
same reset seeds, so the evaluations differ only by the policies). The main run goes on
untouched. The *advantage* of the big round is its evaluation gain minus the small round's.
With ``--horizon H`` each branch holds its size for H rounds (each sampled from the branch's
own updated policy), as a boost that lasts a while; those rows are stored apart, as are
another task's (``--task``).

``--use`` says how the big round spends its extra samples, so that "a bigger round does not
help" can be told apart from "this use of a bigger round does not help": ``count`` (the
paper's: the same 32 minibatches, each ``big / small`` times larger, so the same optimiser
steps on a less noisy gradient), ``steps`` (minibatches of the small round's size, so
``big / small`` times the optimiser steps: the update a learner timed by its samples makes)
and ``lr`` (the paper's minibatches with the learning rate raised by Adam's square-root rule,
``sqrt(big / small)``, so the less noisy gradient may also take a longer step). The small
round is the same in all of them, and rows of a use other than ``count`` are stored apart.
``clip`` asks whether the clipped objective is what bounds one round's progress: the big
round takes ``steps``'s optimiser steps inside a clip range widened by the same square-root
rule. A wider range might pay at any round size, so ``clip`` adds a third arm, the small round
with the same range (the *control*), and reports the big round's gain over it too.

If the premise holds, the advantage is larger where the signal is larger: its rank
correlation with log rho (and with rho's deviation from its own trend, which is what a
windowed rule reacts to) is positive with an interval that excludes zero. The same is
reported for the gradient noise scale and for the round number.

Caveats kept in the report: a branch samples from freshly reset envs (the main run's actors
carry episodes across rounds), and one round's effect is measured, not a boost of several.

    .venv/bin/python perf/boost_premise.py --seed 1                 # ~10 min on one core
    .venv/bin/python perf/boost_premise.py --seed 2 --append        # add a seed
    .venv/bin/python perf/boost_premise.py --seed 1 --horizon 3     # boosts of 3 rounds
    .venv/bin/python perf/boost_premise.py --seed 1 --task Walker2d-v5
    .venv/bin/python perf/boost_premise.py --seed 1 --use steps     # big round: more steps
    .venv/bin/python perf/boost_premise.py --seed 1 --use clip      # ... and a wider clip
    .venv/bin/python perf/boost_premise.py --render                 # the table only

Rows: perf/results/boost_premise.json (one per branch, with the probes of its round).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

import boost  # noqa: E402
from common import RESULTS, log, md_table, printed, write_result  # noqa: E402

from envs import Sampler, evaluate  # noqa: E402
from kernel.engine import Engine  # noqa: E402
from kernel.plan import load_plan  # noqa: E402
from kernel.registry import Plugin, default_registry  # noqa: E402
from kernel.roles import PluginContext, ProbeContext  # noqa: E402
from plugins.learners.onpolicy import env_spec_of  # noqa: E402

NAME = "boost_premise"
#: Probe values kept beside each branch (from the same round's ``hessian`` and ``gns``).
SIGNALS = ("hessian_ratio", "hessian_ratio_prototype", "lambda_max", "lambda_min", "gns")
RESAMPLES = 4000


@dataclass(frozen=True)
class Branching:
    every: int
    start: int
    small: int
    big: int
    replicates: int
    episodes: int
    steps: int
    horizon: int = 1  # rounds each branch runs at its size (a boost held for a while)
    task: str = "Hopper-v5"
    use: str = "count"  # how the big round spends its samples (see USES)


#: How a big round may use its extra samples (the module's docstring says why each), in the
#: words the rendered table says it with.
USE_WORDS = {
    "count": "the big round in as many minibatches as the small one",
    "steps": "the big round in minibatches of the small one's size (more optimiser steps)",
    "lr": "the big round in as many minibatches, its learning rate x sqrt(big / small)",
    "clip": "the big round in minibatches of the small one's size (more optimiser steps), "
            "its clip range x sqrt(big / small)",
}
USES = tuple(USE_WORDS)
#: Uses whose change could pay without the extra samples: a third arm, the small round with
#: the same change, tells "the big round pays" from "the change pays at any size".
CONTROLLED = ("clip",)


def widened_clip(config: Any, b: Branching) -> float:
    """The clip range of a round ``big / small`` times larger, by the same square-root rule
    as the learning rate: the surrogate's sampling error shrinks with the square root of the
    samples behind it, so a region that many times wider is as well estimated."""
    return config.clip_coef * (b.big / b.small) ** 0.5


def big_config(config: Any, b: Branching) -> Any:
    """The learner configuration of the big branch under ``b.use``; the small branch keeps
    the run's own. The small round's minibatch size is the reference either way."""
    if b.use == "count":
        return config
    small_minibatch = max(1, b.small * b.steps // config.num_minibatches)
    if b.use == "steps":
        return dataclasses.replace(config, minibatch_size=small_minibatch)
    if b.use == "lr":
        return dataclasses.replace(config, lr_reference_minibatch=small_minibatch)
    if b.use == "clip":
        return dataclasses.replace(config, minibatch_size=small_minibatch,
                                   clip_coef=widened_clip(config, b))
    raise ValueError(f"--use must be one of {', '.join(USES)}, not {b.use!r}")


def control_config(config: Any, b: Branching) -> Any:
    """The small round with the big round's change (see CONTROLLED): the same clip range
    at the small round's own minibatches and samples."""
    if b.use == "clip":
        return dataclasses.replace(config, clip_coef=widened_clip(config, b))
    raise ValueError(f"--use {b.use} has no control arm; those that do: {CONTROLLED}")


def arms(config: Any, b: Branching) -> list[tuple[str, int, Any]]:
    """Each branch's arms: a label, its actors and its learner configuration (None: the
    run's own)."""
    out = [("small", b.small, None), ("big", b.big, big_config(config, b))]
    if b.use in CONTROLLED:
        out.append(("control", b.small, control_config(config, b)))
    return out


def fork(learner: Any, config: Any = None) -> Any:
    """An independent copy of an on-policy learner: model, optimiser and normalisation
    statistics, so that training the copy leaves the run's learner as it was. Probes run
    while nothing trains, so the copy is of a learner at rest. The core is built afresh and
    loaded (its weights live in one flat buffer that a deep copy would not keep whole), with
    ``config`` in place of the run's if given."""
    core = learner.core
    twin = copy.copy(learner)
    twin.core = type(core)(learner.spaces, core.config if config is None else config,
                           device=core.device)
    twin.core.load_state_dict(copy.deepcopy(core.state_dict()))
    twin.obs_rms = copy.deepcopy(learner.obs_rms)
    twin.ret_rms = copy.deepcopy(learner.ret_rms)
    twin.last_rollout = None
    twin._lock = threading.Lock()
    return twin


def branch_probe(b: Branching) -> type:
    """A probe class that branches the run every ``b.every`` rounds (see the module's
    docstring); its values are the branches' evaluation returns."""

    class BranchProbe:
        def __init__(self, ctx: PluginContext):
            self.every = b.every
            self.env_spec = env_spec_of(ctx.plan)
            self.policy: Any = None

        def _policy(self, learner: Any, weights: dict[str, Any], seed: int) -> Any:
            if self.policy is None:
                from plugins.registry_access import actor_policy

                self.policy = actor_policy(learner.actor_spec())
            self.policy.load(weights["model"])
            reseed = getattr(self.policy, "reseed", None)
            if reseed is not None:
                reseed(seed)
            return self.policy

        def _evaluate(self, learner: Any, weights: dict[str, Any], seed: int) -> float:
            policy = self._policy(learner, weights, seed)
            returns = evaluate(policy, self.env_spec, b.episodes, seed=seed,
                               obs_rms=weights.get("obs_rms"))
            return float(np.mean(returns))

        def _round(self, learner: Any, actors: int, seed: int) -> dict[str, Any]:
            """One round of ``actors`` actors (one env each) from the learner's policy, as
            the actors' batches would arrive, merged into one."""
            weights = learner.weights()
            policy = self._policy(learner, weights, seed)
            with Sampler({**self.env_spec, "num_envs": actors}, seed) as sampler:
                rollout = sampler.sample(policy, b.steps, weights.get("obs_rms"))
            rollout.pop("episode_returns")
            rollout.pop("episode_lengths")
            stats = {k: rollout.pop(k) for k in ("obs_stats", "ret_stats") if k in rollout}
            return {"data": rollout, "stats": stats, "env_steps": b.steps * actors}

        def measure(self, ctx: ProbeContext) -> dict[str, float]:
            import torch

            if ctx.round < b.start:
                return {}
            t0 = time.perf_counter()
            rng = torch.get_rng_state()  # the run's own minibatch order stays its own
            learner = ctx.learner
            eval_seed = 100_000 + ctx.round
            out = {"eval_before": self._evaluate(learner, learner.weights(), eval_seed)}
            try:
                for r in range(b.replicates):
                    seed = 1_000_000 * ctx.seed + 1_000 * ctx.round + r
                    for label, actors, config in arms(learner.core.config, b):
                        twin = fork(learner, config)
                        torch.manual_seed(seed)
                        for k in range(b.horizon):  # each round samples the twin's policy
                            twin.update([self._round(twin, actors, seed + 7_919 * k)])
                        out[f"{label}_{r}"] = self._evaluate(twin, twin.weights(), eval_seed)
            finally:
                torch.set_rng_state(rng)
            out["branch_s"] = time.perf_counter() - t0
            return out

    return BranchProbe


def run_seed(seed: int, rounds: int, b: Branching) -> list[dict[str, Any]]:
    """The main run at 16 actors with its branches; one row per branch."""
    registry = default_registry()
    registry.register(Plugin("branch", "probe", branch_probe(b),
                             "Branches the run into a small and a big round.", config={}))
    p = boost.PAPER
    raw = boost.base_plan(p, b.task, "aws-gpu", None, "sync", 0)
    raw["run"].update(seed=seed, torch_threads=1)
    raw["stop"]["max_rounds"] = rounds
    raw["actors"].update(count=p.start_actors, min=p.start_actors, max=p.start_actors)
    raw["scaler"] = {"name": "fixed"}
    raw["probes"] = [{"name": "hessian"}, {"name": "gns"}, {"name": "branch"}]
    plan = load_plan(raw, [], registry)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(Engine(plan, out_dir=Path(tmp) / "run", registry=registry).run())
        probes: dict[int, dict[str, float]] = {}
        with (Path(tmp) / "run" / "events.jsonl").open() as fh:
            for line in fh:
                e = json.loads(line)
                if e["event"] == "ProbeMeasured":
                    probes.setdefault(e["round"], {}).update(e["values"])
    rows = []
    for number, values in sorted(probes.items()):
        if "eval_before" not in values:
            continue
        rows.append({"seed": seed, "round": number,
                     "eval_before": values["eval_before"], "branch_s": values.get("branch_s"),
                     "small": [values[f"small_{r}"] for r in range(b.replicates)],
                     "big": [values[f"big_{r}"] for r in range(b.replicates)],
                     **({"control": [values[f"control_{r}"] for r in range(b.replicates)]}
                        if b.use in CONTROLLED else {}),
                     **{k: values.get(k) for k in SIGNALS}})
    return rows


# -- analysis ---------------------------------------------------------------------------------

def ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(float)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = ranks(x), ranks(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def detrended(seeds: np.ndarray, rounds: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``y`` less a quadratic trend in the round, fitted per seed: what is left is a round's
    departure from its run's drift, which a windowed rule reacts to."""
    out = np.empty_like(y)
    for s in np.unique(seeds):
        m = seeds == s
        x = np.vstack([np.ones(m.sum()), rounds[m], rounds[m] ** 2]).T
        coef, *_ = np.linalg.lstsq(x, y[m], rcond=None)
        out[m] = y[m] - x @ coef
    return out


def correlation(x: np.ndarray, y: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Spearman's rank correlation and its percentile-bootstrap 95 % interval over branches
    (NaN where either side does not vary)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), (float("nan"), float("nan"))
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(RESAMPLES):
        i = rng.integers(0, len(x), len(x))
        if np.ptp(x[i]) > 0 and np.ptp(y[i]) > 0:
            boot.append(spearman(x[i], y[i]))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return spearman(x, y), (float(lo), float(hi))


def mean_ci(v: np.ndarray) -> tuple[float, tuple[float, float]]:
    rng = np.random.default_rng(0)
    boot = v[rng.integers(0, len(v), (RESAMPLES, len(v)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(v.mean()), (float(lo), float(hi))


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The big round's advantage and its correlation with each signal.

    Every branch with a ρ counts towards the advantage and ρ's correlations. The noise scale
    is a separate estimate that comes out at or below zero where the batch's gradient is
    smaller than its noise (one branch in six on Humanoid-v5); its correlations are taken
    over the branches where it is positive, and only they: dropping those branches from
    everything would select the advantage by a signal under test."""
    rows = [r for r in rows if r.get("hessian_ratio") and r["hessian_ratio"] > 0]
    seeds = np.array([r["seed"] for r in rows], dtype=float)
    rounds = np.array([r["round"] for r in rows], dtype=float)
    gain_small = np.array([np.mean(r["small"]) - r["eval_before"] for r in rows])
    gain_big = np.array([np.mean(r["big"]) - r["eval_before"] for r in rows])
    adv = gain_big - gain_small
    log_rho = np.log([r["hessian_ratio"] for r in rows])
    with_gns = np.array([bool(r.get("gns")) and r["gns"] > 0 for r in rows], dtype=bool)
    log_gns = np.log([r["gns"] for r in rows if r.get("gns") and r["gns"] > 0])
    gns_seeds, gns_rounds = seeds[with_gns], rounds[with_gns]
    # Replicate noise: how far two draws of the same round size land apart.
    spread = [np.std(r[k], ddof=1) for r in rows for k in ("small", "big")
              if len(r[k]) > 1]
    adv_detrended = detrended(seeds, rounds, adv)
    # (signal, the advantage it is set against): a detrended signal meets the advantage
    # detrended the same way, over the same branches.
    signals = {
        "log rho": (log_rho, adv),
        "log rho, detrended": (detrended(seeds, rounds, log_rho), adv_detrended),
        "log gns": (log_gns, adv[with_gns]),
        "log gns, detrended": (detrended(gns_seeds, gns_rounds, log_gns),
                               detrended(gns_seeds, gns_rounds, adv[with_gns])),
        "round": (rounds, adv)}
    out: dict[str, Any] = {
        "branches": len(rows), "gns_branches": int(with_gns.sum()),
        "seeds": sorted({int(s) for s in seeds}),
        "gain_small": mean_ci(gain_small), "gain_big": mean_ci(gain_big),
        "advantage": mean_ci(adv),
        "replicate_sd": float(np.sqrt(np.mean(np.square(spread)))) if spread else None,
        "correlations": {},
    }
    for name, (x, y) in signals.items():
        out["correlations"][name] = correlation(x, y) if len(x) > 2 else \
            (float("nan"), (float("nan"), float("nan")))
    # The rule's view: the third of each run's branches where rho stands highest above its
    # run's trend against the third where it stands lowest (a windowed rule boosts the first).
    top, bottom = [], []
    rho_departure = signals["log rho, detrended"][0]
    for s in np.unique(seeds):
        m = np.flatnonzero(seeds == s)
        order = m[np.argsort(rho_departure[m])]
        k = max(1, len(order) // 3)
        bottom.extend(adv[order[:k]])
        top.extend(adv[order[-k:]])
    out["top_third_rho"] = mean_ci(np.array(top))
    out["bottom_third_rho"] = mean_ci(np.array(bottom))
    if all("control" in r for r in rows):
        gain_control = np.array([np.mean(r["control"]) - r["eval_before"] for r in rows])
        out["gain_control"] = mean_ci(gain_control)
        out["advantage_over_control"] = mean_ci(gain_big - gain_control)
    return out


def render(data: dict[str, Any]) -> str:
    rows = data.get("rows", [])
    if not rows:
        return "No branches stored yet."
    a = analyse(rows)
    b = data["branching"]

    def ci(v: tuple[float, tuple[float, float]], digits: int = 0) -> str:
        return f"{v[0]:+.{digits}f} [{v[1][0]:+.{digits}f}, {v[1][1]:+.{digits}f}]"

    lines = [
        f"{b.get('task', 'Hopper-v5')}, the paper's protocol at 16 actors; "
        f"{a['branches']} branches over seeds "
        f"{', '.join(map(str, a['seeds']))}, every {b['every']} rounds from round {b['start']}: "
        f"{b['small']} against {b['big']} actors for "
        f"{'one round' if b.get('horizon', 1) == 1 else str(b['horizon']) + ' rounds'}, "
        f"{b['replicates']} draws of each, "
        f"{USE_WORDS[b.get('use', 'count')]}, "
        f"{b['episodes']} evaluation episodes. Evaluation gain over the branch point, mean "
        "[95 % interval over branches]:",
        "",
        md_table(["round of", "gain in evaluation return"],
                 [[f"{b['small']} actors", ci(a["gain_small"])],
                  [f"{b['big']} actors", ci(a["gain_big"])],
                  [f"{b['big']} minus {b['small']} (the advantage)", ci(a["advantage"])],
                  ["advantage, the third of each run's branches where rho stands highest "
                   "above its trend", ci(a["top_third_rho"])],
                  ["advantage, the third where it stands lowest", ci(a["bottom_third_rho"])],
                  *([[f"{b['small']} actors with the big round's {b.get('use')} (the "
                      "control)", ci(a["gain_control"])],
                     [f"{b['big']} minus the control (what the samples add)",
                      ci(a["advantage_over_control"])]] if "gain_control" in a else [])]),
        "",
        *([f"Two draws of the same round size land {a['replicate_sd']:.0f} apart (sd): the "
           "noise each gain carries.", ""] if a["replicate_sd"] is not None else []),
        "Rank correlation of the advantage with each signal (detrended signals against the "
        "advantage detrended the same way), [95 % interval over branches]"
        + ("" if a["gns_branches"] == a["branches"] else
           f"; the noise scale's over the {a['gns_branches']} branches where its estimate "
           "is positive")
        + ":",
        "",
        md_table(["signal", "Spearman"],
                 [[name, ci(v, 2)] for name, v in a["correlations"].items()]),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--start", type=int, default=2)
    parser.add_argument("--small", type=int, default=8)
    parser.add_argument("--big", type=int, default=64)
    parser.add_argument("--replicates", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--task", default="Hopper-v5",
                        help="a MuJoCo task of the paper's (stored apart when not Hopper)")
    parser.add_argument("--horizon", type=int, default=1,
                        help="rounds each branch runs at its size (stored apart when not 1)")
    parser.add_argument("--use", choices=USES, default="count",
                        help="how the big round spends its samples (stored apart when not "
                             "count)")
    parser.add_argument("--append", action="store_true",
                        help="keep the stored branches of other seeds beside this one's")
    parser.add_argument("--render", action="store_true", help="print the stored table only")
    args = parser.parse_args()

    name = NAME + ("" if args.task == "Hopper-v5" else "_" + args.task.split("-")[0].lower())
    name += "" if args.horizon == 1 else f"_h{args.horizon}"
    name += "" if args.use == "count" else f"_{args.use}"
    stored = RESULTS / f"{name}.json"
    b = Branching(args.every, args.start, args.small, args.big, args.replicates,
                  args.episodes, boost.PAPER.steps_per_actor, args.horizon, args.task, args.use)
    data: dict[str, Any] = {"branching": asdict(b), "rows": []}
    if (args.append or args.render) and stored.is_file():
        kept = json.loads(stored.read_text())
        made = {"horizon": 1, "task": "Hopper-v5", "use": "count", **kept.get("branching", {})}
        if made != asdict(b):
            raise SystemExit(f"{stored} was made with {kept.get('branching')}; pass the same "
                             "options to add to it")
        data["rows"] = [r for r in kept["rows"] if r["seed"] != args.seed or args.render]
    if not args.render:
        log(f"{b.task}, seed {args.seed}: {args.rounds} rounds at 16 actors, branching "
            f"{b.small} vs {b.big} every {b.every}")
        data["rows"].extend(run_seed(args.seed, args.rounds, b))
        data["rows"].sort(key=lambda r: (r["seed"], r["round"]))
    with printed() as out:
        print(render(data))
    if not args.render:
        write_result(name, {**data, "report": out.getvalue(),
                            "title": "Does the curvature say when a bigger round pays? "
                                     f"(a boost of {args.horizon} round"
                                     f"{'s' if args.horizon > 1 else ''}; issue 16)"})


if __name__ == "__main__":
    main()
