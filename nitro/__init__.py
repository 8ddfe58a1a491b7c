"""Nitro's public API for users of a trained agent: ``from nitro import Policy``.

The implementation lives in the plugin layer (``plugins.agent.policy``); this package only names
what users need, so the internal layout can change without breaking their scripts.
``Engine`` is the embedding API for training (``kernel.Engine``).
"""

from typing import Any

from kernel import __version__

__all__ = ["Engine", "Policy", "PolicyLoadError", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import nitro` stays cheap; torch or the engine load only when asked for.
    if name in ("Policy", "PolicyLoadError"):
        from plugins.agent import policy as agent

        return getattr(agent, name)
    if name == "Engine":
        from kernel.engine import Engine

        return Engine
    raise AttributeError(f"module 'nitro' has no attribute {name!r}")
