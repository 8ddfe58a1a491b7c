"""Building an algorithm's actor-side policy by the algo name its learner reports."""

from __future__ import annotations

from typing import Any

from kernel.registry import default_registry


def actor_policy(actor_spec: dict[str, Any]) -> Any:
    name = actor_spec.get("algo")
    if not isinstance(name, str):
        raise ValueError("actor spec must name its algorithm ('algo')")
    return default_registry().get("algo", name).load_actor()(actor_spec)
