"""The long learning tests, marked ``slow`` in one place (loaded with ``-p tests.slow_tests``
from pyproject's pytest options): ``make test`` (``-m "not slow"``) skips them, ``make
test-all`` and ``pytest -m slow`` run them. They train to a target return, which takes minutes
on 2 cores; every other test checks a mechanism on a few rounds.

A listed test that no longer exists in its (collected) module is an error, so a rename cannot
silently bring a long test back into the quick suite.
"""

from __future__ import annotations

import pytest

#: node id (without parameters) -> why it is slow
SLOW = {
    "tests/test_run.py::test_cartpole_learns_to_475":
        "the default plan trains CartPole to an eval return of 475 (up to 150k env steps)",
    "tests/test_algos_ppo.py::test_cartpole_learns":
        "CleanRL's CartPole PPO loop to a last-20 mean of 195 (up to 100k steps)",
    "tests/test_vtrace_learning.py::test_cartpole_learns":
        "IMPALA and APPO each train CartPole to 400 (up to 150k env steps)",
    "tests/test_plugin_package.py::test_a2c_learns_cartpole":
        "a plugin package's A2C trains CartPole to 475 through the CLI",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = {}
    for item in items:
        path, _, name = item.nodeid.partition("::")
        modules[path] = getattr(item, "module", None)
        if f"{path}::{name.split('[')[0]}" in SLOW:
            item.add_marker(pytest.mark.slow)
    for node in SLOW:
        path, _, name = node.partition("::")
        module = modules.get(path)
        if module is not None and not hasattr(module, name):
            raise pytest.UsageError(f"tests/slow_tests.py lists {node}, which no longer exists")
