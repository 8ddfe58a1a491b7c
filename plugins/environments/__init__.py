"""Environment plugins: the ``env`` role, which checks the plan's ``[env]`` section before anything
starts (registered ids, modules that register a user's own envs, image observations)."""
