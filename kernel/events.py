"""Facts the engine publishes on the bus: frozen, slotted, past-tense, timestamped.

Observers (sinks, progress display, embedding applications) read them; the coordinator never
waits on anyone reading them. ``to_dict`` gives the JSON line written to ``events.jsonl``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kernel.roles import Receipt

EVENT_SCHEMA = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    ts: float = field(default_factory=time.time)
    schema: ClassVar[int] = EVENT_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"event": type(self).__name__, "schema": self.schema, **data}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted(Event):
    run_id: str
    name: str
    run_dir: str
    resumed_from_round: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundStarted(Event):
    round: int
    actors: int
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsPublished(Event):
    round: int
    version: int
    bytes: int
    encode_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class InvocationFinished(Event):
    """One invocation's end, carrying the actor's ``Receipt`` whole, so what the journal says
    of a call (billing included: ``billed_ms``, ``init_ms``, ``cancelled``) is what the cost
    model was charged from. Its JSON line lists the receipt's fields beside ``round``."""

    round: int
    receipt: Receipt

    def to_dict(self) -> dict[str, Any]:
        data = Event.to_dict(self)
        receipt = data.pop("receipt")
        return {**data, **receipt.report()}


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchArrived(Event):
    round: int
    request_id: str
    version: int
    env_steps: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchDropped(Event):
    """A well-formed batch not used: ``reason`` is ``stale``, ``duplicate`` or ``late``."""

    round: int
    request_id: str
    version: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadRejected(Event):
    round: int
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherFinished(Event):
    round: int
    expected: int
    received: int
    failed: int
    timed_out: int
    gather_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnerUpdated(Event):
    round: int
    version: int
    learner_s: float
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionLag(Event):
    """Policy-version lag of the batches one asynchronous update consumed."""

    round: int
    mean: float
    max: int
    histogram: dict[str, int]
    dropped_stale: int
    #: Async: invocations the fleet kept outstanding during the round (None: pipelined).
    in_flight: int | None = None
    #: Share of the env steps read this round that the update trains on (the rest: stale).
    trained_fraction: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeMeasured(Event):
    round: int
    probe: str
    probe_s: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class CostCharged(Event):
    round: int
    items: dict[str, float]
    round_usd: float
    total_usd: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleDecided(Event):
    round: int
    previous: int
    actors: int
    scaler: str
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundFinished(Event):
    round: int
    actors: int
    batches: int
    env_steps: int
    round_env_steps: int
    episodes: int
    episode_return_mean: float | None
    eval_return: float | None
    round_s: float
    actor_s: float
    learner_s: float
    probe_s: float
    wall_s: float
    cost_usd: float
    sim_time_s: float
    #: Fraction of the round the learner spent updating (overlap shows as a higher value).
    learner_busy: float = 0.0
    #: Actor-seconds spent waiting for the learner (strict alternation: N x learner time).
    actor_idle_s: float = 0.0
    #: Env steps trained on per second of the round (None: sinks derive it from the times).
    env_steps_per_s: float | None = None
    #: Mean length, in env steps, of the training episodes that ended in the round.
    episode_length_mean: float | None = None
    probes: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    #: Share of the env steps read in the round's gather that the learner trained on; the
    #: rest were dropped as too stale (None: nothing arrived).
    trained_fraction: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginFailed(Event):
    plugin: str
    kind: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStopped(Event):
    reason: str
    rounds: int
    env_steps: int
    wall_s: float
