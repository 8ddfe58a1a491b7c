"""The learner on a GPU: the same steps as on the CPU, a probe that measures the same curvature,
and a run trained on CUDA whose agent loads on a machine without one.

Skipped where CUDA is absent (CI, most laptops): these run by hand on a GPU machine, as
perf/gpu_check.py does for speed. What they pin is correctness only.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from algos.appo import APPO, APPOConfig
from algos.ppo import PPO, PPOConfig
from kernel.roles import ProbeContext
from tests.test_algos_ppo import BOX, synthetic_rollout
from tests.test_hessian import FakeLearner, make_probe, ppo_rollout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[1]


def _on(core_cpu: PPO, device: str) -> PPO:
    """A core on ``device`` that starts from ``core_cpu``'s parameters."""
    other = PPO(core_cpu.spaces, copy.deepcopy(core_cpu.config), device=device)
    other.model.load_state_dict(core_cpu.model.state_dict())
    return other


def test_ppo_sgd_steps_on_cuda_match_the_cpus() -> None:
    torch.manual_seed(0)
    cpu = PPO(BOX, PPOConfig())
    gpu = _on(cpu, "cuda")
    mb_cpu = cpu.make_batch(synthetic_rollout(cpu, 32, 4))
    mb_gpu = {k: v.to("cuda") for k, v in mb_cpu.items()}
    for _ in range(5):
        norm_cpu = cpu.sgd_step(cpu.loss(mb_cpu)[0], 0.5)
        norm_gpu = gpu.sgd_step(gpu.loss(mb_gpu)[0], 0.5)
        assert float(norm_gpu) == pytest.approx(float(norm_cpu), rel=1e-4)
    for (name, p), q in zip(cpu.model.named_parameters(), gpu.model.parameters(), strict=True):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-4, atol=1e-5, msg=name)


def test_a_whole_ppo_update_on_cuda_reports_what_the_cpu_does() -> None:
    torch.manual_seed(1)
    cpu = PPO(BOX, PPOConfig(num_minibatches=4, update_epochs=2))
    gpu = _on(cpu, "cuda")
    rollout = synthetic_rollout(cpu, 64, 4)
    torch.manual_seed(7)
    m_cpu = cpu.update(rollout, 0.0)
    torch.manual_seed(7)
    m_gpu = gpu.update(rollout, 0.0)
    # Minibatch order comes from each device's own generator, so the runs differ in order but
    # see the same data: the summaries agree loosely, the weights come back as CPU arrays.
    assert np.isfinite([m_gpu[k] for k in ("loss", "v_loss", "pg_loss", "approx_kl")]).all()
    assert m_gpu["v_loss"] == pytest.approx(m_cpu["v_loss"], rel=0.3)
    weights = gpu.weights()
    assert all(isinstance(w, np.ndarray) and w.dtype == np.float32 for w in weights.values())


def test_appo_updates_on_cuda() -> None:
    torch.manual_seed(0)
    core = APPO(BOX, APPOConfig(num_minibatches=2, update_epochs=2), device="cuda")
    before = core.weights()
    metrics = core.update(synthetic_rollout(core, 32, 4), 0.0)
    assert np.isfinite([v for v in metrics.values() if isinstance(v, float)]).all()
    after = core.weights()
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_the_hessian_probe_on_cuda_measures_the_cpus_curvature() -> None:
    torch.manual_seed(0)
    cpu = PPO(BOX, PPOConfig(hidden_sizes=(16,), ent_coef=0.01))
    gpu = _on(cpu, "cuda")
    rollout = ppo_rollout(32, 4, np.random.default_rng(0))
    probe = make_probe(samples=96, tol=1e-7, max_steps=200)
    got = {name: probe.measure(ProbeContext(round=1, learner=FakeLearner(core, rollout),
                                            batches=[], seed=3))
           for name, core in (("cpu", cpu), ("cuda", gpu))}
    for key in ("lambda_max", "lambda_min"):
        assert got["cuda"][key] == pytest.approx(got["cpu"][key], rel=1e-3, abs=1e-5), key


def test_a_run_trained_on_cuda_loads_and_acts_without_cuda(tmp_path: Path) -> None:
    from kernel import Engine
    from nitro import Policy

    out = tmp_path / "run"
    engine = Engine.from_plan(ROOT / "plans" / "cartpole.toml",
                              {"run.seed": 1, "run.device": "cuda", "sinks": [],
                               "stop.max_rounds": 3, "probes": []}, out_dir=out)
    summary = asyncio.run(engine.run())
    assert summary["rounds"] == 3
    # What a user does on a laptop: the checkpoint holds CPU tensors, so no map_location.
    policy = Policy.load(out)
    obs = np.zeros((5, 4), np.float32)
    actions = policy.predict(obs)
    assert actions.shape == (5,)
