"""The flat parameter buffer: the same SGD steps as per-tensor Adam, and no silent failure.

`algos.flat` makes every parameter and gradient a view into one buffer so Adam, the norm
clip and zeroing are one call each. These tests pin that the optimiser still trains the
model (the views stay bound), that the steps equal per-tensor Adam's, and that old
per-parameter optimiser checkpoints resume.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn, optim

from algos.flat import FlatParameters
from algos.ppo import PPO, PPOConfig
from tests.test_algos_ppo import BOX, synthetic_rollout


def reference_step(model: nn.Module, opt: optim.Optimizer, loss: torch.Tensor) -> None:
    """What `LearnerCore.sgd_step` did before the flat buffer: per-tensor everything."""
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()


def with_reference() -> tuple[PPO, nn.Module, optim.Optimizer, dict[str, torch.Tensor]]:
    """A PPO core, a copy of its model under per-tensor Adam, and a minibatch for both."""
    torch.manual_seed(0)
    ppo = PPO(BOX, PPOConfig())
    ref = copy.deepcopy(ppo.model)
    ref_opt = optim.Adam(ref.parameters(), lr=3e-4, eps=1e-5)
    return ppo, ref, ref_opt, ppo.make_batch(synthetic_rollout(ppo, 16, 4))


def test_flat_steps_equal_per_tensor_adam() -> None:
    ppo, ref, ref_opt, mb = with_reference()
    start = ppo.flat.param.detach().clone()
    for _ in range(5):
        ppo.sgd_step(ppo.loss(mb)[0], 0.5)
        reference_step(ref, ref_opt, PPO.loss(_with_model(ppo, ref), mb)[0])
    for (name, p), q in zip(ppo.model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert (ppo.flat.param.detach() - start).abs().max() > 1e-4  # five steps moved it


def _with_model(ppo: PPO, model: nn.Module) -> PPO:
    other = copy.copy(ppo)
    other.model = model
    return other


def test_dropped_gradients_are_bound_again() -> None:
    """`module.zero_grad()` sets gradients to None; the next step must still train."""
    torch.manual_seed(0)
    ppo = PPO(BOX, PPOConfig())
    mb = ppo.make_batch(synthetic_rollout(ppo, 16, 4))
    before = ppo.flat.param.detach().clone()
    ppo.model.zero_grad(set_to_none=True)
    ppo.sgd_step(ppo.loss(mb)[0], 0.5)
    assert not torch.equal(before, ppo.flat.param.detach())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ppo.flat.params)
    # The model's own parameters are what moved (they are views of the buffer).
    weight = ppo.model.actor[0].weight
    assert weight.untyped_storage().data_ptr() == ppo.flat.param.untyped_storage().data_ptr()


def test_a_parameter_moved_off_the_buffer_is_an_error() -> None:
    ppo = PPO(BOX, PPOConfig())
    mb = ppo.make_batch(synthetic_rollout(ppo, 16, 4))
    ppo.model.double()
    with pytest.raises(RuntimeError, match="left the flat buffer"):
        ppo.sgd_step(ppo.loss({k: v.double() if v.is_floating_point() else v
                               for k, v in mb.items()})[0], 0.5)


def test_mixed_dtypes_are_refused() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="differ in dtype or device"):
        FlatParameters(model)


def test_a_per_parameter_optimiser_checkpoint_resumes_on_the_flat_buffer() -> None:
    """Checkpoints from before the flat buffer hold one Adam state per parameter."""
    torch.manual_seed(0)
    ppo = PPO(BOX, PPOConfig())
    mb = ppo.make_batch(synthetic_rollout(ppo, 16, 4))
    old = copy.deepcopy(ppo.model)
    old_opt = optim.Adam(old.parameters(), lr=3e-4, eps=1e-5)
    for _ in range(3):
        reference_step(old, old_opt, PPO.loss(_with_model(ppo, old), mb)[0])
    saved = {"model": old.state_dict(), "optimizer": old_opt.state_dict()}
    assert len(saved["optimizer"]["state"]) == len(ppo.flat.params) > 1

    resumed = PPO(BOX, PPOConfig())
    resumed.load_state_dict(saved)
    reference_step(old, old_opt, PPO.loss(_with_model(ppo, old), mb)[0])
    resumed.sgd_step(resumed.loss(mb)[0], 0.5)
    for p, q in zip(resumed.model.parameters(), old.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_core_that_steps_by_hand_still_trains() -> None:
    """optimizer.zero_grad(), backward, optimizer.step(), as any torch code writes it."""
    ppo, ref, ref_opt, mb = with_reference()
    for _ in range(3):
        ppo.optimizer.zero_grad()
        ppo.loss(mb)[0].backward()
        nn.utils.clip_grad_norm_(ppo.model.parameters(), 0.5)
        ppo.optimizer.step()
        reference_step(ref, ref_opt, PPO.loss(_with_model(ppo, ref), mb)[0])
    for p, q in zip(ppo.model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
