"""The ``gymnasium`` env provider: checks ids at plan validation (before anything starts).

Besides registered ids it accepts gymnasium's ``module:EnvId`` form and an ``env.imports``
list of modules that register envs when imported, so a user's own environment trains without
touching Nitro. Image observations are checked here too: uint8 frames must stay uint8 so the
learner builds the Nature CNN; normalised, they would be floats and get an MLP over every pixel.
"""

from __future__ import annotations

from typing import Any

from kernel.schema import PlanError


def validate(section: dict[str, Any], plan: dict[str, Any]) -> None:
    from envs import check_env_id, describe, is_image_obs

    del plan
    _check_imports(section["imports"])
    try:
        check_env_id(section["id"], section["imports"])
    except ValueError as exc:
        raise PlanError("env.id", "a registered gymnasium environment id", section["id"],
                        note=str(exc)) from None
    # Build one env now: bad kwargs or an unsupported space must fail before work starts,
    # not in every actor. Described unnormalised, so pixel frames show as uint8.
    spec = {k: v for k, v in section.items() if k != "provider"}
    try:
        spaces = describe({**spec, "normalize_obs": False})
    except TypeError as exc:  # gymnasium's creator rejected a keyword argument
        raise PlanError("env.kwargs", f"arguments {section['id']} accepts",
                        section["kwargs"], note=str(exc)) from None
    except Exception as exc:  # spaces Nitro cannot train on, or an env that fails to build
        raise PlanError("env.id", "an environment Nitro can build and train on",
                        section["id"], note=f"{type(exc).__name__}: {exc}") from None
    _check_pixels(section, is_image_obs(spaces), spaces["obs_shape"])


def _check_imports(imports: list[str]) -> None:
    """Each entry must be an importable module; importing it registers its envs."""
    from envs.make import import_env_modules

    for i, module in enumerate(imports):
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise PlanError(f"env.imports[{i}]", "a dotted module name such as mypkg.envs",
                            module)
        try:
            import_env_modules([module])
        except ValueError as exc:
            raise PlanError(f"env.imports[{i}]", "a module that can be imported", module,
                            note=str(exc)) from None


def _check_pixels(section: dict[str, Any], pixels: bool, obs_shape: list[int]) -> None:
    """Unset ``normalize_obs`` follows the observations (off for images); set to true on
    images, the plan is refused: the CNN scales pixels by 1/255 itself, and normalised frames
    would silently get an MLP instead."""
    if section["normalize_obs"] is None:
        section["normalize_obs"] = not pixels
    elif section["normalize_obs"] and pixels:
        shape = "x".join(str(d) for d in obs_shape)
        raise PlanError("env.normalize_obs", "false for image observations", True,
                        note=f"{section['id']} gives uint8 frames {shape}: the Nature CNN "
                             "scales pixels itself, normalised frames would get an MLP")


def make(ctx: Any) -> None:
    """Envs are built by actors and probes from the env spec; nothing runs on the learner."""
    return None
