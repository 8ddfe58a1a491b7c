"""A minimal single-process CleanRL-style PPO loop: the baseline Nitro's CartPole time is held to.

Same hyperparameters as ``plans/cartpole.toml`` (4 envs x 128 steps, lr 2.5e-4 annealed over
300k steps, ent 0.01, 4 epochs, 4 minibatches, gamma 0.99, lambda 0.95, clip 0.2, tanh 64x64,
no normalisation). It stops the way Nitro's eval probe (``every = 5``, ``episodes = 10``) with
``stop.target_return = 475`` does: every 5 updates, 10 deterministic episodes on 8 fresh envs
seeded ``seed + update``, each env given a fixed quota of episodes; stop when their mean >= 475.

The loop reads top to bottom like ``cleanrl/ppo.py``; only ``done = terminated | truncated`` is
handled CleanRL's way (no bootstrap of truncated episodes), as CleanRL does.

    python perf/ppo_minimal.py --seed 1            # prints one JSON line: wall_s, env_steps, ...
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

T_PROCESS = time.perf_counter()

import gymnasium as gym  # noqa: E402  (start-up time is part of what we measure)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn, optim  # noqa: E402
from torch.distributions import Categorical  # noqa: E402


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    seed: int = 1
    """seed of the experiment"""
    total_timesteps: int = 300_000
    """total timesteps (the annealing horizon and the step cap)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    eval_every: int = 5
    """evaluate the deterministic policy every this many updates (Nitro's eval probe `every`)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    target_return: float = 475.0
    """stop once the evaluation mean reaches this"""
    threads: int = 0
    """torch threads (0: torch's default)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias_const: float = 0.0
               ) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def make_env(env_id: str):
    def thunk():
        return gym.make(env_id)
    return thunk


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of `episodes` greedy episodes on min(episodes, 8) envs with fixed quotas."""
    n = min(episodes, 8)
    envs = gym.vector.SyncVectorEnv([make_env(env_id)] * n,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    counted = np.zeros(n, dtype=np.int64)
    ep_return = np.zeros(n)
    returns: list[float] = []
    obs, _ = envs.reset(seed=seed)
    with torch.no_grad():
        while (counted < quota).any():
            action = agent.actor(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1)
            obs, r, term, trunc, _ = envs.step(action.numpy())
            ep_return += r
            for i in np.flatnonzero(term | trunc):
                if counted[i] < quota[i]:
                    returns.append(float(ep_return[i]))
                    counted[i] += 1
                ep_return[i] = 0.0
    envs.close()
    return float(np.mean(returns))


def train(args: Args) -> dict:
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.threads:
        torch.set_num_threads(args.threads)

    # TRY NOT TO MODIFY: seeding
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    # env setup
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id)] * args.num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n)).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim))
    actions = torch.zeros((args.num_steps, args.num_envs))
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))
    values = torch.zeros((args.num_steps, args.num_envs))

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.perf_counter()
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
    next_done = torch.zeros(args.num_envs)
    eval_return: float | None = None
    best_eval = float("-inf")
    eval_s = 0.0
    evals: list[tuple[int, float]] = []
    episode_returns: list[float] = []
    ep_ret = np.zeros(args.num_envs)
    iteration = 0

    for iteration in range(1, args.num_iterations + 1):
        # Annealing the rate
        frac = 1.0 - (iteration - 1.0) / args.num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs_np, reward, terminations, truncations, _ = envs.step(action.numpy())
            next_done_np = np.logical_or(terminations, truncations)
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
            next_done = torch.as_tensor(next_done_np, dtype=torch.float32)
            ep_ret += reward
            for i in np.flatnonzero(next_done_np):
                episode_returns.append(float(ep_ret[i]))
                ep_ret[i] = 0.0

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(args.num_envs)
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1, obs_dim))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start:start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                    mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef,
                                                        1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss (clipped, as in the PPO paper)
                newvalue = newvalue.view(-1)
                v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(
                    newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        # the stop rule of Nitro's eval probe + stop.target_return
        if iteration % args.eval_every == 0:
            t0 = time.perf_counter()
            eval_return = evaluate(agent, args.env_id, args.eval_episodes, args.seed + iteration)
            eval_s += time.perf_counter() - t0
            best_eval = max(best_eval, eval_return)
            evals.append((global_step, round(eval_return, 1)))
            if eval_return >= args.target_return:
                break

    envs.close()
    wall_s = time.perf_counter() - start_time
    last20 = episode_returns[-20:]
    return {
        "impl": "ppo_minimal",
        "env_id": args.env_id,
        "seed": args.seed,
        "reached": eval_return is not None and eval_return >= args.target_return,
        "updates": iteration,
        "env_steps": global_step,
        "wall_s": wall_s,
        "process_s": time.perf_counter() - T_PROCESS,
        "eval_s": eval_s,
        "sps": global_step / wall_s,
        "final_eval_return": eval_return,
        "best_eval_return": best_eval if eval_return is not None else None,
        "last20_train_return": float(np.mean(last20)) if last20 else None,
        "evals": evals,
        "args": asdict(args),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Args()
    for name in ("seed", "total_timesteps", "target_return", "eval_every", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(getattr(defaults, name)),
                            default=getattr(defaults, name))
    ns = parser.parse_args()
    args = Args(seed=ns.seed, total_timesteps=ns.total_timesteps, target_return=ns.target_return,
                eval_every=ns.eval_every, threads=ns.threads)
    result = train(args)
    result["process_s"] = time.perf_counter() - T_PROCESS
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
