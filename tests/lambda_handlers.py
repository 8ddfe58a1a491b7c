"""Tiny Lambda handlers for the endpoint and backend tests (``--handler tests.lambda_handlers:X``).

``dispatch`` picks by ``event["op"]`` so one endpoint serves every case: ``echo``, ``boom``
(raises), ``sleep`` (``seconds``). Each returns a receipt shaped like the actor function's, so
the ``lambda`` backend can parse it.
"""

from __future__ import annotations

import os
import time
from typing import Any

_calls = 0


def _receipt(event: dict[str, Any], context: Any, t0: float, **extra: Any) -> dict[str, Any]:
    global _calls
    _calls += 1
    return {
        "request_id": event.get("request_id", context.aws_request_id),
        "version": int(event.get("version", 0)),
        "env_steps": int(event.get("env_steps", 1)),
        "episodes": 0,
        "duration_ms": (time.perf_counter() - t0) * 1000,
        "cold_start": _calls == 1,
        "pid": os.getpid(),
        "aws_request_id": context.aws_request_id,
        **extra,
    }


def echo(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _receipt(event, context, time.perf_counter(), echoed=event,
                    remaining_ms=context.get_remaining_time_in_millis(),
                    env={"NITRO_TEST_MARK": os.environ.get("NITRO_TEST_MARK")})


def boom(event: dict[str, Any], context: Any) -> dict[str, Any]:
    raise ValueError(event.get("message", "boom"))


def sleep(event: dict[str, Any], context: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    time.sleep(float(event.get("seconds", 0.5)))
    return _receipt(event, context, t0)


def slow_init() -> None:
    """A worker initializer that takes ``NITRO_TEST_INIT_S`` seconds (a heavy import)."""
    time.sleep(float(os.environ.get("NITRO_TEST_INIT_S", "0")))


def dispatch(event: dict[str, Any], context: Any) -> dict[str, Any]:
    op = event.get("op", "echo")
    handlers = {"echo": echo, "boom": boom, "sleep": sleep}
    if op not in handlers:
        raise KeyError(f"unknown op {op!r}")
    return handlers[op](event, context)


class Endpoint:
    """``python -m plugins.function.endpoint`` as a real subprocess on a free port (test helper;
    stdlib only, so workers importing this module stay light)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.port = self._free_port()
        self.args = args
        self.env = env or {}
        self.proc: Any = None

    @staticmethod
    def _free_port() -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60, attempts: int = 3) -> Endpoint:
        """Start and return once this endpoint (not another on the same port) is ready: its
        own log says so. The suite's parallel workers each look for free ports, so the one
        found can be taken before the endpoint binds it; it then exits, and the start moves
        to a fresh port."""
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        root = Path(__file__).resolve().parents[1]
        # A file, not a pipe: nobody drains a pipe while the test runs, and a full one blocks.
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "plugins.function.endpoint", "--port", str(self.port),
             *self.args],
            cwd=root, env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL, stderr=self._log,
        )
        started = time.monotonic()
        while time.monotonic() < started + timeout:
            if self.proc.poll() is not None:
                text = self.log()
                if "already in use" in text and attempts > 1:
                    self.port = self._free_port()
                    left = timeout - (time.monotonic() - started)
                    return self.start(left, attempts - 1)
                raise RuntimeError(f"endpoint exited: {text[-2000:]}")
            if "lambda_endpoint_ready" in self.log():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("endpoint did not start")

    def stats(self) -> dict[str, Any]:
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/_nitro/stats", timeout=10) as reply:
            return json.loads(reply.read())

    def stop(self) -> int | None:
        import signal
        import subprocess

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        code = self.proc.returncode
        self.proc = None
        return code

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")
