"""The kernel's ``Learner`` role for on-policy algorithms, around a pure algorithm core.

The core (``algos.ppo.PPO`` or any object with ``actor_spec``, ``weights``, ``update(rollout,
progress)``, ``state_dict`` and ``load_state_dict``) does the math. This shell does what the
distributed setting adds: checking batches before they reach the math, merging the actors'
observation and return statistics (so the run normalises like a single process), scaling
rewards, concatenating the round's fragments and tracking progress for annealing.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from envs import RunningMeanStd, describe, is_image_obs
from kernel.roles import Batch, PluginContext, SnapshotRequest

ROLLOUT_KEYS = ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated",
                "bootstrap_values", "last_obs", "last_values")
#: Scaled rewards are clipped like gymnasium's NormalizeReward + TransformReward stack.
REWARD_CLIP = 10.0


def configure_threads(spaces: Mapping[str, Any], requested: int,
                      actors: Mapping[str, Any] | None = None) -> int:
    """Set the learner's torch intra-op threads: ``requested``, or the default below.

    Vector observations get 1 thread: a PPO update of 2048 Hopper samples in minibatches of
    64 took 0.48 s on 1 thread and 5 s on 2 while another process used the other core.

    Pixel learners (the Nature CNN) gain from threads only on cores nobody else uses. Local
    actors (``actors`` is the plan's section) run worker processes on this machine, one per
    core unless ``actors.workers`` says fewer, so the learner takes the cores they leave,
    at least 1: a torch thread on a core an actor keeps busy is descheduled in the middle of
    its share of each convolution, and every other thread waits at the next barrier
    (`perf/learner_bench.py` on a loaded 2-core machine: APPO's update took 55 frames/s on 1
    thread, 21 on 2). Remote actors (Lambda) leave the machine to the learner: every core.
    """
    import torch

    threads = requested or _default_threads(spaces, actors)
    torch.set_num_threads(threads)
    return threads


def _default_threads(spaces: Mapping[str, Any], actors: Mapping[str, Any] | None) -> int:
    if len(spaces["obs_shape"]) != 3:
        return 1
    from plugins.actors.workers import default_worker_count

    cores = default_worker_count()  # the cores this process may run on
    if actors is None or actors["backend"] != "local":
        return cores
    workers = actors["workers"] or cores  # 0: one worker per core
    return max(1, cores - workers)


def resolve_device(name: str, spaces: Mapping[str, Any] | None = None) -> str:
    """The learner's torch device; ``auto`` takes CUDA for pixel observations only.

    A vector-observation MLP is too small for a GPU: each SGD step costs the launch of its
    kernels, and on an H200 a Hopper PPO update ran at 0.40x of one CPU thread, while the
    Nature CNN's APPO update on Pong frames ran at 17.7x (perf/gpu_check.py). Name ``cuda``
    to put an MLP there anyway. Without ``spaces`` (a plugin written before this rule) any
    available CUDA device is taken, as before.
    """
    if name != "auto":
        return name
    import torch

    pixels = spaces is None or is_image_obs(spaces)
    return "cuda" if pixels and torch.cuda.is_available() else "cpu"


class OnPolicyLearner:
    def __init__(self, ctx: PluginContext, core: Any, spaces: dict[str, Any], algo: str):
        self.core = core
        self.spaces = spaces
        self.algo = algo
        self.threads = configure_threads(spaces, ctx.plan["run"]["torch_threads"],
                                         ctx.plan["actors"])
        env = ctx.plan["env"]
        self.steps = ctx.plan["actors"]["steps"]
        self.num_envs = env["num_envs"]
        self.stop = ctx.plan["stop"]
        self._env_spec = env_spec_of(ctx.plan)
        obs_shape = tuple(spaces["obs_shape"])
        self.obs_rms = RunningMeanStd(obs_shape) if env["normalize_obs"] else None
        self.ret_rms = RunningMeanStd(()) if env["normalize_reward"] else None
        self.trained_env_steps = 0
        self.updates = 0
        self.last_rollout: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()  # probes read weights while nothing else trains
        #: Mid-update weights need a core whose update reports its steps (`on_step`).
        self.supports_snapshots = "on_step" in inspect.signature(core.update).parameters

    # -- what actors need ---------------------------------------------------------------------

    def actor_spec(self) -> dict[str, Any]:
        return {"algo": self.algo, **self.core.actor_spec()}

    def weights(self) -> dict[str, Any]:
        with self._lock:
            return self._weights()

    def _weights(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.core.weights()}
        if self.obs_rms is not None:
            out["obs_rms"] = self.obs_rms.to_dict()
        return out

    # -- batches ------------------------------------------------------------------------------

    def env_spec(self) -> dict[str, Any]:
        """The env spec every invocation carries: the plan's env section, plus the discount
        the actors' reward normalisation needs."""
        return dict(self._env_spec)

    def check_batch(self, body: Mapping[str, Any]) -> None:
        """Reject a batch whose arrays do not fit this run before it can reach the math."""
        data = body.get("data")
        if not isinstance(data, dict):
            raise ValueError("batch has no data table")
        for key in ROLLOUT_KEYS:
            if not isinstance(data.get(key), np.ndarray):
                raise ValueError(f"batch data lacks array {key!r}")
        obs_shape = tuple(self.spaces["obs_shape"])
        t, e = data["rewards"].shape[:2] if data["rewards"].ndim == 2 else (-1, -1)
        if t != self.steps or e < 1:
            raise ValueError(f"rewards shape {data['rewards'].shape}, expected ({self.steps}, E)")
        if body.get("env_steps") != t * e:
            raise ValueError(f"env_steps {body.get('env_steps')!r} is not the rollout's "
                             f"{t} x {e} steps")
        if data["obs"].shape != (t, e, *obs_shape):
            raise ValueError(f"obs shape {data['obs'].shape}, expected {(t, e, *obs_shape)}")
        if data["last_obs"].shape != (e, *obs_shape) or data["last_values"].shape != (e,):
            raise ValueError("last_obs / last_values do not match the batch")
        for key in ("logprobs", "values", "terminated", "truncated", "bootstrap_values"):
            if data[key].shape != (t, e):
                raise ValueError(f"{key} shape {data[key].shape}, expected {(t, e)}")
        action = self.spaces["action"]
        want = (t, e) if action["kind"] == "discrete" else (t, e, *action["shape"])
        if data["actions"].shape != want:
            raise ValueError(f"actions shape {data['actions'].shape}, expected {want}")
        for key in ("obs", "rewards", "values", "logprobs", "bootstrap_values"):
            if data[key].dtype.kind == "f" and not np.isfinite(data[key]).all():
                raise ValueError(f"{key} holds NaN or infinity")
        if action["kind"] == "discrete" and (
            data["actions"].min(initial=0) < 0 or data["actions"].max(initial=0) >= action["n"]
        ):
            raise ValueError("discrete action out of range")
        self._check_stats(body.get("stats", {}), obs_shape, t * e)

    @staticmethod
    def _check_stats(stats: Any, obs_shape: tuple[int, ...], samples: int) -> None:
        """Normalisation moments merge into the run's statistics for good: a wrong shape would
        crash the update and a NaN would poison every later observation."""
        if not isinstance(stats, dict):
            raise ValueError("batch stats is not a table")
        for key, shape in (("obs_stats", obs_shape), ("ret_stats", ())):
            if key not in stats:
                continue
            moments = stats[key]
            if not isinstance(moments, dict) or not {"mean", "var", "count"} <= moments.keys():
                raise ValueError(f"{key} lacks mean/var/count")
            try:
                mean = np.asarray(moments["mean"], dtype=np.float64)
                var = np.asarray(moments["var"], dtype=np.float64)
                count = float(moments["count"])
            except (TypeError, ValueError):
                raise ValueError(f"{key} is not numeric") from None
            if mean.shape != shape or var.shape != shape:
                raise ValueError(f"{key} shape {mean.shape}, expected {shape}")
            if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all()
                    and np.isfinite(count) and 0 < count <= samples):
                raise ValueError(f"{key} holds NaN, a negative variance or a bad count")

    # -- learning -----------------------------------------------------------------------------

    def progress(self) -> float:
        """How far the run has come towards its end, in [0, 1], for the learning-rate anneal.

        The horizon is read from the plan's stop limits on purpose, and only here: the anneal
        must reach zero where the run ends, and the stop section is the one place a run's
        length is written. An algo key of its own (Stable-Baselines3's ``total_timesteps``)
        would be a second copy that a ``--set stop.max_env_steps=...`` leaves behind. A run
        stopped by budget, wall time or a target alone has no known end, so it does not
        anneal (0)."""
        if self.stop["max_env_steps"]:
            return self.trained_env_steps / self.stop["max_env_steps"]
        if self.stop["max_rounds"]:
            return self.updates / self.stop["max_rounds"]
        return 0.0

    def update(self, batches: Sequence[Batch], snapshot: SnapshotRequest | None = None
               ) -> dict[str, float]:
        with self._lock:
            for batch in batches:
                stats = batch.get("stats", {})
                if self.obs_rms is not None and "obs_stats" in stats:
                    self.obs_rms.merge(stats["obs_stats"])
                if self.ret_rms is not None and "ret_stats" in stats:
                    self.ret_rms.merge(stats["ret_stats"])
            rollout = {
                key: np.concatenate([b["data"][key] for b in batches], axis=1 if key not in (
                    "last_obs", "last_values") else 0)
                for key in ROLLOUT_KEYS
            }
            rewards = rollout["rewards"].astype(np.float32)
            if self.ret_rms is not None:
                rewards = np.clip(rewards / np.sqrt(self.ret_rms.var + 1e-8), -REWARD_CLIP,
                                  REWARD_CLIP).astype(np.float32)
            rollout["rewards"] = rewards
            # Probes (Hessian, gradient noise) measure the loss on exactly what was trained on.
            self.last_rollout = rollout
            if snapshot is not None and self.supports_snapshots:
                on_step = self._snapshot_hook(snapshot)
                metrics = self.core.update(rollout, self.progress(), on_step=on_step)
            else:
                metrics = self.core.update(rollout, self.progress())
            self.trained_env_steps += int(sum(int(b["env_steps"]) for b in batches))
            self.updates += 1
            if self.ret_rms is not None:
                metrics["reward_scale"] = float(1.0 / np.sqrt(self.ret_rms.var + 1e-8))
            return metrics

    def _snapshot_hook(self, snapshot: SnapshotRequest) -> Callable[[int, int], None]:
        delivered = False

        def on_step(done: int, total: int) -> None:
            nonlocal delivered
            if not delivered and done >= snapshot.at * total:
                delivered = True
                snapshot.deliver(self._weights())  # the update holds the lock already

        return on_step

    # -- checkpoints --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        import torch

        with self._lock:
            return {
                "core": to_numpy_tree(self.core.state_dict()),
                "torch_rng": torch.get_rng_state().numpy(),
                "obs_rms": self.obs_rms.to_dict() if self.obs_rms is not None else None,
                "ret_rms": self.ret_rms.to_dict() if self.ret_rms is not None else None,
                "trained_env_steps": self.trained_env_steps,
                "updates": self.updates,
            }

    def load_state(self, state: Mapping[str, Any]) -> None:
        import torch

        with self._lock:
            self.core.load_state_dict(to_torch_tree(state["core"]))
            if state.get("torch_rng") is not None:
                torch.set_rng_state(torch.from_numpy(np.array(state["torch_rng"])))
            if self.obs_rms is not None and state.get("obs_rms") is not None:
                self.obs_rms = RunningMeanStd.from_dict(state["obs_rms"])
            if self.ret_rms is not None and state.get("ret_rms") is not None:
                self.ret_rms = RunningMeanStd.from_dict(state["ret_rms"])
            self.trained_env_steps = int(state["trained_env_steps"])
            self.updates = int(state["updates"])


