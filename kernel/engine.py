"""The engine: builds a run's plugins from a plan, runs rounds, and always leaves a summary.

Embedding, in an application's own event loop::

    engine = Engine.from_plan("plans/cartpole.toml", overrides={"stop.max_rounds": 5})
    async with engine:
        async for event in engine.events():   # in another task, or after run()
            ...
        summary = await engine.run()

Lifecycle: plugins start in a fixed order (transport, actors, algo, probes, scaler, cost,
sinks) and close in reverse. Sinks consume the bus in tasks of a ``TaskGroup``; the coordinator
never waits for them. A stop request (signal, ``request_stop``, task cancellation) ends the run
between rounds or interrupts a fan-out; ``summary.json`` is written in every case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import tomli_w

from kernel import checkpoint, logs
from kernel import events as ev
from kernel.async_rounds import OverlappedRounds
from kernel.bus import Bus, Policy
from kernel.coordinator import Coordinator, PluginCrashed, Roles, RunState, blame
from kernel.plan import load_plan
from kernel.registry import Registry, default_registry
from kernel.roles import PluginContext

log = structlog.get_logger("kernel.engine")

#: Order in which roles start; they close in reverse.
START_ORDER = ("transport", "actors", "algo", "probe", "scaler", "cost", "sink")


class Engine:
    def __init__(
        self,
        plan: dict[str, Any],
        *,
        out_dir: str | os.PathLike[str] | None = None,
        registry: Registry | None = None,
        resume: dict[str, Any] | None = None,
    ):
        self.plan = plan
        self.registry = registry or default_registry()
        self.bus = Bus()
        # A resumed run keeps its id, so its Redis stream and weights are found again.
        self.run_id = resume["run_id"] if resume else _run_id(plan["run"]["name"])
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        self.run_dir = Path(out_dir) if out_dir else (
            Path(plan["run"]["out_dir"]) / f"{plan['run']['name']}-{stamp}"
        )
        self.state = RunState(actors_next=plan["actors"]["count"])
        self.stop_requested = asyncio.Event()
        self.stop_reason: str | None = None
        self.summary: dict[str, Any] | None = None
        self._resume = resume
        self.rng = np.random.default_rng(plan["run"]["seed"] + 7919)
        ckpt = plan["checkpoint"]
        self.checkpointer = (
            checkpoint.Checkpointer(self.run_dir, ckpt["every"], ckpt["keep"])
            if ckpt["enabled"] else None
        )
        self._started: list[tuple[str, str, Any]] = []
        self._roles: Roles | None = None
        self._sinks: list[tuple[str, Any]] = []
        self._journal: Any = None
        self._entered = False
        self._readers = 0
        self._t_start = 0.0
        self._wall_before = 0.0

    @classmethod
    def from_plan(
        cls,
        plan: str | os.PathLike[str] | Mapping[str, Any],
        overrides: Mapping[str, Any] | Iterable[str] = (),
        *,
        out_dir: str | os.PathLike[str] | None = None,
        registry: Registry | None = None,
    ) -> Engine:
        """Load and validate a plan (raises ``PlanError`` before anything starts)."""
        registry = registry or default_registry()
        return cls(load_plan(plan, overrides, registry), out_dir=out_dir, registry=registry)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        self.bus.bind(asyncio.get_running_loop())
        self.run_dir.mkdir(parents=True, exist_ok=True)
        logs.ensure_configured(self.plan["run"]["log_level"])
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        logs.open_run_log(self.run_id, self.run_dir / "log.jsonl")
        mode = "a" if self._resume is not None else "w"
        # Line-buffered: whoever tails the journal (a dashboard, a test) sees each event at once.
        self._journal = (self.run_dir / "events.jsonl").open(mode, encoding="utf-8", buffering=1)
        (self.run_dir / "plan.toml").write_text(
            tomli_w.dumps(_drop_none(logs.redact(self.plan))), encoding="utf-8"
        )
        self._entered = True
        try:
            await self._build()
        except BaseException:
            await self._close_plugins()
            self._close_files()
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._close_plugins()
        self._close_files()

    async def _build(self) -> None:
        plan = self.plan
        transport = await self._make("transport", plan["transport"]["kind"], plan["transport"])
        # Actors (a worker pool whose forkserver imports torch) and the learner (which imports
        # torch and builds a probe env) start side by side: start-up is the slower of the two,
        # not their sum.
        actors_task = asyncio.create_task(self._make(
            "actors", plan["actors"]["backend"], plan["actors"], transport=transport))
        try:
            learner = await self._make("algo", plan["algo"]["name"], plan["algo"],
                                       in_thread=True)
        finally:
            await asyncio.wait([actors_task])
        actors = actors_task.result()
        probes = []
        for item in plan["probes"]:
            probe = await self._make("probe", item["name"], item)
            if not hasattr(probe, "every"):
                probe.every = item["every"]
            probes.append((item["name"], probe))
        scaler = await self._make("scaler", plan["scaler"]["name"], plan["scaler"])
        cost = await self._make("cost", plan["cost"]["name"], plan["cost"])
        for item in plan["sinks"]:
            self._sinks.append((item["name"], await self._make("sink", item["name"], item)))
        self._roles = Roles(
            learner=learner, actors=actors, transport=transport, scaler=scaler, cost=cost,
            probes=probes,
            names={"algo": plan["algo"]["name"], "actors": plan["actors"]["backend"],
                   "transport": plan["transport"]["kind"], "scaler": plan["scaler"]["name"],
                   "cost": plan["cost"]["name"]},
        )
        if self._resume is not None:
            with blame("algo", plan["algo"]["name"]):
                await asyncio.to_thread(checkpoint.restore, self, self._resume)
            log.info("run_resumed", round=self.state.round, env_steps=self.state.env_steps)

    async def _make(self, kind: str, name: str, config: dict[str, Any], transport: Any = None,
                    in_thread: bool = False) -> Any:
        plugin = self.registry.get(kind, name)
        ctx = PluginContext(
            name=name, config=config, plan=self.plan, run_id=self.run_id,
            run_dir=self.run_dir, seed=self.plan["run"]["seed"], bus=self.bus,
            transport=transport,
        )
        with blame(kind, name):
            factory = plugin.load()
            instance = await asyncio.to_thread(factory, ctx) if in_thread else factory(ctx)
            start = getattr(instance, "start", None)
            if start is not None:
                result = start(ctx)
                if asyncio.iscoroutine(result):
                    await result
        self._started.append((kind, name, instance))
        return instance

    async def _close_plugins(self) -> None:
        while self._started:
            kind, name, instance = self._started.pop()
            close = getattr(instance, "close", None)
            if close is None:
                continue
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    await asyncio.wait_for(result, 30)
            except Exception as exc:  # closing must go on for the others
                log.warning("plugin_close_failed", kind=kind, plugin=name, error=repr(exc))

    def _close_files(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        logs.close_run_log(self.run_id)

    # -- events ------------------------------------------------------------------------------

    def publish(self, event: ev.Event) -> None:
        """Journal the event (``events.jsonl`` is complete by contract), then fan it out."""
        if self._journal is not None:
            self._journal.write(json.dumps(_json_safe(event.to_dict())) + "\n")
        self.bus.publish(event)

    async def events(
        self, *, maxsize: int = 4096, policy: Policy = "drop_oldest",
        types: tuple[type, ...] = (),
    ) -> AsyncIterator[ev.Event]:
        """Iterate the run's events until it stops. A slow reader loses the oldest events (see
        ``kernel.bus``); it never slows training."""
        self._readers += 1
        sub = self.bus.subscribe(f"events-{self._readers}", maxsize=maxsize, policy=policy,
                                 types=types)
        try:
            async for event in sub:
                yield event
        finally:
            self.bus.unsubscribe(sub)

    def request_stop(self, reason: str = "requested") -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_requested.set()

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        """Run until a stop rule fires; return the summary (also in ``summary.json``)."""
        if not self._entered:
            async with self:
                return await self.run()
        assert self._roles is not None
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        self._t_start = time.perf_counter()
        coordinator = Coordinator(self.plan, self.run_id, self._roles, self.state, self.publish,
                                  self.stop_requested, self.rng)
        mode = self.plan["run"]["mode"]
        rounds: Any = coordinator if mode == "sync" else OverlappedRounds(coordinator, mode)
        reason = "error"
        sink_subs = [
            (name, sink, self.bus.subscribe(f"sink-{name}", maxsize=8192))
            for name, sink in self._sinks
        ]
        self.publish(ev.RunStarted(run_id=self.run_id, name=self.plan["run"]["name"],
                                   run_dir=str(self.run_dir),
                                   resumed_from_round=self.state.round))
        log.info("run_started", run_dir=str(self.run_dir), plan=self.plan["run"]["name"])
        try:
            async with asyncio.TaskGroup() as tg:
                for name, sink, sub in sink_subs:
                    tg.create_task(_drain(name, sink, sub), name=f"sink-{name}")
                try:
                    reason = await self._loop(coordinator, rounds)
                except PluginCrashed as exc:
                    reason = f"error: {exc}"
                    self.publish(ev.PluginFailed(plugin=exc.name, kind=exc.kind,
                                                 error=f"{type(exc.error).__name__}: {exc.error}"))
                    log.error("plugin_failed", kind=exc.kind, plugin=exc.name,
                              error=f"{type(exc.error).__name__}: {exc.error}")
                    raise
                except asyncio.CancelledError:
                    reason = "cancelled"
                    raise
                finally:
                    if rounds is not coordinator:
                        await rounds.close()
                    await coordinator.close()
                    await self._on_stop(reason)
                    self.bus.close()
        except BaseExceptionGroup as group:
            crashed = _first(group, PluginCrashed)
            if crashed is not None:
                raise crashed from None
            raise
        return self.summary or {}

    async def _loop(self, coordinator: Coordinator, rounds: Any) -> str:
        s = self.state
        while True:
            if self.stop_requested.is_set():
                return self.stop_reason or "requested"
            reached = self._limit_reached()  # also on entry: a resumed run may be done
            if reached:
                return reached
            if not coordinator.can_afford_next_round():
                return "budget"
            record = await rounds.run_round()
            if record is None:
                return self.stop_reason or "requested"
            if self.checkpointer is not None and self.checkpointer.due(s.round):
                await asyncio.to_thread(self.checkpointer.save, self)
            target = self.plan["stop"]["target_return"]
            if target is not None and record.eval_return is not None and \
                    record.eval_return >= target:
                return "target_return"
            if s.counters.empty_rounds >= 3:
                return "actors_failing"

    def _limit_reached(self) -> str | None:
        limits, s = self.plan["stop"], self.state
        if limits["max_rounds"] is not None and s.round >= limits["max_rounds"]:
            return "max_rounds"
        if limits["max_env_steps"] is not None and s.env_steps >= limits["max_env_steps"]:
            return "max_env_steps"
        if limits["max_wall_s"] is not None and self.wall_s() >= limits["max_wall_s"]:
            return "max_wall_s"
        if limits["budget_usd"] is not None and s.cost_usd >= limits["budget_usd"]:
            return "budget"
        return None

    def coordinator_rng_state(self) -> dict[str, Any]:
        return self.rng.bit_generator.state

    def restore_coordinator_rng(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state

    def wall_s(self) -> float:
        return self._wall_before + (time.perf_counter() - self._t_start)

    async def _on_stop(self, reason: str) -> None:
        """Runs on every way out: checkpoint hook, RunStopped, summary.json."""
        if self.stop_reason and reason in ("requested", "cancelled"):
            reason = self.stop_reason if reason == "requested" else reason
        if self.checkpointer is not None and not reason.startswith("error"):
            try:
                await asyncio.to_thread(self.checkpointer.save, self, True)
            except Exception as exc:  # the summary must still be written
                log.error("checkpoint_failed", error=repr(exc))
        s = self.state
        self.publish(ev.RunStopped(reason=reason, rounds=s.round, env_steps=s.env_steps,
                                   wall_s=self.wall_s()))
        self.summary = self._summary(reason)
        path = self.run_dir / "summary.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_json_safe(self.summary), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        log.info("run_stopped", reason=reason, rounds=s.round, env_steps=s.env_steps,
                 best_eval_return=s.best_eval_return, wall_s=round(self.wall_s(), 2))

    def _summary(self, reason: str) -> dict[str, Any]:
        s, c = self.state, self.state.counters
        dropped = sum(st.dropped for st in self.bus.statistics().values())
        return {
            "run_id": self.run_id,
            "name": self.plan["run"]["name"],
            "stop_reason": reason,
            "rounds": s.round,
            "env_steps": s.env_steps,
            "best_eval_return": s.best_eval_return,
            "final_eval_return": s.final_eval_return,
            "wall_s": self.wall_s(),
            "sim_time_s": s.sim_time_s,
            "cost_usd": s.cost_usd,
            "actors_per_round": s.actors_per_round,
            "invocations": c.invocations,
            "invocation_errors": c.invocation_errors,
            "invocation_timeouts": c.invocation_timeouts,
            "throttles": c.throttles,
            "retries": c.retries,
            "cold_starts": c.cold_starts,
            "rejected_payloads": c.rejected_payloads,
            "rejected_reasons": c.rejected_reasons,
            "stale_batches": c.stale_batches,
            "duplicate_batches": c.duplicate_batches,
            "lost_batches": c.lost_batches,
            "dropped_events": dropped,
            **_extra_counters(self._roles),
        }


async def _drain(name: str, sink: Any, sub: Any) -> None:
    """Feed one sink from its queue; a failing sink is logged and unsubscribed, not fatal."""
    try:
        async for event in sub:
            try:
                await sink.handle(event)
            except Exception as exc:
                log.error("sink_failed", sink=name, error=repr(exc))
                return
    finally:
        flush = getattr(sink, "flush", None)
        if flush is not None:
            with contextlib.suppress(Exception):
                result = flush()
                if asyncio.iscoroutine(result):
                    await result


def _extra_counters(roles: Roles | None) -> dict[str, Any]:
    """Counters that plugins keep themselves (``counters()``), merged into the summary."""
    if roles is None:
        return {}
    out: dict[str, Any] = {}
    for role in (roles.actors, roles.transport):
        counters = getattr(role, "counters", None)
        if callable(counters):
            with contextlib.suppress(Exception):
                out.update(counters())
    return out


def _first(group: BaseExceptionGroup, kind: type[BaseException]) -> Any:
    for exc in group.exceptions:
        if isinstance(exc, kind):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first(exc, kind)
            if found is not None:
                return found
    return None


def _run_id(name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)[:40]
    return f"{safe}-{secrets.token_hex(4)}"


def _drop_none(value: Any) -> Any:
    """TOML has no null: unset optional keys are left out of the resolved plan."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _json_safe(value.item())
    return value
