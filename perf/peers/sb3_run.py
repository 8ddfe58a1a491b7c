"""Stable-Baselines3 PPO on the peer-comparison tasks; prints one JSON line of results.

Runs with the peer venv's interpreter (``perf/peers/.venv-sb3/bin/python``), never the
project's. Hyperparameters mirror ``plans/cartpole.toml`` and ``plans/hopper.toml``; every
difference is listed in ``perf/peers/README.md``.

    sb3_run.py --task cartpole --seed 1      # to a 10-episode deterministic eval mean >= 475
    sb3_run.py --task hopper --seed 1        # 300k steps, then a 10-episode eval
    sb3_run.py --task hopper --threads 1 --vec subproc --procs 2   # SubprocVecEnv, 2 processes

``SubprocVecEnv`` runs one env per process, so with ``--procs 2`` the update's batch comes from
2 envs stepping 4x as many steps (Hopper: 2 x 1024 instead of 8 x 256): the same samples per
update, epochs and minibatches, from longer fragments of fewer envs.
"""

from __future__ import annotations

import argparse
import json
import time

T_PROCESS = time.perf_counter()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize  # noqa: E402

TASKS = {
    # CartPole: plans/cartpole.toml (4 envs x 128 steps, 4 epochs x 4 minibatches).
    "cartpole": dict(env_id="CartPole-v1", num_envs=4, n_steps=128, n_epochs=4, minibatches=4,
                     lr=2.5e-4, ent_coef=0.01, total=300_000, normalize=False, target=475.0,
                     eval_every=5),
    # Hopper: plans/hopper.toml (2 actors x 4 envs = 8 envs x 256 steps = 2048 per update,
    # 10 epochs x 32 minibatches), 300k steps.
    "hopper": dict(env_id="Hopper-v5", num_envs=8, n_steps=256, n_epochs=10, minibatches=32,
                   lr=3e-4, ent_coef=0.0, total=300_000, normalize=True, target=None,
                   eval_every=0),
}


def evaluate(model: PPO, env_id: str, episodes: int, seed: int,
             obs_norm: VecNormalize | None) -> float:
    """Nitro's eval probe: min(episodes, 8) envs, fixed quota each, deterministic actions."""
    n = min(episodes, 8)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * n,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    counted = np.zeros(n, dtype=np.int64)
    ep_return = np.zeros(n)
    returns: list[float] = []
    obs, _ = envs.reset(seed=seed)
    while (counted < quota).any():
        x = obs_norm.normalize_obs(obs) if obs_norm is not None else obs
        action, _ = model.predict(x, deterministic=True)
        obs, r, term, trunc, _ = envs.step(action)
        ep_return += r
        for i in np.flatnonzero(term | trunc):
            if counted[i] < quota[i]:
                returns.append(float(ep_return[i]))
                counted[i] += 1
            ep_return[i] = 0.0
    envs.close()
    return float(np.mean(returns))


class EvalStop(BaseCallback):
    """Every ``every`` updates, evaluate; stop at the target. SB3 calls ``_on_rollout_start``
    after each ``train()``, so update count u = rollout starts - 1; the stop lands on the
    next env step (``_on_step`` returning False), which is not counted in ``env_steps``."""

    def __init__(self, env_id: str, every: int, target: float, seed: int, episodes: int = 10):
        super().__init__()
        self.env_id, self.every, self.target, self.seed = env_id, every, target, seed
        self.episodes = episodes
        self.rollouts = 0
        self.stop = False
        self.eval_return: float | None = None
        self.eval_s = 0.0
        self.steps_at_stop: int | None = None

    def _on_rollout_start(self) -> None:
        updates = self.rollouts
        self.rollouts += 1
        if updates and updates % self.every == 0:
            t0 = time.perf_counter()
            self.eval_return = evaluate(self.model, self.env_id, self.episodes,
                                        self.seed + updates, None)
            self.eval_s += time.perf_counter() - t0
            if self.eval_return >= self.target:
                self.stop = True
                self.steps_at_stop = self.model.num_timesteps

    def _on_step(self) -> bool:
        return not self.stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=None,
                        help="annealing horizon and step cap (default: the task's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--vec", choices=("dummy", "subproc"), default="dummy",
                        help="DummyVecEnv (envs in this process) or SubprocVecEnv")
    parser.add_argument("--procs", type=int, default=0,
                        help="with --vec subproc: env processes (0: one per env of the task)")
    args = parser.parse_args()
    t = dict(TASKS[args.task])
    if args.vec == "subproc" and args.procs:
        # one env per process: keep the samples per update with longer fragments
        t["n_steps"] = t["num_envs"] * t["n_steps"] // args.procs
        t["num_envs"] = args.procs
    total = args.total_timesteps or t["total"]
    if args.threads:
        torch.set_num_threads(args.threads)

    vec = make_vec_env(t["env_id"], n_envs=t["num_envs"], seed=args.seed,
                       vec_env_cls=SubprocVecEnv if args.vec == "subproc" else None)
    if t["normalize"]:
        vec = VecNormalize(vec, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0,
                           gamma=0.99)
    lr0 = t["lr"]
    batch = t["num_envs"] * t["n_steps"]
    model = PPO(
        "MlpPolicy", vec, seed=args.seed, device="cpu", verbose=0,
        learning_rate=lambda progress_remaining: lr0 * progress_remaining,
        n_steps=t["n_steps"], batch_size=batch // t["minibatches"], n_epochs=t["n_epochs"],
        gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=t["ent_coef"], vf_coef=0.5,
        max_grad_norm=0.5, normalize_advantage=True,
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh,
                           ortho_init=True, log_std_init=0.0),
    )
    callback = (EvalStop(t["env_id"], t["eval_every"], t["target"], args.seed)
                if t["target"] is not None else None)
    t_first = time.perf_counter()
    model.learn(total_timesteps=total, callback=callback)
    wall_s = time.perf_counter() - t_first
    if callback is not None:
        env_steps = callback.steps_at_stop or model.num_timesteps
        final = callback.eval_return
        eval_s = callback.eval_s
    else:
        env_steps = model.num_timesteps
        t0 = time.perf_counter()
        final = evaluate(model, t["env_id"], 10, args.seed + 10_000,
                         vec if isinstance(vec, VecNormalize) else None)
        eval_s = time.perf_counter() - t0
    train_returns = [ep["r"] for ep in model.ep_info_buffer]
    import stable_baselines3

    print(json.dumps({
        "impl": "sb3", "version": stable_baselines3.__version__, "task": args.task,
        "env_id": t["env_id"], "seed": args.seed,
        "reached": None if t["target"] is None else bool(final is not None
                                                          and final >= t["target"]),
        "env_steps": int(env_steps), "wall_s": wall_s, "eval_s": eval_s,
        "startup_s": t_first - T_PROCESS, "sps": env_steps / wall_s,
        "final_eval_return": final,
        "train_return_last": float(np.mean(train_returns)) if train_returns else None,
        "gymnasium": gym.__version__, "torch": torch.__version__, "vec": args.vec,
        "num_envs": t["num_envs"], "n_steps": t["n_steps"], "threads": torch.get_num_threads(),
    }), flush=True)
    vec.close()


if __name__ == "__main__":
    main()
