"""Using a trained agent: `Policy.load`, `nitro enjoy` and `nitro export`, on real runs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from kernel.engine import Engine
from nitro import Policy, PolicyLoadError
from tests.conftest import ROOT, run_cli

CARTPOLE = ROOT / "plans" / "cartpole.toml"


def _train(out: Path, overrides: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """A seeded short run evaluated every round; returns its directory and last eval event."""
    # A fixed snapshot point: the default's is timed from the machine's speed, and a seeded
    # run must train the same on a loaded machine as on a quiet one.
    engine = Engine.from_plan(CARTPOLE, {"run.seed": 1, "sinks": [], "run.snapshot_at": 0.5,
                                         "probes": [{"name": "eval", "every": 1,
                                                     "episodes": 10}], **overrides},
                              out_dir=out)
    summary = asyncio.run(engine.run())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "ProbeMeasured" and e["probe"] == "eval"]
    assert evals and evals[-1]["round"] == summary["rounds"], summary
    return out, evals[-1]


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return _train(tmp_path_factory.mktemp("cartpole") / "run",
                  {"stop.max_env_steps": 40_000, "stop.target_return": 450.0})


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Continuous actions with observation normalisation on (statistics in the checkpoint)."""
    return _train(tmp_path_factory.mktemp("pendulum") / "run",
                  {"env.id": "Pendulum-v1", "env.normalize_obs": True, "stop.max_rounds": 4,
                   "stop.target_return": 1e9,
                   "probes": [{"name": "eval", "every": 1, "episodes": 4}]})


def _plain_returns(policy: Policy, env_id: str, seeds: range) -> list[float]:
    """What a user's own script does: gymnasium, reset with a seed, predict, step."""
    env = gym.make(env_id)
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.predict(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def test_policy_reaches_the_runs_eval_return(cartpole_run: tuple[Path, dict]) -> None:
    run_dir, last_eval = cartpole_run
    policy = Policy.load(run_dir)
    seed = 1 + last_eval["round"]  # the eval probe's seed: run.seed + round
    assert np.mean(policy.evaluate(10, seed=seed)) == last_eval["values"]["eval_return"]
    assert last_eval["values"]["eval_return"] >= 450
    assert np.mean(_plain_returns(policy, "CartPole-v1", range(100, 105))) >= 400


def test_policy_loads_a_checkpoint_file_and_answers_single_and_batched(
        cartpole_run: tuple[Path, dict]) -> None:
    run_dir, _ = cartpole_run
    ckpt = sorted((run_dir / "checkpoints").glob("*.nitro"))[-1]
    policy = Policy.load(ckpt)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    batch = policy.predict(obs)
    assert batch.shape == (16,) and batch.dtype == np.int64
    assert [int(policy.predict(o)) for o in obs] == batch.tolist()
    assert np.asarray(policy.value(obs)).shape == (16,)
    policy.reseed(3)
    sampled = policy.predict(obs, deterministic=False)
    assert set(sampled.tolist()) <= {0, 1}
    with pytest.raises(ValueError, match=r"observation shape \(3,\): expected \(4,\)"):
        policy.predict(np.zeros(3))


def test_policy_load_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="no such run directory"):
        Policy.load(tmp_path / "absent")
    with pytest.raises(PolicyLoadError, match="no checkpoints"):
        Policy.load(tmp_path)


def test_continuous_policy_applies_the_runs_normalisation(pendulum_run: tuple[Path, dict]
                                                          ) -> None:
    run_dir, last_eval = pendulum_run
    policy = Policy.load(run_dir)
    assert policy.obs_filter.enabled and policy.obs_filter.mean is not None
    returns = policy.evaluate(4, seed=1 + last_eval["round"])
    assert np.mean(returns) == pytest.approx(last_eval["values"]["eval_return"], rel=1e-9)
    obs = np.array([[1.0, 0.0, 8.0]], dtype=np.float32)
    action = policy.predict(obs[0])
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0
    # Without the run's statistics the same weights act differently: they are applied.
    raw = policy._policy.act_deterministic(obs.astype(np.float32))
    assert not np.allclose(np.clip(raw, -2, 2)[0], action)


