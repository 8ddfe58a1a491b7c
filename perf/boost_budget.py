"""Equal-budget boosting on a MuJoCo task at the scale of plans/hopper-nitro.toml: the study
behind the results in docs/boosting.md.

Every setting trains PPO on the task (Hopper-v5 unless ``--task`` says otherwise; 1 to 16 actors of 2 envs x 256 steps, minibatches of 256
samples so a bigger round takes more optimiser steps) in the simulated cloud until its budget
cannot pay for another round; evaluation every 10 rounds and at stop (10 episodes, measured but
not charged). Runs go seed-major, so every setting sees the same machine load on average, and a
rerun skips finished runs.

    python perf/boost_budget.py run --pricing cpu --budget 0.004 --seeds 6-10
    python perf/boost_budget.py store --pricing cpu       # into perf/boost_runs/
    python perf/boost_budget.py collect --pricing cpu     # rows, table and figures
    python perf/boost_budget.py run --task Walker2d-v5 --pricing gpu --budget 0.06 --seeds 1-5
    python perf/boost_budget.py fit --pricing gpu --out runs/boost    # the time model's constants
    python perf/boost_budget.py run --pricing gpu --budget 0.06 --clock model --seeds 1-10

``run`` writes whole runs under runs/boost/ (not kept in git); ``store`` keeps what the report
reads of each finished run (its summary, plan and the events the curves come from) under
perf/boost_runs/[<task>/]<pricing>/<setting>/seed-<s>/ (Hopper's runs have no task folder), so a
later session adds seeds instead of starting over; ``collect`` aggregates the stored runs with
``nitro report``'s statistics (mean, IQM, 95 % bootstrap intervals, paired differences against a
baseline) and writes every per-seed row to perf/results/boost_<task>_<pricing>.json and band
figures to perf/figures/boost_<task>_<pricing>/ (task in lower case without its version, e.g.
``boost_hopper_gpu``).

Durations are measured here by default, so the rounds a budget buys depend on the machine's
load; ``--clock model`` bills every run from the time model instead (``cost.time_model``),
whose constants ``fit`` takes from measured runs and keeps in perf/results/time_model_<task>.json:
such runs cost the same under any load, and their folders and results end in ``-model``. A
task without a model gets one first from two calibration runs (``calibrate``); ``fit-gns``
adds the gns probe's constants to a model fitted before that probe was timed by it.
``--clock model_cuda`` keeps that model's actor seconds (Lambdas run on CPUs) and takes the
learner's and the probe's from perf/gpu_check.py's run on a GPU (perf/results/gpu_check.json);
its folders and results end in ``-model-cuda``.

Measured durations depend on the machine and its load, so runs measured later, elsewhere or on
an idle machine do not pair with a study's earlier seeds: ``--label idle`` keeps them as a study
of their own (folders and results end in ``-idle``), to be compared only with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common as c
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugins.experiments import aggregate as agg  # noqa: E402
from plugins.experiments.report import probe_share_of  # noqa: E402

PLAN = ROOT / "plans" / "hopper-nitro.toml"
STORED = ROOT / "perf" / "boost_runs"
#: What ``store`` keeps of a RoundFinished (the report's curves, and the round's facts).
ROUND_FIELDS = ("round", "actors", "env_steps", "round_env_steps", "eval_return",
                "episode_return_mean", "round_s", "learner_s", "probe_s", "sim_time_s",
                "cost_usd", "ts", "probes")
CALIBRATION_PROBES = ('probes=[{name="eval", every=10, episodes=10}, {name="hessian", every=1}, '
                      '{name="gns", every=1}]')
GNS_PROBES = 'probes=[{name="eval", every=10, episodes=10}, {name="gns", every=1}]'
#: The Hessian measured every 4th round, N held in between (the rules' probe since study 7).
HESSIAN_EVERY_4 = 'probes=[{name="eval", every=10, episodes=10}, {name="hessian", every=4}]'
#: The same, with a measurement skipped where it would take the probe past a tenth of the
#: run's simulated time: the Hessian probe the anchored rule adds to a plan since study 20.
HESSIAN_EVERY_4_SHARE = ('probes=[{name="eval", every=10, episodes=10}, '
                         '{name="hessian", every=4, max_share=0.1}]')
#: Each setting names the start count it ran with (the plan's count changed from 2 to 8 when
#: the anchored rule became the default; the adaptive rules keep the 2 their stored runs used).
SETTINGS = {
    "fixed1": ['scaler={name="fixed"}', "actors.count=1"],
    "fixed2": ['scaler={name="fixed"}', "actors.count=2"],
    "fixed4": ['scaler={name="fixed"}', "actors.count=4"],
    "fixed8": ['scaler={name="fixed"}', "actors.count=8"],
    "fixed16": ['scaler={name="fixed"}', "actors.count=16"],
    # The paper's rule with its bugs fixed (a min-max window over a decaying rho), pinned by
    # name so the stored runs keep their meaning whatever nitro's default rule is.
    "nitro": ['scaler={name="nitro", rule="window"}', "actors.count=2"],
    # The same rule with the Hessian measured every 4th round (N held in between): what the
    # probe's own cost takes from nitro.
    "nitro_p4": ['scaler={name="nitro", rule="window"}', "actors.count=2", HESSIAN_EVERY_4],
    # The anchored rule around N = 8 (the best fixed N of the Hopper studies), N in [4, 16],
    # the Hessian measured every 4th round: against fixed8 it is what the curvature adds.
    "anchored8_p4": ['scaler={name="nitro", rule="anchored"}', "actors.count=8", HESSIAN_EVERY_4],
    # The default rule as a plan gets it since study 20: the same, the probe held to 10 %.
    "anchored8_p4_share": ['scaler={name="nitro", rule="anchored"}', "actors.count=8",
                           HESSIAN_EVERY_4_SHARE],
    # The same around N = 4, for tasks whose best fixed N is 4 (Humanoid-v5): N in [2, 8].
    "anchored4_p4": ['scaler={name="nitro", rule="anchored"}', "actors.count=4", HESSIAN_EVERY_4],
    # A learning rate that follows the minibatch size (Adam's square-root rule from the 64
    # samples per minibatch CleanRL tuned 3e-4 at): with --minibatches count a bigger round
    # takes bigger steps, and these let it take longer ones too (N = 8: x1.41, N = 16: x2).
    "fixed8_lr": ['scaler={name="fixed"}', "actors.count=8", "algo.lr_reference_minibatch=64"],
    "fixed16_lr": ['scaler={name="fixed"}', "actors.count=16",
                   "algo.lr_reference_minibatch=64"],
    "anchored8_p4_lr": ['scaler={name="nitro", rule="anchored"}', "actors.count=8",
                        HESSIAN_EVERY_4, "algo.lr_reference_minibatch=64"],
    # A clip range that follows the round's batch by the square-root rule, from the 0.2 of
    # 8 actors' 4,096 samples (the premise test's ``--use clip`` found it the one use that lets
    # a bigger round improve the policy more): N = 4: 0.14, N = 16: 0.28. At N = 8 it is the
    # plan's 0.2, so fixed8 is its own baseline.
    "fixed16_clip": ['scaler={name="fixed"}', "actors.count=16",
                     "algo.clip_reference_batch=4096"],
    "anchored8_p4_clip": ['scaler={name="nitro", rule="anchored"}', "actors.count=8",
                          HESSIAN_EVERY_4, "algo.clip_reference_batch=4096"],
    # The same around N = 4 (Humanoid-v5's best fixed N), its range at 0.2 for 4 actors'
    # 2,048 samples: N = 2 clips at 0.14, N = 8 at 0.28, and fixed4 is its own baseline.
    "anchored4_p4_clip": ['scaler={name="nitro", rule="anchored"}', "actors.count=4",
                          HESSIAN_EVERY_4, "algo.clip_reference_batch=2048"],
    # Four actors at the range the clip option gives them beside 8 (0.14 every round): the
    # anchored rule with the option spends most of its rounds below 8 at such ranges, so this
    # tells whether the narrower range of its cut rounds is what lifts it.
    "fixed4_clip": ['scaler={name="fixed"}', "actors.count=4",
                    "algo.clip_reference_batch=4096"],
    # Calibration for a task's time model (``fit``): the Hessian and gns probes run every
    # round at a fixed N, so updates and probes are seen many times at two sizes (the gns
    # probe takes 1,024 samples at N = 2 and its cap of 4,096 at N = 16).
    "probe_n2": ['scaler={name="no_boost"}', "actors.count=2", CALIBRATION_PROBES],
    "probe_n16": ['scaler={name="no_boost"}', "actors.count=16", CALIBRATION_PROBES],
    # The gns probe alone, to add its constants to a model fitted before it had any.
    "gns_n2": ['scaler={name="fixed"}', "actors.count=2", GNS_PROBES],
    "gns_n16": ['scaler={name="fixed"}', "actors.count=16", GNS_PROBES],
    "decay_only": ['scaler={name="decay_only"}', "actors.count=2"],
    "prototype": ['scaler={name="prototype"}', "actors.count=2"],
    "hydrozoa": ['scaler={name="hydrozoa"}', "actors.count=2"],
    "critical_batch": ['scaler={name="critical_batch"}', "actors.count=2"],
    # KungFu's adaptive batch (N from actors.min, grown with the gradient noise scale): the
    # setting that bought the most samples in the paper's protocol, here at equal budget.
    "kungfu": ['scaler={name="kungfu"}', "actors.count=2"],
    # Rounds that grow with the gradient noise scale, from half the plan's count to twice it
    # (the premise study found a big round's advantage rising as training goes on): around
    # 8, N in [4, 16]; around 4, N in [2, 8].
    "grow8": ['scaler={name="grow"}', "actors.count=8"],
    "grow4": ['scaler={name="grow"}', "actors.count=4"],
    # The same with the clip range following the round (study 17): the premise test found a
    # big round paying only with a wider range, and paying more as training goes on, which is
    # the schedule grow runs; its small early rounds then clip narrower, as fixed4_clip does.
    "grow8_clip": ['scaler={name="grow"}', "actors.count=8", "algo.clip_reference_batch=4096"],
    "grow4_clip": ['scaler={name="grow"}', "actors.count=4", "algo.clip_reference_batch=2048"],
    # The fixed counts' front followed in dollars (study 15): the count that led the front of
    # study 14 at each share of the budget, switched where the lead changed hands. An oracle
    # read off these very runs, not a rule: it asks whether one run can follow the envelope
    # of separate ones. Hopper-v5 (study 3): fixed4 led the first 63 %, fixed8 after;
    # Walker2d-v5 (study 6): fixed2 to 73 %, fixed4 to 95 %, fixed8 at the end.
    "spend4to8": ['scaler={name="schedule", steps=[4, 8], at=[0.63]}', "actors.count=4"],
    "spend2to8": ['scaler={name="schedule", steps=[2, 4, 8], at=[0.73, 0.95]}',
                  "actors.count=2"],
}
COMMON = ["checkpoint.enabled=false", "sinks=[]",
          'probes=[{name="eval", every=10, episodes=10}]']


#: How an update uses a bigger round. ``size``: minibatches of 256 samples, so a round of N
#: actors takes N times the SGD steps (the study's default). ``count``: the plan's 32
#: minibatches whatever the batch, so a boosted round takes bigger steps, not more of them:
#: the regime the paper assumed, where a GPU learner's update costs about the same at any N.
MINIBATCHES = {"size": ["algo.minibatch_size=256"], "count": []}


#: How rounds are scheduled. ``sync`` (the studies'): sample, then train. ``pipelined``: the
#: next fan-out starts half-way through the update (a fixed snapshot point, so a seed replays),
#: or after the decision where the scaler reads this round's probes; the simulated clock then
#: leaves out the sampling the update hid. ``timed``: pipelined as PPO's plans run it, the
#: snapshot point timed so the batches arrive as the update ends (by the time model's
#: durations under a model clock, where a seed replays too).
MODES = {"sync": [], "pipelined": ['run.mode="pipelined"', "run.snapshot_at=0.5"],
         "timed": ['run.mode="pipelined"']}
#: What each mode adds to a study's title.
MODE_TITLES = {"sync": "", "pipelined": ", pipelined rounds clocked for their overlap",
               "timed": ", pipelined rounds at a timed snapshot point, clocked for their overlap"}


def common_sets(args: argparse.Namespace) -> list[str]:
    return [*MINIBATCHES[args.minibatches], *MODES[args.mode], *COMMON]


def variant(args: argparse.Namespace) -> str:
    """The study's folder and result-name suffix beyond task and price (``-model-cuda-mb32``)."""
    clock = "" if args.clock == "measured" else f"-{args.clock.replace('_', '-')}"
    label = f"-{args.label}" if args.label else ""
    mode = "" if args.mode == "sync" else f"-{args.mode}"
    return clock + ("-mb32" if args.minibatches == "count" else "") + mode + label


