"""One script for a machine with a GPU: learner frames/s on CUDA, same learning as on CPU, and
how much of the fan-out overlaps with training. Ran in about 3 minutes on an H200 with 16
cores; on a machine without CUDA it runs the CPU parts and says which CUDA parts it skipped, so
it can be checked anywhere. tests/test_cuda.py checks correctness on the same machine.

The packages it needs beyond the GPU image's (gymnasium, mujoco, ale-py, structlog, ...) and
the project itself travel as wheels when that machine has no package index:
``pip install --no-deps --target DIR *.whl`` there, with the project's own wheel so that its
plugin entry points are registered.

1. Learner frames/s: a PPO update of a Hopper-sized batch (MLP, 2048 samples, 10 epochs of 32
   minibatches) and an APPO update of the Pong plan's batch (Nature CNN, 1024 frames, 4 epochs
   of 4 minibatches), on CPU and on CUDA, median of ``--repeats``; ``hopper_ppo_waiting`` is
   the same update with the host waiting for each step's gradient norm, as it did before.
2. Same learning: a short seeded PPO run on CartPole (sampler and learner in this process) on
   CPU and on CUDA; the mean episode return of the last rounds must agree within ``--tolerance``
   (kernels differ in rounding, so runs drift apart slowly; a wrong device path breaks far more).
3. Overlap: ``plans/hopper.toml`` through the engine in ``sync`` and ``pipelined`` mode on the
   learner's device; the env steps/s ratio and the learner's busy fraction say how much of the
   fan-out ran while the learner trained.
4. The boosting study's time model on this device: the study's plan (perf/boost_budget.py) with
   1, 4 and 16 fixed actors and the Hessian probe every round, learner on the device; update
   seconds against env steps trained and probe seconds against samples x Lanczos steps, fitted
   as ``boost_budget.py fit`` does. With a GPU these are the constants the GPU-priced study
   should bill the learner and the probe by (its actors stay on CPU-priced Lambdas).

    python perf/gpu_check.py                 # results in perf/results/gpu_check.json
    python perf/gpu_check.py --out /tmp/r --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common as c
import numpy as np
from learner_bench import SPACES as PONG
from learner_bench import pong_rollout

HOPPER = {"obs_shape": [11], "obs_dtype": "float32",
          "action": {"kind": "box", "shape": [3], "low": [-1.0] * 3, "high": [1.0] * 3}}


def hopper_rollout(steps: int = 256, envs: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.standard_normal((steps, envs, 11)).astype(np.float32),
        "actions": rng.standard_normal((steps, envs, 3)).astype(np.float32),
        "logprobs": np.full((steps, envs), -4.0, np.float32),
        "values": np.zeros((steps, envs), np.float32),
        "rewards": rng.standard_normal((steps, envs)).astype(np.float32),
        "terminated": rng.random((steps, envs)) < 0.005,
        "truncated": np.zeros((steps, envs), bool),
        "bootstrap_values": np.zeros((steps, envs), np.float32),
        "last_obs": rng.standard_normal((envs, 11)).astype(np.float32),
        "last_values": np.zeros(envs, np.float32),
    }


Case = tuple[Any, dict[str, np.ndarray]]


def learner_cases(device: str) -> dict[str, Callable[[], Case]]:
    """The timed updates, by name: each builds its learner core and the rollout it updates on
    when asked, so a run that times or profiles one case builds no other."""
    from algos.appo import APPO, APPOConfig
    from algos.ppo import PPO, PPOConfig

    def waiting_each_step(core: PPO) -> PPO:
        """The core as it was before ``sgd_step`` kept the gradient norm on the device: reading
        it made the host wait for every step (the previous design, for a same-run ratio)."""
        step = core.sgd_step
        core.sgd_step = lambda loss, clip: float(step(loss, clip))  # type: ignore[method-assign]
        return core

    hopper = PPOConfig(num_minibatches=32, update_epochs=10)

    def pong(cnn_dtype: str) -> Case:
        config = APPOConfig(learning_rate=2.5e-4, clip_coef=0.1, cnn_dtype=cnn_dtype)
        return APPO(PONG, config, device=device), pong_rollout(128, 8)

    return {
        "hopper_ppo": lambda: (PPO(HOPPER, hopper, device=device), hopper_rollout()),
        "hopper_ppo_waiting": lambda: (waiting_each_step(PPO(HOPPER, hopper, device=device)),
                                       hopper_rollout()),
        "pong_appo": lambda: pong("float32"),
        # The Nature-CNN trunk under bfloat16 autocast (algo.cnn_dtype), on either device.
        "pong_appo_bf16": lambda: pong("bfloat16"),
    }


def learner_fps(device: str, repeats: int, raw: list[dict[str, Any]],
                only: set[str] | None = None) -> dict[str, float]:
    """Median frames/s of one update on ``device`` for each case (all, or those in ``only``);
    each timed update is appended to ``raw``."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    out = {}
    for name, build in learner_cases(device).items():
        if only and name not in only:
            continue
        core, rollout = build()
        frames = rollout["rewards"].size
        core.update(rollout, 0.0)  # warm-up: kernels, allocator, oneDNN primitives
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            core.update(rollout, 0.0)
            sync()
            times.append(time.perf_counter() - t0)
            raw.append({"device": device, "case": name, "frames": frames, "s": times[-1]})
        out[name] = frames / statistics.median(times)
    return out


