"""Nitro's own plugins, advertised through the ``nitro.plugins`` entry point like anyone's.

Each area keeps its descriptors in ``plugins/descriptors/<area>.py`` (a ``PLUGINS`` list of
light ``Plugin`` records: nothing heavy is imported until a plugin is built).
"""

from __future__ import annotations

import importlib
import pkgutil

from kernel.registry import Plugin
from plugins import descriptors


def _collect() -> list[Plugin]:
    found: list[Plugin] = []
    for info in sorted(pkgutil.iter_modules(descriptors.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{descriptors.__name__}.{info.name}")
        found.extend(getattr(module, "PLUGINS", []))
    return found


PLUGINS = _collect()
