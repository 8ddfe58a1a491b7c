"""A pool of warm worker processes that behaves like a serverless platform.

Each worker runs ``handler(event, context)`` calls one at a time and keeps whatever the handler
caches (envs, policy, connections) between them, like a warm Lambda execution environment.
Workers come from a forkserver that preloads heavy modules once (a fresh Python importing
torch costs ~1 s here; a fork of a preloaded server ~25 ms). Calls are asyncio futures, so
fan-out is N awaits on a fixed pool, never a process per call.

Requests and replies cross the pipes as msgpack (``send_bytes``), not pickle. A call that
outlives its deadline gets its worker killed and replaced; a worker that dies mid-call fails
that call only. Both raise ``WorkerFailed`` with a reason the caller counts.

A worker's start-up (process, imports, initializer) is its init phase, which Lambda limits on
its own (``INIT_LIMIT_S``) and does not count against the invocation's timeout: a new or
replacement worker takes calls once it says it is ready, so a machine slow to start a process
does not time out the call that happens to land on it. An init that runs past the limit goes
on inside the first call, under that call's deadline, as Lambda retries it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import structlog

log = structlog.get_logger("plugins.actors.workers")

#: Lambda's limit on the init phase of an on-demand function, separate from its timeout.
INIT_LIMIT_S = 10.0
#: What a worker sends once its init is done, before any reply (msgpack never starts so).
READY = b"\xc1ready"


class WorkerFailed(Exception):
    """The call did not complete: ``reason`` is ``timeout``, ``worker_died``, ``closed`` or
    ``bad_request`` (the event cannot cross the pipe; no worker was taken for it).
    ``duration_ms`` is how long the call held a worker: a platform bills that time."""

    def __init__(self, reason: str, detail: str = "", *, duration_ms: float = 0.0):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.duration_ms = duration_ms


class HandlerError(Exception):
    """The handler raised: carries the error type and message as Lambda reports them, and how
    long the handler ran (a function error is billed for its duration)."""

    def __init__(self, error_type: str, message: str, trace: list[str], *,
                 duration_ms: float = 0.0, init_ms: float | None = None):
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message
        self.trace = trace
        self.duration_ms = duration_ms
        self.init_ms = init_ms


@dataclass
class InvokeContext:
    """The ``context`` argument handlers receive, shaped like AWS Lambda's."""

    aws_request_id: str
    function_name: str
    memory_limit_in_mb: int
    deadline_ms: float
    #: Bytes the caller attached (e.g. weights for an in-process transport), or None when the
    #: worker already holds the attachment with the same tag.
    attachment: bytes | None = None
    attachment_tag: str | None = None
    #: Bytes the handler hands back beside its JSON result (e.g. a batch).
    returned_payload: bytes | None = field(default=None, repr=False)
    function_version: str = "$LATEST"
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self.deadline_ms - time.time() * 1000))


@dataclass
class CallResult:
    result: Any
    payload: bytes | None
    duration_ms: float
    worker: int
    #: Set on a worker's first call only: its set-up time (imports, initializer), which Lambda
    #: reports as ``Init Duration`` on a cold start.
    init_ms: float | None = None


def pack_event(event: Any) -> bytes:
    """The event as it crosses the pipe; ``WorkerFailed("bad_request")`` when msgpack cannot
    carry it (an integer beyond 64 bits, nesting past msgpack's limit, a non-JSON type).

    Callers check this before taking a worker, so a hostile event never holds one."""
    try:
        return msgpack.packb(event, use_bin_type=True)
    except (OverflowError, ValueError, TypeError, RecursionError) as exc:
        raise WorkerFailed("bad_request", f"event cannot be packed: {exc}") from None


