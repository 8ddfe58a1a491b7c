"""Learner frames/s of the Nature-CNN V-trace updates, today's code against a frozen baseline.

The baseline is the algos/ package as it stood at ``--baseline`` (a git revision, by default
the commit before the learner speed-ups), read with ``git show`` into a temporary package
``algos_base`` so both run in this process, on the same machine state. Each repeat runs every
variant once, in turn (interleaved, so a neighbour's load hits all of them alike); the table
shows the median over repeats of frames/s (sampled frames per second of ``update``) and its
ratio to the baseline at the learner's default thread count.

The batch is the Pong plan's: 8 envs x 128 steps of 4x84x84 uint8 frames (random pixels: the
cost of a convolution does not depend on them), APPO with 4 epochs of 4 minibatches and IMPALA
with one pass. Thread counts: ``2`` is what the learner picks today for pixels on this machine
(every core), ``1`` is what the Atari plans set (``run.torch_threads``) because actors share
the cores.

On a CPU with native bfloat16 (AMX or AVX512-BF16) the ``today-bf16`` rows add today's code
with ``algo.cnn_dtype = "bfloat16"``: the Nature-CNN trunk under autocast, the rest float32.

    .venv/bin/python perf/learner_bench.py            # 5 repeats, raw rows in perf/results/
    .venv/bin/python perf/learner_bench.py --quick    # 2 repeats, APPO only
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common as c
import numpy as np

#: The last commit before the learner speed-ups (channels-last frames, one V-trace loop).
BASELINE = "c5e1d85"
SPACES = {"obs_shape": [4, 84, 84], "obs_dtype": "uint8", "action": {"kind": "discrete", "n": 6}}


def load_baseline(revision: str, folder: Path) -> str:
    """Write algos/ at ``revision`` as package ``algos_base`` under ``folder``; its name."""
    package = folder / "algos_base"
    package.mkdir()
    names = subprocess.run(["git", "ls-tree", "--name-only", revision, "algos/"], cwd=c.ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        source = subprocess.run(["git", "show", f"{revision}:{name}"], cwd=c.ROOT, check=True,
                                capture_output=True, text=True).stdout
        source = source.replace("from algos.", "from algos_base.")
        (package / Path(name).name).write_text(source, encoding="utf-8")
    sys.path.insert(0, str(folder))
    return "algos_base"


def pong_rollout(steps: int, envs: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.integers(0, 255, (steps, envs, 4, 84, 84), dtype=np.uint8),
        "actions": rng.integers(0, 6, (steps, envs)),
        "logprobs": np.full((steps, envs), -np.log(6.0), np.float32),
        "values": np.zeros((steps, envs), np.float32),
        "rewards": rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], (steps, envs)).astype(np.float32),
        "terminated": rng.random((steps, envs)) < 0.01,
        "truncated": np.zeros((steps, envs), bool),
        "bootstrap_values": np.zeros((steps, envs), np.float32),
        "last_obs": rng.integers(0, 255, (envs, 4, 84, 84), dtype=np.uint8),
    }


def make_core(package: str, algo: str, **extra: Any) -> Any:
    """An APPO (the Pong plan's settings) or IMPALA core of ``package`` (algos or algos_base);
    ``extra`` config fields only today's code has (``cnn_dtype``)."""
    import torch

    torch.manual_seed(0)
    module = importlib.import_module(f"{package}.{algo}")
    if algo == "appo":
        return module.APPO(SPACES, module.APPOConfig(learning_rate=2.5e-4, clip_coef=0.1,
                                                     **extra))
    return module.IMPALA(SPACES, module.IMPALAConfig(learning_rate=2.5e-4, **extra))


def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 itself (AMX or AVX512-BF16); elsewhere oneDNN
    emulates it, slower than float32, so the ``today-bf16`` rows are left out by default."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("amx_bf16", "avx512_bf16"))


#: The code variants: the frozen baseline, today's code, and today's with a bfloat16 trunk.
CODES = {"baseline": {}, "today": {}, "today-bf16": {"cnn_dtype": "bfloat16"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the baseline")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=128, help="steps per env in the batch")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--threads", default="2,1", help="torch thread counts to measure")
    parser.add_argument("--algos", default="appo,impala")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="measure today's code with algo.cnn_dtype = bfloat16 too (auto: "
                        "where the CPU has native bfloat16)")
    parser.add_argument("--quick", action="store_true", help="2 repeats, APPO only")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.algos = 2, "appo"

    import torch

    tmp = tempfile.TemporaryDirectory()
    base = load_baseline(args.baseline, Path(tmp.name))
    rollout = pong_rollout(args.steps, args.envs)
    frames = args.steps * args.envs
    threads = [int(t) for t in args.threads.split(",")]
    bf16 = args.bf16 == "on" or (args.bf16 == "auto" and native_bfloat16())
    codes = [code for code in CODES if bf16 or code != "today-bf16"]
    variants = [(algo, code, t) for algo in args.algos.split(",") for code in codes
                for t in threads]
    cores = {(algo, code): make_core(base if code == "baseline" else "algos", algo,
                                     **CODES[code])
             for algo, code, _ in variants}
    c.log(f"warming up {len(cores)} cores")
    for core in cores.values():
        core.update(rollout, 0.0)

    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for algo, code, t in variants:
            torch.set_num_threads(t)
            t0 = time.perf_counter()
            cores[(algo, code)].update(rollout, 0.0)
            seconds = time.perf_counter() - t0
            rows.append({"algo": algo, "code": code, "threads": t, "repeat": repeat,
                         "seconds": seconds, "frames_per_s": frames / seconds})
        c.log(f"repeat {repeat + 1}/{args.repeats} done")

    summary = summarise(rows, threads)
    print(f"Nature-CNN learner, {frames} frames per update, median of {args.repeats} "
          f"interleaved repeats (baseline = {args.baseline}, load {c.machine()['loadavg']})")
    for line in summary["lines"]:
        print("  " + line)
    c.write_result("learner_bench", {
        "title": "Nature-CNN learner frames/s against the pre-speed-up code (issue 18)",
        "baseline": args.baseline, "frames_per_update": frames, "repeats": args.repeats,
        "native_bfloat16": native_bfloat16(),
        "rows": rows, "medians": summary["medians"], "markdown": "\n".join(summary["lines"]),
    }, args.out)


def summarise(rows: list[dict[str, Any]], threads: list[int]) -> dict[str, Any]:
    """Median frames/s per variant, each as a ratio to the baseline at the default threads
    (the first in ``threads``) and to the baseline at the same thread count."""
    medians: dict[str, float] = {}
    for row in rows:
        key = f"{row['algo']}/{row['code']}/{row['threads']}"
        medians.setdefault(key, 0.0)
    for key in medians:
        algo, code, t = key.split("/")
        medians[key] = statistics.median(
            r["frames_per_s"] for r in rows
            if r["algo"] == algo and r["code"] == code and r["threads"] == int(t))
    lines = [f"{'algo':<7}{'code':<12}{'threads':>8}{'frames/s':>10}{'x default':>11}"
             f"{'x same threads':>16}"]
    for key, fps in medians.items():
        algo, code, t = key.split("/")
        default = medians[f"{algo}/baseline/{threads[0]}"]
        same = medians[f"{algo}/baseline/{t}"]
        lines.append(f"{algo:<7}{code:<12}{t:>8}{fps:>10,.0f}{fps / default:>10.2f}x"
                     f"{fps / same:>15.2f}x")
    return {"medians": medians, "lines": lines}


if __name__ == "__main__":
    main()
