"""The roles the coordinator awaits, as typed protocols.

The kernel never imports an RL library: it talks to learners, actor backends, transports,
scalers, probes, cost models and sinks only through these protocols, so a plugin written
against them needs nothing else from us. Payloads cross as plain dicts of numpy arrays and
JSON scalars (what the codec carries); anything heavier stays inside the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

#: A batch as the learner receives it: the decoded payload an actor pushed. The kernel reads
#: only the envelope keys (``request_id``, ``version``, ``env_steps``, ``episode_returns``,
#: ``episode_lengths``, ``receipt``); the algorithm owns ``data``.
Batch = dict[str, Any]

#: Weights as the learner publishes them: name -> numpy array, plus any JSON-able extras
#: (observation-normalisation statistics travel here).
Weights = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """Asks a learner for its weights part-way through an update.

    Pipelined rounds start the next fan-out while the learner trains. Weights taken when a
    fraction ``at`` of the update's optimiser steps is done are fresher than the last
    published ones, so the next batches lag the learner by less than a whole update.
    ``deliver`` is called at most once, from the learner's thread, with what ``weights()``
    would return at that moment.
    """

    at: float
    deliver: Callable[[Weights], None]


@dataclass(frozen=True, slots=True)
class Invocation:
    """One actor call. ``event`` is the JSON body every backend sends, so the same handler
    runs in AWS Lambda, behind the local endpoint and in the local worker pool."""

    request_id: str
    version: int
    round: int
    event: dict[str, Any]
    #: Its place among the round's invocations (across the run when rounds overlap). A backend
    #: whose warm workers keep envs mid-episode may pin calls by it, so that what each
    #: invocation continues does not depend on which call finished first.
    index: int = 0


@dataclass(frozen=True, slots=True)
class Receipt:
    """What an actor reports about one invocation (the small JSON the handler returns)."""

    request_id: str
    ok: bool
    version: int = -1
    env_steps: int = 0
    episodes: int = 0
    duration_ms: float = 0.0
    billed_ms: int = 0
    cold_start: bool = False
    bytes_pushed: int = 0
    attempts: int = 1
    throttles: int = 0
    error: str | None = None
    #: The platform only accepted the call (Lambda ``Event``, HTTP 202): the actor's own receipt
    #: arrives later, inside its batch.
    accepted_only: bool = False
    #: Set when the backend hands the batch back itself (the in-memory transport path).
    payload: bytes | None = field(default=None, repr=False, compare=False)
    #: Init (cold-start) time the platform reported; AWS bills it for image functions.
    init_ms: float = 0.0
    #: The caller gave up on the call (deadline, stop): on AWS it runs on, and is billed, until
    #: it ends or reaches the function timeout. ``duration_ms`` is then the time until the
    #: cancel, not the invocation's real duration.
    cancelled: bool = False

    def report(self) -> dict[str, Any]:
        """The receipt as JSON-ready fields, without the batch it may carry back."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "payload"}


class Unreachable(Exception):
    """A backend or transport that cannot reach its service before round 1. The message is
    one line a user can act on (e.g. "is `nitro lambda serve` running?"): the engine prints it
    and exits before any work is done or billed."""


class InvocationFailed(Exception):
    """An invocation that gave up: the round goes on without it.

    It carries the call's failure ``receipt``, so what the platform bills for it reaches the
    cost model: AWS charges a function error or a timeout for its duration (and init), and a
    call the caller gave up on (``cancelled``) runs on, billed, until it ends or times out."""

    def __init__(self, request_id: str, reason: str, *, attempts: int = 1, throttles: int = 0,
                 duration_ms: float = 0.0, billed_ms: int = 0, init_ms: float = 0.0,
                 cancelled: bool = False):
        super().__init__(f"invocation {request_id} failed: {reason}")
        self.receipt = Receipt(request_id=request_id, ok=False, error=reason, attempts=attempts,
                               throttles=throttles, duration_ms=duration_ms,
                               billed_ms=billed_ms, init_ms=init_ms, cancelled=cancelled)

    @property
    def request_id(self) -> str:
        return self.receipt.request_id

    @property
    def reason(self) -> str:
        return str(self.receipt.error)


async def nothing_async(*_: Any, **__: Any) -> None:
    """An optional coroutine a plugin does not have: awaiting it does nothing."""
    return None


def nothing(*_: Any, **__: Any) -> None:
    """An optional hook a plugin does not have: calling it does nothing."""
    return None


def no_counters() -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Capability:
    """An optional member of a role's protocol, and what the kernel assumes of a plugin that
    lacks it. Every other public member of a protocol is required: a plugin without it fails
    when it is built (``kernel/contract.py`` reads the protocols below, nothing else)."""

    default: Any


class Lifecycle(Protocol):
    """Optional on every role: ``async start(ctx: PluginContext)`` before round 1, ``close()``
    when the run ends (a coroutine for backends, transports and sinks), and checkpoint state:
    ``state() -> dict`` to save, ``load_state(dict)`` to resume (codec-encodable)."""

    start = close = state = load_state = Capability(nothing)


