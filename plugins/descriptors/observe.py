"""Descriptors of the observers: console, JSON lines, CSV and TensorBoard sinks."""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field
from plugins.sinks.metrics import TAG_STYLES

CONSOLE_CONFIG = {
    "progress": Field("str", "auto", "Live display: auto (only on a terminal), live, or plain.",
                      choices=("auto", "live", "plain")),
}
JSONL_CONFIG = {
    "path": Field("str", "rounds.jsonl", "File in the run directory."),
    "events": Field("list[str]", ["RoundFinished"], "Event types ('*': all)."),
}
CSV_CONFIG = {
    "path": Field("str", "rounds.csv", "File in the run directory."),
    "columns": Field("list[str]", ["pg_loss", "v_loss", "entropy", "approx_kl"],
                     "Extra columns: probe, learner-metric or scaler keys."),
}
TENSORBOARD_CONFIG = {
    "dir": Field("str", "tensorboard", "Directory in the run directory."),
    "step": Field("str", "env_steps", "x axis of every scalar.", choices=("env_steps", "round")),
    "tag_style": Field("str", "nitro", "Scalar names: nitro (group/key, keys as in the CSV), "
                       "sb3 (rollout/ep_rew_mean, time/fps, train/ losses) or cleanrl "
                       "(charts/episodic_return, charts/SPS, losses/).", choices=TAG_STYLES),
}

PLUGINS = [
    Plugin("console", "sink", "plugins.sinks.console:ConsoleSink",
           "Live progress on a terminal; one plain line per round otherwise.",
           config=CONSOLE_CONFIG),
    Plugin("jsonl", "sink", "plugins.sinks.jsonl_file:JsonlSink", "Chosen events as JSON lines.",
           config=JSONL_CONFIG),
    Plugin("csv", "sink", "plugins.sinks.csv_file:CsvSink",
           "One row per round: times, actors, eval return, loss, cost, Hessian ratio, boost "
           "score, GNS.",
           config=CSV_CONFIG),
    Plugin("tensorboard", "sink", "plugins.sinks.tensorboard_file:TensorboardSink",
           "Scalars per round for TensorBoard (eval, learner, probes, actors, cost, times).",
           config=TENSORBOARD_CONFIG),
    Plugin("wandb", "sink", "plugins.sinks.wandb_run:WandbSink",
           "Rounds to Weights & Biases, the resolved plan as config (extra: nitro-rl[wandb]).",
           validator="plugins.sinks.wandb_run:check",
           config={"project": Field("str", "nitro", "W&B project."),
                   "entity": Field("str", None, "W&B team or user (unset: the default one)."),
                   "group": Field("str", None, "W&B group, e.g. to gather a study's seeds."),
                   "tags": Field("list[str]", [], "W&B tags."),
                   "mode": Field("str", None, "online, offline or disabled (unset: "
                                 "WANDB_MODE, else online when logged in).",
                                 choices=("online", "offline", "disabled"))}),
    Plugin("mlflow", "sink", "plugins.sinks.mlflow_run:MlflowSink",
           "Rounds as MLflow metrics, the plan as parameters (extra: nitro-rl[mlflow]).",
           validator="plugins.sinks.mlflow_run:check",
           config={"tracking_uri": Field("str", None, "MLflow tracking URI (unset: a file "
                                         "store in <run_dir>/mlruns)."),
                   "experiment": Field("str", "nitro", "MLflow experiment name.")}),
]
