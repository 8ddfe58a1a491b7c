"""Embedding the engine in an application's event loop: concurrency, events, cancellation."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernel import Engine
from kernel import events as ev

ROOT = Path(__file__).resolve().parents[1]


def plan(name: str, seed: int, max_rounds: int) -> dict[str, Any]:
    return {
        "run": {"name": name, "seed": seed},
        "stop": {"max_rounds": max_rounds},
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "algo": {"name": "ppo"},
        "actors": {"backend": "local", "count": 1, "steps": 32, "workers": 1},
        "probes": [{"name": "eval", "every": 1, "episodes": 2}],
        "sinks": [],
    }


async def run_collecting(engine: Engine) -> tuple[dict[str, Any], list[ev.Event]]:
    seen: list[ev.Event] = []

    async def collect() -> None:
        async for event in engine.events():
            seen.append(event)

    async with engine:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(collect())
            summary = await engine.run()
    return summary, seen


def test_two_runs_concurrently_in_one_loop(tmp_path: Path) -> None:
    async def main() -> list[tuple[dict[str, Any], list[ev.Event]]]:
        engines = [Engine.from_plan(plan(f"emb{i}", seed=i, max_rounds=3),
                                    out_dir=tmp_path / f"run{i}") for i in (1, 2)]
        return list(await asyncio.gather(*(run_collecting(e) for e in engines)))

    results = asyncio.run(main())
    for i, (summary, seen) in zip((1, 2), results, strict=True):
        assert summary["stop_reason"] == "max_rounds" and summary["rounds"] == 3
        on_disk = json.loads((tmp_path / f"run{i}" / "summary.json").read_text())
        assert on_disk["run_id"] == summary["run_id"] and on_disk["name"] == f"emb{i}"
        rounds = [e for e in seen if isinstance(e, ev.RoundFinished)]
        assert [e.round for e in rounds] == [1, 2, 3]
        assert all(e.eval_return is not None for e in rounds)
        assert isinstance(seen[-1], ev.RunStopped)
    # Two engines, two run ids: nothing leaked from one run into the other.
    assert results[0][0]["run_id"] != results[1][0]["run_id"]


def test_cancelling_a_running_engine_stops_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "cut"

    async def main() -> tuple[bool, list[ev.Event]]:
        engine = Engine.from_plan(plan("cut", seed=3, max_rounds=10_000), out_dir=out)
        first_round = asyncio.Event()
        seen: list[ev.Event] = []

        async def watch() -> None:
            async for event in engine.events(types=(ev.RoundFinished,)):
                seen.append(event)
                first_round.set()

        async def train() -> dict[str, Any]:
            async with engine:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(watch())
                    return await engine.run()

        task = asyncio.create_task(train())
        await asyncio.wait_for(first_round.wait(), 120)
        task.cancel()
        cancelled = False
        try:
            await asyncio.wait_for(task, 60)
        except asyncio.CancelledError:
            cancelled = True
        return cancelled, seen

    cancelled, seen = asyncio.run(main())
    assert cancelled
    assert seen and isinstance(seen[0], ev.RoundFinished)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "cancelled"
    assert 1 <= summary["rounds"] < 10_000
    journal = [json.loads(line) for line in (out / "events.jsonl").open()]
    assert journal[-1]["event"] == "RunStopped" and journal[-1]["reason"] == "cancelled"


def test_embed_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "examples/embed.py", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cut:  cancelled" in proc.stdout and "full: max_rounds, 12 rounds" in proc.stdout
