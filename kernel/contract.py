"""The contract between the kernel and its plugins, checked when a plugin is built.

The protocols in ``kernel/roles.py`` are the contract: ``ROLE_SPECS`` reads from each the
methods the kernel must be able to call and the optional capabilities (``Capability``) with
what the kernel assumes when a plugin has none. ``Bound`` is a plugin seen through that spec:
the kernel calls plugins only through it, so what a plugin may implement is written down once,
in its protocol, and a plugin that lacks a required method fails at build time with one line
naming it and the method (pluggy's habit of checking hooks at registration).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from kernel import roles
from kernel.roles import Capability, Unreachable


class PluginContractError(Exception):
    """A plugin that lacks a method its role requires (one line naming both)."""


class PluginCrashed(Exception):
    """A plugin raised where the run cannot go on; names the plugin."""

    def __init__(self, kind: str, name: str, error: BaseException):
        super().__init__(f"{kind} plugin {name!r} failed: {type(error).__name__}: {error}")
        self.kind = kind
        self.name = name
        self.error = error


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What the kernel calls on a plugin of one kind, read off its protocol: the methods it
    must have, and the optional capabilities with the behaviour the kernel assumes when a
    plugin has none."""

    protocol: str
    required: tuple[str, ...]
    optional: Mapping[str, Any] = field(default_factory=dict)


def role_spec(protocol: type) -> RoleSpec:
    """A protocol's members, base classes first: a method is required, a ``Capability`` is
    optional with its default (a role may make a lifecycle capability required, as the
    learner does ``state``)."""
    required: dict[str, None] = {}
    optional: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for attr, value in vars(klass).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, Capability):
                optional[attr] = value.default
                required.pop(attr, None)
            elif callable(value):
                required[attr] = None
                optional.pop(attr, None)
    return RoleSpec(protocol.__name__, tuple(required), optional)


#: Each kind of plugin and the protocol in kernel/roles.py it is checked against.
ROLE_SPECS: dict[str, RoleSpec] = {kind: role_spec(protocol) for kind, protocol in {
    "algo": roles.Learner, "actors": roles.ActorBackend, "transport": roles.Transport,
    "scaler": roles.Scaler, "probe": roles.Probe, "cost": roles.CostModel, "sink": roles.Sink,
}.items()}


class Bound:
    """A plugin as the kernel sees it: its role's required methods, and each optional
    capability either the plugin's own or the default its role declares. The kernel calls
    plugins only through this view, so what a plugin may implement is written down once,
    here, rather than discovered call by call."""

    def __init__(self, kind: str, name: str, plugin: Any):
        spec = ROLE_SPECS[kind]
        missing = [m for m in spec.required if not callable(getattr(plugin, m, None))]
        if missing:
            raise PluginContractError(
                f"{kind} plugin {name!r} ({type(plugin).__name__}) lacks {missing[0]}(), "
                f"required by the {spec.protocol} protocol")
        self.kind = kind
        self.name = name
        self.plugin = plugin
        self._spec = spec

    def __getattr__(self, attr: str) -> Any:
        spec = object.__getattribute__(self, "_spec")
        if attr in spec.required:
            return getattr(self.plugin, attr)
        if attr in spec.optional:
            return getattr(self.plugin, attr, spec.optional[attr])
        raise AttributeError(f"{attr!r} is not part of the {spec.protocol} protocol")


@dataclass(frozen=True, slots=True)
class ProbeSlot:
    name: str
    probe: Bound
    #: Every this many rounds.
    every: int
    #: The value that is the policy's score if this probe evaluates the policy (it drives
    #: the target return, and its time is not charged), else None.
    score: str | None
    #: Most of the run's simulated time this probe may take (``Coordinator.due``); None: any.
    max_share: float | None = None

    @property
    def evaluation(self) -> bool:
        return self.score is not None


@dataclass
class Roles:
    """The run's plugins, bound to their roles."""

    learner: Bound
    actors: Bound
    transport: Bound
    scaler: Bound
    cost: Bound
    probes: list[ProbeSlot]
    #: The env spec every invocation carries, built by the algorithm plugin; never opened here.
    env_spec: dict[str, Any]


class Named(Protocol):
    kind: str
    name: str


class PluginName(NamedTuple):
    """A plugin not built yet (its factory may raise), named for ``blame``."""

    kind: str
    name: str


@contextlib.contextmanager
def blame(plugin: Named) -> Iterator[None]:
    """Name the plugin in whatever it raises, so a crash report says whose it is."""
    try:
        yield
    except (PluginCrashed, Unreachable, PluginContractError, asyncio.CancelledError):
        raise
    except Exception as exc:
        raise PluginCrashed(plugin.kind, plugin.name, exc) from exc
