"""V-trace against a hand-computed case, the paper's sum form and the on-policy n-step returns;
the IMPALA and APPO cores' interface (the same as PPO's) on small real batches."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from algos.appo import APPO, APPOConfig
from algos.impala import IMPALA, IMPALAConfig
from algos.policy import ActorPolicy
from algos.vtrace import vtrace


def t(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def test_hand_computed_two_steps() -> None:
    # Env 0: rho_0 = 2 (clipped to 1), rho_1 = 0.5. Env 1: on-policy, the episode ends at t=0.
    behaviour = t([[0.0, 0.0], [0.0, 0.0]])
    target = t([[math.log(2.0), 0.0], [math.log(0.5), 0.0]])
    rewards = t([[1.0, 1.0], [1.0, 2.0]])
    values = t([[1.0, 0.5], [2.0, 1.0]])
    bootstrap = t([3.0, 4.0])
    discounts = t([[0.9, 0.0], [0.9, 0.9]])
    vs, adv = vtrace(behaviour, target, rewards, values, bootstrap, discounts)
    # env 0: delta_1 = 0.5 * (1 + 0.9*3 - 2) = 0.85, v_1 = 2 + 0.85 = 2.85
    #        delta_0 = 1 * (1 + 0.9*2 - 1) = 1.8, v_0 = 1 + 1.8 + 0.9*1*0.85 = 3.565
    #        A_0 = 1 * (1 + 0.9*2.85 - 1) = 2.565, A_1 = 0.5 * (1 + 0.9*3 - 2) = 0.85
    # env 1: v_1 = 2 + 0.9*4 = 5.6; the done at t=0 cuts the trace: v_0 = r_0 = 1
    #        A_0 = 1 - 0.5 = 0.5, A_1 = 5.6 - 1 = 4.6
    torch.testing.assert_close(vs, t([[3.565, 1.0], [2.85, 5.6]]))
    torch.testing.assert_close(adv, t([[2.565, 0.5], [0.85, 4.6]]))


def reference_vs(mu, pi, r, v, boot, disc, rho_bar, c_bar):
    """Eq. (1) of the paper as an explicit sum, one column at a time (numpy float64)."""
    T, B = r.shape
    ratio = np.exp(pi - mu)
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    v_next = np.concatenate([v[1:], boot[None]])
    delta = rho * (r + disc * v_next - v)
    vs = np.empty_like(v)
    for b in range(B):
        for s in range(T):
            total, weight = v[s, b], 1.0
            for k in range(s, T):
                total += weight * delta[k, b]
                weight *= disc[k, b] * c[k, b]
            vs[s, b] = total
    vs_next = np.concatenate([vs[1:], boot[None]])
    return vs, rho * (r + disc * vs_next - v)


@pytest.mark.parametrize(("rho_bar", "c_bar", "T"), [
    (1.0, 1.0, 7), (2.0, 0.5, 7), (0.7, 1.3, 7),
    # lengths around the recursive doubling's powers of two, and one step
    (1.0, 1.0, 1), (1.0, 1.0, 2), (1.3, 0.9, 64), (1.3, 0.9, 128), (1.0, 1.0, 129)])
def test_matches_the_papers_sum_form(rho_bar: float, c_bar: float, T: int) -> None:
    rng = np.random.default_rng(3)
    B = 5
    mu, pi = rng.normal(-1, 0.5, (T, B)), rng.normal(-1, 0.5, (T, B))
    r, v, boot = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    disc = 0.95 * (rng.random((T, B)) > 0.2)
    want_vs, want_adv = reference_vs(mu, pi, r, v, boot, disc, rho_bar, c_bar)
    vs, adv = vtrace(t(mu), t(pi), t(r), t(v), t(boot), t(disc), rho_bar=rho_bar, c_bar=c_bar)
    np.testing.assert_allclose(vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(adv.numpy(), want_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_targets_are_bootstrapped_discounted_returns() -> None:
    rng = np.random.default_rng(0)
    T, B, gamma = 6, 3, 0.9
    logp = rng.normal(size=(T, B))
    r, v, boot = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    done = np.zeros((T, B), dtype=bool)
    done[2, 1] = True  # an episode boundary inside column 1
    disc = gamma * (1.0 - done)
    returns = np.empty((T, B))
    g = boot.copy()
    for s in reversed(range(T)):
        g = r[s] + disc[s] * g
        returns[s] = g
    vs, adv = vtrace(t(logp), t(logp), t(r), t(v), t(boot), t(disc))
    np.testing.assert_allclose(vs.numpy(), returns, rtol=1e-10)
    # On-policy the pg advantage is the one-step-lookahead TD(1) advantage.
    vs_next = np.concatenate([returns[1:], boot[None]])
    np.testing.assert_allclose(adv.numpy(), r + disc * vs_next - v, rtol=1e-10)


def test_no_gradient_flows_through_the_targets() -> None:
    values = torch.zeros(3, 2, requires_grad=True)
    vs, adv = vtrace(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 2), values,
                     torch.zeros(2), torch.full((3, 2), 0.9))
    assert not vs.requires_grad and not adv.requires_grad


# ---- the cores ------------------------------------------------------------------------------

SPACES = {"obs_shape": [4], "obs_dtype": "float32", "action": {"kind": "discrete", "n": 2}}
BOX_SPACES = {
    "obs_shape": [3], "obs_dtype": "float32",
    "action": {"kind": "box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]},
}


def rollout_from(policy: ActorPolicy, spaces: dict[str, Any], T: int = 16, E: int = 4,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """A synthetic [T, E] rollout sampled by `policy` (terminations and truncations included)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T + 1, E, *spaces["obs_shape"])).astype(np.float32)
    actions, logprobs, values = [], [], []
    for i in range(T):
        a, extras = policy.act(obs[i])
        actions.append(a)
        logprobs.append(extras["logprobs"])
        values.append(extras["values"])
    terminated = rng.random((T, E)) < 0.05
    truncated = (rng.random((T, E)) < 0.05) & ~terminated
    return {
        "obs": obs[:T], "actions": np.stack(actions), "logprobs": np.stack(logprobs),
        "values": np.stack(values), "rewards": rng.normal(size=(T, E)).astype(np.float32),
        "terminated": terminated, "truncated": truncated,
        "bootstrap_values": (truncated * rng.normal(size=(T, E))).astype(np.float32),
        "last_obs": obs[T], "last_values": policy.value(obs[T]),
    }