def label_name(text: str) -> str:
    """A ``--label``: lower-case letters, digits and inner hyphens, as it names folders."""
    if not text or not all(ch.islower() or ch.isdigit() or ch == "-" for ch in text) \
            or text.startswith("-") or text.endswith("-"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a label is lower-case letters, digits and inner hyphens (e.g. idle)")
    return text


def seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


#: The paper's MuJoCo tasks.
TASKS = ("Hopper-v5", "Walker2d-v5", "Humanoid-v5")


def task_id(text: str) -> str:
    """A gymnasium id that is registered (argparse's check, before any run starts)."""
    import gymnasium as gym

    try:
        gym.spec(text)
    except gym.error.Error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a registered gymnasium id ({exc})") from None
    return text


def task_slug(task: str) -> str:
    """``Walker2d-v5`` -> ``walker2d``: the task's part of folder and result names."""
    return task.split("-")[0].lower()


def task_dir(root: Path, task: str, pricing: str, suffix: str = "") -> Path:
    """Hopper's runs were stored before other tasks were: they keep the folder without a task.
    Runs billed by the time model sit beside the measured ones, as ``<pricing>-model`` (the
    ``suffix`` from ``variant``)."""
    folder = pricing + suffix
    return root / folder if task == "Hopper-v5" else root / task_slug(task) / folder


def model_path(task: str) -> Path:
    """Where ``task``'s time model is read from: the results folder ``fit`` and ``calibrate``
    write to (``NITRO_PERF_RESULTS`` or perf/results/), else the published one."""
    name = f"time_model_{task_slug(task)}.json"
    written = c.RESULTS / name
    return written if written.exists() else ROOT / "perf" / "results" / name


def line_through_medians(pairs: list[tuple[float, float]], min_count: int
                         ) -> tuple[float, float]:
    """(intercept, slope) of a straight line through the median of each size seen at least
    ``min_count`` times, so rounds slowed by a neighbour's job move it little.

    Both are at least 0: more work never takes less time, and nothing takes negative time. A
    cheap step (the gns probe on a small network) grows by microseconds per sample, which a
    loaded machine's jitter can turn into a falling line; the least-squares line with both
    constraints is then flat through the medians (or, for a negative intercept, through the
    origin), and the fit says so."""
    sizes = sorted({x for x, _ in pairs})
    xs = [x for x in sizes if sum(1 for p in pairs if p[0] == x) >= min_count]
    if len(xs) < 2:
        raise ValueError(f"a line needs two sizes seen at least {min_count} times each; "
                         f"saw {sizes}")
    ys = [float(np.median([y for x2, y in pairs if x2 == x])) for x in xs]
    slope, intercept = (float(v) for v in np.polyfit(xs, ys, 1))
    if slope < 0:
        c.log(f"time model: seconds fell with the work ({slope:.3g} per unit over sizes {xs}); "
              "fitted flat instead (a loaded machine?)")
        return max(0.0, float(np.mean(ys))), 0.0
    if intercept < 0:
        return 0.0, float(np.dot(xs, ys) / np.dot(xs, xs))
    return intercept, slope


def timing_pairs(paths: list[Path]) -> dict[str, list]:
    """What the time model is fitted on, read from runs' events in one pass: each successful
    invocation's milliseconds per env step (``per_step``), and (work, seconds) of each update
    (env steps trained), Hessian probe (samples x Lanczos steps) and gns probe (samples)."""
    seen: dict[str, list] = {"per_step": [], "update": [], "hessian": [], "gns": []}
    for events in paths:
        for line in events.open():
            e = json.loads(line)
            if e["event"] == "InvocationFinished" and e["ok"] and e["env_steps"]:
                seen["per_step"].append(e["duration_ms"] / e["env_steps"])
            elif e["event"] == "RoundFinished":
                seen["update"].append((e["round_env_steps"], e["learner_s"]))
            elif e["event"] == "ProbeMeasured":
                v = e["values"]
                if "lanczos_steps" in v and "hessian_samples" in v:
                    seen["hessian"].append((v["hessian_samples"] * v["lanczos_steps"],
                                            e["probe_s"]))
                elif "gns_samples" in v:
                    seen["gns"].append((v["gns_samples"], e["probe_s"]))
    return seen


def gns_constants(pairs: list[tuple[float, float]], min_count: int) -> dict[str, float]:
    """The gns probe's constants from its (samples, seconds), or none when the runs did not
    see it at two sizes (the model then bills that probe as measured)."""
    try:
        gns_s, gns_per = line_through_medians(pairs, min_count)
    except ValueError:
        return {}
    return {"model_gns_s": gns_s, "model_gns_s_per_sample": gns_per}


def fit_events(paths: list[Path], min_count: int = 5) -> dict[str, Any]:
    """The time model's constants (``cost.model_*``) from runs' events: per invocation
    milliseconds per env step, update seconds against env steps trained, Hessian probe seconds
    against samples x Lanczos steps, and gns probe seconds against its samples where the runs
    ran it; each a line through the median of each size (sizes seen fewer than ``min_count``
    times are left out; a short calibration run passes 1). Also says how many of each it saw."""
    seen = timing_pairs(paths)
    learner_s, learner_per_step = line_through_medians(seen["update"], min_count)
    probe_s, probe_per = line_through_medians(seen["hessian"], min_count)
    constants = {"model_actor_ms": 0.0,
                 "model_actor_ms_per_step": float(np.median(seen["per_step"])),
                 "model_learner_s": learner_s, "model_learner_s_per_step": learner_per_step,
                 "model_probe_s": probe_s, "model_probe_s_per_sample_step": probe_per,
                 **gns_constants(seen["gns"], min_count)}
    return {"constants": constants, "runs": len(paths), "invocations": len(seen["per_step"]),
            "updates": len(seen["update"]), "probes": len(seen["hessian"]),
            "gns_probes": len(seen["gns"])}


def constants_markdown(constants: dict[str, float]) -> str:
    return "| key | value |\n|---|---:|\n" + "\n".join(
        f"| `cost.{k}` | {v:.4g} |" for k, v in constants.items())


FIT_NOTE = ("Every invocation of the study steps the same 512 env steps, so the fixed part of an "
            "invocation is folded into its per-step time (model_actor_ms = 0).")


def fit(args: argparse.Namespace) -> int:
    """Fit the time model on the task's measured runs (see ``fit_events``)."""
    runs = sorted(task_dir(args.out, args.task, args.pricing).glob("*/seed-*/events.jsonl"))
    fitted = fit_events(runs)
    c.write_result(model_path(args.task).stem, {
        "title": f"Time model for {args.task}, fitted on {len(runs)} measured runs", **fitted,
        "note": FIT_NOTE,
        "markdown": constants_markdown(fitted["constants"])})
    print(json.dumps(fitted["constants"], indent=2))
    return 0


def clock_sets(args: argparse.Namespace) -> list[str]:
    if args.clock == "measured":
        return []
    task = args.model_task or args.task
    path = model_path(task)
    if not path.exists():  # a task not studied yet: its calibration runs first
        c.log(f"{path.name} is missing: calibrating {task}'s time model first")
        path = calibrate(task, args.out / "calibration")
    constants = json.loads(path.read_text())["constants"]
    if args.clock == "model_cuda":
        constants = {**constants, **cuda_learner_constants(task, args.minibatches)}
    return c.time_model_sets(constants)


#: Where perf/gpu_check.py keeps the study's learner and probe seconds measured on a GPU.
GPU_CHECK = ROOT / "perf" / "results" / "gpu_check.json"
LEARNER_KEYS = ("model_learner_s", "model_learner_s_per_step", "model_probe_s",
                "model_probe_s_per_sample_step")


def cuda_learner_constants(task: str, minibatches: str = "size") -> dict[str, float]:
    """The learner's and the probe's time-model constants as measured on a GPU: the actors stay
    Lambdas on CPUs, so only these replace the CPU fit's under ``--clock model_cuda``. The gns
    probe was not timed on the GPU: its constants, where fitted, stay this CPU's (a model).

    With minibatches of a fixed size the fit over 1, 4 and 16 actors applies as it is. With a
    fixed count of 32 the update is 320 SGD steps whatever the batch, and on a GPU a step of
    these small networks costs the launch of its kernels: gpu_check timed such an update at
    2,048 samples (minibatches of 64), and its fit gives the seconds per step at minibatches of
    256. A straight line through the two prices each step by its minibatch size, so an update
    of B samples costs ``320 * (a + b * B / 32)`` seconds: a constant plus a small slope."""
    if task != "Hopper-v5":
        raise SystemExit(f"perf/gpu_check.py measures Hopper-v5's learner only, not {task}: "
                         "pass --model-task Hopper-v5")
    fitted = json.loads(GPU_CHECK.read_text()).get("time_model") if GPU_CHECK.exists() else None
    if not fitted or fitted.get("device") != "cuda":
        raise SystemExit(f"{GPU_CHECK} holds no time model measured on CUDA: run "
                         "perf/gpu_check.py on a machine with a GPU first")
    constants = {k: fitted["constants"][k] for k in LEARNER_KEYS}
    if minibatches == "count":
        data = json.loads(GPU_CHECK.read_text())
        update_s = float(np.median([r["s"] for r in data["repeats"]
                                    if r["device"] == "cuda" and r["case"] == "hopper_ppo"]))
        epochs, count, measured_batch = 10, 32, 2048  # gpu_check's hopper_ppo update
        small = (update_s / (epochs * count), measured_batch / count)
        large = (constants["model_learner_s_per_step"] * 256 / epochs, 256.0)
        b = (large[0] - small[0]) / (large[1] - small[1])
        a = small[0] - b * small[1]
        constants["model_learner_s"] = epochs * count * a
        constants["model_learner_s_per_step"] = epochs * b
    return constants


CLOCK_TITLES = {"measured": "", "model": ", durations from the time model",
                "model_cuda": ", durations from the time model with the learner on a GPU"}


def run_one(task: str, pricing: str, budget: float, name: str, seed: int, out: Path,
            sets: list[str]) -> int:
    """One run of setting ``name`` into ``out`` (skipped when it finished before); its exit."""
    if (out / "summary.json").exists():
        return 0
    sets = [f"run.seed={seed}", f"stop.budget_usd={budget}", f'cost.learner="{pricing}"',
            f'env.id="{task}"', *sets, *SETTINGS[name]]
    cmd = [sys.executable, "-m", "kernel", "run", str(PLAN), "--out", str(out), "--force",
           *[a for s in sets for a in ("--set", s)]]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    c.log(f"{task} {name} seed {seed}: exit {done.returncode} in "
          f"{time.perf_counter() - t0:.0f} s")
    if done.returncode != 0:
        c.log(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "(no stderr)")
    return done.returncode


def run(args: argparse.Namespace) -> int:
    names = args.settings or list(SETTINGS)
    for seed in seeds(args.seeds):
        for name in names:
            out = task_dir(args.out, args.task, args.pricing, variant(args)) / name / f"seed-{seed}"
            run_one(args.task, args.pricing, args.budget, name, seed, out,
                    [*common_sets(args), *clock_sets(args)])
    return 0


#: The calibration of a new task's time model: the two no-boost runs ``fit`` reads, measured
#: (not modelled), each a fixed number of rounds rather than a budget, so a busy machine
#: slows them without leaving the fit fewer than its five updates of each size.
CALIBRATION = ("probe_n2", "probe_n16")
CALIBRATION_ROUNDS = 20
CALIBRATION_UNBOUNDED_USD = 100.0  # far above what 20 rounds cost: the rounds end the run


def calibration_runs(task: str, out: Path, names: tuple[str, ...]) -> list[Path]:
    """The events of ``task``'s measured calibration runs ``names`` (settings), made first where
    they are missing: a fixed number of rounds each, on a machine doing nothing else, as their
    durations are the model."""
    runs = []
    for name in names:
        run_dir = task_dir(out, task, "gpu") / name / "seed-1"
        code = run_one(task, "gpu", CALIBRATION_UNBOUNDED_USD, name, 1, run_dir,
                       [f"stop.max_rounds={CALIBRATION_ROUNDS}", *MINIBATCHES["size"], *COMMON])
        if code != 0:
            raise RuntimeError(f"the calibration run {run_dir} of {task} failed (exit {code})")
        runs.append(run_dir / "events.jsonl")
    return runs


def calibrate(task: str, out: Path) -> Path:
    """Fit ``task``'s time model on its calibration runs (a few minutes) and write it where
    ``model_path`` finds it."""
    runs = calibration_runs(task, out, CALIBRATION)
    # Two short runs see most sizes once (the probe's samples x Lanczos steps vary with the
    # rounds' convergence): a median of one is the value itself.
    fitted = fit_events(runs, min_count=1)
    path = c.write_result(f"time_model_{task_slug(task)}", {
        "title": f"Time model for {task}, fitted on its {len(runs)} calibration runs",
        **fitted, "note": FIT_NOTE, "markdown": constants_markdown(fitted["constants"])})
    c.log(f"{task}: time model fitted on {runs} -> {path}")
    return path


GNS_CALIBRATION = ("gns_n2", "gns_n16")


def calibrate_gns(task: str, out: Path) -> Path:
    """Add the gns probe's constants to ``task``'s time model, fitted on two short measured
    runs of that probe alone, and keep every constant already there (the studies billed by
    them replay as they ran). Like ``calibrate``, on a machine doing nothing else."""
    path = model_path(task)
    if not path.exists():
        raise SystemExit(f"{task} has no time model to add to ({path.name}): run a study with "
                         "--clock model, which calibrates it with the gns probe included")
    pairs = timing_pairs(calibration_runs(task, out, GNS_CALIBRATION))["gns"]
    added = gns_constants(pairs, min_count=5)
    if not added:
        raise RuntimeError(f"the gns calibration of {task} saw its probe at fewer than two "
                           f"sizes: {sorted({x for x, _ in pairs})}")
    constants = {**json.loads(path.read_text())["constants"], **added}
    c.update_result(path, {
        "constants": constants, "gns_probes": len(pairs), "gns_when": c.now(),
        "gns_command": c.command_line(), "gns_loadavg": list(os.getloadavg()),
        "gns_note": (f"model_gns_* fitted later than the rest, on {len(pairs)} gns probes of "
                     f"two measured calibration runs ({', '.join(GNS_CALIBRATION)})"),
        "markdown": constants_markdown(constants)})
    c.log(f"{task}: gns probe constants {added} -> {path}")
    return path


def fit_gns(args: argparse.Namespace) -> int:
    """``fit-gns``: the gns probe's constants for a task whose model predates them."""
    calibrate_gns(args.task, args.out / "calibration")
    return 0


def _slim(event: dict) -> dict | None:
    kind = event["event"]
    if kind == "RoundFinished":
        return {"event": kind, **{f: event.get(f) for f in ROUND_FIELDS}}
    if kind == "ProbeMeasured":
        value = event.get("values", {}).get("eval_return")
        return None if event.get("probe") != "eval" else {
            "event": kind, "round": event["round"], "probe": "eval",
            "values": {"eval_return": value}}
    if kind in ("RunStarted", "ScaleDecided", "CostCharged", "RunStopped"):
        return event
    return None


def store(args: argparse.Namespace) -> int:
    for summary in sorted(task_dir(args.out, args.task, args.pricing, variant(args))
                          .glob("*/seed-*/summary.json")):
        run_dir = summary.parent
        kept = task_dir(STORED, args.task, args.pricing, variant(args)) / run_dir.parent.name \
            / run_dir.name
        if (kept / "summary.json").exists():
            continue
        kept.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "plan.toml"):
            shutil.copy(run_dir / name, kept / name)
        with (run_dir / "events.jsonl").open() as src, (kept / "events.jsonl").open("w") as out:
            for line in src:
                event = _slim(json.loads(line))
                if event is not None:
                    out.write(json.dumps(event) + "\n")
        c.log(f"stored {kept.relative_to(ROOT)}")
    return 0


