"""Environments: building vector envs from an env spec, sampling rollouts, normalisation.

Depends only on gymnasium, numpy, mujoco and (lazily) ale-py, so actors can import it without
torch or the rest of the project. The data it produces is fixed by docs/contracts.md.
"""

from envs.make import (
    check_env_id,
    describe,
    env_modules,
    is_image_obs,
    make_env,
    make_vector_env,
)
from envs.normalize import RunningMeanStd, moments
from envs.rollout import Sampler, evaluate

__all__ = [
    "RunningMeanStd",
    "Sampler",
    "check_env_id",
    "describe",
    "env_modules",
    "evaluate",
    "is_image_obs",
    "make_env",
    "make_vector_env",
    "moments",
]
