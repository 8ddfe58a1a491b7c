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
import copy
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from kernel import checkpoint, logs, rundir, tasks
from kernel import events as ev
from kernel.bus import Bus, Policy
from kernel.contract import Bound, PluginCrashed, PluginName, ProbeSlot, Roles, blame
from kernel.coordinator import Coordinator
from kernel.overlapped import OverlappedRounds
from kernel.plan import Overrides, apply_overrides, fixed_on_resume, load_plan, read_toml
from kernel.registry import Registry, default_registry
from kernel.roles import PluginContext
from kernel.run_state import RunState, StopRules, summary_of
from kernel.schema import PlanError

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
        force: bool = False,
    ):
        """``out_dir`` must be new or empty unless ``force`` (which replaces the run in it);
        ``resume`` is a checkpoint body whose run continues in ``out_dir``."""
        self.plan = plan
        self.registry = registry or default_registry()
        self.bus = Bus()
        # A resumed run keeps its id, so its Redis stream and weights are found again.
        self.run_id = resume["run_id"] if resume else rundir.new_run_id(plan["run"]["name"])
        if resume is not None:
            self.run_dir = Path(out_dir or ".")
        else:
            self.run_dir = rundir.new_run_dir(plan, out_dir, force)
        self._force = force and resume is None
        rundir.check_sink_paths(plan, self.run_dir)
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
        self._started: list[Bound] = []
        self._roles: Roles | None = None
        self._sinks: list[Bound] = []
        self.files = rundir.RunFiles(self.run_dir, self.run_id)
        self._entered = False
        self._readers = 0
        self._t_start = time.perf_counter()
        self._wall_before = 0.0
        self._rounds: Any = None
        self._rounds_restored: dict[str, Any] | None = None
        self.first_errors = logs.FirstErrors()

    @classmethod
    def from_plan(
        cls,
        plan: str | os.PathLike[str] | Mapping[str, Any],
        overrides: Overrides = (),
        *,
        out_dir: str | os.PathLike[str] | None = None,
        registry: Registry | None = None,
        force: bool = False,
    ) -> Engine:
        """Load and validate a plan (raises ``PlanError`` before anything starts)."""
        registry = registry or default_registry()
        return cls(load_plan(plan, overrides, registry), out_dir=out_dir, registry=registry,
                   force=force)

    @classmethod
    def resume(cls, run_dir: str | os.PathLike[str], overrides: Iterable[str] = (),
               registry: Registry | None = None) -> Engine:
        """An engine that continues the run in ``run_dir`` from its newest checkpoint.

        Overrides that would change what the checkpoint's model was trained for are refused
        here, before anything in ``run_dir`` is touched (``PlanError`` naming the key)."""
        run_dir = Path(run_dir)
        body = checkpoint.find(run_dir)
        registry = registry or default_registry()
        overrides = list(overrides)
        # The saved plan.toml is resolved (every default written), so the overrides are
        # compared on the raw tables: a changed algorithm is named before its keys clash.
        saved = read_toml(run_dir / "plan.toml")
        changed = copy.deepcopy(saved)
        apply_overrides(changed, overrides)
        rundir.check_resume_fits(saved, changed, fixed_on_resume(registry, saved, changed))
        plan = load_plan(run_dir / "plan.toml", overrides, registry)
        return cls(plan, out_dir=run_dir, registry=registry, resume=body)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        self.bus.bind(asyncio.get_running_loop())
        logs.ensure_configured(self.plan["run"]["log_level"])
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        self._t_start = time.perf_counter()
        if self._resume is None:
            self.files.open(self.plan, force=self._force, append=self._resume is not None)
        # A resumed run's directory is left as it is until its checkpoint is restored: a
        # resume that does not fit must leave the run resumable.
        self._entered = True
        try:
            await self._build()
        except BaseException as exc:
            # Summary first, then the plugins closed to the end: a second signal while they
            # close (a worker pool takes a moment) must neither lose the summary nor orphan
            # worker processes.
            if isinstance(exc, asyncio.CancelledError) and self.files.is_open:
                self._stopped_in_start_up()
            try:
                await tasks.shielded(self._close_plugins())
            finally:
                self.files.close()
            raise
        return self

    def _stopped_in_start_up(self) -> None:
        """A signal during start-up (plugins starting, a preflight waiting) still leaves a
        summary and a journal that ends in ``RunStopped``."""
        reason = self.stop_reason or "cancelled"
        try:
            self._write_summary(reason)
            self.publish(ev.RunStopped(reason=reason, rounds=self.state.round,
                                       env_steps=self.state.env_steps, wall_s=self.wall_s()))
        except OSError as exc:
            log.error("summary_failed", error=repr(exc))
        log.info("run_stopped", reason=reason, rounds=self.state.round, during="start-up")

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._close_plugins()
        self.files.close()

    async def _build(self) -> None:
        plan = self.plan
        transport = await self._make("transport", plan["transport"]["kind"], plan["transport"])
        # Actors (a worker pool whose forkserver imports torch) and the learner (which imports
        # torch and builds a probe env) start side by side: start-up is the slower of the two,
        # not their sum.
        actors_task = asyncio.create_task(self._make(
            "actors", plan["actors"]["backend"], plan["actors"], transport=transport.plugin))
        try:
            learner = await self._make("algo", plan["algo"]["name"], plan["algo"],
                                       in_thread=True)
        finally:
            await asyncio.wait([actors_task])
        actors = actors_task.result()
        probes = []
        for item in plan["probes"]:
            probe = await self._make("probe", item["name"], item)
            probes.append(ProbeSlot(item["name"], probe, probe.every or item["every"],
                                    self.registry.get("probe", item["name"]).evaluation_score,
                                    item["max_share"]))
        scaler = await self._make("scaler", plan["scaler"]["name"], plan["scaler"])
        cost = await self._make("cost", plan["cost"]["name"], plan["cost"])
        with blame(learner):
            env_spec = learner.env_spec()
        self._roles = Roles(
            learner=learner, actors=actors, transport=transport, scaler=scaler, cost=cost,
            probes=probes,
            env_spec=env_spec if env_spec is not None else dict(plan["env"]))
        # Reachability before anything is trained or billed: a missing endpoint or Redis is a
        # one-line error in seconds, not an empty run.
        for role in (transport, actors):
            with blame(role):
                await role.preflight()
        if self._resume is not None:
            await self._restore_or_refuse(learner)
            self.files.open(self.plan, force=self._force, append=self._resume is not None)
            log.info("run_resumed", round=self.state.round, env_steps=self.state.env_steps)
        # Sinks start last: nothing writes into the run directory before the run can start.
        for item in plan["sinks"]:
            self._sinks.append(await self._make("sink", item["name"], item))

    async def _restore_or_refuse(self, learner: Bound) -> None:
        """Restore the checkpoint; one that does not fit the built plugins (a network of
        another shape) is a one-line refusal, with the run directory untouched."""
        assert self._resume is not None
        try:
            with blame(learner):
                await asyncio.to_thread(self._restore, self._resume)
        except PluginCrashed as exc:
            first = (str(exc.error).strip().splitlines() or [""])[0][:300]
            raise PlanError("--resume", "a checkpoint that fits the plan's plugins",
                            note=f"{exc.kind} {exc.name!r}: {type(exc.error).__name__}: "
                                 f"{first}") from None

    async def _make(self, kind: str, name: str, config: dict[str, Any], transport: Any = None,
                    in_thread: bool = False) -> Bound:
        plugin = self.registry.get(kind, name)
        ctx = PluginContext(
            name=name, config=config, plan=self.plan, run_id=self.run_id,
            run_dir=self.run_dir, seed=self.plan["run"]["seed"], bus=self.bus,
            transport=transport,
        )
        with blame(PluginName(kind, name)):  # a factory that raises is named too
            factory = plugin.load()
            instance = await asyncio.to_thread(factory, ctx) if in_thread else factory(ctx)
        bound = Bound(kind, name, instance)  # a missing method fails here, before round 1
        with blame(bound):
            result = bound.start(ctx)
            if asyncio.iscoroutine(result):
                await result
        self._started.append(bound)
        return bound

    async def _close_plugins(self) -> None:
        while self._started:
            bound = self._started.pop()
            try:
                result = bound.close()
                if asyncio.iscoroutine(result):
                    await asyncio.wait_for(result, 30)
            except Exception as exc:  # closing must go on for the others
                log.warning("plugin_close_failed", kind=bound.kind, plugin=bound.name,
                            error=repr(exc))

    # -- events ------------------------------------------------------------------------------

    def publish(self, event: ev.Event) -> None:
        """Journal the event (``events.jsonl`` is complete by contract), then fan it out."""
        self.files.journal(event)
        self.first_errors.note(event)
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
        rules = StopRules(self.plan, self.state, self._roles.cost, self.wall_s)
        coordinator = Coordinator(self.plan, self.run_id, self._roles, self.state, self.publish,
                                  self.stop_requested, self.rng, rules)
        mode = self.plan["run"]["mode"]
        self._rounds = rounds = coordinator if mode == "sync" else \
            OverlappedRounds(coordinator, mode, resume=self._rounds_restored)
        reason = "error"
        sink_subs = [(sink, self.bus.subscribe(f"sink-{sink.name}", maxsize=8192))
                     for sink in self._sinks]
        self.publish(ev.RunStarted(run_id=self.run_id, name=self.plan["run"]["name"],
                                   run_dir=str(self.run_dir),
                                   resumed_from_round=self.state.round))
        log.info("run_started", run_dir=str(self.run_dir), plan=self.plan["run"]["name"])
        try:
            async with asyncio.TaskGroup() as tg:
                for sink, sub in sink_subs:
                    tg.create_task(tasks.drain_into(sink, sub), name=f"sink-{sink.name}")
                try:
                    reason = await self._loop(coordinator, rounds, rules)
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
                    await tasks.shielded(self._on_stop(reason, coordinator))
                    self.bus.close()
        except BaseExceptionGroup as group:
            crashed = tasks.first_of(group, PluginCrashed)
            if crashed is not None:
                raise crashed from None
            raise
        return self.summary or {}

    async def _loop(self, coordinator: Coordinator, rounds: Any, rules: StopRules) -> str:
        while True:
            if self.stop_requested.is_set():
                return self.stop_reason or "requested"
            reached = rules.before_round()  # also on entry: a resumed run may be done
            if reached:
                return reached
            record = await rounds.run_round()
            if record is None:
                return self.stop_reason or "requested"
            if self.checkpointer is not None and self.checkpointer.due(self.state.round):
                await asyncio.to_thread(self.checkpointer.save, self._parts())
            ended = rules.after_round(record)
            if ended:
                return ended

    def _parts(self) -> checkpoint.RunParts:
        assert self._roles is not None
        return checkpoint.RunParts(
            run_id=self.run_id, plan_name=self.plan["run"]["name"], wall_s=self.wall_s(),
            state=self.state, roles=self._roles, rng_state=self.rng.bit_generator.state,
            rounds=self._rounds.state() if isinstance(self._rounds, OverlappedRounds) else None)

    def _restore(self, body: dict[str, Any]) -> None:
        assert self._roles is not None
        restored = checkpoint.restore(body, self._roles)
        self.state = restored.state
        self.rng.bit_generator.state = restored.rng_state
        self._wall_before, self._rounds_restored = restored.wall_s, restored.rounds

    def wall_s(self) -> float:
        return self._wall_before + (time.perf_counter() - self._t_start)

    async def _on_stop(self, reason: str, coordinator: Coordinator) -> None:
        """Runs on every way out: what is still in flight is cancelled and billed, the final
        policy evaluated, ``summary.json`` written, then the final checkpoint."""
        if self.stop_reason and reason in ("requested", "cancelled"):
            reason = self.stop_reason if reason == "requested" else reason
        failed = reason.startswith("error")
        try:
            await coordinator.close()
            if not failed and reason != "cancelled":
                await coordinator.evaluate_at_stop()
        except Exception as exc:  # the summary must still be written
            log.error("stop_path_failed", error=repr(exc))
        s = self.state
        self._write_summary(reason)
        if self.checkpointer is not None and not failed:
            try:
                await asyncio.to_thread(self.checkpointer.save, self._parts(), True)
            except Exception as exc:
                log.error("checkpoint_failed", error=repr(exc))
        self.publish(ev.RunStopped(reason=reason, rounds=s.round, env_steps=s.env_steps,
                                   wall_s=self.wall_s()))
        log.info("run_stopped", reason=reason, rounds=s.round, env_steps=s.env_steps,
                 best_eval_return=s.best_eval_return, wall_s=round(self.wall_s(), 2))

    def _write_summary(self, reason: str) -> None:
        dropped = sum(st.dropped for st in self.bus.statistics().values())
        extra: dict[str, Any] = {}
        for role in (self._roles.actors, self._roles.transport) if self._roles else ():
            with contextlib.suppress(Exception):  # a plugin's own counters, if it keeps any
                extra.update(role.counters() or {})
        self.summary = summary_of(self.state, run_id=self.run_id, name=self.plan["run"]["name"],
                                  reason=reason, wall_s=self.wall_s(), dropped_events=dropped,
                                  extra=extra)
        self.files.write_summary(self.summary)