def probe_cost(dirs: list[Path]) -> dict[str, dict[str, float]]:
    """What the Hessian probe cost, per setting whose rounds ran it: its share of each round's
    wall time here (where 1-16 actors share 2 cores, so a round lasts longer than in the
    cloud), of each round's simulated time (the round as it would last with one Lambda per
    actor) and of the dollars charged (``probe_usd`` of every CostCharged). The simulated share
    is the probe's share of the time the round's bill charged at the learner's price, so under
    a time model it is the modelled probe's, not this machine's measured seconds over modelled
    ones.

    A rule that probes every k-th round pays the probe in one round of k: ``wall_all`` and
    ``sim_all`` are the probe's seconds over all rounds' seconds, the share of a run's time it
    costs on average. The simulated share counts every round, as the bill leaves evaluation
    out; the wall shares only rounds without an evaluation, whose time the events do not
    separate from the probe's. (Until study 20 the simulated share also left out rounds with
    an evaluation, which every 20th round coincide with a probed one: 2 of 9 rounds left out
    were probed against 1 in 4 overall, so it read low: 10.1 % for 11.0 % on Humanoid-v5.)"""
    wall: dict[str, list[float]] = {}
    sim: dict[str, list[float]] = {}
    usd: dict[str, list[float]] = {}
    #: per setting: probe and round seconds summed over every round, here and simulated
    totals: dict[str, np.ndarray] = {}
    for run_dir in dirs:
        setting = run_dir.parent.name
        sim_before, charged_share = 0.0, None
        for line in (run_dir / "events.jsonl").open():
            event = json.loads(line)
            if event["event"] == "RoundFinished":
                sim_s, sim_before = event["sim_time_s"] - sim_before, event["sim_time_s"]
                evaluated = event.get("eval_return") is not None
                total = totals.setdefault(setting, np.zeros(4))
                if sim_s > 0 and (charged_share is not None or not evaluated):
                    sim_share = (event["probe_s"] / sim_s if charged_share is None
                                 else charged_share)
                    total[2:] += (sim_share * sim_s if event["probe_s"] > 0 else 0.0, sim_s)
                if evaluated or event["round_s"] <= 0 or sim_s <= 0:
                    continue
                if "lanczos_steps" in (event.get("probes") or {}):
                    wall.setdefault(setting, []).append(event["probe_s"] / event["round_s"])
                    sim.setdefault(setting, []).append(sim_share)
                total[:2] += (event["probe_s"], event["round_s"])
            elif event["event"] == "CostCharged":
                items = event["items"]
                pair = usd.setdefault(setting, [0.0, 0.0])
                pair[0] += items.get("probe_usd", 0.0)
                pair[1] += event["round_usd"]
                charged_share = probe_share_of(items)

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90))}

    return {setting: {"rounds": len(values), "wall": spread(values), "sim": spread(sim[setting]),
                      "wall_all": totals[setting][0] / totals[setting][1],
                      "sim_all": totals[setting][2] / totals[setting][3],
                      "usd_share": usd[setting][0] / usd[setting][1] if usd[setting][1] else 0.0}
            for setting, values in sorted(wall.items())}


