"""From invocation to accepted batch: the one path every round mode takes.

``Intake`` builds invocations, starts them as tasks, and turns what comes back through the
transport into batches the learner may train on. Everything that can go wrong between the two
is decided here, once for every mode: a payload that does not decode, a field out of range,
a duplicate, a batch of another run or of a version too old, an invocation that failed, a batch
that never arrives. Each is counted with its reason, and nothing in acceptance can raise out of
a round.

Sync rounds gather what they launch; overlapped ones what they launched earlier. One gather
loop, one rule for a lost batch: once every invocation has returned saying it pushed, a batch
still missing ``LOST_BATCH_GRACE_S`` later was lost on the way (a Redis restart, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from kernel import codec
from kernel import events as ev
from kernel.acceptance import check_envelope
from kernel.roles import Batch, Invocation, InvocationFailed, Receipt
from kernel.run_state import RunState

log = structlog.get_logger("kernel.intake")

#: How long to wait for batches whose actors have all returned saying they pushed.
LOST_BATCH_GRACE_S = 5.0


@dataclass
class Gathered:
    """What a gather brought: batches in request order, their message ids to acknowledge."""

    batches: list[Batch]
    message_ids: list[str]
    #: Batches dropped as too old (or not awaited) during this gather.
    stale: int = 0
    #: Env steps of this run's batches read during this gather, kept or dropped as stale.
    sampled_env_steps: int = 0

    @property
    def trained_fraction(self) -> float | None:
        """Share of the env steps read in this gather that go to the learner."""
        if self.sampled_env_steps <= 0:
            return None
        return sum(int(b["env_steps"]) for b in self.batches) / self.sampled_env_steps


class Intake:
    """Owns invocations in flight and the acceptance of their batches."""

    def __init__(self, plan: dict[str, Any], run_id: str, roles: Any, state: RunState,
                 publish: Callable[[ev.Event], None], stop_requested: asyncio.Event):
        self.plan = plan
        self.run_id = run_id
        self.roles = roles
        self.state = state
        self.publish = publish
        self.stop_requested = stop_requested
        #: Invocations in flight, with the monotonic time they started.
        self.tasks: dict[asyncio.Task[Receipt], tuple[Invocation, float]] = {}
        #: Request ids whose batch may still come (launched, not failed, not yet accepted),
        #: mapped to whether the platform only accepted the call (its actor reports later).
        self.pending: dict[str, bool] = {}
        #: The weights version each pending invocation was sent: a batch is that invocation's
        #: own only if it carries the same one (anyone who can write to the transport can
        #: forge a request id, and must not cost the round its honest batch).
        self._versions: dict[str, int] = {}
        #: Receipts of invocations finished since the last drain.
        self.receipts: list[Receipt] = []
        #: Seconds from launch to return of successful invocations since the last drain.
        self.sample_s: list[float] = []
        self.consecutive_failures = 0
        self.last_done = time.monotonic()
        self.closing = False
        #: Called with each finished invocation's success (async mode tops its fleet up).
        self.on_done: Callable[[bool], None] | None = None
        #: Called when a batch was read (kept or dropped): async mode launches the next then.
        self.on_settled: Callable[[], None] | None = None
        #: The share of sampled env steps the last gather handed to the learner.
        self.last_trained_fraction: float | None = None
        self._sampled_in_gather = 0
        self._inner: dict[str, Receipt] = {}
        self._indices: dict[int, int] = {}
        self.per_round = True
        #: The next index when they count across the run: a pipelined checkpoint keeps it.
        self.run_index = 1
        self._batch_task: asyncio.Task[tuple[str, bytes] | None] | None = None

    # -- invocations --------------------------------------------------------------------------

    def invocation(self, number: int, version: int, actor_spec: dict[str, Any]) -> Invocation:
        """The next invocation of round ``number``; its index (request id, seed) counts within
        the round, or across the run when ``per_round`` is off: seeded runs replay exactly."""
        if self.per_round:
            index = self._indices[number] = self._indices.get(number, -1) + 1
            if len(self._indices) > 8:  # only the last few rounds can still launch
                del self._indices[min(self._indices)]
        else:
            index, self.run_index = self.run_index, self.run_index + 1
        request_id = f"{self.run_id}-r{number}-v{version}-a{index}"
        seed = zlib.crc32(f"{self.plan['run']['seed']}:{number}:{index}".encode())
        event = {"run_id": self.run_id, "request_id": request_id, "version": version,
                 "round": number, "seed": seed, "steps": self.plan["actors"]["steps"],
                 "env": self.roles.env_spec, "algo": actor_spec,
                 "transport": self.roles.transport.public_spec()}
        ckpt = self.plan["checkpoint"]
        if ckpt["exact_resume"]:  # actors' warm envs restart with each periodic checkpoint
            event["episode_epoch"] = (number - 1) // ckpt["every"]
        return Invocation(request_id=request_id, version=version, round=number, event=event,
                          index=index)

    def launch(self, number: int, version: int, count: int, actor_spec: dict[str, Any]) -> int:
        """Start ``count`` invocations for round ``number`` with weights ``version``."""
        started = 0
        for _ in range(max(0, count)):
            if self.closing:
                break
            inv = self.invocation(number, version, actor_spec)
            task = asyncio.create_task(self._invoke(inv), name=inv.request_id)
            self.tasks[task] = (inv, time.monotonic())
            self.pending[inv.request_id] = False
            self._versions[inv.request_id] = version
            self.state.counters.invocations += 1
            task.add_done_callback(self._done)
            started += 1
        return started

    async def _invoke(self, invocation: Invocation) -> Receipt:
        counters = self.state.counters
        try:
            receipt = await self.roles.actors.invoke(invocation)
        except InvocationFailed as exc:
            receipt = exc.receipt
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a backend bug must not take the round down with it
            log.exception("invoke_crashed", request_id=invocation.request_id)
            receipt = Receipt(request_id=invocation.request_id, ok=False,
                              error=f"{type(exc).__name__}: {exc}")
        counters.throttles += receipt.throttles
        counters.retries += max(0, receipt.attempts - 1)
        counters.cold_starts += int(receipt.cold_start)
        if not receipt.ok:
            counters.invocation_errors += 1
        if receipt.payload is not None:
            await self.roles.transport.deliver(receipt.payload)
        self.publish(ev.InvocationFinished(round=invocation.round, receipt=receipt))
        return receipt

    def _done(self, task: asyncio.Task[Receipt]) -> None:
        if (entry := self.tasks.pop(task, None)) is None:  # cancel() settled it already
            return
        self.last_done = time.monotonic()
        if task.cancelled():
            return
        inv, started = entry
        exc = task.exception()
        receipt = task.result() if exc is None else Receipt(
            request_id=inv.request_id, ok=False, error=f"{type(exc).__name__}: {exc}")
        self.receipts.append(receipt)
        if receipt.ok:
            self.consecutive_failures = 0
            self.sample_s.append(self.last_done - started)
            if inv.request_id in self.pending:
                self.pending[inv.request_id] = receipt.accepted_only
        else:
            self.pending.pop(inv.request_id, None)
            self._versions.pop(inv.request_id, None)
            self.consecutive_failures += 1
        if self.on_done is not None and not self.closing:
            self.on_done(receipt.ok)

    async def cancel(self, request_ids: set[str] | None = None) -> list[Receipt]:
        """Give up on invocations in flight (all, or those of ``request_ids``). On AWS they
        run on and are billed, so each gets a receipt marked ``cancelled`` for the cost model.
        A task finished but not yet settled (done-callbacks run a loop turn later) keeps its
        own receipt, never a second, cancelled one that would bill it twice."""
        for task in [t for t in self.tasks if t.done()]:
            self._done(task)
        now = time.monotonic()
        chosen = [(t, inv, t0) for t, (inv, t0) in self.tasks.items()
                  if request_ids is None or inv.request_id in request_ids]
        for task, _, _ in chosen:
            task.cancel()
        await asyncio.gather(*(t for t, _, _ in chosen), return_exceptions=True)
        receipts = []  # a task that finished before its cancel landed was settled by _done
        for _, inv, started in [c for c in chosen if c[0].cancelled()]:
            self.pending.pop(inv.request_id, None)
            self._versions.pop(inv.request_id, None)
            receipt = Receipt(request_id=inv.request_id, ok=False, version=inv.version,
                              duration_ms=(now - started) * 1000, error="cancelled", cancelled=True)
            receipts.append(receipt)
            self.publish(ev.InvocationFinished(round=inv.round, receipt=receipt))
        self.state.counters.invocations_cancelled += len(receipts)
        return receipts

    def drain(self) -> tuple[list[Receipt], list[float]]:
        """Receipts and sampling times of the invocations finished since the last drain."""
        out = self.receipts, self.sample_s
        self.receipts, self.sample_s = [], []
        return out

    # -- gathering ----------------------------------------------------------------------------

    async def gather(self, number: int, version: int, wanted: int, *, max_lag: int,
                     refill: Callable[[int], int] | None = None) -> Gathered | None:
        """Accept batches until ``wanted`` are in, the deadline passes, or nothing more can
        come; None when a stop request interrupts.

        ``refill(missing)`` starts new invocations when nothing is in flight and no batch is on
        its way (overlapped rounds); without it the gather ends there (sync rounds go on with
        what arrived)."""
        batches: dict[str, Batch] = {}
        message_ids: list[str] = []
        t0 = time.monotonic()
        deadline = t0 + self.plan["actors"]["deadline_s"]
        errors_before = self.state.counters.invocation_errors
        stale_before = self.state.counters.stale_batches
        self._sampled_in_gather = 0
        self.consecutive_failures = 0
        stop_wait = asyncio.create_task(self.stop_requested.wait())
        try:
            while len(batches) < wanted:
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0:
                    log.warning("gather_deadline", round=number, received=len(batches),
                                wanted=wanted)
                    break
                if not self.tasks:
                    remaining = min(remaining, self._expire_lost(number, now))
                    if not self.pending:
                        if refill is None or self.closing or \
                                self.consecutive_failures >= max(4, 2 * wanted):
                            if self.consecutive_failures:
                                log.warning("actors_failing", round=number,
                                            failures=self.consecutive_failures)
                            break
                        if refill(wanted - len(batches)) == 0:
                            break
                        continue
                if self._batch_task is None:
                    self._batch_task = asyncio.create_task(
                        self.roles.transport.next_batch(timeout=min(max(remaining, 0.01), 1.0)))
                done, _ = await asyncio.wait({self._batch_task, stop_wait, *self.tasks},
                                             timeout=max(remaining, 0.0),
                                             return_when=asyncio.FIRST_COMPLETED)
                if stop_wait in done:
                    return None
                if self._batch_task in done:
                    task, self._batch_task = self._batch_task, None
                    message = task.result()
                    if message is not None:
                        await self.accept(number, version, message, batches, message_ids,
                                          max_lag=max_lag)
        finally:
            stop_wait.cancel()
        failures = self.state.counters.invocation_errors - errors_before
        if refill is None and len(batches) < math.ceil(
                self.plan["actors"]["min_fraction"] * wanted):
            log.warning("round_below_min_fraction", round=number, received=len(batches),
                        expected=wanted)
        self.publish(ev.GatherFinished(
            round=number, expected=wanted, received=len(batches), failed=failures,
            timed_out=sum(1 for inv, _ in self.tasks.values() if inv.round == number),
            gather_s=time.monotonic() - t0))
        gathered = Gathered([batches[rid] for rid in sorted(batches)], message_ids,
                            stale=self.state.counters.stale_batches - stale_before,
                            sampled_env_steps=self._sampled_in_gather)
        self.state.counters.trained_env_steps += sum(int(b["env_steps"]) for b in gathered.batches)
        self.last_trained_fraction = gathered.trained_fraction
        return gathered

    def _expire_lost(self, number: int, now: float) -> float:
        """With nothing in flight: once the grace after the last return is over, batches still
        missing are lost. Returns how long the gather may still wait for them."""
        if not self.pending or any(self.pending.values()):
            return math.inf  # Event-mode actors report through their batch: wait for it
        left = self.last_done + LOST_BATCH_GRACE_S - now
        if left > 0:
            return left
        self.state.counters.lost_batches += len(self.pending)
        log.warning("batches_lost", round=number, lost=len(self.pending))
        self.pending.clear()
        self._versions.clear()
        return math.inf

    async def settle(self, gathered: Gathered, wait_s: float = 5.0) -> list[Receipt]:
        """After a sync gather: let invocations whose batches are in return (an actor pushes,
        then replies), cancel the rest, and return the round's receipts — the actor's own
        receipt from inside its batch where the platform's reply never said more."""
        arrived = {b["request_id"] for b in gathered.batches}
        answering = [t for t, (inv, _) in self.tasks.items() if inv.request_id in arrived]
        if answering and not self.stop_requested.is_set():
            await asyncio.wait(answering, timeout=wait_s)
        cancelled = await self.cancel()
        timed_out = [r.request_id for r in cancelled if r.request_id not in arrived]
        self.state.counters.invocation_timeouts += len(timed_out)
        return self.receipts_for(arrived, self.drain()[0] + cancelled)

    def receipts_for(self, arrived: set[str], receipts: list[Receipt]) -> list[Receipt]:
        """Replace the platform's bare receipt of an arrived batch (Event mode's 202, or a
        reply given up on) by the actor's own, which rode inside the batch."""
        out, used = [], []
        for receipt in receipts:
            inner = self._inner.pop(receipt.request_id, None)
            if inner is not None and (receipt.accepted_only or receipt.cancelled):
                used.append(inner)
                receipt = dataclasses.replace(inner, attempts=receipt.attempts,
                                              throttles=receipt.throttles)
            out.append(receipt)
        known = {r.request_id for r in out}  # the rest: the batch came, the reply never did
        late = [inner for rid in arrived - known if (inner := self._inner.pop(rid, None))]
        self.state.counters.cold_starts += sum(int(r.cold_start) for r in used + late)
        return out + late

    # -- acceptance ---------------------------------------------------------------------------

    async def accept(self, number: int, version: int, message: tuple[str, bytes],
                     batches: dict[str, Batch], message_ids: list[str], *,
                     max_lag: int) -> None:
        """Decode and check one batch; keep it, or drop/reject it with a counted reason.

        A batch sampled more than ``max_lag`` versions before ``version`` is stale, and so is
        one of another run or of an invocation this intake is not waiting for. The message is
        acknowledged in every case: a bad payload never improves."""
        s = self.state
        message_id, payload = message
        message_ids.append(message_id)
        try:
            # Decoding a large batch takes milliseconds: off the loop, so probes, sinks and
            # other invocations keep being served meanwhile.
            body = await asyncio.to_thread(codec.decode, payload, kind="batch")
            rid, got_version, inner = check_envelope(body)
            self.roles.learner.check_batch(body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # anything a forged payload can provoke is a rejection
            reason = getattr(exc, "reason", None) or "invalid_batch"
            s.counters.reject(reason)
            detail = f"{type(exc).__name__}: {exc}"[:200]
            log.warning("payload_rejected", round=number, reason=reason, detail=detail)
            self.publish(ev.PayloadRejected(round=number, reason=reason, detail=detail))
            return
        if rid in s.seen_requests or rid in batches:
            s.counters.duplicate_batches += 1
            self.publish(ev.BatchDropped(round=number, request_id=rid, version=got_version,
                                         reason="duplicate"))
            return
        if body["run_id"] == self.run_id:
            s.counters.sampled_env_steps += int(body["env_steps"])
            self._sampled_in_gather += int(body["env_steps"])
        own = body["run_id"] == self.run_id and self._versions.get(rid) == got_version
        if not own or rid not in self.pending or not version - max_lag <= got_version <= version:
            s.counters.stale_batches += 1
            if own:  # too old, but it is that invocation's batch: nothing more will come
                self._settle(rid)
            self.publish(ev.BatchDropped(round=number, request_id=rid, version=got_version,
                                         reason="stale"))
            return
        s.seen_requests.add(rid)
        batches[rid] = body
        self._inner[rid] = inner
        self._settle(rid)
        self.publish(ev.BatchArrived(round=number, request_id=rid, version=got_version,
                                     env_steps=int(body["env_steps"]), bytes=len(payload)))

    def _settle(self, rid: str) -> None:
        """The batch of ``rid`` was read: its invocation is no longer outstanding."""
        self._versions.pop(rid, None)
        if self.pending.pop(rid, None) is not None and self.on_settled is not None \
                and not self.closing:
            self.on_settled()

    async def close(self) -> list[Receipt]:
        """Cancel what is still in flight (billed as cancelled) and the pending transport read;
        the receipts to charge: the cancelled ones, and those of invocations that finished
        after the last round took its receipts (a fan-out started ahead of a round that never
        ran), which AWS billed as any other."""
        self.closing = True
        cancelled = await self.cancel()
        receipts = self.receipts_for(set(), self.drain()[0] + cancelled)
        if self._batch_task is not None:
            self._batch_task.cancel()
            with contextlib.suppress(BaseException):
                await self._batch_task
            self._batch_task = None
        return receipts
