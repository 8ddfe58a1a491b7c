"""Learner plugins: the ``algo`` role. Each wraps a pure algorithm core from ``algos/`` (PPO,
IMPALA and APPO with V-trace) with what the distributed setting adds: batch checks, merged
observation statistics, devices and threads."""
