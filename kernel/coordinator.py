"""The synchronous round protocol of DESIGN.md, steps 1-10, as one readable method.

The coordinator awaits the roles it needs in order (publish weights, invoke actors, gather
batches, update the learner, measure, charge, scale); the bus only reports what happened.
Every wait has a deadline: a round goes on without actors that fail or are late.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from kernel import codec
from kernel import events as ev
from kernel.roles import (
    Batch,
    Invocation,
    InvocationFailed,
    ProbeContext,
    Receipt,
    RoundRecord,
    ScaleContext,
    SnapshotRequest,
    Weights,
)

log = structlog.get_logger("kernel.coordinator")

#: How long to wait for batches whose actors have all returned successfully.
LOST_BATCH_GRACE_S = 5.0


class PluginCrashed(Exception):
    """A plugin raised where the run cannot go on; names the plugin."""

    def __init__(self, kind: str, name: str, error: BaseException):
        super().__init__(f"{kind} plugin {name!r} failed: {type(error).__name__}: {error}")
        self.kind = kind
        self.name = name
        self.error = error


@contextlib.contextmanager
def blame(kind: str, name: str) -> Iterator[None]:
    try:
        yield
    except (PluginCrashed, asyncio.CancelledError):
        raise
    except Exception as exc:
        raise PluginCrashed(kind, name, exc) from exc


@dataclass
class Counters:
    invocations: int = 0
    invocation_errors: int = 0
    invocation_timeouts: int = 0
    throttles: int = 0
    retries: int = 0
    cold_starts: int = 0
    rejected_payloads: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    stale_batches: int = 0
    duplicate_batches: int = 0
    empty_rounds: int = 0
    lost_batches: int = 0


@dataclass
class RunState:
    """Everything that continues across rounds (and across a resume)."""

    round: int = 0
    version: int = 0
    env_steps: int = 0
    actors_next: int = 1
    cost_usd: float = 0.0
    sim_time_s: float = 0.0
    best_eval_return: float | None = None
    final_eval_return: float | None = None
    actors_per_round: list[int] = field(default_factory=list)
    history: list[RoundRecord] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    seen_requests: set[str] = field(default_factory=set)


@dataclass
class Roles:
    learner: Any
    actors: Any
    transport: Any
    scaler: Any
    cost: Any
    probes: list[tuple[str, Any]]
    names: dict[str, str]


class Coordinator:
    def __init__(
        self,
        plan: dict[str, Any],
        run_id: str,
        roles: Roles,
        state: RunState,
        publish: Callable[[ev.Event], None],
        stop_requested: asyncio.Event,
        rng: np.random.Generator,
    ):
        self.plan = plan
        self.run_id = run_id
        self.roles = roles
        self.state = state
        self.publish = publish
        self.stop_requested = stop_requested
        self.rng = rng
        self._batch_task: asyncio.Task[tuple[str, bytes] | None] | None = None
        self._env_spec = {
            **{k: plan["env"][k] for k in plan["env"] if k != "provider"},
            "gamma": float(plan["algo"].get("gamma", 0.99)),
        }

    # -- one round ---------------------------------------------------------------------------

    async def run_round(self) -> RoundRecord | None:
        """Run one round; return its record, or None if a stop request cut it short."""
        s, actors_cfg = self.state, self.plan["actors"]
        t_round = time.perf_counter()
        number, n = s.round + 1, s.actors_next
        self.publish(ev.RoundStarted(round=number, actors=n, version=s.version + 1))

        # 2. Weights (and normalisation statistics) encoded once, published under a new version.
        version = await self.publish_weights(number)

        # 3-5. Fan out N invocations, gather their batches until N, or by the deadline.
        actor_spec = self.actor_spec()
        invocations = [self._invocation(number, version, i, actor_spec) for i in range(n)]
        t_actors = time.perf_counter()
        gathered = await self._gather(number, version, invocations, actors_cfg["deadline_s"])
        if gathered is None:
            return None
        batches, receipts, message_ids = gathered
        actor_s = time.perf_counter() - t_actors

        # 6. Learner update in a worker thread: the loop keeps serving observers meanwhile.
        metrics, learner_s = await self.update(number, version, batches, message_ids)
        # 7-10. Probes, cost, scaler, the round's facts.
        return await self.finish_round(
            number, n, batches, receipts, metrics, t_round=t_round, actor_s=actor_s,
            learner_s=learner_s, actor_idle_s=n * learner_s,
        )

    def actor_spec(self) -> dict[str, Any]:
        with blame("algo", self.roles.names["algo"]):
            return self.roles.learner.actor_spec()

    async def publish_weights(self, number: int, weights: Weights | None = None) -> int:
        """Encode the learner's weights (or a snapshot of them) under the next version."""
        s, roles = self.state, self.roles
        version = s.version + 1
        if weights is None:
            with blame("algo", roles.names["algo"]):
                weights = await asyncio.to_thread(roles.learner.weights)
        t0 = time.perf_counter()
        payload = await asyncio.to_thread(
            codec.encode, "weights", {"version": version, "weights": weights}
        )
        encode_ms = (time.perf_counter() - t0) * 1000
        with blame("transport", roles.names["transport"]):
            await roles.transport.publish_weights(version, payload)
        s.version = version
        self.publish(
            ev.WeightsPublished(round=number, version=version, bytes=len(payload),
                                encode_ms=encode_ms)
        )
        return version

    async def update(self, number: int, version: int, batches: list[Batch],
                     message_ids: list[str], snapshot: SnapshotRequest | None = None,
                     ) -> tuple[dict[str, float], float]:
        s, roles = self.state, self.roles
        if not batches:
            s.counters.empty_rounds += 1
            log.warning("round_without_batches", round=number)
            # Rejected or stale entries of this round are done with: never re-read them.
            with blame("transport", roles.names["transport"]):
                await roles.transport.ack(message_ids)
            return {}, 0.0
        t0 = time.perf_counter()
        with blame("algo", roles.names["algo"]):
            if snapshot is not None:
                metrics = await asyncio.to_thread(roles.learner.update, batches,
                                                  snapshot=snapshot)
            else:
                metrics = await asyncio.to_thread(roles.learner.update, batches)
        learner_s = time.perf_counter() - t0
        # Acknowledged only now: a learner that dies mid-update re-reads these batches.
        with blame("transport", roles.names["transport"]):
            await roles.transport.ack(message_ids)
        s.env_steps += sum(int(b["env_steps"]) for b in batches)
        s.counters.empty_rounds = 0
        self.publish(ev.LearnerUpdated(round=number, version=version, learner_s=learner_s,
                                       metrics=_finite(metrics)))
        return metrics, learner_s

    async def finish_round(
        self,
        number: int,
        n: int,
        batches: list[Batch],
        receipts: list[Receipt],
        metrics: dict[str, float],
        *,
        t_round: float,
        actor_s: float,
        learner_s: float,
        actor_idle_s: float,
    ) -> RoundRecord:
        s, roles = self.state, self.roles
        # 7. Probes measure the updated policy.
        probe_values, probe_s = await self._probe(number, batches)

        round_steps = sum(int(b["env_steps"]) for b in batches)
        episodes = np.concatenate(
            [np.asarray(b["episode_returns"], dtype=np.float64) for b in batches]
        ) if batches else np.zeros(0)
        eval_return = probe_values.get("eval_return")
        record = RoundRecord(
            round=number,
            actors=n,
            env_steps=round_steps,
            batches=len(batches),
            round_s=time.perf_counter() - t_round,
            learner_s=learner_s,
            probe_s=probe_s,
            actor_durations_ms=[r.duration_ms for r in receipts if r.ok],
            cold_starts=sum(r.cold_start for r in receipts),
            eval_return=eval_return,
            episode_return_mean=float(episodes.mean()) if episodes.size else None,
            probes=probe_values,
        )
        if getattr(roles.actors, "simulate", False):
            record.sim_time_s = roles.actors.simulated_actor_s(receipts) + learner_s + probe_s
        else:
            record.sim_time_s = record.round_s

        # 8. Cost of the round's invocations and learner time.
        with blame("cost", roles.names["cost"]):
            items = roles.cost.charge(record, receipts)
        record.cost_usd = float(sum(items.values()))
        s.cost_usd += record.cost_usd
        self.publish(ev.CostCharged(round=number, items=items, round_usd=record.cost_usd,
                                    total_usd=s.cost_usd))

        s.round = number
        s.sim_time_s += record.sim_time_s
        s.actors_per_round.append(n)
        s.history.append(record)
        if eval_return is not None:
            s.final_eval_return = eval_return
            if s.best_eval_return is None or eval_return > s.best_eval_return:
                s.best_eval_return = eval_return

        # 9. The scaler picks the next round's N from the history and the budget left.
        s.actors_next = self._scale(record)
        self.publish(
            ev.RoundFinished(
                round=number, actors=n, batches=len(batches), env_steps=s.env_steps,
                round_env_steps=round_steps, episodes=int(episodes.size),
                episode_return_mean=record.episode_return_mean, eval_return=eval_return,
                round_s=record.round_s, actor_s=actor_s, learner_s=learner_s, probe_s=probe_s,
                wall_s=0.0, cost_usd=s.cost_usd, sim_time_s=s.sim_time_s,
                learner_busy=learner_s / record.round_s if record.round_s > 0 else 0.0,
                actor_idle_s=actor_idle_s,
                probes=_finite(probe_values), metrics=_finite(metrics),
            )
        )
        return record

    def _invocation(self, number: int, version: int, index: int, actor_spec: dict[str, Any]
                    ) -> Invocation:
        request_id = f"{self.run_id}-r{number}-v{version}-a{index}"
        seed = zlib.crc32(f"{self.plan['run']['seed']}:{number}:{index}".encode())
        event = {
            "run_id": self.run_id,
            "request_id": request_id,
            "version": version,
            "round": number,
            "seed": seed,
            "steps": self.plan["actors"]["steps"],
            "env": self._env_spec,
            "algo": actor_spec,
            "transport": self.roles.transport.public_spec(),
        }
        return Invocation(request_id=request_id, version=version, round=number, event=event)

    # -- gathering ---------------------------------------------------------------------------

    async def _gather(
        self, number: int, version: int, invocations: Sequence[Invocation], deadline_s: float
    ) -> tuple[list[Batch], list[Receipt], list[str]] | None:
        s, roles = self.state, self.roles
        n = len(invocations)
        expected = {inv.request_id for inv in invocations}
        batches: dict[str, Batch] = {}
        message_ids: list[str] = []
        receipts: dict[str, Receipt] = {}
        failed: set[str] = set()
        deadline = time.monotonic() + deadline_s
        t0 = time.perf_counter()
        tasks = {
            asyncio.create_task(self._invoke(inv), name=inv.request_id): inv.request_id
            for inv in invocations
        }
        s.counters.invocations += n
        stop_wait = asyncio.create_task(self.stop_requested.wait())
        interrupted = False
        grace_until: float | None = None
        try:
            while len(batches) + len(failed - batches.keys()) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if not tasks and grace_until is None and all(
                    not r.accepted_only for r in receipts.values()
                ):
                    # Every actor said it pushed; a batch still missing after a short grace
                    # was lost on the way (e.g. Redis restarted): do not wait for the deadline.
                    grace_until = time.monotonic() + LOST_BATCH_GRACE_S
                if grace_until is not None:
                    remaining = min(remaining, grace_until - time.monotonic())
                    if remaining <= 0:
                        lost = n - len(batches) - len(failed - batches.keys())
                        s.counters.lost_batches += lost
                        log.warning("batches_lost", round=number, lost=lost)
                        break
                if self._batch_task is None:
                    self._batch_task = asyncio.create_task(
                        roles.transport.next_batch(timeout=min(remaining, 1.0))
                    )
                waiting: set[asyncio.Future[Any]] = {self._batch_task, stop_wait, *tasks}
                done, _ = await asyncio.wait(
                    waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if stop_wait in done:
                    interrupted = True
                    break
                for task in [t for t in done if t in tasks]:
                    rid = tasks.pop(task)
                    receipt = task.result()
                    receipts[rid] = receipt
                    if not receipt.ok:
                        failed.add(rid)
                if self._batch_task in done:
                    task, self._batch_task = self._batch_task, None
                    with blame("transport", roles.names["transport"]):
                        message = task.result()
                    if message is not None:
                        self._accept(number, version, message, expected, batches, message_ids)
            # A batch can land before its invocation returns (actors push, then reply): give
            # those replies a moment so their receipts (durations, cost) are not lost.
            answered = [t for t, rid in tasks.items() if rid in batches]
            if answered and not interrupted:
                await asyncio.wait(answered, timeout=max(0.0, min(5.0, deadline - time.monotonic())))
                for task in [t for t in answered if t.done()]:
                    rid = tasks.pop(task)
                    receipts[rid] = task.result()
        finally:
            stop_wait.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for rid, body in batches.items():
            sent = receipts.get(rid)
            if sent is None or sent.accepted_only:
                # The actor's own receipt (duration, cold start) rode inside its batch.
                inner = _receipt_from_batch(rid, body)
                if sent is not None:
                    inner = dataclasses.replace(inner, attempts=sent.attempts,
                                                throttles=sent.throttles)
                s.counters.cold_starts += int(inner.cold_start)
                receipts[rid] = inner
        timed_out = [rid for rid in tasks.values() if rid not in batches]
        s.counters.invocation_timeouts += len(timed_out)
        for rid in timed_out:
            self.publish(ev.InvocationFinished(round=number, request_id=rid, ok=False,
                                               error="deadline"))
        self.publish(
            ev.GatherFinished(round=number, expected=n, received=len(batches),
                              failed=len(failed - batches.keys()), timed_out=len(timed_out),
                              gather_s=time.perf_counter() - t0)
        )
        if interrupted:
            return None
        if len(batches) < math.ceil(self.plan["actors"]["min_fraction"] * n):
            log.warning("round_below_min_fraction", round=number, received=len(batches),
                        expected=n)
        return in_request_order(batches), list(receipts.values()), message_ids

    async def _invoke(self, invocation: Invocation) -> Receipt:
        s, roles = self.state, self.roles
        try:
            receipt = await roles.actors.invoke(invocation)
        except InvocationFailed as exc:
            receipt = Receipt(request_id=invocation.request_id, ok=False, error=exc.reason,
                              attempts=exc.attempts, throttles=exc.throttles)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a backend bug must not take the round down with it
            log.exception("invoke_crashed", request_id=invocation.request_id)
            receipt = Receipt(request_id=invocation.request_id, ok=False,
                              error=f"{type(exc).__name__}: {exc}")
        s.counters.throttles += receipt.throttles
        s.counters.retries += max(0, receipt.attempts - 1)
        s.counters.cold_starts += int(receipt.cold_start)
        if not receipt.ok:
            s.counters.invocation_errors += 1
        if receipt.payload is not None:
            with blame("transport", roles.names["transport"]):
                await roles.transport.deliver(receipt.payload)
        self.publish(
            ev.InvocationFinished(
                round=invocation.round, request_id=receipt.request_id, ok=receipt.ok,
                env_steps=receipt.env_steps, episodes=receipt.episodes,
                duration_ms=receipt.duration_ms, billed_ms=receipt.billed_ms,
                cold_start=receipt.cold_start, attempts=receipt.attempts,
                throttles=receipt.throttles, error=receipt.error,
            )
        )
        return receipt

    def _accept(
        self,
        number: int,
        version: int,
        message: tuple[str, bytes],
        expected: set[str],
        batches: dict[str, Batch],
        message_ids: list[str],
        max_lag: int = 0,
    ) -> str | None:
        """Decode and check one batch; keep it, or drop/reject it with a counted reason.

        A batch sampled more than ``max_lag`` versions ago is stale (sync rounds: 0). Returns
        the batch's request id once it could be read (kept or dropped), else None."""
        s = self.state
        message_id, payload = message
        message_ids.append(message_id)  # acknowledged either way: a bad payload never improves
        try:
            body = codec.decode(payload, kind="batch")
            rid = codec.require(body, "request_id", str)
            got_version = codec.require(body, "version", int)
            codec.require(body, "env_steps", int)
            codec.require(body, "episode_returns", np.ndarray)
            codec.require(body, "run_id", str)
            check = getattr(self.roles.learner, "check_batch", None)
            if check is not None:
                check(body)
        except (codec.CodecError, ValueError, KeyError, TypeError) as exc:
            reason = exc.reason if isinstance(exc, codec.CodecError) else "invalid_batch"
            s.counters.rejected_payloads += 1
            s.counters.rejected_reasons[reason] = s.counters.rejected_reasons.get(reason, 0) + 1
            log.warning("payload_rejected", round=number, reason=reason, detail=str(exc)[:200])
            self.publish(ev.PayloadRejected(round=number, reason=reason, detail=str(exc)[:200]))
            return None
        if rid in s.seen_requests or rid in batches:
            s.counters.duplicate_batches += 1
            self.publish(ev.BatchDropped(round=number, request_id=rid, version=got_version,
                                         reason="duplicate"))
            return rid
        if not version - max_lag <= got_version <= version or rid not in expected or \
                body["run_id"] != self.run_id:
            s.counters.stale_batches += 1
            self.publish(ev.BatchDropped(round=number, request_id=rid, version=got_version,
                                         reason="stale"))
            return rid
        s.seen_requests.add(rid)
        batches[rid] = body
        self.publish(ev.BatchArrived(round=number, request_id=rid, version=got_version,
                                     env_steps=int(body["env_steps"]), bytes=len(payload)))
        return rid

    # -- probes and scaling ------------------------------------------------------------------

    async def _probe(self, number: int, batches: list[Batch]) -> tuple[dict[str, float], float]:
        values: dict[str, float] = {}
        total = 0.0
        ctx = ProbeContext(round=number, learner=self.roles.learner, batches=batches,
                           seed=self.plan["run"]["seed"] + number)
        for name, probe in self.roles.probes:
            if number % max(1, getattr(probe, "every", 1)) != 0 or (not batches and
                                                                     name != "eval"):
                continue
            t0 = time.perf_counter()
            with blame("probe", name):
                measured = await asyncio.to_thread(probe.measure, ctx)
            probe_s = time.perf_counter() - t0
            total += probe_s
            values.update(measured)
            self.publish(ev.ProbeMeasured(round=number, probe=name, probe_s=probe_s,
                                          values=_finite(measured)))
        return values, total

    def _scale(self, record: RoundRecord) -> int:
        s, actors_cfg = self.state, self.plan["actors"]
        n_min, n_max = actors_cfg["min"], actors_cfg["max"]
        per_actor = self.roles.cost.estimate_actor_usd(record)
        budget = self.plan["stop"]["budget_usd"]
        budget_left = None if budget is None else budget - s.cost_usd
        ctx = ScaleContext(
            round=record.round, current=record.actors, n_min=n_min, n_max=n_max,
            history=s.history, budget_left_usd=budget_left, cost_per_actor_usd=per_actor,
            rng=self.rng,
        )
        with blame("scaler", self.roles.names["scaler"]):
            wanted = int(self.roles.scaler.decide(ctx))
        chosen = max(n_min, min(n_max, wanted))
        self.publish(ev.ScaleDecided(round=record.round, previous=record.actors, actors=chosen,
                                     scaler=self.roles.names["scaler"],
                                     detail=_finite(getattr(self.roles.scaler, "last_detail", {}))))
        return chosen

    def can_afford_next_round(self) -> bool:
        """Budget rule: stop before a round whose expected cost exceeds what is left."""
        budget = self.plan["stop"]["budget_usd"]
        return budget is None or self.state.cost_usd + self._next_round_usd() <= budget

    def _next_round_usd(self) -> float:
        """The cost model's estimate of a round of ``actors_next`` actors."""
        if not self.state.history:
            # Nothing measured yet: a cost model may still know a first round's price.
            first = getattr(self.roles.cost, "estimate_first_round_usd", None)
            return (first(self.state.actors_next) if callable(first) else 0.0) or 0.0
        return self.roles.cost.estimate_round_usd(self.state.history[-1], self.state.actors_next)

    def another_round_due(self, pending_env_steps: int) -> bool:
        """Whether a round after the current one fits the plan's limits, counting the current
        round's gathered but untrained steps and its uncharged cost.

        Pipelined rounds launch the next fan-out before the current update; without this check
        the last round would pay for invocations that are never trained on, and a budget would
        be overspent. Wall time and the target return cannot be foreseen: at most one fan-out
        is cancelled when they stop the run.
        """
        limits, s = self.plan["stop"], self.state
        if limits["max_rounds"] is not None and s.round + 1 >= limits["max_rounds"]:
            return False
        if limits["max_env_steps"] is not None and \
                s.env_steps + pending_env_steps >= limits["max_env_steps"]:
            return False
        budget = limits["budget_usd"]
        return budget is None or s.cost_usd + 2 * self._next_round_usd() <= budget

    async def close(self) -> None:
        if self._batch_task is not None:
            self._batch_task.cancel()
            with contextlib.suppress(BaseException):
                await self._batch_task
            self._batch_task = None


def in_request_order(batches: dict[str, Batch]) -> list[Batch]:
    """The round's batches by request id, not by arrival: the learner concatenates them, and
    arrival order would change the update of a seeded run from one replay to the next."""
    return [batches[rid] for rid in sorted(batches)]


def _receipt_from_batch(request_id: str, body: Batch) -> Receipt:
    """The receipt that travels inside a batch (when the invoke reply itself never came)."""
    meta = body.get("receipt") if isinstance(body.get("receipt"), dict) else {}
    return Receipt(
        request_id=request_id, ok=True, version=int(body.get("version", -1)),
        env_steps=int(body.get("env_steps", 0)), episodes=int(meta.get("episodes", 0)),
        duration_ms=float(meta.get("duration_ms", 0.0)), billed_ms=int(meta.get("billed_ms", 0)),
        cold_start=bool(meta.get("cold_start", False)),
        bytes_pushed=int(meta.get("bytes_pushed", 0)),
    )


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe scalars: NaN and infinities become None rather than invalid JSON."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, (float, np.floating)):
            value = float(value)
            out[key] = value if math.isfinite(value) else None
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            out[key] = int(value)
        else:
            out[key] = value
    return out
