"""One name per quantity: what every sink calls the numbers of a round.

A quantity has one key (the ``RoundFinished`` field where there is one), used as it is by the
CSV columns, the JSON events and the trackers (W&B, MLflow). The console uses a short label
to fit a round on 80 columns, and TensorBoard a ``group/key`` tag; users coming from
Stable-Baselines3 or CleanRL can ask for those libraries' tags instead, so their dashboards
work unchanged. ``docs/metrics.md`` is the table of all of them; a test keeps it current.

``rollout/`` holds what the actors' training episodes scored; ``train/`` is never used for it,
because Stable-Baselines3 readers take ``train/`` to mean losses.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any

from kernel import events as ev

TAG_STYLES = ("nitro", "sb3", "cleanrl")


@dataclass(frozen=True, slots=True)
class Metric:
    #: The one name: CSV column, tracker key, and the event field when there is one.
    key: str
    #: TensorBoard group in the ``nitro`` style; the tag is ``group/key``.
    group: str
    doc: str
    #: Short label in the console's round line (None: not on the round line).
    console: str | None = None
    #: Stable-Baselines3's tag for the same quantity (None: the nitro tag is kept).
    sb3: str | None = None
    #: CleanRL's tag for the same quantity (None: the nitro tag is kept).
    cleanrl: str | None = None


#: Per-round quantities, in the order CSV columns and the docs list them.
ROUND_METRICS: tuple[Metric, ...] = (
    Metric("round", "progress", "Round number.", "round", sb3="time/iterations"),
    Metric("env_steps", "progress", "Env steps trained on since the run began.", "steps",
           sb3="time/total_timesteps"),
    Metric("round_env_steps", "progress", "Env steps the round's batches carried."),
    Metric("actors", "fanout", "Actors (invocations) in the round.", "actors"),
    Metric("batches", "fanout", "Batches the round's update used."),
    Metric("episodes", "rollout", "Training episodes that ended in the round."),
    Metric("episode_return_mean", "rollout",
           "Mean undiscounted return of the training episodes that ended in the round "
           "(the actors' stochastic policy, raw rewards).", "return",
           sb3="rollout/ep_rew_mean", cleanrl="charts/episodic_return"),
    Metric("episode_length_mean", "rollout",
           "Mean length in env steps of the training episodes that ended in the round.", "len",
           sb3="rollout/ep_len_mean", cleanrl="charts/episodic_length"),
    Metric("eval_return", "eval", "Mean return of the eval probe's deterministic episodes.",
           "eval", sb3="eval/mean_reward", cleanrl="eval/episodic_return"),
    Metric("eval_return_min", "eval", "Lowest eval episode return."),
    Metric("eval_return_max", "eval", "Highest eval episode return."),
    Metric("eval_return_std", "eval", "Standard deviation of the eval episode returns."),
    Metric("env_steps_per_s", "time",
           "Env steps per second of the round (round_env_steps / round_s when the engine "
           "does not report it).", "sps", sb3="time/fps", cleanrl="charts/SPS"),
    Metric("round_s", "time", "Seconds the round took."),
    Metric("actor_s", "time", "Seconds of the round spent gathering batches."),
    Metric("learner_s", "time", "Seconds of the round's learner update."),
    Metric("probe_s", "time", "Seconds of the round's probes (evaluation included)."),
    Metric("sim_time_s", "time", "Simulated cloud time so far (wall time when not simulating)."),
    Metric("overlap_s", "time",
           "Simulated seconds of the round's sampling hidden behind the previous round's "
           "training (pipelined fan-outs started ahead, async invocations out before that update "
           "began), left out of sim_time_s."),
    Metric("wall_s", "time", "Seconds since the run started.", "wall",
           sb3="time/time_elapsed"),
    Metric("round_cost_usd", "cost", "Dollars the round cost."),
    Metric("cost_usd", "cost", "Dollars spent since the run started.", "cost"),
    Metric("next_actors", "fanout", "Actors the scaler chose for the next round."),
    Metric("boost_score", "fanout", "The scaler's score behind next_actors (0-1)."),
)
BY_KEY = {m.key: m for m in ROUND_METRICS}

#: Learner metrics (``LearnerUpdated.metrics``) under the two other libraries' names. A value
#: SB3 logs with the opposite sign is listed with -1 (SB3's ``entropy_loss`` is -entropy).
LEARNER_SB3: dict[str, tuple[str, float]] = {
    "loss": ("train/loss", 1.0),
    "pg_loss": ("train/policy_gradient_loss", 1.0),
    "v_loss": ("train/value_loss", 1.0),
    "entropy": ("train/entropy_loss", -1.0),
    "approx_kl": ("train/approx_kl", 1.0),
    "clipfrac": ("train/clip_fraction", 1.0),
    "explained_variance": ("train/explained_variance", 1.0),
    "learning_rate": ("train/learning_rate", 1.0),
}
LEARNER_CLEANRL: dict[str, tuple[str, float]] = {
    "pg_loss": ("losses/policy_loss", 1.0),
    "v_loss": ("losses/value_loss", 1.0),
    "entropy": ("losses/entropy", 1.0),
    "old_approx_kl": ("losses/old_approx_kl", 1.0),
    "approx_kl": ("losses/approx_kl", 1.0),
    "clipfrac": ("losses/clipfrac", 1.0),
    "explained_variance": ("losses/explained_variance", 1.0),
    "learning_rate": ("charts/learning_rate", 1.0),
}


def env_steps_per_s(event: ev.RoundFinished) -> float | None:
    """The engine's figure, or the round's own steps over its duration."""
    if event.env_steps_per_s is not None:
        return event.env_steps_per_s
    return event.round_env_steps / event.round_s if event.round_s > 0 else None


def round_values(event: ev.RoundFinished, *, started_ts: float | None = None,
                 round_cost_usd: float | None = None,
                 scale: ev.ScaleDecided | None = None) -> dict[str, Any]:
    """Every ``ROUND_METRICS`` key of one round (None where the round has no value).

    ``started_ts`` (from ``RunStarted``), the round's ``CostCharged`` and ``ScaleDecided``
    arrive as their own events before ``RoundFinished``; a sink passes what it kept.
    """
    fields = {name: getattr(event, name) for name in event.__dataclass_fields__}
    probes = event.probes
    values: dict[str, Any] = {m.key: fields.get(m.key, probes.get(m.key))
                              for m in ROUND_METRICS}
    values["env_steps_per_s"] = env_steps_per_s(event)
    values["wall_s"] = None if started_ts is None else event.ts - started_ts
    values["round_cost_usd"] = round_cost_usd
    values["next_actors"] = None if scale is None else scale.actors
    values["boost_score"] = None if scale is None else scale.detail.get("score")
    return values


def tensorboard_tag(key: str, style: str) -> str:
    """The TensorBoard tag of a ``ROUND_METRICS`` key in a tag style."""
    metric = BY_KEY[key]
    other = {"sb3": metric.sb3, "cleanrl": metric.cleanrl}.get(style)
    return other or f"{metric.group}/{key}"


def learner_tag(key: str, style: str) -> tuple[str, float]:
    """(tag, sign) of a learner metric: ``learner/<key>`` unless the style has its own name."""
    table = {"sb3": LEARNER_SB3, "cleanrl": LEARNER_CLEANRL}.get(style, {})
    return table.get(key, (f"learner/{key}", 1.0))


def markdown_table() -> str:
    """The table of ``docs/metrics.md``."""
    rows = ["| key (CSV, events, W&B, MLflow) | console | TensorBoard `nitro` | `sb3` | "
            "`cleanrl` | meaning |", "|---|---|---|---|---|---|"]
    for m in ROUND_METRICS:
        nitro = f"{m.group}/{m.key}"
        rows.append(
            f"| `{m.key}` | {_code(m.console)} | `{nitro}` | {_code(m.sb3) if m.sb3 else 'same'}"
            f" | {_code(m.cleanrl) if m.cleanrl else 'same'} | {m.doc} |"
        )
    return "\n".join(rows) + "\n"


def learner_markdown_table() -> str:
    """Learner metrics under the three tag styles."""
    rows = ["| learner metric | TensorBoard `nitro` | `sb3` | `cleanrl` |", "|---|---|---|---|"]
    for key in dict.fromkeys([*LEARNER_SB3, *LEARNER_CLEANRL]):
        sb3, sign = learner_tag(key, "sb3")
        sb3_text = f"`{sb3}`" + (" (negated)" if sign < 0 else "")
        rows.append(f"| `{key}` | `learner/{key}` | {sb3_text} | "
                    f"`{learner_tag(key, 'cleanrl')[0]}` |")
    return "\n".join(rows) + "\n"


def _code(text: str | None) -> str:
    return "-" if text is None else f"`{text}`"


def tracker_values(event: ev.RoundFinished, *, started_ts: float | None = None,
                   round_cost_usd: float | None = None,
                   scale: ev.ScaleDecided | None = None) -> dict[str, float]:
    """A round as the flat ``{key: number}`` trackers log: the keys of ``ROUND_METRICS``, the
    learner's metrics and the other probe values under their own keys; finite numbers only."""
    values: dict[str, Any] = {**event.probes, **event.metrics}
    values.update(round_values(event, started_ts=started_ts, round_cost_usd=round_cost_usd,
                               scale=scale))
    return {key: float(value) for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


def require_extra(module: str, extra: str) -> None:
    """Refuse, in one line naming the install command, a plugin whose optional library is
    missing: at plan validation, before any actor starts."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{module} is not installed: pip install 'nitro-rl[{extra}]'")


class RoundRows:
    """Joins each round's ``ScaleDecided`` and ``CostCharged`` to its ``RoundFinished``: a
    tracker logs one row per round, and the three events arrive apart."""

    def __init__(self) -> None:
        self.started_ts: float | None = None
        self._scale: dict[int, ev.ScaleDecided] = {}
        self._cost: dict[int, float] = {}

    def feed(self, event: Any) -> dict[str, float] | None:
        """The round's row when ``event`` finishes a round, else None (the event is kept)."""
        if isinstance(event, ev.RunStarted):
            self.started_ts = event.ts
        elif isinstance(event, ev.ScaleDecided):
            self._scale[event.round] = event
        elif isinstance(event, ev.CostCharged):
            self._cost[event.round] = event.round_usd
        elif isinstance(event, ev.RoundFinished):
            return tracker_values(event, started_ts=self.started_ts,
                                  round_cost_usd=self._cost.pop(event.round, None),
                                  scale=self._scale.pop(event.round, None))
        return None


class FileSink:
    """A sink that writes one file-like object (a journal, a CSV, an event file): the engine
    flushes it when the run's events stop, and it is closed once."""

    file: Any = None

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    async def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class TrackerSink:
    """What the W&B and MLflow sinks share: the run they log, its plan, and one row per round."""

    def __init__(self, ctx: Any):
        self.config = ctx.config
        self.plan = ctx.plan
        self.run_dir = ctx.run_dir
        self.run_id = ctx.run_id
        self.rows = RoundRows()
        self._stop_reason: str | None = None
