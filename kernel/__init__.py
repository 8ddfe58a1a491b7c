"""Nitro's microkernel: event loop, bus, plugin registry, plans, codec, round protocol, CLI.

It imports no RL library; ``from kernel import Engine`` is the embedding API.
"""

from typing import Any

from kernel.version import __version__

__all__ = ["Engine", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Engine":  # lazy: `python -m kernel validate` need not import the engine
        from kernel.engine import Engine

        return Engine
    raise AttributeError(name)
