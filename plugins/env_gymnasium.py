"""The ``gymnasium`` env provider: checks ids at plan validation (before anything starts)."""

from __future__ import annotations

from typing import Any

from kernel.schema import PlanError


def validate(section: dict[str, Any], plan: dict[str, Any]) -> None:
    from envs import check_env_id

    try:
        check_env_id(section["id"])
    except ValueError as exc:
        raise PlanError("env.id", "a registered gymnasium environment id", section["id"],
                        note=str(exc)) from None
    # Build one env now: bad kwargs or an unsupported space must fail before work starts,
    # not in every actor.
    from envs import describe

    spec = {k: v for k, v in section.items() if k != "provider"}
    try:
        describe(spec)
    except TypeError as exc:  # gymnasium's creator rejected a keyword argument
        raise PlanError("env.kwargs", f"arguments {section['id']} accepts",
                        section["kwargs"], note=str(exc)) from None
    except Exception as exc:  # spaces Nitro cannot train on, or an env that fails to build
        raise PlanError("env.id", "an environment Nitro can build and train on",
                        section["id"], note=f"{type(exc).__name__}: {exc}") from None


def make(ctx: Any) -> None:
    """Envs are built by actors and probes from the env spec; nothing runs on the learner."""
    return None