def profile_update(device: str, case: str = "pong_appo") -> dict[str, Any]:
    """Where one update's time goes on ``device``: the busiest operators, and the share of the
    wall time the device spent computing (a small share means the update waits on the host:
    kernel launches, synchronisations, Python)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    core, rollout = learner_cases(device)[case]()
    core.update(rollout, 0.0)
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        core.update(rollout, 0.0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    averages = prof.key_averages()
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    device_us = sum(getattr(a, "self_device_time_total", 0.0) for a in averages)
    return {"device": device, "case": case, "wall_s": wall, "device_busy_s": device_us / 1e6,
            "table": averages.table(sort_by=sort, row_limit=15)}


def short_run(device: str, rounds: int, seed: int = 1) -> list[float]:
    """Mean episode return per round of a seeded CartPole PPO run with its learner on
    ``device`` (actors on CPU, as in the engine)."""
    import torch

    from algos.policy_numpy import MLPPolicy
    from algos.ppo import PPO, PPOConfig
    from envs import Sampler, describe

    spec = {"id": "CartPole-v1", "num_envs": 4, "normalize_obs": False,
            "normalize_reward": False, "gamma": 0.99}
    torch.manual_seed(seed)
    core = PPO(describe(spec), PPOConfig(), device=device)
    policy = MLPPolicy(core.actor_spec())
    sampler = Sampler(spec, seed=seed)
    returns: list[float] = []
    for r in range(rounds):
        policy.load(core.weights())
        policy.reseed(seed * 1000 + r)
        rollout = sampler.sample(policy, 128)
        core.update(rollout, r / rounds)
        ep = rollout["episode_returns"]
        returns.append(float(np.mean(ep)) if len(ep) else float("nan"))
    return returns


def overlap(device: str, rounds: int, out: Path) -> dict[str, Any]:
    """Hopper PPO through the engine, sync against pipelined, learner on ``device``."""
    result = {}
    for mode in ("sync", "pipelined"):
        folder = out / mode
        proc = c.run([sys.executable, "-m", "kernel", "run", "plans/hopper.toml", "--out",
                      str(folder), "--set", f"run.mode={mode}", "--set",
                      f"stop.max_rounds={rounds}", "--set", f"run.device={device}",
                      "--set", "probes=[]", "--set", "sinks=[]"], timeout=300)
        if proc.rc != 0:
            raise RuntimeError(f"hopper {mode} on {device} failed: {proc.stderr[-1500:]}")
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        finished = [e for e in events if e["event"] == "RoundFinished"]
        steady = finished[1:]  # round 1 holds the workers' cold starts
        span = steady[-1]["ts"] - finished[0]["ts"]
        result[mode] = {
            "env_steps_per_s": sum(e["round_env_steps"] for e in steady) / span,
            "learner_busy": statistics.mean(e["learner_busy"] for e in steady),
            "actor_idle_s": sum(e["actor_idle_s"] for e in steady),
        }
    result["speedup"] = (result["pipelined"]["env_steps_per_s"]
                         / result["sync"]["env_steps_per_s"])
    return result


def time_model(device: str, rounds: int, out: Path) -> dict[str, Any]:
    """The study's learner and probe seconds on ``device``, fitted over three batch sizes."""
    import boost_budget as bb

    paths = []
    for n in (1, 4, 16):
        folder = out / f"fixed{n}"
        sets = [*bb.MINIBATCHES["size"], *bb.COMMON, 'scaler={name="fixed"}', f"actors.count={n}",
                'probes=[{name="hessian", samples=2048}]', f"stop.max_rounds={rounds}",
                "stop.budget_usd=100", f"run.device={device}"]
        proc = c.run([sys.executable, "-m", "kernel", "run", str(bb.PLAN), "--out", str(folder),
                      *[a for s in sets for a in ("--set", s)]], timeout=300)
        if proc.rc != 0:
            raise RuntimeError(f"fixed{n} on {device} failed: {proc.stderr[-1500:]}")
        paths.append(folder / "events.jsonl")
    fitted = bb.fit_events(paths, min_count=1)  # probe sizes vary with the Lanczos steps
    fitted["markdown"] = bb.constants_markdown(fitted["constants"])
    return fitted


