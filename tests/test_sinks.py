"""Sinks: the console's two paths, CSV rows, TensorBoard scalars, and a real run through them."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from kernel import Engine
from kernel import events as ev
from kernel.roles import PluginContext, Receipt
from plugins.sinks.console import ConsoleSink, RunProgress, round_header, round_line
from plugins.sinks.csv_file import BASE_COLUMNS, CsvSink
from plugins.sinks.metrics import markdown_table
from plugins.sinks.tensorboard_file import TensorboardSink

PLAN_STOP = {"max_rounds": 3, "max_env_steps": 10_000, "budget_usd": 1.0, "target_return": 475.0}


def ctx(tmp_path: Path, config: dict[str, Any] | None = None) -> PluginContext:
    plan = {"stop": PLAN_STOP, "env": {"num_envs": 4}}
    return PluginContext(name="x", config=config or {}, plan=plan, run_id="r", run_dir=tmp_path,
                         seed=1, bus=None)


def round_events(number: int, t0: float) -> list[ev.Event]:
    """What the coordinator publishes for one round, in its order."""
    eval_return = 100.0 * number if number % 2 == 0 else None
    probes = {"hessian_ratio": 0.5 * number, "gns": 3.0}
    if eval_return is not None:
        probes |= {"eval_return": eval_return, "eval_return_min": eval_return - 10,
                   "eval_return_max": eval_return + 10}
    return [
        ev.RoundStarted(ts=t0 + number, round=number, actors=2, version=number),
        ev.InvocationFinished(ts=t0 + number, round=number,
                              receipt=Receipt(request_id="a0", ok=True)),
        ev.InvocationFinished(ts=t0 + number, round=number,
                              receipt=Receipt(request_id="a1", ok=True)),
        ev.CostCharged(ts=t0 + number, round=number, items={"actors_usd": 0.01},
                       round_usd=0.01, total_usd=0.01 * number),
        ev.ScaleDecided(ts=t0 + number, round=number, previous=2, actors=3, scaler="nitro",
                        detail={"score": 0.25 * number}),
        ev.RoundFinished(
            ts=t0 + number + 0.5, round=number, actors=2, batches=2, env_steps=1000 * number,
            round_env_steps=1000, episodes=7, episode_return_mean=20.0 + number,
            eval_return=eval_return, round_s=0.5, actor_s=0.3, learner_s=0.1, probe_s=0.1,
            wall_s=0.0, cost_usd=0.01 * number, sim_time_s=0.5 * number, probes=probes,
            metrics={"loss": 1.5, "pg_loss": -0.1, "entropy": 0.69},
        ),
    ]


def run_events() -> list[ev.Event]:
    t0 = 1_000.0
    events: list[ev.Event] = [ev.RunStarted(ts=t0, run_id="r", name="t", run_dir="d")]
    for number in (1, 2, 3):
        events += round_events(number, t0)
    events.append(ev.RunStopped(ts=t0 + 4, reason="max_rounds", rounds=3, env_steps=3000,
                                wall_s=4.0))
    return events


async def feed(sink: Any, events: list[ev.Event]) -> None:
    start = getattr(sink, "start", None)
    if start is not None:
        await start(None)
    for event in events:
        await sink.handle(event)
    sink.flush()
    await sink.close()


def test_progress_counts_actors_in_flight_and_best_eval() -> None:
    progress = RunProgress.from_plan({"stop": PLAN_STOP})
    events = run_events()
    progress.observe(events[0])
    progress.observe(events[1])  # RoundStarted with 2 actors
    assert (progress.actors, progress.in_flight) == (2, 2)
    progress.observe(events[2])
    assert progress.in_flight == 1
    for event in events[3:]:
        progress.observe(event)
    assert progress.in_flight == 0
    assert progress.round == 3 and progress.env_steps == 3000
    assert progress.last_eval == 200.0 and progress.best_eval == 200.0
    assert progress.stopped == "max_rounds"


def test_console_plain_lines_when_not_a_terminal(tmp_path: Path) -> None:
    stream = io.StringIO()
    sink = ConsoleSink(ctx(tmp_path), stream=stream)
    assert not sink.live_mode
    asyncio.run(feed(sink, run_events()))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[0].split() == ["round", "actors", "steps", "return", "len", "eval", "sps",
                                "cost", "wall"]
    # round 1: 1,000 steps in 0.5 s (the engine left env_steps_per_s unset) and no eval.
    assert lines[1].split() == ["1/3", "2", "1,000", "21.0", "-", "-", "2,000", "$0.0100",
                                "1.5s"]
    assert lines[2].split()[5] == "200.0" and lines[2].split()[-1] == "2.5s"
    assert lines[4] == "stopped: max_rounds after 3 rounds, 3,000 env steps, 4.0s"


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_live_display_on_a_terminal(tmp_path: Path) -> None:
    stream = FakeTty()
    sink = ConsoleSink(ctx(tmp_path), stream=stream)
    assert sink.live_mode
    asyncio.run(feed(sink, run_events()))
    out = stream.getvalue()
    # The display shows limits and the budget; no round lines scroll above it.
    assert "3 / 3" in out and "return" not in out.split("stopped:")[0].splitlines()[0]
    assert round_header() not in out and "$0.0300 " not in out.replace("$0.0300 /", "")
    assert "3,000 / 10,000" in out
    assert "$0.0300 / $1.00" in out
    assert "best 200.0" in out and "target 475" in out
    assert out.rstrip().endswith("stopped: max_rounds after 3 rounds, 3,000 env steps, 4.0s")


def test_live_display_shows_each_round_as_it_finishes(tmp_path: Path) -> None:
    """Rounds of a small env end faster than the display's refresh period: the panel must
    show the round just finished, not the one the refresh thread last saw."""
    stream = FakeTty()
    sink = ConsoleSink(ctx(tmp_path), stream=stream)

    async def two_rounds() -> str:
        await sink.start(None)  # type: ignore[arg-type]
        events = run_events()
        for event in events[:1 + 2 * 6]:  # RunStarted, then rounds 1 and 2
            await sink.handle(event)
        shown = stream.getvalue()
        await sink.close()
        return shown

    shown = asyncio.run(two_rounds())
    assert "2 / 3" in shown and "2,000 / 10,000" in shown


def test_round_line_fits_80_columns_and_shows_sps_and_length() -> None:
    progress = RunProgress.from_plan({"stop": {"max_rounds": 9999}})
    progress.observe(ev.RunStarted(ts=0.0, run_id="r", name="t", run_dir="d"))
    worst = ev.RoundFinished(
        ts=11 * 3600.0, round=9999, actors=9999, batches=9999, env_steps=999_990_000,
        round_env_steps=10_000_000, episodes=5, episode_return_mean=-12345.6,
        eval_return=-999.94, round_s=3.0, actor_s=1.0, learner_s=1.0, probe_s=1.0, wall_s=0.0,
        cost_usd=999.99, sim_time_s=3.0, env_steps_per_s=999_999.0,
        episode_length_mean=27_000.0)
    line = round_line(worst, progress)
    assert len(line) <= 79 and len(round_header()) <= 79
    assert line.split() == ["9999/9999", "9999", "999.99M", "-12346", "27000", "-999.9",
                            "1.00M", "$999.99", "11h00m"]
    typical = ev.RoundFinished(
        ts=12.0, round=7, actors=4, batches=4, env_steps=14_336, round_env_steps=2048,
        episodes=90, episode_return_mean=22.4, eval_return=None, round_s=0.4, actor_s=0.2,
        learner_s=0.1, probe_s=0.0, wall_s=0.0, cost_usd=0.0025, sim_time_s=0.4,
        env_steps_per_s=5120.0, episode_length_mean=22.4)
    assert round_line(typical, progress).split() == [
        "7/9999", "4", "14.3k", "22.4", "22.4", "-", "5,120", "$0.0025", "12.0s"]


def test_console_plain_forced_on_a_terminal(tmp_path: Path) -> None:
    sink = ConsoleSink(ctx(tmp_path, {"progress": "plain"}), stream=FakeTty())
    assert not sink.live_mode


def test_csv_one_row_per_round_with_prototype_columns(tmp_path: Path) -> None:
    sink = CsvSink(ctx(tmp_path, {"columns": ["entropy", "score"]}))
    asyncio.run(feed(sink, run_events()))
    rows = list(csv.DictReader((tmp_path / "rounds.csv").open(encoding="utf-8")))
    assert len(rows) == 3
    assert list(rows[0]) == [name for name, _, _ in BASE_COLUMNS] + ["entropy", "score"]
    first, second = rows[0], rows[1]
    assert first["round"] == "1" and first["actors"] == "2" and first["envs_per_actor"] == "4"
    assert first["eval_return"] == "" and second["eval_return"] == "200.0"
    assert second["eval_return_min"] == "190.0" and second["eval_return_max"] == "210.0"
    assert float(second["hessian_ratio"]) == 1.0 and float(second["boost_score"]) == 0.5
    assert float(first["gns"]) == 3.0 and float(first["loss"]) == 1.5
    assert float(first["round_cost_usd"]) == 0.01 and first["next_actors"] == "3"
    assert float(second["wall_s"]) == 2.5 and float(first["entropy"]) == 0.69
    assert float(second["score"]) == 0.5


def test_csv_appends_without_a_second_header(tmp_path: Path) -> None:
    for _ in range(2):
        asyncio.run(feed(CsvSink(ctx(tmp_path)), run_events()))
    lines = (tmp_path / "rounds.csv").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 7 and lines[0].startswith("round,round_s,actors")


def read_scalars_raw(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Parse the event files with tensorboardX's own protobufs (no tensorboard package)."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            record = data[pos + 12:pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event()
            event.ParseFromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_scalars_per_round(tmp_path: Path) -> None:
    sink = TensorboardSink(ctx(tmp_path))
    asyncio.run(feed(sink, run_events()))
    scalars = read_scalars_raw(tmp_path / "tensorboard")
    assert scalars["eval/eval_return"] == [(2000, 200.0)]
    assert [step for step, _ in scalars["fanout/actors"]] == [1000, 2000, 3000]
    assert scalars["fanout/boost_score"][-1] == (3000, 0.75)
    assert scalars["probes/hessian_ratio"][0] == (1000, 0.5)
    assert scalars["learner/loss"][0] == (1000, 1.5)
    assert scalars["cost/round_cost_usd"][0][1] == pytest.approx(0.01)
    assert scalars["time/wall_s"][1] == (2000, 2.5)
    for tag in ("learner/entropy", "time/learner_s", "cost/cost_usd", "fanout/next_actors",
                "rollout/episode_return_mean", "probes/gns"):
        assert tag in scalars


def _run_with_all_sinks(out: Path) -> dict[str, Any]:
    plan = {
        "run": {"name": "sinks", "seed": 3},
        "stop": {"max_rounds": 3},
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "algo": {"name": "ppo"},
        "actors": {"backend": "local", "count": 2, "steps": 32, "workers": 2},
        "probes": [{"name": "eval", "every": 2, "episodes": 2}],
        "sinks": [{"name": "console", "progress": "plain"}, {"name": "csv"},
                  {"name": "tensorboard"}, {"name": "jsonl", "events": ["*"]}],
    }

    async def main() -> dict[str, Any]:
        async with Engine.from_plan(plan, out_dir=out) as engine:
            return await engine.run()

    return asyncio.run(main())


def test_real_run_writes_every_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _run_with_all_sinks(tmp_path)
    assert summary["stop_reason"] == "max_rounds"
    rows = list(csv.DictReader((tmp_path / "rounds.csv").open(encoding="utf-8")))
    assert [r["round"] for r in rows] == ["1", "2", "3"]
    assert rows[1]["eval_return"] != "" and rows[0]["actors"] == "2"
    scalars = read_scalars_raw(tmp_path / "tensorboard")
    assert len(scalars["fanout/actors"]) == 3 and len(scalars["eval/eval_return"]) == 1
    lines = [json.loads(line) for line in (tmp_path / "rounds.jsonl").open(encoding="utf-8")]
    assert {"RunStarted", "RoundFinished", "RunStopped"} <= {line["event"] for line in lines}
    out = capsys.readouterr().out
    assert "    3/3  " in out and "stopped: max_rounds after 3 rounds" in out


@pytest.mark.parametrize(("style", "tags"), [
    ("sb3", {"rollout/ep_rew_mean": 21.0, "rollout/ep_len_mean": 30.0, "time/fps": 2000.0,
             "eval/mean_reward": None, "train/entropy_loss": -0.69, "train/loss": 1.5,
             "time/total_timesteps": 1000.0}),
    ("cleanrl", {"charts/episodic_return": 21.0, "charts/episodic_length": 30.0,
                 "charts/SPS": 2000.0, "losses/entropy": 0.69, "losses/policy_loss": -0.1}),
    ("nitro", {"rollout/episode_return_mean": 21.0, "rollout/episode_length_mean": 30.0,
               "time/env_steps_per_s": 2000.0, "learner/entropy": 0.69}),
])
def test_tensorboard_tag_styles(tmp_path: Path, style: str, tags: dict[str, float | None]
                                ) -> None:
    """Dashboards made for SB3 or CleanRL read our runs; ``train/`` never holds returns."""
    events = run_events()
    first = next(e for e in events if isinstance(e, ev.RoundFinished))
    events[events.index(first)] = dataclasses.replace(first, episode_length_mean=30.0)
    asyncio.run(feed(TensorboardSink(ctx(tmp_path, {"tag_style": style})), events))
    scalars = read_scalars_raw(tmp_path / "tensorboard")
    for tag, value in tags.items():
        assert tag in scalars, (tag, sorted(scalars))
        if value is not None:
            assert scalars[tag][0] == (1000, pytest.approx(value)), tag
    assert not any(t.startswith("train/") and "ep_" in t for t in scalars)
    assert "train/episode_return_mean" not in scalars
    if style == "sb3":
        assert scalars["eval/mean_reward"] == [(2000, 200.0)]


def test_csv_names_match_events_and_carry_sps(tmp_path: Path) -> None:
    events = run_events()
    first = next(e for e in events if isinstance(e, ev.RoundFinished))
    events[events.index(first)] = dataclasses.replace(first, env_steps_per_s=1234.5,
                                                      episode_length_mean=30.0)
    asyncio.run(feed(CsvSink(ctx(tmp_path)), events))
    rows = list(csv.DictReader((tmp_path / "rounds.csv").open(encoding="utf-8")))
    # The engine's figure where it gave one, the round's own steps / seconds otherwise.
    assert [r["env_steps_per_s"] for r in rows] == ["1234.5", "2000.0", "2000.0"]
    assert rows[0]["episode_length_mean"] == "30.0" and rows[1]["episode_length_mean"] == ""
    fields = set(ev.RoundFinished.__dataclass_fields__)
    assert {"episode_return_mean", "eval_return", "round_s"} <= set(rows[0]) & fields


def test_csv_resumed_file_keeps_its_header(tmp_path: Path) -> None:
    """A run resumed on a file written with other columns lines its rows up with them."""
    (tmp_path / "rounds.csv").write_text("round,train_return_mean,actors\n1,5.0,2\n")
    asyncio.run(feed(CsvSink(ctx(tmp_path)), run_events()))
    rows = list(csv.DictReader((tmp_path / "rounds.csv").open(encoding="utf-8")))
    assert [r["round"] for r in rows] == ["1", "1", "2", "3"]
    assert rows[1] == {"round": "1", "train_return_mean": "", "actors": "2"}


def test_metrics_doc_lists_every_name() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert markdown_table() in doc
