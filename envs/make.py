"""Building environments from an env spec (the plan's ``[env]`` table, see docs/contracts.md).

Actors build their vector env from the spec they receive in every event, so everything here is
a pure function of that dict: no global state apart from gymnasium's registry. ale-py is
imported only when an id needs it, because importing it costs time and most runs are MuJoCo or
classic control.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from envs.atari import is_atari, make_atari_vector_env

__all__ = [
    "DEFAULT_ENV_SPEC",
    "check_env_id",
    "describe",
    "env_modules",
    "is_image_obs",
    "make_env",
    "make_vector_env",
    "resolve_spec",
    "rollout_obs_dtype",
    "wrappers_for",
]

#: Values used for keys an env spec leaves out; they mirror the contract's example.
DEFAULT_ENV_SPEC: dict[str, Any] = {
    "num_envs": 1,
    "kwargs": {},
    "normalize_obs": True,
    "normalize_reward": True,
    "clip_obs": 10.0,
    "gamma": 0.99,
    "max_episode_steps": None,
    # None: clip training rewards to their sign for Atari ids only (the DQN/IMPALA convention).
    "clip_reward": None,
    # Modules imported before the id is looked up: packages that register envs on import.
    "imports": [],
}

Wrapper = Callable[[gym.Env], gym.Env]


def resolve_spec(env_spec: Mapping[str, Any]) -> dict[str, Any]:
    """Return the spec with defaults filled in, so callers never need ``.get`` chains."""
    if "id" not in env_spec:
        raise ValueError(f"env spec needs an 'id' key, got keys {sorted(env_spec)}")
    spec = {**DEFAULT_ENV_SPEC, **env_spec}
    spec["kwargs"] = dict(spec["kwargs"] or {})
    spec["imports"] = [str(m) for m in spec["imports"] or []]
    if spec["clip_reward"] is None:
        spec["clip_reward"] = is_atari(split_env_id(spec["id"])[1])
    return spec


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``"pkg.envs:MyEnv-v0"`` -> ``("pkg.envs", "MyEnv-v0")``; a plain id has no module.

    This is gymnasium's own ``module:EnvId`` form: ``gym.make`` imports the module (which
    registers the env on import) and then looks the id up in its registry.
    """
    module, sep, name = env_id.partition(":")
    if not sep:
        return None, env_id
    return module, name


def env_modules(env_spec: Mapping[str, Any]) -> list[str]:
    """The modules a spec imports to register its env: ``imports``, then the id's module.

    Importing a module runs its code, so an actor function must only import the modules its
    learner validated; this list is what it compares against.
    """
    modules = [str(m) for m in env_spec.get("imports") or []]
    module, _ = split_env_id(str(env_spec["id"]))
    if module is not None:
        modules.append(module)
    return list(dict.fromkeys(modules))