def _resolve(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _worker_main(
    conn: Connection, worker_id: int, initializer: str | None, env: dict[str, str],
    learner_pid: int,
) -> None:
    """Body of a worker process: serve calls until the pipe closes."""
    started = time.perf_counter()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into a clean stop
    _watch_learner(learner_pid)
    os.environ.update(env)  # e.g. a Redis password, as a function's environment would hold
    if initializer:
        _resolve(initializer)()
    init_ms: float | None = (time.perf_counter() - started) * 1000
    try:
        conn.send_bytes(READY)
    except (BrokenPipeError, OSError):
        return
    functions: dict[str, Callable[..., Any]] = {}
    attachment: tuple[str | None, bytes | None] = (None, None)
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        req = msgpack.unpackb(raw, raw=False)
        if req.get("attachment") is not None:
            attachment = (req.get("attachment_tag"), req["attachment"])
        held = attachment[1] if attachment[0] == req.get("attachment_tag") else None
        context = InvokeContext(
            aws_request_id=req["request_id"],
            function_name=req["function"],
            memory_limit_in_mb=req.get("memory_mb", 0),
            deadline_ms=req["deadline_ms"],
            attachment=held,
            attachment_tag=req.get("attachment_tag"),
        )
        start = time.perf_counter()
        try:
            fn = functions.get(req["target"])
            if fn is None:
                fn = functions[req["target"]] = _resolve(req["target"])
            result = fn(req["event"], context)
            reply = {"ok": True, "result": result, "payload": context.returned_payload}
        except Exception as exc:
            reply = {
                "ok": False,
                "error_type": type(exc).__name__,
                "message": str(exc),
                "trace": traceback.format_exception(exc)[-6:],
            }
        reply["duration_ms"] = (time.perf_counter() - start) * 1000
        reply["init_ms"], init_ms = init_ms, None
        try:
            conn.send_bytes(msgpack.packb(reply, use_bin_type=True, default=_plain))
        except (BrokenPipeError, OSError):
            return
        except (TypeError, OverflowError, ValueError) as exc:
            err = {"ok": False, "error_type": "TypeError",
                   "message": f"handler result is not JSON-like: {exc}", "trace": [],
                   "duration_ms": reply["duration_ms"], "init_ms": reply["init_ms"]}
            conn.send_bytes(msgpack.packb(err, use_bin_type=True))


def _watch_learner(learner_pid: int, period_s: float = 1.0) -> None:
    """Exit when the learner process is gone. A forkserver outlives the learner while any of
    its workers does, so neither notices a learner killed with SIGKILL; a hung handler would
    otherwise keep its worker alive forever."""

    def watch() -> None:
        while True:
            time.sleep(period_s)
            try:
                os.kill(learner_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="learner-watch", daemon=True).start()


def _plain(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(type(obj).__name__)


class _Worker:
    def __init__(self, wid: int, process: Any, conn: Connection):
        self.id = wid
        self.process = process
        self.conn = conn
        self.attachment_tag: str | None = None
        self.calls = 0
        #: Whether its ``READY`` was read (else the first call reads it first).
        self.ready = False

    def wait_ready(self, limit_s: float) -> None:
        """Block until the worker's init is done, at most ``limit_s``; a worker that died
        during it stays not ready, and its first call finds out."""
        with contextlib.suppress(EOFError, OSError):
            if self.conn.poll(limit_s):
                self.ready = self.conn.recv_bytes() == READY

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.conn.close()
        with contextlib.suppress(Exception):
            self.process.join(timeout=1)


class WorkerPool:
    """``size`` warm processes serving calls of ``module:function`` handlers."""

    def __init__(
        self,
        size: int,
        *,
        preload: Sequence[str] = (),
        initializer: str | None = None,
        name: str = "nitro-worker",
        env: dict[str, str] | None = None,
    ):
        if size < 1:
            raise ValueError(f"worker pool needs at least 1 worker, got {size}")
        self.size = size
        self.name = name
        self._initializer = initializer
        self._env = dict(env or {})
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self._mp = multiprocessing.get_context(method)
        if method == "forkserver" and preload:
            self._mp.set_forkserver_preload(list(preload))
        #: The pool's places: ``_slots[i]`` is the worker serving place i (a replacement takes
        #: its place). Each keeps its env mid-episode between calls, so which place serves a
        #: call decides what the call continues: a call that names its place (``slot``) gets
        #: that one, in the order the calls came, whatever finished first, and a seeded run
        #: replays exactly however many calls share a place.
        self._slots: list[_Worker] = []
        self._free: set[int] = set()
        #: Calls waiting for a place, oldest first: (the place wanted or None for any, future).
        self._waiting: deque[tuple[int | None, asyncio.Future[int]]] = deque()
        #: Calls waiting for their worker's reply: worker id -> (the pipe's fd, its future).
        self._receiving: dict[int, tuple[int, asyncio.Future[None]]] = {}
        self._next_id = 0
        self._closed = False
        self.started_workers = 0
        self.killed_workers = 0

    async def start(self) -> None:
        workers = await asyncio.gather(*(asyncio.to_thread(self._spawn) for _ in range(self.size)))
        self._slots = list(workers)
        self._free = set(range(self.size))
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free places to waiting calls, oldest first: a call that wants a busy place
        keeps waiting without holding back calls behind it that can run elsewhere."""
        still: deque[tuple[int | None, asyncio.Future[int]]] = deque()
        while self._waiting:
            wanted, future = self._waiting.popleft()
            if future.done():
                continue
            if wanted is None:
                place = min(self._free, default=None)
            else:
                place = wanted if wanted in self._free else None
            if place is None:
                still.append((wanted, future))
                continue
            self._free.discard(place)
            future.set_result(place)
        self._waiting = still

    async def _take(self, slot: int | None, timeout_s: float) -> int:
        """A free place (``slot`` modulo the pool's size, or the lowest free one), waiting up to
        ``timeout_s``; raises ``TimeoutError``."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((None if slot is None else slot % self.size, future))
        self._dispatch()
        try:
            return await asyncio.wait_for(future, timeout_s)
        except BaseException:
            if future.done() and not future.cancelled():
                self._release(future.result())  # granted as the wait was given up
            raise

    def _release(self, place: int) -> None:
        self._free.add(place)
        self._dispatch()

    def _spawn(self) -> _Worker:
        parent, child = self._mp.Pipe(duplex=True)
        self._next_id += 1
        wid = self._next_id
        process = self._mp.Process(
            target=_worker_main,
            args=(child, wid, self._initializer, self._env, os.getpid()),
            name=f"{self.name}-{wid}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = _Worker(wid, process, parent)
        self.started_workers += 1
        worker.wait_ready(INIT_LIMIT_S)
        return worker

    async def _replace(self, place: int) -> None:
        """Kill the worker at ``place`` and start a fresh one there, free once it is ready."""
        await asyncio.to_thread(self._slots[place].kill)
        self.killed_workers += 1
        if self._closed:
            return
        worker = await asyncio.to_thread(self._spawn)
        if self._closed:  # closed during its init: close() could not see it
            await asyncio.to_thread(worker.kill)
            return
        self._slots[place] = worker
        self._release(place)

    async def call(
        self,
        target: str,
        event: dict[str, Any],
        *,
        request_id: str,
        timeout_s: float,
        function: str = "nitro-actor",
        memory_mb: int = 0,
        attachment: bytes | None = None,
        attachment_tag: str | None = None,
        slot: int | None = None,
    ) -> CallResult:
        """Run ``target(event, context)`` in a warm worker; raise ``WorkerFailed`` or
        ``HandlerError``. ``timeout_s`` covers waiting for a free worker too. ``slot`` pins the
        call to place ``slot % size`` (calls pinned to one place run in the order they came);
        without it the call takes the lowest free place, as a platform would any warm one.

        Whatever happens, the worker taken for the call goes back to the pool or is replaced
        by a fresh one: a pool that loses workers wedges every later call."""
        if self._closed:
            raise WorkerFailed("closed", "worker pool is closed")
        pack_event(event)  # refuse what cannot cross the pipe before it takes a worker
        deadline = time.monotonic() + timeout_s
        try:
            place = await self._take(slot, timeout_s)
        except TimeoutError:
            raise WorkerFailed("timeout", "no free worker before the deadline",
                               duration_ms=timeout_s * 1000) from None
        worker = self._slots[place]
        t0 = time.perf_counter()
        reusable = False
        try:
            raw = await self._exchange(worker, target, event, request_id, deadline, function,
                                       memory_mb, attachment, attachment_tag, timeout_s, t0)
            try:
                reply = msgpack.unpackb(raw, raw=False)
            except Exception as exc:  # the pipe is out of step: its next reply is not ours
                log.warning("worker_reply_unreadable", worker=worker.id, request_id=request_id,
                            error=repr(exc))
                raise WorkerFailed("worker_died", f"unreadable reply: {exc!r}",
                                   duration_ms=(time.perf_counter() - t0) * 1000) from None
            reusable = True
        finally:
            if reusable:
                worker.attachment_tag = attachment_tag
                worker.calls += 1
                self._release(place)
            else:
                # The pipe may still hold a reply nobody will read: never reuse this worker.
                await asyncio.shield(self._replace(place))
        if not reply["ok"]:
            raise HandlerError(reply["error_type"], reply["message"], reply.get("trace", []),
                               duration_ms=reply["duration_ms"], init_ms=reply.get("init_ms"))
        return CallResult(reply["result"], reply.get("payload"), reply["duration_ms"], worker.id,
                          init_ms=reply.get("init_ms"))

    async def _exchange(self, worker: _Worker, target: str, event: dict[str, Any],
                        request_id: str, deadline: float, function: str, memory_mb: int,
                        attachment: bytes | None, attachment_tag: str | None, timeout_s: float,
                        t0: float) -> bytes:
        """Send one request to ``worker`` and wait for its reply (raw msgpack bytes)."""
        send_attachment = attachment if worker.attachment_tag != attachment_tag else None
        request = {
            "target": target,
            "event": event,
            "request_id": request_id,
            "function": function,
            "memory_mb": memory_mb,
            "deadline_ms": time.time() * 1000 + (deadline - time.monotonic()) * 1000,
            "attachment": send_attachment,
            "attachment_tag": attachment_tag,
        }
        try:
            worker.conn.send_bytes(msgpack.packb(request, use_bin_type=True))
            if not worker.ready:  # an init past its limit: the rest of it counts here
                if await self._receive(worker, deadline - time.monotonic()) != READY:
                    raise EOFError("no ready signal before the first reply")
                worker.ready = True
            return await self._receive(worker, deadline - time.monotonic())
        except TimeoutError:
            log.warning("worker_killed", worker=worker.id, request_id=request_id, reason="timeout")
            raise WorkerFailed("timeout", f"no reply within {timeout_s:.1f}s",
                               duration_ms=(time.perf_counter() - t0) * 1000) from None
        except WorkerFailed as exc:  # the pool closed during the call: it held the worker
            exc.duration_ms = (time.perf_counter() - t0) * 1000
            raise
        except (EOFError, OSError, BrokenPipeError) as exc:
            code = worker.process.exitcode
            log.warning("worker_died", worker=worker.id, request_id=request_id, exitcode=code)
            raise WorkerFailed("worker_died", f"exit code {code}: {exc!r}",
                               duration_ms=(time.perf_counter() - t0) * 1000) from None

    async def _receive(self, worker: _Worker, timeout: float) -> bytes:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = worker.conn.fileno()

        def on_readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, on_readable)
        self._receiving[worker.id] = (fd, ready)
        try:
            await asyncio.wait_for(ready, max(timeout, 0.0))
        finally:
            if self._receiving.pop(worker.id, None) is not None:  # else close() took it
                loop.remove_reader(fd)
        # The whole message may still be in flight: read it off the loop's thread.
        return await asyncio.to_thread(worker.conn.recv_bytes)

    async def close(self) -> None:
        self._closed = True
        for _, future in self._waiting:
            if not future.done():
                future.set_exception(WorkerFailed("closed", "worker pool is closed"))
        self._waiting.clear()
        # A call in flight can never get its reply once the pipe is closed: fail it now
        # rather than let it wait out its timeout (its worker is then killed, not replaced).
        loop = asyncio.get_running_loop()
        for fd, ready in self._receiving.values():
            loop.remove_reader(fd)
            if not ready.done():
                ready.set_exception(WorkerFailed("closed", "worker pool closed during the call"))
        self._receiving.clear()
        workers = list(self._slots)
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.conn.close()
        await asyncio.to_thread(_join_all, workers)

    def dead_workers(self) -> list[int]:
        """Exit codes of workers that are no longer running (a preload or initializer that
        fails kills its worker before the first call)."""
        return [w.process.exitcode for w in self._slots
                if w.process.exitcode is not None]

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._slots if w.process.pid]


def _join_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.process.join(timeout=2)
        if worker.process.is_alive():
            worker.kill()


def default_worker_count() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
