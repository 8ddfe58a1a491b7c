"""The ``local`` actor backend: a warm process pool that behaves like a serverless platform.

Each invocation is stateless from the caller's side; a warm worker keeps its env and policy
between invocations; cold starts are counted; each invocation's duration is measured. With
``simulate = true`` the run's clock and bill are those of N concurrent cloud functions:
``simulated_actor_s`` is the invocation latency plus the slowest actor, plus a cold start when
the round started any function cold. Which did is the kernel's count
(``RoundRecord.sim_cold_starts``, from the warm pool it keeps with the run's history), so the
clock and the bill read one count and a resumed run's simulated cloud is as warm as it was.

Invocations are pinned to workers by their index in the round (``index % workers``): a warm
worker's envs are mid-episode, so letting whichever worker frees first take the next call
would make a round of more actors than workers continue different episodes from run to run.
Pinned, a seeded run replays exactly at any actor count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import structlog

from kernel.roles import Invocation, InvocationFailed, PluginContext, Receipt, Unreachable
from kernel.schema import defaults
from plugins.actors.workers import HandlerError, WorkerFailed, WorkerPool, default_worker_count
from plugins.descriptors.core import LOCAL_CONFIG
from plugins.function.actor_contract import (
    ENV_MODULES_VAR,
    REFUSED_ERROR,
    plan_env_modules,
    refusal_reason,
)

log = structlog.get_logger("plugins.actors.local")

HANDLER = "plugins.function.handler:handler"
#: Modules the forkserver imports once, so a new worker costs a fork, not a torch import.
PRELOAD = ("numpy", "torch", "gymnasium", "envs", "algos.policy", "plugins.function.handler")


class LocalBackend:
    def __init__(self, ctx: PluginContext):
        # A plan's section arrives validated; a hand-made one (a test) is completed from the
        # descriptor's own defaults, not from a second copy of them here.
        cfg = {**defaults(LOCAL_CONFIG), **ctx.config}
        self.transport = ctx.transport
        self.env_modules = plan_env_modules(ctx.plan.get("env", {}))
        self.workers = cfg["workers"] or default_worker_count()
        self.timeout_s = float(cfg["timeout_s"] or cfg["deadline_s"])
        self.retries = int(cfg["retries"])
        self.memory_mb = int(cfg["memory_mb"])
        self.simulate = bool(cfg["simulate"])
        self.handler = str(cfg["handler"] or HANDLER)
        self.invoke_latency_s = float(cfg["sim_invoke_latency_s"])
        self.cold_start_s = float(cfg["sim_cold_start_s"])
        self._inline = self.transport.public_spec().get("kind") == "inline"
        self.pool: WorkerPool | None = None
        self._counts: dict[str, Any] = {"worker_deaths": 0, "worker_kills": 0,
                                        "handler_errors": 0, "events_refused": {}}

    async def start(self, ctx: PluginContext) -> None:
        # What the actors may use (the Redis URL, password and TLS policy; the env modules the
        # plan validated) reaches workers as their environment, the way a Lambda function gets
        # it: never from an event.
        environment = getattr(self.transport, "actor_environment", None)
        env = dict(environment() if environment else {})
        env[ENV_MODULES_VAR] = ",".join(self.env_modules)
        self.pool = WorkerPool(self.workers, preload=PRELOAD,
                               initializer="plugins.function.handler:init_worker",
                               name="nitro-actor", env=env)
        await self.pool.start()
        log.info("local_pool_started", workers=self.workers, simulate=self.simulate)

    async def preflight(self) -> None:
        """Raise ``Unreachable`` when the warm workers did not survive their start (a broken
        preload or initializer kills them before any invocation). Invokes nothing."""
        if self.pool is None:
            raise RuntimeError("local backend preflight before start()")
        dead = self.pool.dead_workers()
        if dead:
            raise Unreachable(f"{len(dead)} of {self.workers} local actor workers exited at "
                              f"start-up (exit codes {sorted(set(dead))}) — run `python -c "
                              "'import plugins.function.handler'` to see why")

    async def invoke(self, invocation: Invocation) -> Receipt:
        assert self.pool is not None
        attachment = tag = None
        if self._inline:
            attachment = await self.transport.weights_payload(invocation.version)
            tag = f"weights:{invocation.version}"
            if attachment is None:
                raise InvocationFailed(invocation.request_id, "weights_gone")
        attempts = 0
        while True:
            attempts += 1
            try:
                result = await self.pool.call(
                    self.handler, invocation.event, request_id=invocation.request_id,
                    timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                    attachment=attachment, attachment_tag=tag, slot=invocation.index,
                )
                break
            except WorkerFailed as exc:
                self._counts["worker_kills" if exc.reason == "timeout" else "worker_deaths"] += 1
                # A crashed worker is retried (the platform would run it elsewhere); a hung one
                # already used up the deadline.
                if exc.reason == "worker_died" and attempts <= self.retries:
                    continue
                raise InvocationFailed(invocation.request_id, exc.reason, attempts=attempts,
                             duration_ms=exc.duration_ms,
                             billed_ms=math.ceil(exc.duration_ms)) from None
            except HandlerError as exc:
                self._counts["handler_errors"] += 1
                if exc.error_type == REFUSED_ERROR:
                    refused = self._counts["events_refused"]
                    reason = refusal_reason(exc.message)
                    refused[reason] = refused.get(reason, 0) + 1
                log.warning("handler_error", request_id=invocation.request_id,
                            error=str(exc), trace="".join(exc.trace[-2:]))
                # A function error is billed for its duration, as AWS bills it.
                raise InvocationFailed(invocation.request_id, f"handler: {exc}", attempts=attempts,
                             duration_ms=exc.duration_ms, billed_ms=math.ceil(exc.duration_ms),
                             init_ms=exc.init_ms or 0.0) from None
        r = result.result
        return Receipt(
            request_id=invocation.request_id, ok=True, version=int(r["version"]),
            env_steps=int(r["env_steps"]), episodes=int(r["episodes"]),
            duration_ms=float(r["duration_ms"]), billed_ms=math.ceil(r["duration_ms"]),
            cold_start=bool(r["cold_start"]), bytes_pushed=int(r.get("bytes_pushed", 0)),
            attempts=attempts, payload=result.payload, init_ms=result.init_ms or 0.0,
        )

    def simulated_actor_s(self, receipts: Sequence[Receipt], cold_starts: int = 0) -> float:
        """Time concurrent cloud functions would take for this round's invocations, of which
        ``cold_starts`` started cold (they start side by side: one cold start's delay)."""
        ok = [r for r in receipts if r.ok]
        if not ok:
            return self.invoke_latency_s
        slowest = max(r.duration_ms for r in ok) / 1000
        return self.invoke_latency_s + slowest + (self.cold_start_s if cold_starts else 0.0)

    def counters(self) -> dict[str, Any]:
        return {**self._counts, "events_refused": dict(self._counts["events_refused"])}

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