def import_env_modules(modules: Iterable[str]) -> None:
    """Import each module (a no-op for modules already imported), so their envs register.

    Raises ``ValueError`` naming the module that cannot be imported, with the reason.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"cannot import env module {module!r}: {exc}") from None


def _register_ale() -> bool:
    """Import ale-py so that its ``ALE/...`` (and ``...NoFrameskip-v4``) ids are registered.

    Returns False when ale-py is not installed, so the caller can still report close matches.
    """
    try:
        import ale_py  # lazy on purpose: only Atari runs pay for it
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def _ensure_registered(env_id: str, imports: Iterable[str] = ()) -> str:
    """Register what provides ``env_id`` and return its registry id (without ``module:``).

    The spec's ``imports`` and the id's own module are imported first. ale-py also registers
    ids without the ``ALE/`` prefix (``PongNoFrameskip-v4``), so an id still unknown then gets
    one ale-py registration attempt before it is declared unknown.
    """
    module, name = split_env_id(env_id)
    import_env_modules([*imports, *([module] if module else [])])
    if name.startswith("ALE/") or name not in gym.registry:
        _register_ale()
    return name


def check_env_id(env_id: str, imports: Iterable[str] = ()) -> None:
    """Raise ``ValueError`` when ``env_id`` is not registered once its modules are imported.

    Called when a plan is loaded, so a typo fails in the coordinator with a helpful message
    (the module that cannot be imported, or close matches) instead of inside every actor.
    """
    imports = list(imports)
    name = _ensure_registered(env_id, imports)
    if name in gym.registry:
        return
    module, _ = split_env_id(env_id)
    if module is not None:
        raise ValueError(f"module {module!r} imported but does not register {name!r}")
    matches = difflib.get_close_matches(name, list(gym.registry.keys()), n=5, cutoff=0.6)
    hint = f"; close matches: {', '.join(matches)}" if matches else ""
    where = f" (after importing {', '.join(imports)})" if imports else ""
    raise ValueError(f"unknown environment id {name!r}{where}{hint}")


def is_image_obs(description: Mapping[str, Any]) -> bool:
    """Whether ``describe``'s spaces are pixel frames: uint8 of rank 3, the Nature CNN's input.

    Such frames must reach the network as uint8 (the CNN scales them by 1/255); normalised,
    they would be float32 and get an MLP over every pixel.
    """
    return description["obs_dtype"] == "uint8" and len(description["obs_shape"]) == 3


def wrappers_for(env_id: str) -> list[Wrapper]:
    """The wrapper stack for ``env_id``, in the order the wrappers apply (first wraps first).

    This is the extension point for per-family preprocessing of single envs. Atari ids are not
    built here: ale-py's vector env preprocesses them in C++ (``envs/atari.py``), so
    ``make_vector_env`` builds them whole and ``make_env`` gives the raw env.
    Statistics-based wrappers (observation and reward normalisation, episode statistics) are
    deliberately absent: the ``Sampler`` does them batched over envs and with frozen learner
    statistics, which per-env wrappers cannot do.
    """
    del env_id
    return []


def make_env(
    env_id: str,
    kwargs: Mapping[str, Any] | None = None,
    max_episode_steps: int | None = None,
    imports: Iterable[str] = (),
    render_mode: str | None = None,
) -> Callable[[], gym.Env]:
    """Return a thunk that builds one env, for ``SyncVectorEnv`` (which calls it in-process).

    Box actions are not clipped by a wrapper: ``ClipAction`` would widen the action space to
    infinite bounds (hiding them from ``describe``), and clipping once over the batch in the
    sampler is cheaper than once per env. ``render_mode`` is for watching a trained agent
    (``rgb_array`` frames for a video); training envs never render.
    """
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    imports = list(imports)

    def thunk() -> gym.Env:
        name = _ensure_registered(env_id, imports)
        # The passive checker only inspects the first calls but stays a wrapper layer on the
        # hot path; ids are validated by check_env_id instead.
        env = gym.make(
            name, max_episode_steps=max_episode_steps, disable_env_checker=True, **kwargs
        )
        for wrap in wrappers_for(name):
            env = wrap(env)
        return env

    return thunk


def make_vector_env(
    env_spec: Mapping[str, Any], seed: int, *, training: bool = True
) -> gym.vector.VectorEnv:
    """Build the actor's vector env (reset with ``seed``: sub-env ``i`` gets ``seed + i``).

    Atari ids get ale-py's preprocessed vector env; ``training`` then ends episodes at every
    lost life, evaluation envs (``training=False``) play whole games (see ``envs/atari.py``).

    In-process ``SyncVectorEnv`` because on 2 cores subprocess messaging costs about as much as a
    MuJoCo step (measured here). SAME_STEP autoreset: the obs returned at a done step is already the
    reset obs, and the finished episode's last obs is in ``info["final_obs"]``. ``copy=False``
    because the sampler copies every obs into its own buffers straight away.
    """
    spec = resolve_spec(env_spec)
    name = _ensure_registered(spec["id"], spec["imports"])
    if is_atari(name):
        atari = make_atari_vector_env(
            name, int(spec["num_envs"]), spec["kwargs"], training=training,
            max_episode_steps=spec["max_episode_steps"],
        )
        atari.reset(seed=seed)
        return atari
    thunk = make_env(name, spec["kwargs"], spec["max_episode_steps"])
    vec = gym.vector.SyncVectorEnv(
        [thunk] * int(spec["num_envs"]),
        copy=False,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    vec.reset(seed=seed)
    return vec


def rollout_obs_dtype(observation_space: gym.Space, normalize_obs: bool) -> np.dtype:
    """The dtype of ``obs`` in a rollout: float32 unless integer (pixel) obs stay unnormalised.

    float64 MuJoCo observations are narrowed to float32 since the network is float32 anyway
    and it halves the bytes an actor pushes.
    """
    dtype = np.dtype(observation_space.dtype)
    if not normalize_obs and np.issubdtype(dtype, np.integer):
        return dtype
    return np.dtype(np.float32)


def describe(env_spec: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-able description of the spaces (contracts.md), read from one probe env.

    ``obs_dtype`` is the dtype the rollouts carry (see ``rollout_obs_dtype``), which is what a
    learner needs to size its buffers and pick its encoder.
    """
    spec = resolve_spec(env_spec)
    name = _ensure_registered(spec["id"], spec["imports"])
    if is_atari(name):
        vec = make_atari_vector_env(name, 1, spec["kwargs"])
        try:
            obs_space, act_space = vec.single_observation_space, vec.single_action_space
        finally:
            vec.close()
    else:
        env = make_env(name, spec["kwargs"], spec["max_episode_steps"])()
        try:
            obs_space, act_space = env.observation_space, env.action_space
        finally:
            env.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(
            f"{spec['id']}: only Box observation spaces are supported, got {obs_space}"
        )
    if isinstance(act_space, gym.spaces.Discrete):
        if int(act_space.start) != 0:
            raise ValueError(f"{spec['id']}: Discrete actions must start at 0, got {act_space}")
        action: dict[str, Any] = {"kind": "discrete", "n": int(act_space.n)}
    elif isinstance(act_space, gym.spaces.Box):
        action = {
            "kind": "box",
            "shape": [int(d) for d in act_space.shape],
            "low": act_space.low.astype(np.float64).ravel().tolist(),
            "high": act_space.high.astype(np.float64).ravel().tolist(),
        }
    else:
        raise ValueError(f"{spec['id']}: unsupported action space {act_space}")
    return {
        "obs_shape": [int(d) for d in obs_space.shape],
        "obs_dtype": rollout_obs_dtype(obs_space, bool(spec["normalize_obs"])).name,
        "action": action,
    }
