"""Failures a user sees in the terminal, quickly: a Lambda plan with no endpoint running fails
before round 1 with a one-line hint, and the first error of each kind is printed once (not only
in events.jsonl), however often it repeats."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, RedisServer, closed_port, run_cli

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
LAMBDA_PLAN = str(ROOT / "plans" / "cartpole-lambda-local.toml")


@pytest.mark.redis
def test_a_lambda_plan_with_no_endpoint_fails_in_seconds_with_the_hint(
        redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with closed_port() as port:  # nobody listens there
        t0 = time.monotonic()
        result = run_cli("run", LAMBDA_PLAN, "--out", str(out),
                         "--set", f'actors.endpoint_url="http://127.0.0.1:{port}"',
                         "--set", f'transport.url="{redis_server.url}"', timeout=120)
        took = time.monotonic() - t0
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nitro: ") and "is `nitro lambda serve` running?" in last, last
    assert f"127.0.0.1:{port}" in last
    # Imports and start-up, then a preflight that gives up within 5 s: not 60 s of retries
    # (the bound is loose for a busy 2-core machine; the preflight's own 5 s limit is tested
    # in tests/test_lambda_backend.py).
    assert took < 40, took
    journal = [json.loads(line) for line in (out / "events.jsonl").open()]
    assert not any(e["event"] == "RoundStarted" for e in journal)  # nothing ran or was billed


def test_the_first_error_of_each_kind_is_printed_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli("run", CARTPOLE, "--out", str(out),
                     "--set", "actors.handler=tests.fault_handlers:faulty",
                     "--set", 'run.mode="sync"', "--set", "probes=[]",
                     "--set", "actors.count=2", "--set", "stop.max_rounds=3",
                     "--set", "actors.steps=16",
                     env={"NITRO_FAULT": json.dumps({"mode": "raise", "actors": [0]})},
                     timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["invocation_errors"] == 3
    printed = [line for line in result.stderr.splitlines() if "first_invocation_error" in line]
    assert len(printed) == 1, result.stderr[-3000:]
    assert "RuntimeError" in printed[0] and "injected handler failure" in printed[0]
