"""Shared fixtures: real servers on free ports, never the machine's shared ones."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port where nobody listens, for as long as the block runs: bound but not listening, so
    a connection is refused and no other test (the suite runs in parallel processes) can
    start a server on it meanwhile, as it could on a port that was merely free."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


class RedisServer:
    """A throwaway ``redis-server`` with no persistence, restartable on the same port."""

    def __init__(self, tmp: Path, password: str | None = None):
        self.port = free_port()
        self.tmp = tmp
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = False

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start on ``self.port``. The suite runs in parallel workers (``make test``), and a
        port found free can be taken by another worker's server before ours binds it: then
        ours exits at once, and a first start moves to a fresh port (a restart must keep its
        port, so it fails instead)."""
        for _ in range(3):
            outcome = self._start_once()
            if outcome == "up":
                self._started = True
                return
            if outcome == "stuck" or self._started:
                break
            self.port = free_port()  # "exited": the port was taken
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def _start_once(self) -> str:
        """``up``, ``exited`` (it could not bind) or ``stuck``. Up means the server answering
        on the port says it is our process, not another test's."""
        import redis

        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.tmp)]
        if self.password:
            args += ["--requirepass", self.password]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # One try per look (the client's own retries would wait seconds on a silent port).
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                             socket_timeout=0.5, socket_connect_timeout=0.2,
                             retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                answered = client.info("server")["process_id"]
            except redis.RedisError:  # not up yet (or another's, refusing our password)
                time.sleep(0.05)
                continue
            if answered == proc.pid:
                client.close()
                self.proc = proc
                return "up"
            time.sleep(0.05)  # another's server: ours exits once it fails to bind
        client.close()
        if proc.poll() is not None:
            return "exited"
        proc.kill()
        proc.wait(timeout=10)
        return "stuck"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def missing(what: str) -> None:
    """Skip a test whose tool is absent here; under CI (``CI`` set) fail it instead, so a
    guarantee cannot silently go untested."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI is set: a missing tool fails instead of skipping)",
                    pytrace=False)
    pytest.skip(what)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run_cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m kernel ARGS`` in a real process."""
    return subprocess.run(
        [PYTHON, "-m", "kernel", *args], capture_output=True, text=True, timeout=timeout,
        cwd=cwd or ROOT, env={**os.environ, **(env or {})},
    )


def run_watching(engine: Any, on_event: Any) -> dict[str, Any]:
    """Run the engine while ``on_event`` sees every event, inside the engine's own loop (so a
    test can inject faults at a chosen moment)."""
    import asyncio

    async def body() -> dict[str, Any]:
        async with engine:
            async def watch() -> None:
                async for event in engine.events(maxsize=100_000):
                    await on_event(event)

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0)
            try:
                return await engine.run()
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    return asyncio.run(body())


def run_stopped_after(engine: Any, round_number: int) -> dict[str, Any]:
    """Run the engine and stop it as round ``round_number`` finishes, as a user's Ctrl-C
    would; returns the run's summary."""
    from kernel import events as ev

    async def stop(event: object) -> None:
        if isinstance(event, ev.RoundFinished) and event.round == round_number:
            engine.request_stop("test interruption")

    return run_watching(engine, stop)


def resume_to_end(out: Any) -> Any:
    """Resume the run in ``out`` and run it to its end; returns the resumed engine (closed) for
    the test to read its roles."""
    import asyncio

    from kernel.engine import Engine

    async def body() -> Any:
        again = Engine.resume(out)
        async with again:
            await again.run()
        return again

    return asyncio.run(body())