_INT_KEYS = "__int_keys__"


def to_numpy_tree(obj: Any) -> Any:
    """torch state dicts as codec-encodable trees: tensors to numpy, int-keyed maps (the
    optimiser's per-parameter state) to tagged lists (msgpack maps take string keys here)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()
    if isinstance(obj, dict):
        if obj and all(isinstance(k, int) for k in obj):
            return {_INT_KEYS: [[k, to_numpy_tree(v)] for k, v in obj.items()]}
        return {str(k): to_numpy_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_numpy_tree(v) for v in obj]
    return obj


def to_torch_tree(obj: Any) -> Any:
    import torch

    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, dict):
        if set(obj) == {_INT_KEYS}:
            return {int(k): to_torch_tree(v) for k, v in obj[_INT_KEYS]}
        return {k: to_torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_torch_tree(v) for v in obj]
    return obj


def build_learner(ctx: PluginContext, core_class: Any, config_class: Any) -> OnPolicyLearner:
    """An algorithm's core, seeded, on the plan's device, inside the distributed shell. Every
    learner factory goes through here, so they all start from the same weights for a seed."""
    import torch

    cfg = {k: v for k, v in ctx.config.items() if k != "name"}
    if "hidden_sizes" in cfg:
        cfg["hidden_sizes"] = tuple(cfg["hidden_sizes"])
    torch.manual_seed(ctx.seed)
    spaces = describe(env_spec_of(ctx.plan))
    # Before the model exists: its orthogonal initialisation runs LAPACK, whose result differs
    # in the last bits with the thread count, and a seeded run must start from the same weights.
    configure_threads(spaces, ctx.plan["run"]["torch_threads"], ctx.plan["actors"])
    core = core_class(spaces, config_class(**cfg),
                      device=resolve_device(ctx.plan["run"]["device"], spaces))
    return OnPolicyLearner(ctx, core, spaces, ctx.name)


def make_ppo(ctx: PluginContext) -> OnPolicyLearner:
    from algos.ppo import PPO, PPOConfig

    return build_learner(ctx, PPO, PPOConfig)


def env_spec_of(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The env section as actors and probes build envs from it, plus the algorithm's discount,
    which the actors' return normalisation uses. An algorithm that declares no ``gamma`` (one
    without discounting) leaves it to the env library's own default."""
    env = {k: v for k, v in plan["env"].items() if k != "provider"}
    if "gamma" in plan["algo"]:
        env["gamma"] = float(plan["algo"]["gamma"])
    return env
