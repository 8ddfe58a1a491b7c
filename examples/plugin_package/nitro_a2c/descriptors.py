"""What the package advertises: light descriptors, no torch import until a plan uses them."""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field

A2C_CONFIG = {
    "learning_rate": Field("float", 7e-4, "Optimiser learning rate at the start.", min=0,
                           min_exclusive=True),
    "gamma": Field("float", 0.99, "Discount factor.", min=0, max=1),
    "gae_lambda": Field("float", 1.0, "GAE lambda (1: plain n-step returns, as in A2C).",
                        min=0, max=1),
    "ent_coef": Field("float", 0.0, "Entropy bonus coefficient.", min=0),
    "vf_coef": Field("float", 0.5, "Value loss coefficient.", min=0),
    "max_grad_norm": Field("float", 0.5, "Gradient clipping norm.", min=0, min_exclusive=True),
    "norm_adv": Field("bool", False, "Normalise advantages over the round's batch."),
    "optimizer": Field("str", "rmsprop", "Optimiser.", choices=("rmsprop", "adam")),
    "anneal_lr": Field("bool", False, "Anneal the learning rate linearly to 0."),
    "hidden_sizes": Field("list[int]", [64, 64], "Hidden layer sizes of the MLPs."),
    "activation": Field("str", "tanh", "MLP activation.", choices=("tanh", "relu")),
}

WARMUP_CONFIG = {
    "warmup_rounds": Field("int", 10, "Rounds run with actors.max before settling.", min=0),
}

PLUGINS = [
    Plugin("a2c", "algo", "nitro_a2c.learner:make_a2c",
           "A2C: synchronous advantage actor-critic, one gradient step per round.",
           config=A2C_CONFIG, actor="algos.actor:make_actor_policy"),
    Plugin("warmup", "scaler", "nitro_a2c.scaler:WarmupScaler",
           "actors.max for the first warmup_rounds rounds, then actors.count.",
           config=WARMUP_CONFIG),
]
