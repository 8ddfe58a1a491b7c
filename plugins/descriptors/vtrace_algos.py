"""Descriptors of the V-trace algorithms: IMPALA and APPO (factories in plugins.learners.vtrace).

The fields are `algos.impala.IMPALAConfig` and `algos.appo.APPOConfig` as plan fields, with
bounds and one line of doc each: reading the dataclasses here would import torch, which listing
plugins and validating a plan never do, so tests/test_algo_defaults.py holds the names, defaults
and types equal instead. Both use PPO's actor policy, since the three share one actor-critic
network.
"""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field
from plugins.descriptors.core import NETWORK_FIELDS

_COMMON = {
    "learning_rate": Field("float", 5e-4, "Adam learning rate at the start.", min=0,
                           min_exclusive=True),
    "gamma": Field("float", 0.99, "Discount factor.", min=0, max=1),
    "rho_bar": Field("float", 1.0, "V-trace truncation of the importance weights rho.", min=0,
                     min_exclusive=True),
    "c_bar": Field("float", 1.0, "V-trace truncation of the trace weights c.", min=0,
                   min_exclusive=True),
    "ent_coef": Field("float", 0.01, "Entropy bonus coefficient.", min=0),
    "vf_coef": Field("float", 0.5, "Value loss coefficient.", min=0),
    "max_grad_norm": Field("float", 0.5, "Gradient clipping norm.", min=0, min_exclusive=True),
    "anneal_lr": Field("bool", True, "Anneal the learning rate linearly to 0."),
    **NETWORK_FIELDS,
    "adam_eps": Field("float", 1e-5, "Adam epsilon.", min=0, min_exclusive=True),
}

IMPALA_CONFIG = {
    **_COMMON,
    "num_minibatches": Field("int", 1, "Minibatches (sets of env sequences) per epoch.", min=1),
    "update_epochs": Field("int", 1, "Epochs over each batch.", min=1),
}

APPO_CONFIG = {
    **_COMMON,
    "num_minibatches": Field("int", 4, "Minibatches (sets of env sequences) per epoch.", min=1),
    "update_epochs": Field("int", 4, "Epochs over each batch.", min=1),
    "norm_adv": Field("bool", True, "Normalise advantages per minibatch."),
    "clip_coef": Field("float", 0.2, "Surrogate clipping coefficient.", min=0, min_exclusive=True),
    "target_update_freq": Field("int", 1, "Refresh the target network every k updates.", min=1),
}

PLUGINS = [
    Plugin("impala", "algo", "plugins.learners.vtrace:make_impala",
           "IMPALA: V-trace actor-critic with an entropy bonus (Espeholt et al., 2018).",
           config=IMPALA_CONFIG, actor="algos.actor:make_actor_policy"),
    Plugin("appo", "algo", "plugins.learners.vtrace:make_appo",
           "APPO: PPO's clipped surrogate on V-trace advantages, target network (RLlib-style).",
           config=APPO_CONFIG, actor="algos.actor:make_actor_policy"),
]
