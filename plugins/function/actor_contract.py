"""What the actor function, its backends and the local endpoint agree on, in stdlib only (the
endpoint's worker processes re-import their parent's main module, so it must stay light).

- ``NITRO_ENV_MODULES``: the function's allow-list of modules an event's env may import,
  comma-separated, set from the learner's plan (``plan_env_modules``).
- ``EventRefused``: an event the function will not run, with a short reason that the backends
  and the endpoint count. It crosses processes and HTTP as Lambda's ``errorType`` (the class
  name) and ``errorMessage`` (which starts with the reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENV_MODULES_VAR = "NITRO_ENV_MODULES"
REFUSED_ERROR = "EventRefused"


class EventRefused(ValueError):
    """An event the function will not run. ``reason`` is a short counted name; the message
    starts with it (``"env_module: ..."``) so it survives as Lambda's ``errorMessage``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def refusal_reason(message: str) -> str:
    """The reason of an ``EventRefused`` from its message (what crosses a process or HTTP)."""
    reason = message.partition(":")[0].strip()
    return reason if reason.isidentifier() else "unknown"


def plan_env_modules(env: Mapping[str, Any]) -> list[str]:
    """The modules a learner's plan lets its actors import: ``env.imports`` and the module of
    a ``module:EnvId`` id (what ``NITRO_ENV_MODULES`` is set from)."""
    imports = [str(m) for m in env.get("imports") or []]
    module, sep, _ = str(env.get("id", "")).partition(":")
    return list(dict.fromkeys([*imports, *([module] if sep else [])]))