class Learner(Lifecycle, Protocol):
    """The algorithm's learner. Every method but ``actor_spec`` may run in a worker thread."""

    def actor_spec(self) -> dict[str, Any]:
        """JSON-able description an actor needs to build the policy (goes in every event)."""

    def weights(self) -> Weights:
        """Current policy weights and normalisation statistics, as numpy arrays."""

    def update(self, batches: Sequence[Batch]) -> dict[str, float]:
        """Train on the round's batches; return scalar diagnostics (losses, KL, entropy...).

        A learner whose ``supports_snapshots`` attribute is true also takes a keyword
        ``snapshot: SnapshotRequest`` (pipelined rounds use it when present)."""

    def state(self) -> dict[str, Any]:
        """Everything needed to resume: model, optimiser, statistics (codec-encodable)."""

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state`` returned."""

    #: ``check_batch(batch)`` raises on a batch whose data does not fit the run, before it
    #: reaches the math.
    check_batch = Capability(nothing)
    #: ``env_spec() -> dict`` is the env spec every invocation carries (the algorithm adds what
    #: its actors need, e.g. gamma for reward normalisation); None passes the env section on.
    env_spec = Capability(nothing)
    #: Pipelined rounds may then ask for weights part-way through an update.
    supports_snapshots = Capability(False)


class ActorBackend(Lifecycle, Protocol):
    """Runs invocations. ``invoke`` is called once per actor per round, as concurrent tasks."""

    async def invoke(self, invocation: Invocation) -> Receipt:
        """Run one invocation and return its receipt, or raise ``InvocationFailed``."""

    #: ``async preflight()`` raises ``Unreachable`` within seconds when the platform cannot be
    #: reached.
    preflight = Capability(nothing_async)
    #: ``counters() -> dict`` of the backend's own counts (throttles, retries, ...).
    counters = Capability(no_counters)
    #: Account round time as N concurrent cloud functions (the local backend's simulate mode).
    simulate = Capability(False)
    #: ``simulated_actor_s(receipts, cold_starts=k) -> float | None``: the time a round's
    #: invocations take in the simulated cloud, ``k`` of them started cold.
    simulated_actor_s = Capability(nothing)


class Transport(Lifecycle, Protocol):
    """The learner's side of the data plane: weights out, batches in."""

    def public_spec(self) -> dict[str, Any]:
        """What an actor needs to reach this transport, with no secret in it."""

    async def publish_weights(self, version: int, payload: bytes) -> None: ...

    async def weights_payload(self, version: int) -> bytes | None:
        """The encoded weights of ``version``, if still held."""

    async def deliver(self, payload: bytes) -> None:
        """Accept a batch that a backend handed back itself (in-process transports)."""

    async def next_batch(self, timeout: float) -> tuple[str, bytes] | None:
        """The next (message id, payload), or None after ``timeout`` seconds."""

    async def ack(self, message_ids: Sequence[str]) -> None:
        """Mark batches as used, so a restarted learner does not read them again."""

    preflight = Capability(nothing_async)
    counters = Capability(no_counters)


@dataclass(slots=True)
class ProbeRun:
    """One probe's measurement in one round: ``seconds`` as measured, ``charged_s`` as billed
    (a time model bills the probes it knows by the work their ``values`` report)."""

    name: str
    seconds: float
    values: dict[str, float]
    #: The value that is the policy's score when the probe evaluates the policy (its time is
    #: measured, not charged to the training budget), else None.
    score: str | None = None
    #: Seconds the cost model charged for it, set when it charges the round (None: not yet,
    #: or a cost model that does not say, and ``seconds`` stands).
    charged_s: float | None = None

    @property
    def evaluation(self) -> bool:
        return self.score is not None


@dataclass(slots=True)
class RoundRecord:
    """The facts about one finished round that scalers, cost models and stop rules read."""

    round: int
    actors: int
    env_steps: int
    batches: int
    round_s: float
    learner_s: float
    probe_s: float
    actor_durations_ms: list[float]
    cold_starts: int
    eval_return: float | None
    episode_return_mean: float | None
    probes: dict[str, float]
    cost_usd: float = 0.0
    sim_time_s: float = 0.0
    #: Part of ``probe_s`` spent evaluating the policy (the probe marked ``evaluation``):
    #: measured and reported, but not charged to the training budget.
    eval_s: float = 0.0
    #: Each probe that ran this round, in plan order (``probe_s`` is their seconds' sum).
    probe_runs: list[ProbeRun] = field(default_factory=list)
    #: Pipelined rounds: the share of the previous round's update still to run when this
    #: round's fan-out started (its probes, evaluation aside, ran after that too); None when
    #: the fan-out started after the previous round had trained (sync, a decision waited on).
    #: Async rounds: 1 when every invocation the round charges was out as the previous update
    #: began, else None.
    head_start: float | None = None
    #: Simulated seconds of this round's sampling that ran while the previous round trained,
    #: left out of ``sim_time_s`` (the learner was billed for them in that round).
    overlap_s: float = 0.0
    #: Simulated cloud: functions this round started beyond the warm pool, and the pool after
    #: it (the most functions busy at once so far); kept here, so resumes keep the pool warm.
    sim_cold_starts: int = 0
    warm_pool: int = 0

    def overlapped_s(self, actor_s: float, previous_update_s: float,
                     previous_probe_s: float) -> float:
        """Seconds of this round's sampling (``actor_s``, simulated) that the previous round's
        training hid: a fan-out started part-way through that update samples while the rest of
        it and the probes after it run. The clock, and the learner's bill, count only what is
        left of the sampling after that; the invocations are billed in full either way."""
        if self.head_start is None:
            return 0.0
        hidden = self.head_start * max(0.0, previous_update_s) + max(0.0, previous_probe_s)
        return max(0.0, min(actor_s, hidden))

    @classmethod
    def from_plain(cls, raw: Mapping[str, Any]) -> RoundRecord:
        """A record from its checkpointed form, where probe runs are plain dicts (and absent
        from checkpoints written before they were kept)."""
        raw = dict(raw)
        raw["probe_runs"] = [ProbeRun(**p) for p in raw.get("probe_runs", [])]
        return cls(**raw)


