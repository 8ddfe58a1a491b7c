"""PPO core: GAE by hand, actor/learner agreement, one update, and CartPole learning.

The CartPole test drives `PPO` and `ActorPolicy` with a plain gymnasium loop, so it validates
the algorithm independently of the engine (no kernel, no envs package, no transport).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from algos.actor import make_actor_policy
from algos.policy import ActorPolicy
from algos.ppo import PPO, PPOConfig, compute_gae, ppo_loss

DISCRETE = {"obs_shape": [4], "obs_dtype": "float32", "action": {"kind": "discrete", "n": 2}}
BOX = {
    "obs_shape": [3],
    "obs_dtype": "float32",
    "action": {"kind": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]},
}
PIXELS = {"obs_shape": [4, 84, 84], "obs_dtype": "uint8", "action": {"kind": "discrete", "n": 6}}


def random_obs(spaces: dict[str, Any], *batch: int, rng: np.random.Generator) -> np.ndarray:
    shape = (*batch, *spaces["obs_shape"])
    if spaces["obs_dtype"] == "uint8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


def read_only(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the codec hands an actor: arrays from `numpy.frombuffer` cannot be written."""
    for v in weights.values():
        v.flags.writeable = False
    return weights


# ---- GAE --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_compute_gae_by_hand(backend: str) -> None:
    # gamma = lam = 0.5, T = 3, three envs (columns):
    #  env 0 terminates at t=1:             A2 = 3 + .5*2 - 1 = 3; A1 = 2 - 1 = 1;
    #                                       A0 = (1 + .5*1 - 1) + .25*A1 = 0.75
    #  env 1 truncates at t=0 (V(final)=4): A2 = 1; A1 = 1 + .25*A2 = 1.25;
    #                                       A0 = (1 + .5*4) - 2 = 1 (cut: new episode at t=1)
    #  env 2 terminated and truncated at t=2: the bootstrap 10 must be ignored:
    #                                       A2 = 1; A1 = .25; A0 = .0625
    rewards = np.array([[1, 1, 0], [2, 1, 0], [3, 1, 1]], dtype=np.float32)
    values = np.array([[1, 2, 0], [1, 0, 0], [1, 0, 0]], dtype=np.float32)
    terminated = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 1]], dtype=bool)
    truncated = np.array([[0, 1, 0], [0, 0, 0], [0, 0, 1]], dtype=bool)
    bootstrap = np.array([[0, 4, 0], [0, 0, 0], [0, 0, 10]], dtype=np.float32)
    last_values = np.array([2, 0, 5], dtype=np.float32)
    expected = np.array([[0.75, 1, 0.0625], [1, 1.25, 0.25], [3, 1, 1]], dtype=np.float32)

    args = [rewards, values, terminated, truncated, bootstrap, last_values]
    if backend == "torch":
        args = [torch.from_numpy(a) for a in args]
    adv = compute_gae(*args, gamma=0.5, lam=0.5)
    assert type(adv) is type(args[0])
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(args[0]), rewards)  # inputs untouched


# ---- actor policy matches the learner ---------------------------------------------------------


#: Both actor implementations: torch (any net) and the numpy one the plugins pick for MLPs.
POLICIES = [ActorPolicy, make_actor_policy]


