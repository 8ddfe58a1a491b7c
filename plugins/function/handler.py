"""The actor function: ``handler(event, context)``.

The same code runs in AWS Lambda, behind ``python -m kernel lambda serve`` and in the ``local``
backend's worker processes. A warm invocation reuses the env (episodes continue across
fragments), the policy and the transport connection; a cold one builds them and says so in
its receipt.

The event is JSON and carries no secret: run id, request id, policy version, env spec, algo
spec, step count, seed and the transport's public settings. It is not trusted either: whoever
can invoke the function writes it. So before any work the function refuses (``EventRefused``,
with a reason the backends and the endpoint count) anything a validated plan could not have
produced:

- a transport that names another Redis than the function's environment does, or carries TLS
  settings (the URL, password and TLS policy come from ``REDIS_URL``,
  ``NITRO_REDIS_PASSWORD`` and ``NITRO_REDIS_SSL_*`` in the function's environment);
- an env that would import code: a ``module:EnvId`` id or ``imports`` entry whose module is not
  in ``NITRO_ENV_MODULES`` (comma-separated, set from the learner's plan), or an id gymnasium
  does not know;
- sizes past what a function can do: envs per actor, steps, kwargs, network layers.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from kernel import codec
from kernel.registry import default_registry
from plugins.function.actor_contract import ENV_MODULES_VAR, EventRefused

__all__ = ["EventRefused", "handler", "init_worker", "validate_event"]

_EVENT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "run_id": str,
    "request_id": str,
    "version": int,
    "seed": int,
    "steps": int,
    "env": dict,
    "algo": dict,
    "transport": dict,
}
#: Optional: the event's episode epoch. Envs are kept warm between invocations so episodes run
#: on across rounds; a new epoch starts them afresh from the invocation's seed, which is what
#: lets a run resumed from a checkpoint replay the rounds an uninterrupted run played.
EPOCH_FIELD = "episode_epoch"
#: A fragment larger than this would not fit Lambda's memory or payload limits anyway.
MAX_STEPS = 1_000_000
#: The plan's own bound on envs per actor.
MAX_NUM_ENVS = 4096
#: Env steps of one invocation (steps x envs): more than a function can run in Lambda's 900 s.
MAX_INVOCATION_ENV_STEPS = 1 << 24
MAX_ID_CHARS = 256
MAX_KWARGS_BYTES = 16 * 1024
MAX_NESTING = 8
MAX_EPISODE_STEPS = 10_000_000
MAX_LAYERS = 16
MAX_LAYER_SIZE = 8192
#: Weights of the MLPs an event may ask for (a Nature CNN is far below it).
MAX_PARAMETERS = 1 << 26
MAX_OBS_ELEMENTS = 1 << 22
MAX_ACTIONS = 1 << 16
#: What rollouts carry: float32 after normalisation, or the env's own integer pixels.
OBS_DTYPES = {"float32", "uint8"}
#: Execution environments keep this many runs' envs, policies and connections warm.
WARM_RUNS = 2


K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A small cache that closes what it evicts: events name runs, and a function that keeps
    every run it was ever asked about would hold their envs and sockets until it dies."""

    def __init__(self, size: int, close: Callable[[V], None] = lambda _: None):
        self.size = size
        self._close = close
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            _, old = self._items.popitem(last=False)
            try:
                self._close(old)
            except Exception:  # a broken env or socket must not fail the invocation
                pass
        return value

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _PolicyState:
    policy: Any
    version: int | None = None
    obs_rms: Any = None


class _TransferClock:
    """Milliseconds per byte of this environment's recent pushes (batches of one run are all
    the same size, so the last ones predict the next).

    A batch must carry its own receipt, so the time to push it cannot be measured before it
    leaves: the receipt adds the push time this rate predicts (AWS bills until the handler
    returns, push included)."""

    def __init__(self) -> None:
        self.ms_per_byte: float | None = None

    def observe(self, size: int, ms: float) -> None:
        if size <= 0:
            return
        rate = ms / size
        self.ms_per_byte = rate if self.ms_per_byte is None else 0.5 * (self.ms_per_byte + rate)

    def estimate(self, size: int) -> float:
        return 0.0 if self.ms_per_byte is None else self.ms_per_byte * size