def _observations(env_id: str, n: int) -> np.ndarray:
    env = gym.make(env_id)
    env.reset(seed=0)
    env.action_space.seed(0)
    rows = []
    for i in range(n):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        rows.append(obs)
        if terminated or truncated:
            env.reset(seed=i)
    return np.asarray(rows, dtype=np.float32)


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("onnxruntime is not installed (pip install 'nitro-rl[onnx]')")
    return onnxruntime


@pytest.mark.parametrize("run", ["cartpole_run", "pendulum_run"])
def test_exported_policies_act_like_predict(run: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    import torch

    run_dir, _ = request.getfixturevalue(run)
    policy = Policy.load(run_dir)
    obs = _observations(policy.env_spec["id"], 64)
    expected = policy.predict(obs)

    onnx_file = tmp_path / "policy.onnx"
    result = run_cli("export", str(run_dir), "--format", "onnx", "--out", str(onnx_file))
    assert result.returncode == 0, result.stderr
    session = _onnxruntime().InferenceSession(str(onnx_file))
    (onnx_actions,) = session.run(None, {"obs": obs})
    ts_file = tmp_path / "policy.pt"
    result = run_cli("export", str(run_dir), "--format", "torchscript", "--out", str(ts_file))
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        ts_actions = torch.jit.load(str(ts_file))(torch.from_numpy(obs)).numpy()
    single = session.run(None, {"obs": obs[:1]})[0]
    if policy.discrete:
        assert onnx_actions.tolist() == expected.tolist()
        assert ts_actions.tolist() == expected.tolist()
    else:
        np.testing.assert_allclose(onnx_actions, expected, atol=1e-5)
        np.testing.assert_allclose(ts_actions, expected, atol=1e-5)
    assert single.shape == (1, *expected.shape[1:])


def test_safetensors_export_holds_weights_statistics_and_recipe(
        pendulum_run: tuple[Path, dict]) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from safetensors import safe_open

    run_dir, _ = pendulum_run
    result = run_cli("export", str(run_dir), "--format", "safetensors")
    assert result.returncode == 0, result.stderr
    out = run_dir / "policy.safetensors"
    assert result.stdout.strip() == str(out)
    tensors = safetensors_numpy.load_file(str(out))
    policy = Policy.load(run_dir)
    for name, value in policy.weights.items():
        np.testing.assert_array_equal(tensors[f"model.{name}"], value)
    np.testing.assert_array_equal(tensors["obs_rms.mean"], policy.obs_rms["mean"])
    with safe_open(str(out), "np") as fh:
        meta = fh.metadata()
    assert json.loads(meta["actor_spec"])["spaces"]["obs_shape"] == [3]
    assert json.loads(meta["env"])["id"] == "Pendulum-v1"


def _frames(path: Path) -> int:
    """Frames decoded back from an MP4 by ffmpeg (imageio-ffmpeg's bundled binary)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    assert meta["codec"] == "h264" and tuple(meta["size"]) == (600, 400)
    return sum(1 for _ in reader)


def test_enjoy_prints_returns_and_records_a_playable_mp4(cartpole_run: tuple[Path, dict],
                                                         tmp_path: Path) -> None:
    pytest.importorskip("moviepy", reason="nitro-rl[video] is not installed")
    run_dir, _ = cartpole_run
    videos = tmp_path / "videos"
    result = run_cli("enjoy", str(run_dir), "--episodes", "2", "--video", str(videos))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("episode 1: return ") and lines[2].startswith("mean return")
    length = int(lines[0].rsplit("length ", 1)[1])
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == ["CartPole-v1-episode-0.mp4", "CartPole-v1-episode-1.mp4"]
    # RecordVideo captures the reset frame and one per step (the last one may be left out).
    assert _frames(files[0]) in (length, length + 1)


def test_enjoy_and_export_name_a_bad_run_in_one_line(tmp_path: Path) -> None:
    for args in (("enjoy", str(tmp_path / "absent")),
                 ("export", str(tmp_path), "--format", "onnx")):
        result = run_cli(*args)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_enjoy_gives_a_one_line_hint_when_rendering_fails(cartpole_run: tuple[Path, dict],
                                                          tmp_path: Path) -> None:
    """A MuJoCo env under an OpenGL backend this machine lacks: one line, the fix named."""
    run_dir, _ = cartpole_run
    hopper = tmp_path / "hopper"
    (hopper / "checkpoints").mkdir(parents=True)
    plan = (run_dir / "plan.toml").read_text().replace('id = "CartPole-v1"', 'id = "Hopper-v5"')
    (hopper / "plan.toml").write_text(plan)
    _write_fresh_checkpoint(hopper, {"obs_shape": [11], "obs_dtype": "float32",
                                     "action": {"kind": "box", "shape": [3], "low": [-1.0] * 3,
                                                "high": [1.0] * 3}})
    result = run_cli("enjoy", str(hopper), "--episodes", "1", "--video", str(tmp_path / "v"),
                     env={"MUJOCO_GL": "no-such-backend"})
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "MUJOCO_GL=egl" in result.stderr and "libosmesa6" in result.stderr


def _write_fresh_checkpoint(run_dir: Path, spaces: dict[str, Any]) -> None:
    """A checkpoint as the engine writes it, holding an untrained model for ``spaces``."""
    import dataclasses
    import json

    import numpy as np
    import torch

    from algos.nets import ActorCritic
    from kernel import codec
    from kernel.checkpoint import FORMAT
    from kernel.run_state import RunState
    from kernel.version import __version__

    torch.manual_seed(0)
    model = ActorCritic(spaces)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    state = dataclasses.asdict(RunState())
    state.pop("history")
    state.pop("seen_requests")
    body = {"format": FORMAT, "nitro_version": __version__, "run_id": "fresh-0",
            "plan_name": run_dir.name, "final": True, "wall_s": 0.0, "run_state": state,
            "seen_requests": [], "history": [],
            "learner": {"core": {"model": weights}, "obs_rms": None},
            "scaler": None, "cost": None, "actors": None, "probes": {},
            "rng": json.dumps(np.random.default_rng(0).bit_generator.state)}
    (run_dir / "checkpoints" / "ckpt-000001.nitro").write_bytes(codec.encode("checkpoint", body))


def test_cnn_policy_round_trip_on_pong_frames(tmp_path: Path) -> None:
    """A pixel run's checkpoint: the Nature CNN is rebuilt, frames stay uint8, and predict,
    ONNX and TorchScript agree with the learner's own model."""
    import tomli_w
    import torch

    from algos.nets import ActorCritic
    from envs import describe, make_vector_env

    env = {"provider": "gymnasium", "id": "ALE/Pong-v5", "num_envs": 1, "normalize_obs": False,
           "normalize_reward": False, "clip_obs": 10.0, "kwargs": {}}
    spaces = describe(env)
    run_dir = tmp_path / "pong"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "plan.toml").write_text(tomli_w.dumps({"env": env, "algo": {"name": "ppo"}}))
    _write_fresh_checkpoint(run_dir, spaces)

    policy = Policy.load(run_dir)
    assert policy.obs_filter.dtype == np.uint8
    vec = make_vector_env({**env, "num_envs": 3}, seed=0, training=False)
    frames, _ = vec.reset(seed=0)
    for _ in range(20):
        frames, *_ = vec.step(np.array([2, 3, 2]))
    vec.close()
    assert frames.dtype == np.uint8 and frames.shape == (3, 4, 84, 84)

    torch.manual_seed(0)
    model = ActorCritic(spaces)
    assert model.pixels
    with torch.no_grad():
        logits, _ = model.heads(torch.from_numpy(frames))
    expected = logits.argmax(-1).numpy()
    assert policy.predict(frames).tolist() == expected.tolist()
    assert int(policy.predict(frames[0])) == expected[0]

    for fmt, name in (("onnx", "p.onnx"), ("torchscript", "p.pt")):
        result = run_cli("export", str(run_dir), "--format", fmt, "--out", str(tmp_path / name))
        assert result.returncode == 0, result.stderr
    session = _onnxruntime().InferenceSession(str(tmp_path / "p.onnx"))
    assert session.run(None, {"obs": frames})[0].tolist() == expected.tolist()
    with torch.no_grad():
        ts = torch.jit.load(str(tmp_path / "p.pt"))(torch.from_numpy(frames))
    assert ts.tolist() == expected.tolist()


def test_nitro_facade_exports_policy_without_importing_torch() -> None:
    code = "import sys, nitro; assert 'torch' not in sys.modules; print(nitro.Policy.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "Policy", out.stderr
