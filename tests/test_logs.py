"""Redaction of every URL form of a password, and logging inside an application that set up
structlog itself."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from kernel.logs import redact
from tests.conftest import PYTHON, ROOT

SECRET = "pw-Q7z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
        (f"rediss://user:{SECRET}@h:6380/1", "rediss://user:***@h:6380/1"),
        (f"redis://h:6379/0?password={SECRET}", "redis://h:6379/0?password=***"),
        (f"redis://h/0?db=0&password={SECRET}&x=1", "redis://h/0?db=0&password=***&x=1"),
        (f"unix:///tmp/r.sock?db=2&password={SECRET}", "unix:///tmp/r.sock?db=2&password=***"),
        (f"unix://u:{SECRET}@/tmp/r.sock", "unix://u:***@/tmp/r.sock"),
        # An unencoded '@' in the password: URL parsers take the host after the last '@'.
        (f"redis://:{SECRET}@more@h:6379/0", "redis://:***@h:6379/0"),
        (f"connect to redis://:{SECRET}@h:1/0 failed", "connect to redis://:***@h:1/0 failed"),
        ("redis://user@h:1/0", "redis://user@h:1/0"),
    ],
)
def test_every_url_form_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert SECRET not in redact({"transport": {"url": text}, "list": [text]})["list"][0]


def test_secret_named_keys_are_redacted() -> None:
    assert redact({"password": SECRET, "redis_secret": SECRET, "n": 1}) == {
        "password": "***", "redis_secret": "***", "n": 1}


EMBEDDED = textwrap.dedent("""
    import asyncio, io, sys
    import structlog

    out = io.StringIO()
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(out),
    )
    from kernel.engine import Engine

    engine = Engine.from_plan(sys.argv[1], {"stop.max_rounds": 1, "probes": [], "sinks": [],
                                            "actors.steps": 16}, out_dir=sys.argv[2])

    async def main():
        async with engine:
            structlog.contextvars.bind_contextvars(run_id=engine.run_id)
            structlog.get_logger("app").info("app_line", url=sys.argv[3])
            await engine.run()

    asyncio.run(main())
    sys.stdout.write(out.getvalue())
""")


def test_a_run_inside_an_app_that_configured_structlog_writes_a_redacted_log(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    url = f"redis://:{SECRET}@127.0.0.1:1/0?password={SECRET}"
    proc = subprocess.run([PYTHON, "-c", EMBEDDED, str(ROOT / "plans" / "cartpole.toml"),
                           str(out), url], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    events = {line["event"] for line in lines}
    assert {"run_started", "app_line"} <= events, events
    # The app's own renderer still runs, after our redaction.
    app_lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert any(line["event"] == "run_started" for line in app_lines)
    assert SECRET not in proc.stdout + proc.stderr
    assert SECRET not in (out / "log.jsonl").read_text()
    assert any(line.get("url") == "redis://:***@127.0.0.1:1/0?password=***" for line in lines)
