"""The contract between the kernel and its plugins, checked when a plugin is built.

``ROLE_SPECS`` says, for each kind of plugin, the methods the kernel must be able to call and
the optional capabilities with what the kernel assumes when a plugin has none. ``Bound`` is a
plugin seen through that spec: the kernel calls plugins only through it, so what a plugin may
implement is written down once, here, and a plugin that lacks a required method fails at build
time with one line naming it and the method (pluggy's habit of checking hooks at registration).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from kernel.roles import Unreachable


class PluginContractError(Exception):
    """A plugin that lacks a method its role requires (one line naming both)."""


class PluginCrashed(Exception):
    """A plugin raised where the run cannot go on; names the plugin."""

    def __init__(self, kind: str, name: str, error: BaseException):
        super().__init__(f"{kind} plugin {name!r} failed: {type(error).__name__}: {error}")
        self.kind = kind
        self.name = name
        self.error = error


async def _nothing_async(*_: Any, **__: Any) -> None:
    return None


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _no_counters() -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What the kernel calls on a plugin of one kind: the methods it must have, and the
    optional capabilities with the behaviour the kernel assumes when a plugin has none."""

    protocol: str
    required: tuple[str, ...]
    optional: Mapping[str, Any] = field(default_factory=dict)


#: Optional on every role: lifecycle hooks and checkpoint state.
_LIFECYCLE = {"start": _nothing, "close": _nothing, "state": _nothing, "load_state": _nothing}

ROLE_SPECS: dict[str, RoleSpec] = {
    "algo": RoleSpec("Learner", ("actor_spec", "weights", "update", "state", "load_state"), {
        **_LIFECYCLE,
        # Reject a batch whose data does not fit the run before it reaches the math.
        "check_batch": _nothing,
        # The env spec every invocation carries (the algorithm adds what its actors need,
        # e.g. gamma for reward normalisation); None passes the plan's env section on as is.
        "env_spec": _nothing,
        # Pipelined rounds may then ask for weights part-way through an update.
        "supports_snapshots": False,
    }),
    "actors": RoleSpec("ActorBackend", ("invoke",), {
        **_LIFECYCLE,
        # Raise Unreachable within seconds when the platform cannot be reached.
        "preflight": _nothing_async,
        "counters": _no_counters,
        # Account round time as N concurrent cloud functions (local backend).
        "simulate": False,
        "simulated_actor_s": _nothing,
    }),
    "transport": RoleSpec("Transport", ("public_spec", "publish_weights", "deliver",
                                        "next_batch", "ack"), {
        **_LIFECYCLE,
        "preflight": _nothing_async,
        "counters": _no_counters,
    }),
    "scaler": RoleSpec("Scaler", ("decide",), {
        **_LIFECYCLE,
        "last_detail": {},
        # Reads the round's measurements (probes, returns): the next fan-out waits for its
        # decision. A scaler that does not can be asked ahead, when an overlapped fan-out
        # starts part-way through an update.
        "adaptive": True,
    }),
    # ``every``: measure every k rounds (None: as the plan's probe entry says).
    "probe": RoleSpec("Probe", ("measure",), {**_LIFECYCLE, "every": None}),
    "cost": RoleSpec("CostModel", ("charge", "estimate_round_usd"), {
        **_LIFECYCLE,
        "estimate_first_round_usd": _nothing,
        "estimate_actor_usd": _nothing,
    }),
    "sink": RoleSpec("Sink", ("handle",), {**_LIFECYCLE, "flush": _nothing}),
}


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