def render(data: dict[str, Any]) -> str:
    """RESULTS.md's tables, recomputed from the stored per-repeat rows and runs."""
    parts = [f"Machine: {data.get('gpu', 'no GPU')} beside "
             f"{(data.get('machine') or {}).get('cpu', '?')} "
             f"({(data.get('machine') or {}).get('cores', '?')} cores)."]
    rows = data.get("repeats") or []
    if rows:
        cases = list(dict.fromkeys(r["case"] for r in rows))
        devices = list(dict.fromkeys(r["device"] for r in rows))

        def fps(device: str, case: str) -> float | None:
            times = [r["s"] for r in rows if r["device"] == device and r["case"] == case]
            frames = next((r["frames"] for r in rows if r["case"] == case), 0)
            return frames / statistics.median(times) if times else None

        table = [[case, *(fps(d, case) for d in devices),
                  *([c.ratio(fps("cuda", case), fps("cpu", case))] if "cuda" in devices else [])]
                 for case in cases]
        headers = ["learner update", *(f"{d} frames/s" for d in devices),
                   *(["cuda / cpu"] if "cuda" in devices else [])]
        parts.append("Learner frames/s, median of the repeats (CPU rows on one torch thread, as "
                     "the plans run them). `hopper_ppo_waiting` is the update with the host "
                     "waiting for every step's gradient norm, as before (on the CPU that read "
                     "waits for nothing: the difference there is noise).\n\n"
                     + c.md_table(headers, table))
    short = data.get("short_run")
    if short:
        line = ", ".join(f"{d} {v:.1f}" for d, v in short["last_mean"].items())
        verdict = ""
        if "relative_difference" in short:
            verdict = (f"; relative difference {short['relative_difference']:.2f}: "
                       + ("the same learning within the tolerance" if short["same"]
                          else "DIFFERENT"))
        parts.append("Seeded CartPole PPO, learner on each device, mean return of the last "
                     f"quarter of {len(next(iter(short['returns'].values())))} rounds: "
                     f"{line}{verdict}.")
    if data.get("overlap"):
        table = [[d, o["sync"]["env_steps_per_s"], o["pipelined"]["env_steps_per_s"],
                  o["speedup"], f"{o['pipelined']['learner_busy']:.0%}"]
                 for d, o in data["overlap"].items()]
        parts.append("Hopper through the engine, learner on the device, rounds after the "
                     "first:\n\n" + c.md_table(
                         ["learner", "sync env steps/s", "pipelined env steps/s", "speed-up",
                          "learner busy (pipelined)"], table))
    prof = data.get("profile")
    if prof:
        parts.append(f"One `{prof['case']}` update on {prof['device']} under torch's profiler: "
                     f"{prof['wall_s'] * 1e3:,.0f} ms of wall time, of which the device "
                     f"computed {prof['device_busy_s'] * 1e3:,.0f} ms "
                     f"({prof['device_busy_s'] / prof['wall_s']:.0%}); the busiest operators:"
                     f"\n\n```\n{prof['table'].strip()}\n```")
    model = data.get("time_model")
    if model:
        parts.append(f"The boosting study's time model, learner and probe on {model['device']} "
                     f"({model['updates']} updates, {model['probes']} probes at 1, 4 and 16 "
                     "actors):\n\n" + model["markdown"])
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="results folder "
                        "(default perf/results/)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=40, help="CartPole rounds per device")
    parser.add_argument("--tolerance", type=float, default=0.35,
                        help="allowed relative difference of the last rounds' mean return")
    parser.add_argument("--overlap-rounds", type=int, default=20)
    parser.add_argument("--model-rounds", type=int, default=10,
                        help="rounds per batch size for the time model")
    parser.add_argument("--parts", default="fps,run,overlap,model",
                        help="comma-separated parts to run (fps, run, overlap, model, profile)")
    parser.add_argument("--cases", default="", help="comma-separated learner updates to time "
                        "(default all: hopper_ppo, hopper_ppo_waiting, pong_appo, "
                        "pong_appo_bf16)")
    parser.add_argument("--name", default="gpu_check", help="result name (a later check on "
                        "another machine keeps the earlier one)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and rounds")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.rounds, args.overlap_rounds, args.model_rounds = 2, 12, 6, 6
    parts = set(args.parts.split(","))

    import torch

    cuda = torch.cuda.is_available()
    devices = ["cpu", "cuda"] if cuda else ["cpu"]
    result: dict[str, Any] = {"title": "Learner on CUDA: frames/s, same learning, overlap",
                              "cuda": cuda, "skipped": []}
    if cuda:
        result["gpu"] = torch.cuda.get_device_name(0)
    else:
        result["skipped"] = ["CUDA learner frames/s", "CUDA short run", "CUDA overlap"]
        print("CUDA is not available here: running the CPU parts only "
              "(skipped: CUDA frames/s, CUDA learning check, CUDA overlap)")

    torch.set_num_threads(1)  # CPU rows as the plans run them: actors share the cores
    # Each part's result is written as soon as it is measured: a run stopped by its time limit
    # keeps what it finished.
    path = c.write_result(args.name, result, args.out)
    if "fps" in parts:
        only = set(filter(None, args.cases.split(",")))
        result["repeats"] = []
        result["learner_frames_per_s"] = {d: learner_fps(d, args.repeats, result["repeats"],
                                                         only) for d in devices}
        c.update_result(path, result)
        print(f"learner frames/s ({', '.join(devices)}):", flush=True)
        for d, fps in result["learner_frames_per_s"].items():
            print(f"  {d:<5} " + "  ".join(f"{k} {v:,.0f}" for k, v in fps.items()), flush=True)
    if "profile" in parts:
        result["profile"] = profile_update(devices[-1])
        c.update_result(path, result)
        prof = result["profile"]
        print(f"one {prof['case']} update on {prof['device']}: {prof['wall_s'] * 1e3:.0f} ms "
              f"wall, device busy {prof['device_busy_s'] * 1e3:.0f} ms", flush=True)
        print(prof["table"], flush=True)
    if "run" in parts:
        runs = {d: short_run(d, args.rounds) for d in devices}
        tail = max(3, args.rounds // 4)
        last = {d: float(np.nanmean(r[-tail:])) for d, r in runs.items()}
        result["short_run"] = {"returns": runs, "last_mean": last}
        if cuda:
            diff = abs(last["cuda"] - last["cpu"]) / max(abs(last["cpu"]), 1e-8)
            result["short_run"].update(relative_difference=diff, same=diff <= args.tolerance)
        c.update_result(path, result)
        for d, value in last.items():
            print(f"CartPole PPO, mean return of the last {tail} of {args.rounds} rounds on "
                  f"{d}: {value:.1f}", flush=True)
        if cuda:
            verdict = "same" if result["short_run"]["same"] else "DIFFERENT"
            print(f"  CPU vs CUDA: {verdict} (relative difference "
                  f"{result['short_run']['relative_difference']:.2f}, tolerance "
                  f"{args.tolerance})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "overlap" in parts:
            result["overlap"] = {d: overlap(d, args.overlap_rounds, Path(tmp) / d)
                                 for d in devices}
            c.update_result(path, result)
            for d, o in result["overlap"].items():
                print(f"overlap on {d}: pipelined {o['pipelined']['env_steps_per_s']:,.0f} vs "
                      f"sync {o['sync']['env_steps_per_s']:,.0f} env steps/s "
                      f"(x{o['speedup']:.2f}); learner busy "
                      f"{o['pipelined']['learner_busy']:.0%} of each pipelined round", flush=True)
        if "model" in parts:
            device = devices[-1]
            result["time_model"] = {"device": device, **time_model(
                device, args.model_rounds, Path(tmp) / "model")}
            c.update_result(path, result)
            print(f"time model on {device}:", flush=True)
            print(json.dumps(result["time_model"]["constants"], indent=2), flush=True)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
