"""The actor function: ``handler(event, context)``.

The same code runs in AWS Lambda, behind ``python -m kernel lambda serve`` and in the ``local``
backend's worker processes. A warm invocation reuses the env (episodes continue across
fragments), the policy and the transport connection; a cold one builds them and says so in
its receipt.

The event is JSON and carries no secret: run id, request id, policy version, env spec, algo
spec, step count, seed and the transport's public settings. A Redis password comes from the
function's environment (``REDIS_URL`` / ``NITRO_REDIS_PASSWORD``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernel import codec
from kernel.registry import default_registry

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
#: A fragment larger than this would not fit Lambda's memory or payload limits anyway.
MAX_STEPS = 1_000_000


@dataclass
class _Warm:
    """What survives between invocations of one execution environment."""

    invocations: int = 0
    samplers: dict[str, Any] = field(default_factory=dict)
    policies: dict[str, Any] = field(default_factory=dict)
    weights_version: dict[str, int] = field(default_factory=dict)
    obs_rms: dict[str, Any] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)


_warm = _Warm()


def init_worker() -> None:
    """Worker-process set-up: one torch thread per actor (actors are many, cores are few)."""
    import torch

    torch.set_num_threads(1)


def validate_event(event: Any) -> dict[str, Any]:
    if isinstance(event, (str, bytes)):
        event = json.loads(event)
    if not isinstance(event, dict):
        raise ValueError(f"event must be a JSON object, got {type(event).__name__}")
    for key, types in _EVENT_FIELDS.items():
        if key not in event:
            raise ValueError(f"event is missing {key!r}")
        if not isinstance(event[key], types) or isinstance(event[key], bool):
            raise ValueError(f"event field {key!r} has type {type(event[key]).__name__}")
    if not 1 <= event["steps"] <= MAX_STEPS:
        raise ValueError(f"event steps {event['steps']} out of range 1..{MAX_STEPS}")
    if event["version"] < 0:
        raise ValueError("event version must be >= 0")
    return event


def handler(event: Any, context: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    event = validate_event(event)
    cold = _warm.invocations == 0
    _warm.invocations += 1
    run_id, version = event["run_id"], event["version"]

    client = _client(event["transport"], context)
    env_key = json.dumps([run_id, event["env"]], sort_keys=True)
    algo_key = json.dumps([run_id, event["algo"]], sort_keys=True)

    policy = _warm.policies.get(algo_key)
    if policy is None:
        policy = _warm.policies[algo_key] = _build_policy(event["algo"])
    if _warm.weights_version.get(algo_key) != version:
        body = codec.decode(client.fetch_weights(run_id, version), kind="weights")
        if body.get("version") != version:
            raise ValueError(f"weights payload holds version {body.get('version')}, not {version}")
        weights = codec.require(body, "weights", dict)
        policy.load(codec.require(weights, "model", dict))
        _warm.obs_rms[algo_key] = weights.get("obs_rms")
        _warm.weights_version[algo_key] = version

    sampler = _warm.samplers.get(env_key)
    if sampler is None:
        from envs import Sampler

        sampler = _warm.samplers[env_key] = Sampler(event["env"], seed=event["seed"])
    # Action noise from the invocation's seed: a run replays exactly, whichever warm process
    # (or Lambda environment) serves each call.
    reseed = getattr(policy, "reseed", None)
    if reseed is not None:
        reseed(int(event["seed"]))
    rollout = sampler.sample(policy, event["steps"], _warm.obs_rms.get(algo_key))

    episode_returns = rollout.pop("episode_returns")
    episode_lengths = rollout.pop("episode_lengths")
    stats = {k: rollout.pop(k) for k in ("obs_stats", "ret_stats") if k in rollout}
    env_steps = int(event["steps"] * sampler.num_envs)
    receipt = {
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
    # The receipt rides inside the batch too, so Event-mode invocations still report cost.
    receipt["duration_ms"] = (time.perf_counter() - t0) * 1000
    body["receipt"] = receipt
    payload = codec.encode("batch", body)
    client.push_batch(run_id, payload)
    receipt["bytes_pushed"] = len(payload)
    receipt["duration_ms"] = (time.perf_counter() - t0) * 1000
    return receipt


def _build_policy(spec: dict[str, Any]) -> Any:
    name = spec.get("algo")
    if not isinstance(name, str):
        raise ValueError("algo spec must name its algorithm ('algo')")
    plugin = default_registry().get("algo", name)
    if plugin.actor is None:
        raise ValueError(f"algo plugin {name!r} declares no actor policy")
    return plugin.load_actor()(spec)


def _client(spec: dict[str, Any], context: Any) -> Any:
    kind = spec.get("kind")
    if kind == "inline":
        return _InlineClient(context)
    if kind == "redis":
        key = json.dumps(spec, sort_keys=True)
        client = _warm.clients.get(key)
        if client is None:
            from plugins.transport_redis import ActorRedisClient

            client = _warm.clients[key] = ActorRedisClient.from_spec(spec)
        return client
    raise ValueError(f"unknown transport kind {kind!r} in event")


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
