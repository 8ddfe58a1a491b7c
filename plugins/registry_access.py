"""Building an algorithm's actor-side policy by the algo name its learner reports."""

from __future__ import annotations

from typing import Any

from kernel.registry import default_registry


def actor_policy(actor_spec: dict[str, Any], exact: bool = False) -> Any:
    """The algorithm's actor-side policy for ``actor_spec``; ``exact`` asks for the learner's
    own arithmetic even where the spec lets actors sample with a cheaper one (an int8
    ``net.actor_dtype``): what evaluation and an exported agent should act by."""
    if exact and isinstance(actor_spec.get("net"), dict):
        actor_spec = {**actor_spec, "net": {**actor_spec["net"], "actor_dtype": "float32"}}
    name = actor_spec.get("algo")
    if not isinstance(name, str):
        raise ValueError("actor spec must name its algorithm ('algo')")
    return default_registry().get("algo", name).load_actor()(actor_spec)
