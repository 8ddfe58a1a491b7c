"""Scalers: how many actors the next round gets. Formulas and choices: ``docs/scalers.md``.

Every scaler reads only the ``ScaleContext`` (the history of ``RoundRecord``s, the budget left,
the measured cost of one actor, a seeded generator) and leaves what it based its choice on in
``last_detail`` (published in ``ScaleDecided.detail``). The adaptive ones also cap the count
at what the budget left can pay for; ``fixed``, ``min`` and ``max`` stay what they say and let
the engine's budget rule stop the run instead.

By the signal they read: ``schedules`` (none), ``curvature`` (the Hessian probe's rho),
``noise`` (the gradient noise scale), ``reward`` (the return); ``base`` holds what they share
and ``validation`` the plan-time rules. Every scaler is importable from here too, lazily:
listing plugins or validating a plan imports none of them.
"""

_HOME = {
    "Scaler": "base", "budget_cap": "base", "finite": "base", "scaler_config": "base",
    "NitroScaler": "curvature", "NoBoostScaler": "curvature", "PrototypeScaler": "curvature",
    "prototype_rho": "curvature",
    "CriticalBatchScaler": "noise", "GnsScaler": "noise", "GrowScaler": "noise",
    "KungfuScaler": "noise",
    "RewardSlopeScaler": "reward",
    "DecayOnlyScaler": "schedules", "FixedScaler": "schedules", "HydrozoaScaler": "schedules",
    "MaxScaler": "schedules", "MinScaler": "schedules", "RandomScaler": "schedules",
    "ScheduleScaler": "schedules",
    "validate_adaptive": "validation", "validate_probe": "validation",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> object:
    """Import a scaler's module when the scaler is first asked for (PEP 562), so that the
    package's ``__init__`` imports nothing, like every other plugin package's."""
    from importlib import import_module

    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return __all__
