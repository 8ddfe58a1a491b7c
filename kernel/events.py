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
    """A run began, or resumed after round ``resumed_from_round`` (0 for a new run)."""

    run_id: str
    name: str
    run_dir: str
    resumed_from_round: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundStarted(Event):
    """A round began with ``actors`` invocations to launch, sampling with weights
    ``version``."""

    round: int
    actors: int
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsPublished(Event):
    """Weights ``version`` went out to the transport: ``bytes`` encoded in ``encode_ms``."""

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
    """A batch passed the intake's checks and was kept for the learner."""

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
    """A payload failed to decode or to pass a check; ``reason`` is the counted kind
    (``summary.json``'s ``rejected_reasons``), ``detail`` says what was wrong."""

    round: int
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherFinished(Event):
    """The round stopped waiting for batches: ``received`` of ``expected``, after
    ``failed`` invocations failed and with ``timed_out`` still running, in ``gather_s``."""

    round: int
    expected: int
    received: int
    failed: int
    timed_out: int
    gather_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnerUpdated(Event):
    """The learner trained on the round's batches, making weights ``version``;
    ``metrics`` are its own diagnostics (losses, KL, ...), non-finite values left out."""

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
    """One probe ran after the update: ``values`` as measured, non-finite ones left out."""

    round: int
    probe: str
    values: dict[str, float]
    probe_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CostCharged(Event):
    """The cost model billed a round (or, at the stop, invocations no round took): ``items``
    by line (actors, learner, ...) summing to ``round_usd``; ``total_usd`` is the spend so far."""

    round: int
    items: dict[str, float]
    round_usd: float
    total_usd: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleDecided(Event):
    """The scaler set the next fan-out from ``previous`` to ``actors`` (already capped
    by the budget); ``detail`` is the rule's own reasoning (scores, signals)."""

    round: int
    previous: int
    actors: int
    scaler: str
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundFinished(Event):
    """The round's summary, the row a console or tracker shows: counts, returns, and
    where its time went (``round_s`` split into actor, learner and probe seconds)."""

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
    #: Simulated seconds of the round's sampling hidden behind the previous round's training
    #: (pipelined rounds started ahead, async invocations out before that update began), left
    #: out of ``sim_time_s``.
    overlap_s: float = 0.0
    #: Fraction of the round the learner spent updating (overlap shows as a higher value).
    learner_busy: float = 0.0
    #: Actor-seconds spent waiting for the learner (strict alternation: N x learner time).
    actor_idle_s: float = 0.0
    #: Env steps trained on per second of the round (None: sinks derive it from the times).
    env_steps_per_s: float | None = None
    #: Mean length, in env steps, of the training episodes that ended in the round.
    episode_length_mean: float | None = None
    #: Share of the env steps read in the round's gather that the learner trained on; the
    #: rest were dropped as too stale (None: nothing arrived).
    trained_fraction: float | None = None
    probes: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginFailed(Event):
    """A plugin raised: the run stops (reason ``error: ...``) and the error reaches the caller."""

    plugin: str
    kind: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStopped(Event):
    """The run ended for ``reason`` (a stop rule, the budget, a signal, a failure)."""

    reason: str
    rounds: int
    env_steps: int
    wall_s: float
