"""Plugin registry: every plugin, ours included, arrives through the ``nitro.plugins`` group.

An entry point names a ``Plugin`` (or a list of them). A ``Plugin`` is a light descriptor —
name, kind, one line of doc, its configuration fields and a ``module:attribute`` factory that
is imported only when the plugin is built — so validating a plan or listing plugins never
imports torch. Descriptors are checked when they are registered (pluggy's habit): a bad one
raises ``PluginError`` naming the plugin and what is wrong.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kernel.schema import Field

ENTRY_POINT_GROUP = "nitro.plugins"
KINDS = ("actors", "transport", "algo", "scaler", "probe", "sink", "cost", "env")


class PluginError(Exception):
    """A plugin that cannot be registered, built or run."""


@dataclass(frozen=True)
class Plugin:
    #: Name used in plans (``[algo] name = "ppo"``).
    name: str
    #: One of ``KINDS``.
    kind: str
    #: ``"package.module:callable"``; the callable takes a ``PluginContext``.
    factory: str | Callable[..., Any]
    #: One line shown by ``python -m kernel plugins``.
    doc: str = ""
    #: Configuration keys this plugin accepts in its plan section.
    config: dict[str, Field] = field(default_factory=dict)
    #: Optional ``"module:callable"`` checked at validation: ``(section, plan) -> None`` raising
    #: ``ValueError`` with a message (for checks a type cannot express, e.g. an env id).
    validator: str | Callable[..., Any] | None = None
    #: For algo plugins: ``"module:callable"`` building the actor-side policy from the
    #: learner's ``actor_spec()`` (what the actor function runs).
    actor: str | Callable[..., Any] | None = None
    #: For probe plugins: this probe evaluates the policy; its ``score`` value feeds the
    #: target-return stop rule and the summary, and its time is not charged to the budget.
    evaluation: bool = False
    #: For an evaluation probe: which of its values is the policy's score.
    score: str = "eval_return"
    #: Where it came from (distribution name), filled in by the registry.
    source: str = "builtin"

    @property
    def evaluation_score(self) -> str | None:
        """The value key of the policy's score if this probe evaluates the policy, else None."""
        return self.score if self.evaluation else None

    def load(self) -> Callable[..., Any]:
        return _resolve(self.factory, self)

    def load_actor(self) -> Callable[..., Any]:
        if self.actor is None:
            raise PluginError(f"plugin {self.kind}/{self.name} has no actor policy")
        return _resolve(self.actor, self)

    def validate(self, section: dict[str, Any], plan: dict[str, Any]) -> None:
        if self.validator is not None:
            _resolve(self.validator, self)(section, plan)


def _resolve(target: str | Callable[..., Any], plugin: Plugin) -> Callable[..., Any]:
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(
            f"plugin {plugin.kind}/{plugin.name}: cannot load {target!r}: {exc}"
        ) from exc


class Registry:
    def __init__(self) -> None:
        self._plugins: dict[tuple[str, str], Plugin] = {}
        #: Entry points that failed to load: name -> error. One broken package must not take
        #: every other plugin down; a plan that names one of its plugins gets this error.
        self.broken: dict[str, str] = {}

    def register(self, plugin: Plugin) -> None:
        if not isinstance(plugin, Plugin):
            raise PluginError(f"expected a kernel.registry.Plugin, got {type(plugin).__name__}")
        if plugin.kind not in KINDS:
            raise PluginError(
                f"plugin {plugin.name!r}: unknown kind {plugin.kind!r} (kinds: {', '.join(KINDS)})"
            )
        if not plugin.name or not plugin.name.replace("_", "").replace("-", "").isalnum():
            raise PluginError(f"plugin name {plugin.name!r} must be a non-empty identifier")
        if not (callable(plugin.factory) or ":" in str(plugin.factory)):
            raise PluginError(
                f"plugin {plugin.kind}/{plugin.name}: factory must be 'module:callable'"
            )
        for key, spec in plugin.config.items():
            if not isinstance(spec, Field):
                raise PluginError(
                    f"plugin {plugin.kind}/{plugin.name}: config key {key!r} is not a Field"
                )
        key = (plugin.kind, plugin.name)
        if key in self._plugins:
            raise PluginError(
                f"plugin {plugin.kind}/{plugin.name} from {plugin.source} is already registered"
                f" by {self._plugins[key].source}"
            )
        self._plugins[key] = plugin

    def load_entry_points(self) -> int:
        """Register every plugin advertised under ``nitro.plugins``; return how many."""
        from importlib.metadata import entry_points

        count = 0
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
            except Exception as exc:  # a broken third-party package must name itself
                self.broken[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
                _log_broken(ep.name, self.broken[ep.name])
                continue
            plugins: Iterable[Any] = obj if isinstance(obj, (list, tuple)) else [obj]
            dist = ep.dist.name if ep.dist is not None else ep.value
            for plugin in plugins:
                try:
                    if not isinstance(plugin, Plugin):
                        raise PluginError(f"gave a {type(plugin).__name__}, not a Plugin")
                    key = (plugin.kind, plugin.name)
                    if key in self._plugins and self._plugins[key].source == dist:
                        continue  # the same distribution seen twice (editable installs)
                    self.register(_with_source(plugin, dist))
                    count += 1
                except PluginError as exc:
                    self.broken[ep.name] = str(exc)
                    _log_broken(ep.name, str(exc))
        return count

    def get(self, kind: str, name: str) -> Plugin:
        try:
            return self._plugins[(kind, name)]
        except KeyError:
            known = ", ".join(sorted(self.names(kind))) or "none"
            broken = "".join(f"; entry point {k!r} failed to load ({v})"
                             for k, v in sorted(self.broken.items()))
            raise PluginError(
                f"no {kind} plugin named {name!r} (known: {known}){broken}") from None

    def names(self, kind: str) -> list[str]:
        return sorted(n for k, n in self._plugins if k == kind)

    def all(self) -> list[Plugin]:
        return sorted(self._plugins.values(), key=lambda p: (KINDS.index(p.kind), p.name))


def _log_broken(name: str, error: str) -> None:
    import structlog

    structlog.get_logger("kernel.registry").warning("entry_point_failed", entry_point=name,
                                                     error=error)


def _with_source(plugin: Plugin, source: str) -> Plugin:
    from dataclasses import replace

    return replace(plugin, source=source)


_default: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry, filled from entry points on first use."""
    global _default
    if _default is None:
        registry = Registry()
        registry.load_entry_points()
        _default = registry
    return _default
