"""Actor-side agent steps/s on Atari with the standard preprocessing, against raw ale-py.

Rows (all on one core, one torch thread, like a local worker or a 1-vCPU Lambda):
- raw: ``gym.make("ALE/Pong-v5")`` stepped one env at a time, no preprocessing (the ceiling
  of the emulator with frame skip 4);
- vector env: ale-py's ``AtariVectorEnv`` as ``envs.make_vector_env`` builds it (C++
  preprocessing: max-pool, 84x84 grey, 4-stack), stepped with random actions;
- gymnasium wrappers: ``AtariPreprocessing`` + ``FrameStackObservation`` in a SyncVectorEnv,
  the alternative we did not pick (only when OpenCV is installed);
- Sampler + random policy: ``envs.Sampler.sample`` with a numpy policy (the rollout buffers,
  reward clipping and episode tracking on top of the vector env);
- Sampler + ActorPolicy: the same with the Nature-CNN actor in eager torch;
- Sampler + CNNPolicy: the same network on ONNX Runtime (``algos.policy_onnx``);
- Sampler + CNNPolicy int8: the same with ``net.actor_dtype = "int8"`` (8-bit products,
  calibrated per load; ``algos.onnx_graphs``), what ``algo.actor_dtype = "int8"`` runs;
- Sampler + the plugins' actor: whatever ``algos.actor.make_actor_policy`` picks for the
  Nature CNN (CNNPolicy when the optional ``onnx`` extra is installed, else torch), i.e. what
  an actor of the stock algo plugins runs; its ratio to raw is the actor's figure.

Repeats are interleaved (every row once, then again), so a busy neighbour slows all rows alike;
each row prints its best steps/s and its ratio to the raw row measured in the same run.

    .venv/bin/python perf/atari_sps.py            # raw rows in perf/results/atari_sps.json
    .venv/bin/python perf/atari_sps.py --quick
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import common as c
import gymnasium as gym
import numpy as np


class RandomPolicy:
    def __init__(self, n: int):
        self.n = n
        self.rng = np.random.default_rng(0)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        zeros = np.zeros(len(obs), dtype=np.float32)
        return self.rng.integers(0, self.n, len(obs)), {"logprobs": zeros, "values": zeros}

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.float32)


def timed(fn: Callable[[], int]) -> float:
    """Steps/s of one run of ``fn`` (which returns the agent steps it took)."""
    t0 = time.perf_counter()
    steps = fn()
    return steps / (time.perf_counter() - t0)


def raw(env_id: str, steps: int) -> Callable[[], int]:
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make(env_id, disable_env_checker=True)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n = int(env.action_space.n)

    def run() -> int:
        for _ in range(steps):
            _, _, term, trunc, _ = env.step(int(rng.integers(n)))
            if term or trunc:
                env.reset()
        return steps

    return run


def vector(spec: dict[str, Any], steps: int) -> Callable[[], int]:
    from envs import make_vector_env

    envs = make_vector_env(spec, seed=0)
    rng = np.random.default_rng(0)
    E, n = envs.num_envs, int(envs.single_action_space.n)

    def run() -> int:
        for _ in range(steps // E):
            envs.step(rng.integers(0, n, E))
        return steps // E * E

    return run


def gym_wrappers(env_id: str, num_envs: int, steps: int) -> Callable[[], int] | None:
    try:
        import cv2  # noqa: F401  (AtariPreprocessing needs it)
    except ImportError:
        return None
    import ale_py

    gym.register_envs(ale_py)

    def thunk() -> gym.Env:
        env = gym.make(env_id, frameskip=1, disable_env_checker=True)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
        return gym.wrappers.FrameStackObservation(env, 4)

    envs = gym.vector.SyncVectorEnv([thunk] * num_envs, copy=False,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    n = int(envs.single_action_space.n)

    def run() -> int:
        for _ in range(steps // num_envs):
            envs.step(rng.integers(0, n, num_envs))
        return steps // num_envs * num_envs

    return run


def sampler(spec: dict[str, Any], steps: int, policy: Any) -> Callable[[], int]:
    from envs import Sampler

    s = Sampler(spec, seed=0)
    fragment = 128  # a typical actor fragment: buffers stay small, as in an invocation

    def run() -> int:
        done = 0
        while done < steps:
            s.sample(policy, fragment)
            done += fragment * s.num_envs
        return done

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="ALE/Pong-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20_000, help="agent steps per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,048 steps, one repeat")
    args = parser.parse_args()
    steps, repeats = (2048, 1) if args.quick else (args.steps, args.repeats)

    import torch

    torch.set_num_threads(1)
    from algos.policy import ActorPolicy
    from algos.policy_onnx import CNNPolicy, onnx_available
    from algos.ppo import PPO
    from envs import describe

    spec = {"id": args.env_id, "num_envs": args.num_envs, "normalize_obs": False,
            "normalize_reward": False}
    spaces = describe(spec)
    n = spaces["action"]["n"]
    core = PPO(spaces)
    actor = ActorPolicy(core.actor_spec())
    actor.load(core.weights())
    from algos.actor import make_actor_policy

    plugin_actor = make_actor_policy(core.actor_spec())
    plugin_actor.load(core.weights())
    onnx_actor = int8_actor = None
    if onnx_available():
        onnx_actor = CNNPolicy(core.actor_spec())
        onnx_actor.load(core.weights())
        int8_spec = core.actor_spec()
        int8_spec["net"]["actor_dtype"] = "int8"
        int8_actor = CNNPolicy(int8_spec)
        int8_actor.load(core.weights())

    rows: list[tuple[str, Callable[[], int] | None]] = [
        ("raw ale-py (1 env, no preprocessing)", raw(args.env_id, steps)),
        (f"AtariVectorEnv x{args.num_envs} (C++ preprocessing)", vector(spec, steps)),
        (f"gymnasium wrappers x{args.num_envs} (OpenCV)",
         gym_wrappers(args.env_id, args.num_envs, steps)),
        ("Sampler + random numpy policy", sampler(spec, steps, RandomPolicy(n))),
        ("Sampler + ActorPolicy (Nature CNN, torch)", sampler(spec, steps, actor)),
        ("Sampler + CNNPolicy (Nature CNN, ONNX Runtime)",
         sampler(spec, steps, onnx_actor) if onnx_actor is not None else None),
        ("Sampler + CNNPolicy int8 (Nature CNN, ONNX Runtime, 8-bit products)",
         sampler(spec, steps, int8_actor) if int8_actor is not None else None),
        (f"Sampler + plugins' actor ({type(plugin_actor).__name__})",
         sampler(spec, steps, plugin_actor)),
    ]
    measured = []
    for repeat in range(repeats):
        for name, fn in rows:
            if fn is not None:
                measured.append({"row": name, "repeat": repeat, "steps_per_s": timed(fn)})
    result = {"title": "Atari agent steps/s on Pong with preprocessing vs raw ale-py",
              "env_id": args.env_id, "steps": steps, "quick": args.quick, "rows": measured,
              "skipped": [name for name, fn in rows if fn is None]}
    c.write_result("atari_sps", result)
    print(render(result))


def render(data: dict[str, Any]) -> str:
    """Each row's best steps/s over the repeats and its ratio to raw ale-py's best (the
    repeats ran interleaved, so a busy neighbour slowed every row alike)."""
    names = list(dict.fromkeys(r["row"] for r in data["rows"]))
    best = {n: max(r["steps_per_s"] for r in data["rows"] if r["row"] == n) for n in names}
    repeats = max(r["repeat"] for r in data["rows"]) + 1
    raw_best = best[names[0]]
    table = [[n, best[n], f"x{best[n] / raw_best:.2f}"] for n in names]
    table += [[n, "skipped (optional package not installed)", "—"] for n in data["skipped"]]
    return (f"{data['env_id']}: agent steps/s on one core, {data['steps']:,} steps per row, "
            f"best of {repeats} interleaved repeats (higher is better).\n\n"
            + c.md_table(["row", "agent steps/s", "of raw ale-py"], table))


if __name__ == "__main__":
    main()