@pytest.mark.parametrize("spaces", [SPACES, BOX_SPACES], ids=["discrete", "box"])
@pytest.mark.parametrize("make", [
    lambda s: IMPALA(s, IMPALAConfig(num_minibatches=2)),
    lambda s: APPO(s, APPOConfig(num_minibatches=2, update_epochs=2, target_update_freq=2)),
], ids=["impala", "appo"])
def test_core_interface_and_diagnostics(make: Any, spaces: dict[str, Any]) -> None:
    torch.manual_seed(0)
    core = make(spaces)
    policy = ActorPolicy(core.actor_spec())
    policy.load(core.weights())
    stale = core.weights()
    metrics = core.update(rollout_from(policy, spaces), progress=0.25)
    for key in ("pg_loss", "v_loss", "entropy", "approx_kl", "rho_mean", "explained_variance",
                "learning_rate", "loss"):
        assert key in metrics and isinstance(metrics[key], float)
        assert math.isfinite(metrics[key]) or key == "explained_variance"
    assert metrics["learning_rate"] == pytest.approx(0.75 * core.config.learning_rate)
    assert any(not np.allclose(stale[k], v) for k, v in core.weights().items())
    # The first update's behaviour policy was the model itself: rho is ~1 on the first minibatch.
    assert 0.5 < metrics["rho_mean"] < 2.0

    # A batch from a stale policy (the lag V-trace corrects) still trains, and the state
    # round-trips into a fresh core.
    core.update(rollout_from(policy, spaces, seed=1), progress=0.5)
    clone = make(spaces)
    clone.load_state_dict(core.state_dict())
    for k, v in core.weights().items():
        np.testing.assert_array_equal(clone.weights()[k], v)
    b = core.make_batch(rollout_from(policy, spaces, seed=2))
    loss_a, _ = core.loss(b)
    loss_b, _ = clone.loss(b, dict(clone.model.named_parameters()))
    torch.testing.assert_close(loss_a, loss_b)