def _close(obj: Any) -> None:
    obj.close()


@dataclass
class _Warm:
    """What survives between invocations of one execution environment."""

    invocations: int = 0
    #: env key -> (episode epoch, sampler)
    samplers: _Lru[str, tuple[int, Any]] = field(
        default_factory=lambda: _Lru(WARM_RUNS, lambda item: _close(item[1])))
    policies: _Lru[str, _PolicyState] = field(default_factory=lambda: _Lru(WARM_RUNS))
    clients: _Lru[str, Any] = field(default_factory=lambda: _Lru(WARM_RUNS, _close))
    transfers: _TransferClock = field(default_factory=_TransferClock)


_warm = _Warm()


def init_worker() -> None:
    """Worker-process set-up: one torch thread per actor (actors are many, cores are few)."""
    import torch

    torch.set_num_threads(1)


# -- what an event may ask -------------------------------------------------------------------


def validate_event(event: Any) -> dict[str, Any]:
    """The event as a dict, or ``EventRefused``; imports nothing an event names."""
    if isinstance(event, (str, bytes)):
        try:
            event = json.loads(event)
        except (ValueError, RecursionError) as exc:
            raise EventRefused("bad_event", f"event is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise EventRefused("bad_event", f"event must be a JSON object, got {type(event).__name__}")
    for key, types in _EVENT_FIELDS.items():
        if key not in event:
            raise EventRefused("bad_event", f"event is missing {key!r}")
        if not isinstance(event[key], types) or isinstance(event[key], bool):
            raise EventRefused("bad_event",
                               f"event field {key!r} has type {type(event[key]).__name__}")
    if not 1 <= event["steps"] <= MAX_STEPS:
        raise EventRefused("bounds", f"event steps {event['steps']} out of range 1..{MAX_STEPS}")
    if not 0 <= event["version"] < 1 << 63:
        raise EventRefused("bad_event", "event version must be >= 0 (and below 2**63)")
    if not 0 <= event["seed"] < 1 << 63:
        raise EventRefused("bad_event", "event seed must be in 0..2**63-1")
    epoch = event.get(EPOCH_FIELD, 0)
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 1 << 63:
        raise EventRefused("bad_event", f"event {EPOCH_FIELD} must be an integer in 0..2**63-1")
    for key in ("run_id", "request_id"):
        if not 0 < len(event[key]) <= MAX_ID_CHARS:
            raise EventRefused("bad_event", f"event {key} must have 1..{MAX_ID_CHARS} characters")
    _check_env(event["env"], event["steps"])
    _check_algo(event["algo"])
    _check_transport(event["transport"])
    return event


def allowed_env_modules() -> set[str]:
    """``NITRO_ENV_MODULES`` of the function's environment."""
    raw = os.environ.get(ENV_MODULES_VAR, "")
    return {m.strip() for m in raw.split(",") if m.strip()}


def _check_env(env: dict[str, Any], steps: int) -> None:
    env_id = env.get("id")
    if not isinstance(env_id, str) or not 0 < len(env_id) <= MAX_ID_CHARS:
        raise EventRefused("env_id", f"env id must be a string of 1..{MAX_ID_CHARS} characters")
    imports = env.get("imports") or []
    if not isinstance(imports, list) or not all(isinstance(m, str) for m in imports):
        raise EventRefused("env_module", "env imports must be a list of module names")
    module, sep, _ = env_id.partition(":")
    wanted = [*imports, *([module] if sep else [])]
    allowed = allowed_env_modules()
    for name in wanted:
        if name not in allowed:
            raise EventRefused(
                "env_module", f"env module {name!r} is not in this function's {ENV_MODULES_VAR}"
                " (the modules its learner's plan names)")
    num_envs = env.get("num_envs", 1)
    if not _is_int(num_envs) or not 1 <= num_envs <= MAX_NUM_ENVS:
        raise EventRefused("bounds", f"env num_envs must be an integer in 1..{MAX_NUM_ENVS}")
    if steps * num_envs > MAX_INVOCATION_ENV_STEPS:
        raise EventRefused("bounds", f"steps x num_envs = {steps * num_envs} exceeds "
                                     f"{MAX_INVOCATION_ENV_STEPS} env steps per invocation")
    kwargs = env.get("kwargs") or {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise EventRefused("bounds", "env kwargs must be a table with string keys")
    if _depth(kwargs) > MAX_NESTING or len(json.dumps(kwargs)) > MAX_KWARGS_BYTES:
        raise EventRefused("bounds", f"env kwargs larger than {MAX_KWARGS_BYTES} bytes or "
                                     f"nested deeper than {MAX_NESTING}")
    episode = env.get("max_episode_steps")
    if episode is not None and (not _is_int(episode) or not 1 <= episode <= MAX_EPISODE_STEPS):
        raise EventRefused("bounds", f"env max_episode_steps must be in 1..{MAX_EPISODE_STEPS}")
    for key in ("clip_obs", "gamma"):
        value = env.get(key, 1.0)
        if not _is_number(value) or not 0 < value <= 1e6 or (key == "gamma" and value > 1):
            raise EventRefused("bounds", f"env {key} {value!r} out of range")
    for key in ("normalize_obs", "normalize_reward", "clip_reward"):
        if env.get(key) is not None and not isinstance(env[key], bool):
            raise EventRefused("bad_event", f"env {key} must be true or false")


def _check_registered(env: dict[str, Any]) -> None:
    """The id is one gymnasium knows once the allowed modules are imported. Called only after
    ``_check_env`` allowed every module the spec names."""
    from envs import check_env_id

    try:
        check_env_id(env["id"], env.get("imports") or [])
    except ValueError as exc:
        raise EventRefused("env_id", str(exc)) from None


def _check_algo(algo: dict[str, Any]) -> None:
    if not isinstance(algo.get("algo"), str):
        raise EventRefused("bad_event", "algo spec must name its algorithm ('algo')")
    spaces, net = algo.get("spaces"), algo.get("net", {})
    if not isinstance(spaces, dict) or not isinstance(net, dict):
        raise EventRefused("bad_event", "algo spec needs a spaces table (and net, if any)")
    obs_shape = spaces.get("obs_shape")
    if (not isinstance(obs_shape, list) or not 1 <= len(obs_shape) <= 4
            or not all(_is_int(d) and d >= 1 for d in obs_shape)
            or math.prod(obs_shape) > MAX_OBS_ELEMENTS):
        raise EventRefused("bounds", f"algo obs_shape must be 1..4 positive sizes of at most "
                                     f"{MAX_OBS_ELEMENTS} elements")
    if spaces.get("obs_dtype") not in OBS_DTYPES:
        raise EventRefused("bad_event", f"algo obs_dtype must be one of {sorted(OBS_DTYPES)}")
    action = spaces.get("action")
    if not isinstance(action, dict) or action.get("kind") not in ("discrete", "box"):
        raise EventRefused("bad_event", "algo action must be a discrete or box table")
    n = action.get("n", 1)
    shape = action.get("shape", [1])
    if (not _is_int(n) or not 1 <= n <= MAX_ACTIONS or not isinstance(shape, list)
            or not all(_is_int(d) and d >= 1 for d in shape)
            or math.prod(shape) > MAX_ACTIONS):
        raise EventRefused("bounds", f"algo action space larger than {MAX_ACTIONS}")
    hidden = net.get("hidden_sizes", [64, 64])
    if (not isinstance(hidden, list) or len(hidden) > MAX_LAYERS
            or not all(_is_int(h) and 1 <= h <= MAX_LAYER_SIZE for h in hidden)):
        raise EventRefused("bounds", f"algo hidden_sizes must be at most {MAX_LAYERS} layers "
                                     f"of 1..{MAX_LAYER_SIZE} units")
    sizes = [math.prod(obs_shape), *hidden, max(n, math.prod(shape))]
    parameters = 2 * sum(a * b for a, b in itertools.pairwise(sizes))  # actor and critic
    if parameters > MAX_PARAMETERS:
        raise EventRefused("bounds", f"algo network of ~{parameters} parameters exceeds "
                                     f"{MAX_PARAMETERS}")


def _check_transport(spec: dict[str, Any]) -> None:
    """The event's transport may not choose the TLS policy; where it may connect is checked
    against the function's environment when the client is made (``_client``)."""
    tls = sorted(k for k in spec if k.startswith("ssl_"))
    if tls:
        raise EventRefused("transport_tls", f"the event sets {', '.join(tls)}: the TLS policy "
                                            "comes from the function's environment only")
    if spec.get("kind") not in ("inline", "redis"):
        raise EventRefused("transport", f"unknown transport kind {spec.get('kind')!r} in event")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_NESTING:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


# -- one invocation ----------------------------------------------------------------------------


def handler(event: Any, context: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    event = validate_event(event)
    cold = _warm.invocations == 0
    _warm.invocations += 1
    run_id, version = event["run_id"], event["version"]
    env_key = json.dumps([run_id, event["env"]], sort_keys=True)
    algo_key = json.dumps([run_id, event["algo"]], sort_keys=True)
    epoch = event.get(EPOCH_FIELD, 0)
    warm_sampler = _warm.samplers.get(env_key)
    sampler = warm_sampler[1] if warm_sampler is not None and warm_sampler[0] == epoch else None
    if sampler is None:
        _check_registered(event["env"])  # before any connection or work
    client = _client(event["transport"], context)

    state = _warm.policies.get(algo_key)
    if state is None:
        state = _warm.policies.put(algo_key, _PolicyState(_build_policy(event["algo"])))
    if state.version != version:
        body = codec.decode(client.fetch_weights(run_id, version), kind="weights")
        if body.get("version") != version:
            raise ValueError(f"weights payload holds version {body.get('version')}, not {version}")
        weights = codec.require(body, "weights", dict)
        state.policy.load(codec.require(weights, "model", dict))
        state.obs_rms = weights.get("obs_rms")
        state.version = version

    if sampler is None:
        from envs import Sampler

        if warm_sampler is not None:  # an older epoch's episodes end here
            _close(warm_sampler[1])
        sampler = Sampler(event["env"], seed=event["seed"])
        _warm.samplers.put(env_key, (epoch, sampler))
    _check_rollout_bytes(sampler, event["steps"])
    # Action noise from the invocation's seed: a run replays exactly, whichever warm process
    # (or Lambda environment) serves each call.
    reseed = getattr(state.policy, "reseed", None)
    if reseed is not None:
        reseed(int(event["seed"]))
    rollout = sampler.sample(state.policy, event["steps"], state.obs_rms)

    episode_returns = rollout.pop("episode_returns")
    episode_lengths = rollout.pop("episode_lengths")
    stats = {k: rollout.pop(k) for k in ("obs_stats", "ret_stats") if k in rollout}
    env_steps = int(event["steps"] * sampler.num_envs)
    receipt: dict[str, Any] = {
        "request_id": event["request_id"],
        "version": version,
        "env_steps": env_steps,
        "episodes": int(len(episode_returns)),
        "cold_start": cold,
    }
    body = {
        "run_id": run_id,
        "request_id": event["request_id"],
        "version": version,
        "env_steps": env_steps,
        "episode_returns": np.asarray(episode_returns, dtype=np.float32),
        "episode_lengths": np.asarray(episode_lengths, dtype=np.int64),
        "stats": stats,
        "data": rollout,
    }
    payload = _encode_with_receipt(body, receipt, t0)
    t_push = time.perf_counter()
    client.push_batch(run_id, payload)
    push_ms = (time.perf_counter() - t_push) * 1000
    _warm.transfers.observe(len(payload), push_ms)
    receipt["bytes_pushed"] = len(payload)
    receipt["push_ms"] = push_ms
    receipt["duration_ms"] = (time.perf_counter() - t0) * 1000
    receipt["billed_ms"] = math.ceil(receipt["duration_ms"])
    return receipt


#: Stands in for the batch receipt's duration while the batch is encoded; a value no real
#: duration takes, so its 9 msgpack bytes are found and overwritten once encoding is done.
_DURATION_PLACEHOLDER = -1.2345678901234567e-300
_FLOAT64 = struct.Struct(">d")


def _encode_with_receipt(body: dict[str, Any], receipt: dict[str, Any], t0: float) -> bytes:
    """Encode the batch with its receipt inside (an Event invocation's only report).

    The duration it carries includes encoding (measured: the placeholder is overwritten
    afterwards, msgpack writes every Python float as 8 fixed bytes) and the push (predicted
    from this environment's recent transfers): AWS bills until the handler returns."""
    inner = {**receipt, "duration_ms": _DURATION_PLACEHOLDER}
    payload = codec.encode("batch", {**body, "receipt": inner})
    marker = b"\xcb" + _FLOAT64.pack(_DURATION_PLACEHOLDER)
    at = payload.rfind(marker)  # the receipt is the body's last entry
    if at < 0:
        return payload
    duration = (time.perf_counter() - t0) * 1000 + _warm.transfers.estimate(len(payload))
    return payload[:at] + b"\xcb" + _FLOAT64.pack(duration) + payload[at + len(marker):]


def _check_rollout_bytes(sampler: Any, steps: int) -> None:
    """Refuse a rollout whose batch could not be carried anyway (the learner caps payloads)."""
    per_step = sampler.num_envs * math.prod(sampler.obs_shape) * sampler.obs_dtype.itemsize
    if steps * per_step > codec.DEFAULT_MAX_BYTES:
        raise EventRefused("bounds", f"a rollout of {steps} steps x {sampler.num_envs} envs "
                                     f"exceeds the {codec.DEFAULT_MAX_BYTES} byte batch cap")


def _build_policy(spec: dict[str, Any]) -> Any:
    name = spec["algo"]
    try:
        plugin = default_registry().get("algo", name)
    except Exception:
        raise EventRefused("algo", f"unknown algo {name!r}") from None
    if plugin.actor is None:
        raise EventRefused("algo", f"algo plugin {name!r} declares no actor policy")
    return plugin.load_actor()(spec)


def _client(spec: dict[str, Any], context: Any) -> Any:
    kind = spec.get("kind")
    if kind == "inline":
        return _InlineClient(context)
    key = json.dumps(spec, sort_keys=True)
    client = _warm.clients.get(key)
    if client is None:
        from plugins.transports.redis_stream import ActorRedisClient, TransportRefused, function_url

        try:
            # Where credentials live in the environment, so does the server: checked before a
            # socket is opened, so a refused event connects nowhere.
            function_url(spec.get("url"))
            client = ActorRedisClient.from_spec(spec)
        except TransportRefused as exc:
            raise EventRefused("transport_url", str(exc)) from None
        _warm.clients.put(key, client)
    return client


class _InlineClient:
    """Weights arrive attached to the call; the batch goes back beside the receipt."""

    def __init__(self, context: Any):
        self.context = context

    def fetch_weights(self, run_id: str, version: int) -> bytes:
        attachment = getattr(self.context, "attachment", None)
        if attachment is None:
            raise ValueError(f"weights version {version} were not attached to the call")
        return attachment

    def push_batch(self, run_id: str, payload: bytes) -> None:
        self.context.returned_payload = payload
