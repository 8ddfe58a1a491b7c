"""The learner's default torch threads: 1 for vector observations; for the Nature CNN, the
cores the plan's local actors leave free (at least 1), every core when actors run remotely."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugins.actors.workers import default_worker_count
from plugins.learners.onpolicy import configure_threads

ROOT = Path(__file__).resolve().parents[1]
PIXELS = {"obs_shape": [4, 84, 84]}
VECTOR = {"obs_shape": [11]}
CORES = default_worker_count()


@pytest.fixture(autouse=True)
def keep_torch_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_vector_learners_take_one_thread_whatever_the_actors() -> None:
    assert configure_threads(VECTOR, 0, {"backend": "lambda", "workers": 0}) == 1
    assert configure_threads(VECTOR, 0, {"backend": "local", "workers": 0}) == 1


def test_pixel_learners_take_the_cores_local_actors_leave() -> None:
    import torch

    # One worker per core (workers = 0): the learner shares every core, so one thread.
    assert configure_threads(PIXELS, 0, {"backend": "local", "workers": 0}) == 1
    assert torch.get_num_threads() == 1
    assert configure_threads(PIXELS, 0, {"backend": "local", "workers": CORES}) == 1
    assert configure_threads(PIXELS, 0, {"backend": "local", "workers": 4 * CORES}) == 1
    assert configure_threads(PIXELS, 0, {"backend": "local", "workers": 1}) == max(1, CORES - 1)


def test_remote_actors_leave_every_core_and_a_setting_wins() -> None:
    import torch

    assert configure_threads(PIXELS, 0, {"backend": "lambda", "workers": 0}) == CORES
    assert torch.get_num_threads() == CORES
    assert configure_threads(PIXELS, 3, {"backend": "local", "workers": 0}) == 3
    assert torch.get_num_threads() == 3


def test_a_pong_learner_built_from_its_plan_with_local_actors_takes_one_thread() -> None:
    """Through the plugin factory, as a run builds it (fresh process: torch's thread count is
    process-wide). The plan's own setting is removed so the default shows."""
    script = """
import torch
from kernel.plan import load_plan
from kernel.registry import default_registry
from kernel.roles import PluginContext
plan = load_plan("plans/pong-appo.toml", {"run.torch_threads": 0, "actors.backend": "local",
                                          "actors.workers": 0})
torch.set_num_threads(2)
ctx = PluginContext(name="appo", config=plan["algo"], plan=plan, run_id="t", run_dir=None,
                    seed=0, bus=None)
learner = default_registry().get("algo", "appo").load()(ctx)
assert learner.threads == 1 and torch.get_num_threads() == 1, learner.threads
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(("obs", "cuda", "expected"), [
    ({"obs_shape": [4, 84, 84], "obs_dtype": "uint8"}, True, "cuda"),
    ({"obs_shape": [11], "obs_dtype": "float32"}, True, "cpu"),
    ({"obs_shape": [4, 84, 84], "obs_dtype": "uint8"}, False, "cpu"),
])
def test_auto_device_puts_only_pixel_learners_on_a_gpu(obs: dict, cuda: bool, expected: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from plugins.learners.onpolicy import resolve_device

    # The one stand-in: this machine has no GPU, so whether one exists is what is pretended.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto", obs) == expected
    assert resolve_device("cpu", obs) == "cpu" and resolve_device("cuda:1", obs) == "cuda:1"


def test_auto_device_without_spaces_keeps_the_old_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin written before the rule calls ``resolve_device(name)``: it still works."""
    import torch

    from plugins.learners.onpolicy import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
