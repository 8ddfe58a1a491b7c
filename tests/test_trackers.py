"""The W&B and MLflow sinks: offline W&B and a local MLflow store, both read back; both
optional extras refused at validation, in one line, when the library is missing."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel.plan import load_plan
from kernel.roles import PluginContext
from kernel.schema import PlanError
from tests.test_sinks import feed, run_events

PLAN = {"run": {"name": "trk", "seed": 2}, "stop": {"max_rounds": 3},
        "env": {"id": "CartPole-v1", "num_envs": 4},
        "transport": {"kind": "redis", "url": "redis://:hunter2@localhost:6379/0"}}


def tracker_ctx(tmp_path: Path, name: str, config: dict[str, Any] | None = None
                ) -> PluginContext:
    raw = {k: v for k, v in PLAN.items() if k != "transport"}
    plan = load_plan({**raw, "sinks": [{"name": name, **(config or {})}]})
    plan["transport"]["url"] = PLAN["transport"]["url"]  # a secret the config must not show
    return PluginContext(name=name, config=plan["sinks"][0], plan=plan, run_id="run-abc",
                         run_dir=tmp_path, seed=2, bus=None)


@pytest.mark.parametrize(("sink", "module"), [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_missing_extra_is_one_line_at_validation(monkeypatch: pytest.MonkeyPatch, sink: str,
                                                 module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    raw = {k: v for k, v in PLAN.items() if k != "transport"}
    with pytest.raises(PlanError) as info:
        load_plan({**raw, "sinks": [{"name": "console"}, {"name": sink}]})
    message = str(info.value)
    assert message.startswith("sinks[1]") and "\n" not in message
    assert f"pip install 'nitro-rl[{sink}]'" in message


def wandb_records(run_dir: Path) -> list[Any]:
    """The records of W&B's offline run file (a LevelDB-style log of protobufs: a 7-byte
    ``:W&B`` header, then 32 KiB blocks of (crc, length, type) chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, chunk = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def test_wandb_offline_logs_rounds_and_the_plan(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    from plugins.sinks.wandb_run import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    asyncio.run(feed(WandbSink(tracker_ctx(tmp_path, "wandb")), run_events()))

    records = wandb_records(tmp_path)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_id == "run-abc" and run.display_name == "trk"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["env"]["id"] == "CartPole-v1" and config["run"]["seed"] == 2
    assert "hunter2" not in json.dumps(config)
    history = [{item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
                for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["env_steps"] for h in history] == [1000, 2000, 3000]
    assert history[0]["episode_return_mean"] == 21.0
    assert history[0]["env_steps_per_s"] == 2000.0 and history[1]["eval_return"] == 200.0
    assert history[0]["loss"] == 1.5 and history[2]["boost_score"] == 0.75


def test_mlflow_local_store_in_the_run_dir(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from plugins.sinks.mlflow_run import MlflowSink

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    sink = MlflowSink(tracker_ctx(tmp_path, "mlflow"))
    asyncio.run(feed(sink, run_events()))

    assert (tmp_path / "mlruns").is_dir()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("nitro").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "trk"
    assert run.data.params["env.id"] == "CartPole-v1" and run.data.params["run.seed"] == "2"
    assert "hunter2" not in json.dumps(run.data.params)
    assert run.data.tags["stop_reason"] == "max_rounds"
    returns = client.get_metric_history(run.info.run_id, "episode_return_mean")
    assert [(m.step, m.value) for m in returns] == [(1000, 21.0), (2000, 22.0), (3000, 23.0)]
    sps = client.get_metric_history(run.info.run_id, "env_steps_per_s")
    assert [m.value for m in sps] == [2000.0] * 3
    assert client.get_metric_history(run.info.run_id, "eval_return")[0].value == 200.0


def test_real_run_logs_to_both_trackers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from kernel import Engine

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    plan = {"run": {"name": "trk", "seed": 1}, "stop": {"max_rounds": 2},
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "actors": {"backend": "local", "count": 1, "steps": 32, "workers": 1},
            "probes": [{"name": "eval", "every": 2, "episodes": 1}],
            "sinks": [{"name": "wandb", "mode": "offline"}, {"name": "mlflow"}]}

    async def main() -> dict[str, Any]:
        async with Engine.from_plan(plan, out_dir=tmp_path) as engine:
            return await engine.run()

    assert asyncio.run(main())["stop_reason"] == "max_rounds"
    history = [r for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "history"]
    assert len(history) == 2
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("nitro").experiment_id])
    steps = client.get_metric_history(run.info.run_id, "env_steps")
    assert [m.value for m in steps] == [64.0, 128.0]