def all_rounds(cost: dict[str, Any], kind: str) -> str:
    """A share over all rounds, or a dash in a result collected before it was measured."""
    share = cost.get(f"{kind}_all")
    return "—" if share is None else f"{share:.1%}"


def probe_table(costs: dict[str, dict[str, Any]]) -> str:
    lines = ["Hessian probe, share of each round it ran in (rounds without evaluation): of its "
             "wall time here and of its simulated time; its share of all rounds' time (probed or "
             "not; the wall time of rounds without evaluation), and of the dollars charged", "",
             "| setting | rounds | wall, median | wall, p90 | simulated, median | simulated, p90 "
             "| wall, all rounds | simulated, all rounds | dollars |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| `{s}` | {v['rounds']:,} | {v['wall']['median']:.1%} | {v['wall']['p90']:.1%} "
              f"| {v['sim']['median']:.1%} | {v['sim']['p90']:.1%} | {all_rounds(v, 'wall')} "
              f"| {all_rounds(v, 'sim')} | {v['usd_share']:.1%} |"
              for s, v in costs.items()]
    return "\n".join(lines)


def spend_line(rows: list[dict[str, Any]]) -> str:
    """How close every run came to its budget: the allocator should end each between 95 % and
    100 % (it shrinks a fixed N's last rounds too), short of that only where one round of
    ``actors.min`` costs more than the rest or a round cost more than its estimate."""
    spent = sorted((r["budget_spent"], r["setting"], r["seed"]) for r in rows
                   if r.get("budget_spent") is not None)
    if not spent:
        return ""
    within = sum(1 for s, _, _ in spent if 0.95 <= s <= 1.0)
    short = ", ".join(f"`{n}` seed {seed} {s:.1%}" for s, n, seed in spent if s < 0.95)
    over = ", ".join(f"`{n}` seed {seed} {s:.2%}" for s, n, seed in spent if s > 1.0)
    return (f"Spend: {within} of {len(spent)} runs spent 95-100 % of their budget"
            + (f"; below 95 %: {short}" if short else "")
            + (f"; over 100 %: {over}" if over else "") + ".")