@pytest.mark.parametrize("make_policy", POLICIES, ids=["torch", "plugin"])
@pytest.mark.parametrize("spaces", [DISCRETE, BOX, PIXELS], ids=["discrete", "box", "pixels"])
def test_actor_policy_matches_learner(spaces: dict[str, Any], make_policy: Any) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    ppo = PPO(spaces, PPOConfig())
    policy = make_policy(ppo.actor_spec())
    policy.load(read_only(ppo.weights()))
    obs = random_obs(spaces, 5, rng=rng)
    obs.flags.writeable = False

    actions, extras = policy.act(obs)
    assert extras["logprobs"].dtype == np.float32 and extras["logprobs"].shape == (5,)
    assert extras["values"].dtype == np.float32 and extras["values"].shape == (5,)
    if spaces["action"]["kind"] == "discrete":
        assert actions.dtype == np.int64 and actions.shape == (5,)
    else:
        assert actions.dtype == np.float32 and actions.shape == (5, 2)

    with torch.no_grad():
        t_obs = torch.from_numpy(obs.copy())
        _, logprob, _, value = ppo.model.get_action_and_value(t_obs, torch.from_numpy(actions))
        dist = ppo.model.dist(t_obs)
        mode = dist.probs.argmax(-1) if ppo.model.discrete else dist.mean
    np.testing.assert_allclose(extras["logprobs"], logprob.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(extras["values"], value.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(policy.value(obs), value.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(policy.act_deterministic(obs), mode.numpy(), rtol=1e-6)


@pytest.mark.parametrize("make_policy", POLICIES, ids=["torch", "plugin"])
def test_actor_policy_ignores_extra_keys_and_rejects_missing(make_policy: Any) -> None:
    ppo = PPO(DISCRETE)
    policy = make_policy(json_roundtrip(ppo.actor_spec()))
    weights = ppo.weights()
    policy.load({**weights, "obs_rms.mean": np.zeros(4)})
    weights.pop(next(iter(weights)))
    with pytest.raises(KeyError):
        policy.load(weights)


def json_roundtrip(spec: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(spec))


# ---- one update on a synthetic rollout --------------------------------------------------------


def synthetic_rollout(ppo: PPO, t: int, e: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A rollout with the contract's keys, acted by the current policy so the ratio starts at 1."""
    rng = np.random.default_rng(seed)
    policy = ActorPolicy(ppo.actor_spec())
    policy.load(ppo.weights())
    obs = random_obs(ppo.spaces, t, e, rng=rng)
    actions, extras = zip(*(policy.act(o) for o in obs), strict=True)
    terminated = rng.random((t, e)) < 0.05
    truncated = (rng.random((t, e)) < 0.05) & ~terminated
    last_obs = random_obs(ppo.spaces, e, rng=rng)
    return {
        "obs": obs,
        "actions": np.stack(actions),
        "logprobs": np.stack([x["logprobs"] for x in extras]),
        "values": np.stack([x["values"] for x in extras]),
        "rewards": rng.standard_normal((t, e)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "bootstrap_values": np.where(truncated, rng.standard_normal((t, e)), 0).astype(np.float32),
        "last_obs": last_obs,
        "last_values": policy.value(last_obs),
    }


@pytest.mark.parametrize("spaces", [DISCRETE, BOX], ids=["discrete", "box"])
def test_update_returns_finite_diagnostics_and_small_kl(spaces: dict[str, Any]) -> None:
    torch.manual_seed(0)
    ppo = PPO(spaces, PPOConfig())
    before = ppo.weights()
    diag = ppo.update(synthetic_rollout(ppo, 64, 8), progress=0.25)

    keys = {"pg_loss", "v_loss", "entropy", "approx_kl", "old_approx_kl", "clipfrac",
            "explained_variance", "learning_rate", "loss"}  # fmt: skip
    assert keys <= diag.keys()
    assert all(isinstance(v, float) and np.isfinite(v) for v in diag.values()), diag
    assert diag["learning_rate"] == pytest.approx(0.75 * 3e-4)
    assert 0 <= diag["approx_kl"] < 0.02, diag
    assert 0 <= diag["clipfrac"] < 0.2, diag
    after = ppo.weights()
    assert any(not np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("spaces", [DISCRETE, BOX], ids=["discrete", "box"])
def test_closed_form_scores_equal_torch_distributions(spaces: dict[str, Any]) -> None:
    torch.manual_seed(0)
    ppo = PPO(spaces, PPOConfig())
    with torch.no_grad():
        if not ppo.model.discrete:
            ppo.model.actor_logstd.fill_(-0.7)  # a std other than 1 exercises the scaling
        obs = torch.from_numpy(random_obs(spaces, 32, rng=np.random.default_rng(1)))
        actions, logprob, entropy, _ = ppo.model.get_action_and_value(obs)
        dist = ppo.model.dist(obs)
        torch.testing.assert_close(logprob, dist.log_prob(actions), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy, dist.entropy(), rtol=1e-5, atol=1e-5)


def test_decoupled_batch_clips_against_the_learner_policy_and_reweights_lagging_samples(
) -> None:
    torch.manual_seed(0)
    ppo = PPO(BOX, PPOConfig())
    fresh = synthetic_rollout(ppo, 32, 4)
    b = ppo.make_batch(fresh)
    # Sampled by the learner's own weights: pi_prox = mu, the weights are 1.
    torch.testing.assert_close(b["is_weights"], torch.ones(128), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b["logprobs"], torch.from_numpy(fresh["logprobs"].reshape(-1)),
                               rtol=1e-4, atol=1e-4)

    # Pipelined actors sampled with an older policy: here mu differs from pi_prox by a known
    # factor per sample (e^-1, 1, e^+1), so the weights are pi_prox / mu capped at 2.
    stale = dict(fresh)
    shift = np.resize(np.array([1.0, 0.0, -1.0], dtype=np.float32), (32, 4))
    stale["logprobs"] = fresh["logprobs"] - shift
    b = ppo.make_batch(stale)
    expected = np.minimum(np.exp(shift.reshape(-1)), 2.0)
    np.testing.assert_allclose(b["is_weights"].numpy(), expected, rtol=1e-4)
    # The surrogate starts at ratio 1 against pi_prox: nothing is clipped before the first step.
    _, parts = ppo.loss(b)
    assert parts["clipfrac"].item() == 0.0 and abs(parts["approx_kl"].item()) < 1e-6

    # A lagging actor's critic is older too: GAE and the value clip use the learner's values.
    stale["values"] = fresh["values"] + 5.0
    stale["last_values"] = fresh["last_values"] - 5.0
    b = ppo.make_batch(stale)
    with torch.no_grad():
        values = ppo.model.value(torch.from_numpy(fresh["obs"].reshape(128, -1)))
    torch.testing.assert_close(b["values"], values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b["returns"] - b["advantages"], values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b["advantages"], ppo.make_batch(fresh)["advantages"],
                               rtol=1e-4, atol=1e-4)

    # Without decoupling the stale samples start clipped (CleanRL's behaviour).
    plain = PPO(BOX, PPOConfig(decoupled=False))
    plain.model.load_state_dict(ppo.model.state_dict())
    b = plain.make_batch(stale)
    assert "is_weights" not in b and plain.loss(b)[1]["clipfrac"].item() > 0.5


def test_probe_batch_is_what_the_update_optimised_not_a_rebuild() -> None:
    torch.manual_seed(0)
    ppo = PPO(BOX, PPOConfig(num_minibatches=2, update_epochs=2))
    rollout = synthetic_rollout(ppo, 32, 4)
    before = ppo.make_batch(rollout)
    ppo.update(rollout, progress=0.0)
    kept = ppo.probe_batch(rollout)
    for k, v in before.items():
        torch.testing.assert_close(kept[k], v, msg=k)
    # A rebuild after the update takes the proximal policy from the updated model: ratio 1.
    rebuilt = ppo.make_batch(rollout)
    assert ppo.loss(rebuilt)[1]["approx_kl"].abs().item() < 1e-6
    assert ppo.loss(kept)[1]["approx_kl"].item() > 1e-6
    # Another rollout (even an equal copy) is not the one optimised: built afresh.
    copy = {k: v.copy() for k, v in rollout.items()}
    torch.testing.assert_close(ppo.probe_batch(copy)["logprobs"], rebuilt["logprobs"])


def test_update_with_batch_not_divisible_by_minibatches() -> None:
    torch.manual_seed(0)
    ppo = PPO(DISCRETE, PPOConfig(num_minibatches=4))
    diag = ppo.update(synthetic_rollout(ppo, 5, 3), progress=0.0)  # 15 = 4 + 4 + 4 + 3
    assert all(np.isfinite(v) for k, v in diag.items() if k != "explained_variance"), diag


def test_target_kl_stops_epochs_early_and_lr_never_reaches_zero() -> None:
    torch.manual_seed(0)
    ppo = PPO(DISCRETE, PPOConfig(target_kl=0.0, num_minibatches=2, update_epochs=5))
    rollout = synthetic_rollout(ppo, 16, 4)
    ppo.update(rollout, progress=0.0)
    steps = ppo.optimizer.state[ppo.optimizer.param_groups[0]["params"][0]]["step"]
    assert int(steps) == 2  # one epoch of two minibatches, then the KL check stops it
    diag = ppo.update(rollout, progress=1.0)
    assert 0 < diag["learning_rate"] < 1e-8


def test_learning_rate_follows_the_minibatch_size_by_the_square_root_rule() -> None:
    """With a reference size the rate grows as sqrt(minibatch / reference): a round four times
    bigger split into as many minibatches steps at twice the rate, before annealing; with
    minibatches of a fixed size, or no reference, the rate stays put."""
    torch.manual_seed(0)
    ppo = PPO(DISCRETE, PPOConfig(num_minibatches=4, lr_reference_minibatch=32,
                                  update_epochs=1))
    small, big = synthetic_rollout(ppo, 32, 4), synthetic_rollout(ppo, 32, 16)
    assert ppo.update(small, progress=0.0)["learning_rate"] == pytest.approx(3e-4)  # 128 / 4
    assert ppo.update(big, progress=0.0)["learning_rate"] == pytest.approx(6e-4)  # 512 / 4
    assert ppo.update(big, progress=0.5)["learning_rate"] == pytest.approx(3e-4)
    fixed_size = PPO(DISCRETE, PPOConfig(minibatch_size=32, lr_reference_minibatch=32,
                                         update_epochs=1))
    assert fixed_size.update(big, progress=0.0)["learning_rate"] == pytest.approx(3e-4)
    plain = PPO(DISCRETE, PPOConfig(num_minibatches=4, update_epochs=1))
    assert plain.update(big, progress=0.0)["learning_rate"] == pytest.approx(3e-4)


def test_clip_range_follows_the_round_by_the_square_root_rule_and_the_probe_sees_it() -> None:
    """With a reference batch the clip range is clip_coef * sqrt(batch / reference) for the
    policy and the value alike, and ``loss`` (what the probes differentiate) uses the range of
    the last update; without one the range stays put."""
    torch.manual_seed(0)
    ppo = PPO(DISCRETE, PPOConfig(num_minibatches=4, clip_reference_batch=128,
                                  update_epochs=1))
    small, big = synthetic_rollout(ppo, 32, 4), synthetic_rollout(ppo, 32, 16)
    assert ppo.update(small, progress=0.0)["clip_coef"] == pytest.approx(0.2)  # 128 samples
    assert ppo.update(big, progress=0.0)["clip_coef"] == pytest.approx(0.4)  # 512 samples
    assert ppo.config.clip_coef == 0.2  # the plan's value is kept, the round's is derived
    mb = ppo.probe_batch(big)
    with torch.no_grad():
        # Far from the behaviour policy, the clipped value loss depends on the range.
        ppo.model.critic[-1].bias.add_(5.0)
        _, parts = ppo.loss(mb)
        _, at_plan_range = ppo_loss(ppo.model, mb, ppo.config)
        _, at_round_range = ppo_loss(ppo.model, mb, ppo.loss_config)
    assert parts["v_loss"] == at_round_range["v_loss"] != at_plan_range["v_loss"]
    plain = PPO(DISCRETE, PPOConfig(num_minibatches=4, update_epochs=1))
    assert plain.update(big, progress=0.0)["clip_coef"] == 0.2


# torch's forward-AD decompositions still call torch.jit.script on first use (not our code).
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_state_dict_roundtrip_and_hessian_vector_product() -> None:
    torch.manual_seed(0)
    ppo = PPO(BOX)
    rollout = synthetic_rollout(ppo, 16, 4)
    ppo.update(rollout, progress=0.0)
    clone = PPO(BOX)
    clone.load_state_dict(ppo.state_dict())
    for k, v in ppo.weights().items():
        np.testing.assert_array_equal(clone.weights()[k], v)
    opt_state = ppo.optimizer.state_dict()["state"]
    assert clone.optimizer.state_dict()["state"].keys() == opt_state.keys()

    # The probe's path: Hessian-vector product of the learner's own loss via torch.func.
    mb = ppo.make_batch(rollout)
    params = {k: v.detach() for k, v in ppo.model.named_parameters()}
    vec = {k: torch.randn_like(v) for k, v in params.items()}

    def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return ppo.loss(mb, p)[0]

    _, hvp = torch.func.jvp(torch.func.grad(f), (params,), (vec,))  # forward-over-reverse
    # Cross-check against double backward through plain autograd.
    p_req = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    grads = torch.autograd.grad(f(p_req), list(p_req.values()), create_graph=True)
    dot = sum((g * vec[k]).sum() for g, k in zip(grads, p_req, strict=True))
    expected = torch.autograd.grad(dot, list(p_req.values()))
    for k, e in zip(p_req, expected, strict=True):
        torch.testing.assert_close(hvp[k], e, rtol=1e-4, atol=1e-5)


# ---- CartPole learns --------------------------------------------------------------------------


def train_cartpole(
    seed: int, total_timesteps: int = 100_000, target: float | None = 195.0
) -> tuple[list[float], int]:
    """CleanRL's CartPole loop with `PPO` + `ActorPolicy`; returns (episode returns, steps).

    Stops early once the last 20 episodes average `target`.
    """
    num_envs, num_steps = 4, 128
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    spaces = {"obs_shape": [4], "obs_dtype": "float32", "action": {"kind": "discrete", "n": 2}}
    ppo = PPO(spaces, PPOConfig(learning_rate=2.5e-4, ent_coef=0.01))
    policy = ActorPolicy(ppo.actor_spec())

    obs_buf = np.zeros((num_steps, num_envs, 4), np.float32)
    actions = np.zeros((num_steps, num_envs), np.int64)
    logprobs, values, rewards, bootstrap_values = (
        np.zeros((num_steps, num_envs), np.float32) for _ in range(4)
    )
    terminated, truncated = (np.zeros((num_steps, num_envs), bool) for _ in range(2))

    obs, _ = envs.reset(seed=seed)
    episode_return, finished = np.zeros(num_envs), []
    global_step = 0
    while global_step < total_timesteps:
        policy.load(ppo.weights())
        for step in range(num_steps):
            obs_buf[step] = obs
            actions[step], extras = policy.act(obs)
            logprobs[step], values[step] = extras["logprobs"], extras["values"]
            obs, rewards[step], terminated[step], truncated[step], info = envs.step(actions[step])
            # SAME_STEP: `obs` is already the reset obs; the finished episode's last obs is in info.
            bootstrap_values[step] = 0.0
            cut = truncated[step] & ~terminated[step]
            if cut.any():
                bootstrap_values[step, cut] = policy.value(np.stack(info["final_obs"][cut]))
            episode_return += rewards[step]
            done = terminated[step] | truncated[step]
            finished.extend(episode_return[done].tolist())
            episode_return[done] = 0.0
        global_step += num_steps * num_envs

        rollout = {
            "obs": obs_buf, "actions": actions, "logprobs": logprobs, "values": values,
            "rewards": rewards, "terminated": terminated, "truncated": truncated,
            "bootstrap_values": bootstrap_values, "last_obs": obs, "last_values": policy.value(obs),
        }  # fmt: skip
        diag = ppo.update(rollout, progress=global_step / total_timesteps)
        assert np.isfinite(diag["loss"])
        if target is not None and len(finished) >= 20 and np.mean(finished[-20:]) >= target:
            break
    envs.close()
    return finished, global_step


def test_cartpole_learns() -> None:
    """4 envs x 128 steps, SAME_STEP autoreset, raw obs and rewards: mean of the last 20
    episodes >= 195 within 100k steps (CleanRL's CartPole settings)."""
    start = time.perf_counter()
    finished, steps = train_cartpole(seed=1)
    mean20 = float(np.mean(finished[-20:]))
    elapsed = time.perf_counter() - start
    assert mean20 >= 195, f"last-20 mean {mean20:.1f} after {steps} steps ({elapsed:.1f} s)"