def test_loss_gradient_and_hvp_through_params() -> None:
    """Probes take grad / HVP of `loss(mb, params)` with torch.func, as with PPO."""
    torch.manual_seed(0)
    core = IMPALA(SPACES)
    policy = ActorPolicy(core.actor_spec())
    policy.load(core.weights())
    b = core.make_batch(rollout_from(policy, SPACES))
    params = {k: v.detach() for k, v in core.model.named_parameters()}
    grads = torch.func.grad(lambda p: core.loss(b, p)[0])(params)
    vec = {k: torch.randn_like(v) for k, v in params.items()}
    _, hvp = torch.func.jvp(torch.func.grad(lambda p: core.loss(b, p)[0]), (params,), (vec,))
    assert set(grads) == set(params) == set(hvp)
    assert all(torch.isfinite(g).all() for g in hvp.values())
    # Batches are env-major: a probe's row subsample `{k: v[idx]}` is a batch of sequences.
    sub = {k: v[torch.tensor([2, 0])] for k, v in b.items()}
    assert sub["obs"].shape[:2] == (2, 16) and sub["last_obs"].shape[0] == 2
    assert torch.isfinite(core.loss(sub, params)[0])


def test_appo_target_network_refresh_schedule() -> None:
    torch.manual_seed(0)
    core = APPO(SPACES, APPOConfig(target_update_freq=2, num_minibatches=1, update_epochs=1))
    policy = ActorPolicy(core.actor_spec())
    policy.load(core.weights())

    def target_equals_model() -> bool:
        target = core.target_model.state_dict()
        return all(torch.equal(v, target[k]) for k, v in core.model.state_dict().items())

    core.update(rollout_from(policy, SPACES), 0.0)  # refresh, then train: they differ now
    assert not target_equals_model()
    before = {k: v.clone() for k, v in core.target_model.state_dict().items()}
    core.update(rollout_from(policy, SPACES, seed=1), 0.0)  # no refresh on the second update
    assert all(torch.equal(before[k], v) for k, v in core.target_model.state_dict().items())
    core.update(rollout_from(policy, SPACES, seed=2), 0.0)  # third: refreshed from the model
    assert not all(torch.equal(before[k], v) for k, v in core.target_model.state_dict().items())


@pytest.mark.parametrize("make", [
    lambda s: IMPALA(s, IMPALAConfig(learning_rate=3e-3)),
    lambda s: APPO(s, APPOConfig(learning_rate=3e-3, num_minibatches=1, update_epochs=1)),
], ids=["impala", "appo"])
def test_rho_kept_reports_how_much_of_a_stale_batch_trains(make: Any) -> None:
    """On-policy frames keep their whole importance weight; frames sampled by a policy many
    updates old keep less of it (V-trace truncates), which is what the learner reports."""
    torch.manual_seed(0)
    core = make(SPACES)
    policy = ActorPolicy(core.actor_spec())
    policy.load(core.weights())
    fresh = core.update(rollout_from(policy, SPACES), 0.0)
    assert fresh["rho_kept"] == pytest.approx(1.0, abs=0.05)
    for seed in range(1, 8):  # the learner moves on; the actor keeps the first weights
        core.update(rollout_from(policy, SPACES, seed=seed), 0.0)
    stale = core.update(rollout_from(policy, SPACES, seed=9), 0.0)
    assert 0.0 < stale["rho_kept"] < fresh["rho_kept"]
    assert stale["rho_clipfrac"] > 0.0