def render(data: dict[str, Any]) -> str:
    """The section of perf/RESULTS.md, recomputed from the stored per-seed rows."""
    rows = data["rows"]
    labels = list(dict.fromkeys(r["setting"] for r in rows))
    result = agg.summarize(rows, labels, data.get("target"), data.get("baseline"),
                           c.STUDY_INTERVAL)
    parts = [agg.markdown(result), spend_line(rows)]
    if data.get("probe_cost"):
        parts.append(probe_table(data["probe_cost"]))
    return "\n\n".join(p for p in parts if p)


def collect(args: argparse.Namespace) -> int:
    stored = task_dir(STORED, args.task, args.pricing, variant(args))
    dirs = sorted(p.parent for p in stored.glob("*/seed-*/summary.json"))
    name = result_name(args)
    groups = [g for g in agg.merge(agg.group_runs(dirs, "parent")) if g.runs]
    result = agg.aggregate(groups, args.target, args.baseline, c.STUDY_INTERVAL)
    costs = probe_cost(dirs)
    table = "\n\n".join([agg.markdown(result), spend_line(result["rows"]), probe_table(costs)])
    if args.clock != "measured":
        table = ("Durations from the time model (`cost.time_model`), its constants in "
                 f"`perf/results/{model_path(args.model_task or args.task).name}`"
                 + (f", the learner's and the probe's replaced by those `perf/gpu_check.py` "
                    f"measured on a GPU (`perf/results/{GPU_CHECK.name}`)"
                    if args.clock == "model_cuda" else "") + ".\n\n" + table)
    figures = agg.band_figures(groups, ROOT / "perf" / "figures" / name, c.STUDY_INTERVAL)
    c.write_result(name, {
        "title": f"Boosting at equal budget, {args.task}, learner priced as {args.pricing}"
                 + CLOCK_TITLES[args.clock]
                 + MODE_TITLES[args.mode]
                 + (f", the runs labelled `{args.label}` (a study of their own)"
                    if args.label else ""),
        "protocol": {"plan": str(PLAN.relative_to(ROOT)), "task": args.task, "sets": common_sets(args),
                     "clock": args.clock, "clock_sets": clock_sets(args),
                     "settings": SETTINGS, "pricing": args.pricing, "target": args.target,
                     "baseline": args.baseline},
        **result, "probe_cost": costs, "text": table,
        "figures": [str(p.relative_to(ROOT)) for p in figures]})
    print(table)
    return 0


