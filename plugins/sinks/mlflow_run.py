"""The ``mlflow`` sink: rounds as MLflow metrics, the plan as parameters and an artifact.

An optional extra (``pip install 'nitro-rl[mlflow]'``; ``mlflow-skinny`` is enough): the plan is
refused at validation when the library is missing. By default the run goes to a local file
store under ``<run_dir>/mlruns`` (``mlflow ui --backend-store-uri <run_dir>/mlruns`` shows it);
``tracking_uri`` points at a server or database instead. MLflow 3 keeps its file store only for
callers who opt in with ``MLFLOW_ALLOW_FILE_STORE``; this sink opts in for its own default
store and for nothing else.

Metrics use the keys every other sink uses (docs/metrics.md), stepped by ``env_steps``. The
client makes blocking calls (file writes or HTTP), so each runs in a thread.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kernel import events as ev
from kernel import logs
from kernel.roles import PluginContext
from plugins.sinks.metrics import TrackerSink, require_extra

#: MLflow accepts at most 100 parameters per ``log_batch`` call.
_PARAMS_PER_BATCH = 100


def check(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan validation: the library is installed."""
    require_extra("mlflow", "mlflow")


def flatten(plan: Any, prefix: str = "") -> dict[str, str]:
    """``{"env.id": "CartPole-v1", "probes.0.name": "eval", ...}``: MLflow parameters are flat
    strings."""
    if isinstance(plan, dict):
        items: list[tuple[str, Any]] = list(plan.items())
    elif isinstance(plan, list) and any(isinstance(v, (dict, list)) for v in plan):
        items = [(str(i), v) for i, v in enumerate(plan)]
    else:
        return {prefix: str(plan)} if prefix else {}
    out: dict[str, str] = {}
    for key, value in items:
        if value is not None:
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


class MlflowSink(TrackerSink):
    def __init__(self, ctx: PluginContext):
        check(ctx.config, ctx.plan)
        super().__init__(ctx)
        self.client: Any = None
        self.mlflow_run_id: str | None = None

    @property
    def tracking_uri(self) -> str:
        return self.config["tracking_uri"] or (self.run_dir / "mlruns").resolve().as_uri()

    async def start(self, ctx: PluginContext) -> None:
        await asyncio.to_thread(self._start_run)

    def _start_run(self) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        if not self.config["tracking_uri"]:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=self.tracking_uri)
        name = self.config["experiment"]
        experiment = client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(name))
        run_name = self.plan["run"]["name"]
        run = client.create_run(experiment_id, run_name=run_name,
                                tags={"nitro.run_id": self.run_id})
        self.mlflow_run_id = run.info.run_id
        plan = logs.redact(self.plan)
        params = [Param(k, v[:6000]) for k, v in flatten(plan).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            client.log_batch(self.mlflow_run_id, params=params[i:i + _PARAMS_PER_BATCH])
        client.log_dict(self.mlflow_run_id, plan, "plan.json")
        self.client = client

    async def handle(self, event: Any) -> None:
        if self.client is None:
            return
        values = self.rows.feed(event)
        if values is not None:
            await asyncio.to_thread(self._log_round, values, event.env_steps, event.ts)
        elif isinstance(event, ev.RunStopped):
            self._stop_reason = event.reason
            await asyncio.to_thread(self.client.set_tag, self.mlflow_run_id, "stop_reason",
                                    event.reason)

    def _log_round(self, values: dict[str, float], step: int, ts: float) -> None:
        from mlflow.entities import Metric

        stamp = int(ts * 1000)
        self.client.log_batch(self.mlflow_run_id,
                              metrics=[Metric(k, v, stamp, step) for k, v in values.items()])

    def flush(self) -> None:
        """Every round is written when it is logged."""

    async def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            status = "FAILED" if (self._stop_reason or "").startswith("error") else "FINISHED"
            await asyncio.to_thread(client.set_terminated, self.mlflow_run_id, status)
