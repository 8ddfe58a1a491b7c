"""Embedding Nitro: two CartPole runs in one asyncio application, one cancelled early.

    python examples/embed.py [--out DIR]

Each run is an ``Engine``; ``engine.events()`` streams its facts (here: eval returns as they
are measured) while ``engine.run()`` trains. Cancelling the task that runs an engine stops it
cleanly: the fan-out is interrupted, plugins close, and ``summary.json`` is still written,
with ``stop_reason = "cancelled"``.

The ``__main__`` guard matters: the local actor backend starts worker processes, which import
the main module again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from kernel import Engine
from kernel import events as ev


def cartpole_plan(name: str, seed: int, max_rounds: int) -> dict[str, Any]:
    return {
        "run": {"name": name, "seed": seed},
        "stop": {"max_rounds": max_rounds},
        "env": {"id": "CartPole-v1", "num_envs": 4},
        "algo": {"name": "ppo", "learning_rate": 2.5e-4},
        "actors": {"backend": "local", "count": 1, "steps": 128, "workers": 1},
        "probes": [{"name": "eval", "every": 2, "episodes": 5}],
        "sinks": [],  # this application shows what it wants itself
    }


async def watch(label: str, engine: Engine, first_eval: asyncio.Event | None = None) -> None:
    """Print eval returns as rounds finish; ``events()`` ends when the run stops."""
    async for event in engine.events(types=(ev.RoundFinished, ev.RunStopped)):
        if isinstance(event, ev.RoundFinished) and event.eval_return is not None:
            print(f"[{label}] round {event.round:>3}  env steps {event.env_steps:>6,}"
                  f"  eval return {event.eval_return:6.1f}", flush=True)
            if first_eval is not None:
                first_eval.set()
        elif isinstance(event, ev.RunStopped):
            print(f"[{label}] stopped: {event.reason} after {event.rounds} rounds", flush=True)


async def train(label: str, engine: Engine, first_eval: asyncio.Event | None = None
                ) -> dict[str, Any]:
    async with engine:  # starts the plugins (worker processes, transport...)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(watch(label, engine, first_eval))
            return await engine.run()


async def main(out: Path) -> None:
    full = Engine.from_plan(cartpole_plan("full", seed=1, max_rounds=12), out_dir=out / "full")
    short = Engine.from_plan(cartpole_plan("cut", seed=2, max_rounds=1000), out_dir=out / "cut")
    cut_after_first_eval = asyncio.Event()

    full_task = asyncio.create_task(train("full", full))
    cut_task = asyncio.create_task(train("cut ", short, cut_after_first_eval))

    await cut_after_first_eval.wait()
    cut_task.cancel()  # the application changed its mind: stop that run now
    try:
        await cut_task
    except asyncio.CancelledError:
        pass
    summary = await full_task

    print(f"full: {summary['stop_reason']}, {summary['rounds']} rounds, "
          f"best eval {summary['best_eval_return']}")
    cut = json.loads((out / "cut" / "summary.json").read_text(encoding="utf-8"))
    print(f"cut:  {cut['stop_reason']}, {cut['rounds']} rounds, summary at {out / 'cut'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the two runs (default: a temp dir)")
    args = parser.parse_args()
    asyncio.run(main(args.out or Path(tempfile.mkdtemp(prefix="nitro-embed-"))))