def result_name(args: argparse.Namespace) -> str:
    return f"boost_{task_slug(args.task)}_{args.pricing}" + variant(args).replace("-", "_")


def doc_table(data: dict[str, Any], baselines: list[str]) -> str:
    """docs/boosting.md's compact table of a collected study: per setting the final
    evaluation (mean with its interval, IQM), mean N, env steps, the paired differences
    against each of ``baselines``, and the cost to the target; recomputed from the rows."""
    rows = data["rows"]
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    by = {name: [r for r in rows if r["setting"] == name] for name in settings}

    def num(v: float, signed: bool = False) -> str:
        text = f"{v:+,.0f}" if signed else f"{v:,.0f}"
        return text.replace("-", "−")

    def interval(ci: tuple[float, float] | None, signed: bool = False) -> str:
        return "" if ci is None else f" [{num(ci[0], signed)}, {num(ci[1], signed)}]"

    target = data.get("target")
    head = ["setting", "seeds", "final eval, mean [95 % CI]", "IQM", "mean N", "env steps",
            *(f"Δ final vs `{b}` [95 % CI]" for b in baselines),
            f"cost to {target:g}, $ (seeds reaching it)"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for name in settings:
        mine = by[name]
        final = agg.describe([r["final_eval_return"] for r in mine], c.STUDY_INTERVAL)
        cells = [f"`{name}`", str(len(mine)), num(final["mean"]) + interval(final["mean_ci"]),
                 num(final["iqm"]), f"{np.mean([r['mean_actors'] for r in mine]):.1f}",
                 num(np.mean([r["env_steps"] for r in mine]))]
        for b in baselines:
            if b == name or b not in by:
                cells.append("—")
                continue
            d = agg.paired(mine, by[b], "final_eval_return", c.STUDY_INTERVAL)
            cells.append(num(d["mean"], True) + interval(d["mean_ci"], True))
        reached = [r["cost_to_target_usd"] for r in mine if r.get("cost_to_target_usd")]
        cells.append(f"{np.mean(reached):.4f} ({len(reached)})" if reached else "— (0)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The load-independent studies (time-model clocks) that ``pooled`` reads by default.
POOLED_STUDIES = ("boost_hopper_gpu_model", "boost_hopper_gpu_model_cuda",
                  "boost_hopper_gpu_model_cuda_mb32", "boost_walker2d_gpu_model_cuda")


def pooled_difference(studies: list[dict[str, Any]], setting: str, baseline: str
                      ) -> dict[str, Any] | None:
    """One verdict over several studies: each seed's final return of ``setting`` minus the
    baseline's, divided by the standard deviation of the baseline's returns in that study (so
    a Walker2d seed and a Hopper seed weigh alike), averaged over every seed both ran, with the
    reports' percentile-bootstrap interval over those seeds. None when no study ran both."""
    diffs, per_study = [], {}
    for data in studies:
        rows = [r for r in data["rows"] if r.get("final_eval_return") is not None]
        ours = {r["seed"]: r["final_eval_return"] for r in rows if r["setting"] == setting}
        theirs = {r["seed"]: r["final_eval_return"] for r in rows if r["setting"] == baseline}
        seeds = sorted(set(ours) & set(theirs))
        if len(theirs) < 2 or not seeds:
            continue
        scale = float(np.std(list(theirs.values()), ddof=1))
        study = [(ours[s] - theirs[s]) / scale for s in seeds]
        per_study[data["name"]] = {"seeds": len(seeds), "mean_difference": float(
            np.mean([ours[s] - theirs[s] for s in seeds])), "standardised": float(np.mean(study))}
        diffs += study
    if not diffs:
        return None
    lo, hi = agg.bootstrap_ci(diffs, interval=c.STUDY_INTERVAL) or (float("nan"), float("nan"))
    return {"setting": setting, "baseline": baseline, "seeds": len(diffs),
            "standardised": float(np.mean(diffs)), "interval": [lo, hi],
            "studies": per_study}


def pooled(args: argparse.Namespace) -> int:
    """Print ``pooled_difference`` of ``--settings`` against each of ``--baselines`` over the
    stored results named by ``--studies`` (file stems under perf/results/)."""
    studies = [json.loads((c.RESULTS / f"{name}.json").read_text()) for name in args.studies]
    for setting in args.settings or []:
        for baseline in args.baselines or []:
            got = pooled_difference(studies, setting, baseline)
            if got is None:
                print(f"{setting} - {baseline}: no study ran both")
                continue
            lo, hi = got["interval"]
            print(f"{setting} - {baseline}: {got['standardised']:+.2f} baseline sd "
                  f"[{lo:+.2f}, {hi:+.2f}] over {got['seeds']} seeds; per study: " + ", ".join(
                      f"{k} {v['mean_difference']:+,.0f} ({v['seeds']})"
                      for k, v in got["studies"].items()))
    return 0


def doctable(args: argparse.Namespace) -> int:
    data = json.loads((c.RESULTS / f"{result_name(args)}.json").read_text())
    print(doc_table(data, args.baselines or [data.get("baseline") or "fixed8"]))
    return 0


def argparse_parser() -> argparse.ArgumentParser:
    """The command line: an action and the flags that name a study."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "store", "collect", "fit", "fit-gns",
                                           "doctable", "pooled"))
    parser.add_argument("--task", type=task_id, default="Hopper-v5",
                        help=f"a gymnasium id (the paper's: {', '.join(TASKS)})")
    parser.add_argument("--pricing", choices=("cpu", "gpu"), default="cpu",
                        help="the learner's instance price (cost.learner)")
    parser.add_argument("--clock", choices=tuple(CLOCK_TITLES), default="measured",
                        help="bill measured durations, the time model fitted by `fit`, or that "
                             "model with the learner's and probe's seconds measured on a GPU "
                             "by perf/gpu_check.py (model_cuda)")
    parser.add_argument("--minibatches", choices=tuple(MINIBATCHES), default="size",
                        help="size: minibatches of 256 samples (more SGD steps for a bigger "
                             "round); count: the plan's 32 whatever the batch (the paper's regime)")
    parser.add_argument("--mode", choices=tuple(MODES), default="sync",
                        help="sync rounds (the studies'), or pipelined ones at a fixed snapshot "
                             "point (pipelined) or a timed one (timed), clocked for the sampling "
                             "the update hid")
    parser.add_argument("--label", type=label_name,
                        help="a study of its own beside the one these flags name (folders and "
                             "results end in -<label>): runs made under other conditions, e.g. "
                             "measured on another machine, that must not pair with its seeds")
    parser.add_argument("--model-task", type=task_id,
                        help="take the time model fitted on this task (default: --task)")
    parser.add_argument("--budget", type=float, default=0.004, help="USD per run")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "boost")
    parser.add_argument("--target", type=float, default=500.0)
    parser.add_argument("--baseline", default="fixed2")
    parser.add_argument("--baselines", nargs="+",
                        help="doctable, pooled: settings to pair against")
    parser.add_argument("--studies", nargs="+", default=list(POOLED_STUDIES),
                        help="pooled: result files (stems under perf/results/) to pool")
    return parser


def main() -> int:
    args = argparse_parser().parse_args()
    return {"run": run, "store": store, "collect": collect, "fit": fit, "fit-gns": fit_gns,
            "doctable": doctable, "pooled": pooled}[args.action](args)


if __name__ == "__main__":
    raise SystemExit(main())
