"""structlog set-up: readable lines on the terminal, JSON lines in the run directory.

Secrets never reach either: every string value passes through ``redact`` first.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def redact(value: Any) -> Any:
    """Replace the password of any ``scheme://user:password@host`` inside strings, recursively."""
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


class _Tee:
    """Processor that appends each entry as a JSON line to its run's ``log.jsonl``.

    Entries are routed by the ``run_id`` bound in structlog's context variables, so several
    engines embedded in one process each keep their own log.
    """

    def __init__(self) -> None:
        self.files: dict[str, TextIO] = {}

    def __call__(self, logger: Any, name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        file = self.files.get(event_dict.get("run_id", ""))
        if file is not None:
            file.write(json.dumps(event_dict, default=str) + "\n")
            file.flush()
        return event_dict


_tee = _Tee()


def _redact_processor(logger: Any, name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return redact(event_dict)


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now, so a live progress display that redirects
    stderr gets log lines printed above its bars instead of through them."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog for this process (idempotent; safe to call again with a new level)."""
    stream = stream or _CurrentStderr()  # type: ignore[assignment]
    renderer: Any
    if stream.isatty():
        renderer = structlog.dev.ConsoleRenderer(colors=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_processor,
            _tee,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def ensure_configured(level: str = "info") -> None:
    """Configure Nitro's logging unless the embedding application configured structlog
    itself; either way, our tee processor must be present for ``log.jsonl``."""
    if not structlog.is_configured():
        configure(level)


def open_run_log(run_id: str, path: Path) -> None:
    close_run_log(run_id)
    _tee.files[run_id] = path.open("a", encoding="utf-8")


def close_run_log(run_id: str) -> None:
    file = _tee.files.pop(run_id, None)
    if file is not None:
        file.close()
