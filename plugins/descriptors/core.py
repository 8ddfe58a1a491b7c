"""Descriptors of the core plugins: PPO, local actors, memory transport, eval."""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field

#: The actor-critic network's fields, shared by every algorithm that builds `algos.nets`.
NETWORK_FIELDS = {
    "hidden_sizes": Field("list[int]", [64, 64], "Hidden layer sizes of the MLPs.",
                          fixed_on_resume=True),
    "activation": Field("str", "tanh", "MLP activation.", choices=("tanh", "relu"),
                        fixed_on_resume=True),
    "cnn_dtype": Field("str", "float32", "Compute dtype of the learner's Nature-CNN trunk: "
                       "bfloat16 (autocast) makes updates 2-3x faster on a CPU with native "
                       "bfloat16 (AMX, AVX512-BF16) and slower on one without; weights, heads "
                       "and losses stay float32.", choices=("float32", "bfloat16")),
    "actor_dtype": Field("str", "float32", "Arithmetic of the actors' Nature-CNN forward: int8 "
                         "(8-bit products on ONNX Runtime, calibrated per weights version) "
                         "samples faster, a behaviour policy within ~1e-3 of the learner's; "
                         "evaluation stays float32.", choices=("float32", "int8")),
}

#: `algos.ppo.PPOConfig` as plan fields (tests/test_algo_defaults.py holds them equal; the
#: dataclass is not read here because its module imports torch).
PPO_CONFIG = {
    "learning_rate": Field("float", 3e-4, "Adam learning rate at the start.", min=0,
                           min_exclusive=True),
    "gamma": Field("float", 0.99, "Discount factor.", min=0, max=1),
    "gae_lambda": Field("float", 0.95, "GAE lambda.", min=0, max=1),
    "num_minibatches": Field("int", 4, "Minibatches per epoch.", min=1),
    "minibatch_size": Field("int", None, "Samples per minibatch; overrides num_minibatches, "
                            "so a bigger round takes more optimiser steps.", min=2),
    "update_epochs": Field("int", 4, "Epochs over each round's batch.", min=1),
    "norm_adv": Field("bool", True, "Normalise advantages per minibatch."),
    "clip_coef": Field("float", 0.2, "Surrogate clipping coefficient.", min=0, min_exclusive=True),
    "clip_vloss": Field("bool", True, "Clip the value loss as in the PPO paper."),
    "ent_coef": Field("float", 0.0, "Entropy bonus coefficient.", min=0),
    "vf_coef": Field("float", 0.5, "Value loss coefficient.", min=0),
    "max_grad_norm": Field("float", 0.5, "Gradient clipping norm.", min=0, min_exclusive=True),
    "target_kl": Field("float", None, "Stop the epochs early past this KL.", min=0,
                       min_exclusive=True),
    "anneal_lr": Field("bool", True, "Anneal the learning rate linearly to 0."),
    "lr_reference_minibatch": Field("int", None, "Samples per minibatch the learning rate was "
                                    "tuned at; when set, the rate follows the minibatch size by "
                                    "Adam's square-root rule (a boosted round takes longer "
                                    "steps).", min=1),
    "clip_reference_batch": Field("int", None, "Samples per round the clip range was tuned "
                                  "at; when set, the range follows the round's batch by the "
                                  "square-root rule (a boosted round may move further).", min=1),
    **NETWORK_FIELDS,
    "adam_eps": Field("float", 1e-5, "Adam epsilon.", min=0, min_exclusive=True),
    "decoupled": Field("bool", True, "Clip against the learner's policy at the update's start "
                       "and weight samples by pi_prox/mu (capped at 2): pipelined actors lag "
                       "one version."),
}

LOCAL_CONFIG = {
    "simulate": Field("bool", False, "Account time and cost as N concurrent cloud functions."),
    "timeout_s": Field("float", None, "Per-invocation deadline (default: actors.deadline_s).",
                       min=0, min_exclusive=True),
    "retries": Field("int", 1, "Retries of an invocation whose worker died.", min=0, max=10),
    "memory_mb": Field("int", 1769, "Function memory the cost model bills.", min=128,
                       max=10240),
    "sim_invoke_latency_s": Field("float", 0.03, "Simulated invoke latency.", min=0),
    "sim_cold_start_s": Field("float", 1.0, "Simulated cold start beyond the warm pool.", min=0),
    "handler": Field("str", "plugins.function.handler:handler",
                     "module:function the workers run (tests wrap it to inject faults)."),
}

#: The env section as the gymnasium provider reads it (the kernel only knows env.provider).
#: A resume keeps the env, and so the spaces and statistics its checkpoint was trained on;
#: only the envs per actor may change (they change the batch, not the model).
GYMNASIUM_CONFIG = {
    "id": Field("str", doc="Environment id, e.g. CartPole-v1, Hopper-v5, ALE/Pong-v5.",
                fixed_on_resume=True),
    "num_envs": Field("int", 4, "Vectorised envs per actor.", min=1, max=4096),
    "kwargs": Field("table", {}, "Keyword arguments for gymnasium.make.", fixed_on_resume=True),
    "normalize_obs": Field("bool", None, "Running observation normalisation (default: on for "
                           "vector observations, off for image frames, which the CNN scales "
                           "itself; true on frames is refused).", fixed_on_resume=True),
    "normalize_reward": Field("bool", True, "Scale rewards by the discounted-return std.",
                              fixed_on_resume=True),
    "clip_obs": Field("float", 10.0, "Clip normalised observations to [-c, c].", min=0,
                      min_exclusive=True, fixed_on_resume=True),
    "max_episode_steps": Field("int", None, "Override the env's time limit.", min=1,
                               fixed_on_resume=True),
    "clip_reward": Field(
        "bool", None, "Clip training rewards to their sign (default: on for ALE ids only).",
        fixed_on_resume=True),
    "imports": Field("list[str]", [], "Modules to import first: packages that register their "
                     "envs on import (an id may also name its module, as in mod:MyEnv-v0).",
                     fixed_on_resume=True),
}
MEMORY_CONFIG = {"keep_versions": Field("int", 3, "Weight versions kept.", min=1)}

PLUGINS = [
    Plugin("gymnasium", "env", "plugins.environments.gymnasium_env:make",
           "Gymnasium ids (classic control, MuJoCo v5, ALE v5, your own as module:EnvId).",
           config=GYMNASIUM_CONFIG, validator="plugins.environments.gymnasium_env:validate"),
    Plugin("ppo", "algo", "plugins.learners.onpolicy:make_ppo",
           "PPO: clipped surrogate, GAE, value clipping, entropy bonus (CleanRL-style).",
           config=PPO_CONFIG, actor="algos.actor:make_actor_policy"),
    Plugin("local", "actors", "plugins.actors.local:LocalBackend",
           "Warm worker processes that behave like a serverless platform; each call is "
           "pinned to a worker by its index in the round, so seeded runs replay.",
           config=LOCAL_CONFIG),
    Plugin("memory", "transport", "plugins.transports.memory:MemoryTransport",
           "In-process transport: no server; batches come back with the invocation.",
           config=MEMORY_CONFIG),
    Plugin("eval", "probe", "plugins.probes.evaluation:EvalProbe",
           "Deterministic-policy episodes; reports eval_return.",
           config={"episodes": Field("int", 10, "Episodes per evaluation.", min=1, max=1000)},
           evaluation=True),
]
