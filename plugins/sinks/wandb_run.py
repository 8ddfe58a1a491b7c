"""The ``wandb`` sink: rounds to Weights & Biases, the resolved plan as the run's config.

An optional extra (``pip install 'nitro-rl[wandb]'``): the plan is refused at validation when
the library is missing. ``mode`` defaults to W&B's own rule (``WANDB_MODE``, then the login
state), so ``WANDB_MODE=offline`` logs into ``<run_dir>/wandb`` without an account or key;
``wandb sync`` uploads such a run later.

Metrics use the keys every other sink uses (docs/metrics.md), plotted against ``env_steps``.
``wandb.init`` starts W&B's service process and ``finish`` waits for it to drain, so both run
in a thread; ``log`` only queues to that service.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kernel import events as ev
from kernel import logs
from kernel.roles import PluginContext
from plugins.sinks.metrics import TrackerSink, require_extra


def check(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan validation: the library is installed."""
    require_extra("wandb", "wandb")


class WandbSink(TrackerSink):
    def __init__(self, ctx: PluginContext):
        check(ctx.config, ctx.plan)
        super().__init__(ctx)
        self.run: Any = None

    async def start(self, ctx: PluginContext) -> None:
        self.run = await asyncio.to_thread(self._init)

    def _init(self) -> Any:
        import wandb

        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=cfg["project"], entity=cfg["entity"], group=cfg["group"],
            tags=cfg["tags"] or None, mode=cfg["mode"],
            name=self.plan["run"]["name"],
            # One W&B run per Nitro run: a resumed run continues the same W&B run.
            id=self.run_id, resume="allow", dir=str(self.run_dir),
            config=logs.redact(self.plan),
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        run.define_metric("env_steps")
        run.define_metric("*", step_metric="env_steps")
        return run

    async def handle(self, event: Any) -> None:
        if self.run is None:
            return
        values = self.rows.feed(event)
        if values is not None:
            self.run.log(values)
        elif isinstance(event, ev.RunStopped):
            self._stop_reason = event.reason
            self.run.summary["stop_reason"] = event.reason

    def flush(self) -> None:
        """W&B's service writes on its own schedule; nothing to push from here."""

    async def close(self) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            failed = (self._stop_reason or "").startswith("error")
            await asyncio.to_thread(run.finish, exit_code=1 if failed else 0)
