"""IMPALA and APPO learn CartPole through the engine (local actors, in-process coordinator).

Seeded and CI-sized: both reach an eval return of 475 in about 15-25k env steps here; the
budget leaves a wide margin because local worker scheduling makes runs not bit-reproducible.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernel.engine import Engine

PLAN = Path(__file__).resolve().parent.parent / "plans" / "cartpole-impala.toml"


def run(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    base = {
        "stop.max_env_steps": 150_000,
        "actors.workers": 1,
        "checkpoint.enabled": False,
        "sinks": [],
    }
    engine = Engine.from_plan(PLAN, overrides={**base, **overrides}, out_dir=tmp_path)
    return asyncio.run(engine.run())


@pytest.mark.parametrize(
    "algo",
    [{"algo.name": "impala"}, {"algo.name": "appo", "algo.update_epochs": 4}],
    ids=["impala", "appo"],
)
def test_cartpole_learns(tmp_path: Path, algo: dict[str, Any]) -> None:
    summary = run(tmp_path, **algo)
    assert summary["invocation_errors"] == 0
    assert summary["best_eval_return"] is not None
    assert summary["best_eval_return"] >= 400, summary
