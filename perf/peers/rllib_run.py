"""Ray RLlib PPO (new API stack) on the peer-comparison tasks; prints one JSON line of results.

Runs with ``perf/peers/.venv-rllib/bin/python`` (RLlib 2.60 pins gymnasium 1.2.2). Settings
mirror ``plans/cartpole.toml`` and ``plans/hopper.toml`` where RLlib allows; the differences
are listed in ``perf/peers/README.md``. Sampling runs in the driver (``num_env_runners=0``) and
learning in the driver (``num_learners=0``): on 2 cores, remote runners only add messaging.

    rllib_run.py --task cartpole --seed 1      # to a 10-episode deterministic eval mean >= 475
    rllib_run.py --task hopper --seed 1        # 300k steps, then a 10-episode eval
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

T_PROCESS = time.perf_counter()

TASKS: dict[str, dict[str, Any]] = {
    "cartpole": dict(env_id="CartPole-v1", num_envs=4, n_steps=128, n_epochs=4, minibatches=4,
                     lr=2.5e-4, ent_coef=0.01, total=300_000, normalize=False, target=475.0,
                     eval_every=5),
    "hopper": dict(env_id="Hopper-v5", num_envs=8, n_steps=256, n_epochs=10, minibatches=32,
                   lr=3e-4, ent_coef=0.0, total=300_000, normalize=True, target=None,
                   eval_every=0),
}


def find(result: dict[str, Any], key: str) -> Any:
    """A metric by name anywhere in RLlib's nested result dict (its layout moves between
    releases)."""
    stack = [result]
    while stack:
        d = stack.pop()
        if key in d and not isinstance(d[key], dict):
            return d[key]
        stack.extend(v for v in d.values() if isinstance(v, dict))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=None)
    args = parser.parse_args()
    t = dict(TASKS[args.task])
    total = args.total_timesteps or t["total"]
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    import gymnasium as gym
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    batch = t["num_envs"] * t["n_steps"]
    config = (
        PPOConfig()
        .environment(t["env_id"])
        .framework("torch")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=t["num_envs"],
                     rollout_fragment_length=t["n_steps"])
        .learners(num_learners=0)
        .training(
            # piecewise-linear schedule over env steps: linear annealing to ~0 at `total`
            lr=[[0, t["lr"]], [total, 1e-10]],
            train_batch_size_per_learner=batch, minibatch_size=batch // t["minibatches"],
            num_epochs=t["n_epochs"], gamma=0.99, lambda_=0.95, clip_param=0.2,
            entropy_coeff=t["ent_coef"], vf_loss_coeff=0.5, grad_clip=0.5,
            grad_clip_by="global_norm", use_kl_loss=False, kl_coeff=0.0,
            vf_clip_param=math.inf,
        )
        # Hidden layers initialised as Nitro's and SB3's (orthogonal, gain sqrt 2, zero bias);
        # RLlib's config reaches no further: its output layers keep torch's default init.
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=[64, 64], fcnet_activation="tanh", vf_share_layers=False,
            fcnet_kernel_initializer="orthogonal_",
            fcnet_kernel_initializer_kwargs={"gain": math.sqrt(2)},
            fcnet_bias_initializer="zeros_"))
        # Nitro's eval probe: 10 episodes spread over 8 envs, deterministic actions.
        .evaluation(evaluation_num_env_runners=0, evaluation_duration=10,
                    evaluation_duration_unit="episodes",
                    evaluation_config=PPOConfig.overrides(explore=False,
                                                          num_envs_per_env_runner=8))
        .debugging(seed=args.seed)
    )
    if t["normalize"]:
        from ray.rllib.connectors.env_to_module import MeanStdFilter

        config = config.env_runners(env_to_module_connector=lambda *a, **k: MeanStdFilter())
    algo = config.build_algo() if hasattr(config, "build_algo") else config.build()
    t_first = time.perf_counter()
    env_steps, iteration, final, eval_s, train_return = 0, 0, None, 0.0, None
    evaluations = 0
    while env_steps < total:
        result = algo.train()
        iteration += 1
        env_steps = int(find(result, "num_env_steps_sampled_lifetime") or iteration * batch)
        train_return = find(result, "episode_return_mean")
        if t["target"] is not None and iteration % t["eval_every"] == 0:
            t0 = time.perf_counter()
            final = find(algo.evaluate(), "episode_return_mean")
            eval_s += time.perf_counter() - t0
            evaluations += 1
            if final is not None and final >= t["target"]:
                break
    wall_s = time.perf_counter() - t_first
    if t["target"] is None:
        t0 = time.perf_counter()
        final = find(algo.evaluate(), "episode_return_mean")
        eval_s = time.perf_counter() - t0
    algo.stop()
    ray.shutdown()
    print(json.dumps({
        "impl": "rllib", "version": ray.__version__, "task": args.task, "env_id": t["env_id"],
        "seed": args.seed,
        "reached": None if t["target"] is None else bool(final is not None
                                                          and final >= t["target"]),
        "env_steps": env_steps, "wall_s": wall_s, "eval_s": eval_s,
        "startup_s": t_first - T_PROCESS, "sps": env_steps / wall_s,
        "final_eval_return": final, "train_return_last": train_return,
        "iterations": iteration, "evaluations": evaluations,
        "gymnasium": gym.__version__, "torch": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
