"""structlog set-up: readable lines on the terminal, JSON lines in the run directory.

Secrets never reach either: every string value passes through ``redact`` first. An
application that configured structlog itself keeps its processors and renderer; Nitro adds
its redaction and its ``log.jsonl`` writer just before the renderer.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

from kernel import events as ev

#: ``scheme://userinfo@``: the user info runs to the *last* ``@`` before the path, so a
#: password with an unencoded ``@`` is covered whole (the way URL parsers read it).
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/?#]*)@")
#: ``?password=...`` / ``&password=...``: redis-py reads a password from the query too.
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&;]password=)[^&#\s'\"]*", re.IGNORECASE)
_SECRET_KEYS = re.compile(r"password|secret", re.IGNORECASE)
PLACEHOLDER = "***"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def _redact_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match["userinfo"].partition(":")
    return f"{match['scheme']}{user}:{PLACEHOLDER}@" if colon else match[0]


def redact(value: Any) -> Any:
    """Replace every password inside strings, recursively: the user info of any
    ``scheme://user:password@host``, a ``password=`` query argument, and the value of a map
    key that names a password or secret."""
    if isinstance(value, str):
        value = _URL_USERINFO.sub(_redact_userinfo, value)
        return _QUERY_PASSWORD.sub(lambda m: f"{m['key']}{PLACEHOLDER}", value)
    if isinstance(value, dict):
        return {k: PLACEHOLDER if isinstance(k, str) and _SECRET_KEYS.search(k) and
                isinstance(v, str) and v else redact(v) for k, v in value.items()}
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
        # An application's own processor chain may not merge context variables: look there too.
        run_id = event_dict.get("run_id") or structlog.contextvars.get_contextvars().get(
            "run_id", "")
        file = self.files.get(run_id)
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
    itself. Then its chain is kept, but our redaction and ``log.jsonl`` writer go in just
    before its last processor (the renderer), so its output is redacted too."""
    if not structlog.is_configured():
        configure(level)
        return
    processors = list(structlog.get_config()["processors"])
    if _tee in processors:
        return
    ours = [_redact_processor, _tee]
    if processors and _redact_processor in processors:
        ours = [_tee]
    position = max(0, len(processors) - 1)
    structlog.configure(processors=processors[:position] + ours + processors[position:])


def open_run_log(run_id: str, path: Path) -> None:
    close_run_log(run_id)
    _tee.files[run_id] = path.open("a", encoding="utf-8")


def close_run_log(run_id: str) -> None:
    file = _tee.files.pop(run_id, None)
    if file is not None:
        file.close()


class FirstErrors:
    """The first failure of each kind goes to the terminal, not only to the journal: a run
    whose every invocation fails the same way says why once, not a thousand times."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def note(self, event: Any) -> None:
        """Print ``event`` if it is the first failed invocation or dropped batch of its kind."""
        if isinstance(event, ev.InvocationFinished) and not event.receipt.ok:
            error = event.receipt.error or "unknown error"
            key = ("invocation_error", error.split(":", 1)[0].strip())
            fields = {"request_id": event.receipt.request_id, "error": error[:500]}
        elif isinstance(event, ev.BatchDropped):
            key = ("batch_dropped", event.reason)
            fields = {"request_id": event.request_id, "version": event.version}
        else:
            return
        if key in self._seen:
            return
        self._seen.add(key)
        structlog.get_logger("kernel.engine").warning(
            f"first_{key[0]}", kind=key[1], round=event.round, **fields,
            later="counted in summary.json, not printed")