@dataclass(slots=True)
class ScaleContext:
    """What a scaler may look at to choose the next round's actor count."""

    round: int
    current: int
    n_min: int
    n_max: int
    history: list[RoundRecord]
    budget_left_usd: float | None
    cost_per_actor_usd: float | None
    rng: np.random.Generator
    #: The largest actor count whose estimated round cost fits the budget left (None: no
    #: budget). The kernel applies it after ``decide``; scalers may read it to plan ahead.
    affordable: int | None = None


class Scaler(Lifecycle, Protocol):
    def decide(self, ctx: ScaleContext) -> int:
        """Actor count for the next round (the kernel clips it to [n_min, n_max])."""

    #: What the last decision was made of (scores, signals), for the ScaleDecided event.
    last_detail = Capability({})
    #: Reads the round's measurements (probes, returns): the next fan-out waits for its
    #: decision. A scaler that does not can be asked ahead, when an overlapped fan-out starts
    #: part-way through an update.
    adaptive = Capability(True)
    #: Names of the probes (as the plan's ``[[probes]]`` entries name them) whose values are
    #: all an adaptive scaler reads of a round. In a round where none of them runs, its
    #: decision cannot depend on the round, so the next fan-out may be asked ahead there, as
    #: for a scaler that is not adaptive (a Hessian probe every 4th round leaves 3 rounds in
    #: 4 free to overlap). None: anything of a round may matter, so every decision waits.
    reads_probes = Capability(None)


@dataclass(slots=True)
class ProbeContext:
    round: int
    learner: Any
    batches: Sequence[Batch]
    seed: int


class Probe(Lifecycle, Protocol):
    #: Measure every ``every`` rounds (1 = each round; None: as the plan's probe entry says).
    every = Capability(None)

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        """Runs in a worker thread. Return named scalars. A probe whose descriptor marks it
        ``evaluation`` names its score (``eval_return`` unless it says otherwise): that value
        feeds the summary's best/final eval return and the ``target_return`` stop rule."""


class CostModel(Lifecycle, Protocol):
    """Prices rounds. ``estimate_round_usd`` is the run's one estimate of what a round costs:
    the budget allocator sizes every round with it, so it must not be below what ``charge``
    will bill for the same round."""

    def charge(self, record: RoundRecord, receipts: Sequence[Receipt]) -> dict[str, float]:
        """Dollar charges of one round by item (``actors_usd``, ``learner_usd``, ...)."""

    def estimate_round_usd(self, record: RoundRecord, actors: int) -> float:
        """Expected cost of a round like ``record`` run with ``actors`` actors."""

    #: ``estimate_actor_usd(record) -> float | None``: expected cost of one more actor in a
    #: round like ``record`` (scalers read it to plan ahead).
    estimate_actor_usd = Capability(nothing)
    #: ``estimate_first_round_usd(actors) -> float | None``: the price of a first round,
    #: before anything was measured.
    estimate_first_round_usd = Capability(nothing)
    #: ``stall_usd(actors) -> float | None``: what a stall of the machine (a busy scheduler, a
    #: garbage-collector pause) would add to a round of ``actors`` actors, where the bill
    #: follows the clock; None or 0 where it does not (a time model prices the work done).
    stall_usd = Capability(nothing)
    #: ``modelled_timing() -> (actor_s, update_s) | None``: the slowest invocation and the
    #: update of the round charged last, where a time model sets the durations (None where the
    #: clock does): a pipelined fan-out's snapshot point is timed by them, as the modelled
    #: machines would time it, and a seeded run replays.
    modelled_timing = Capability(nothing)


class Sink(Lifecycle, Protocol):
    async def handle(self, event: Any) -> None: ...

    #: ``flush()`` writes what is buffered (at checkpoints and on stop).
    flush = Capability(nothing)


@dataclass(slots=True)
class PluginContext:
    """Handed to every plugin factory: its own config plus what the run knows."""

    name: str
    config: dict[str, Any]
    plan: dict[str, Any]
    run_id: str
    run_dir: Any  # pathlib.Path; Any keeps this module free of filesystem assumptions
    seed: int
    bus: Any
    transport: Any = None
