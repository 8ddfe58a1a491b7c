"""Under CI, a Redis or TLS test whose tool is missing fails instead of skipping."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import PYTHON, ROOT

TESTS = ["tests/test_redis_transport.py::test_weights_and_batches_round_trip",
         "tests/test_security.py::test_rediss_refuses_a_server_it_cannot_verify"]


def _pytest_without_tools(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    """The two tests with a PATH that holds neither redis-server nor openssl."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(tmp_path)  # an empty folder
    if ci:
        env["CI"] = "true"
    return subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs",
                           *TESTS], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)


def test_missing_redis_or_openssl_skips_locally_and_fails_under_ci(tmp_path: Path) -> None:
    local = _pytest_without_tools(tmp_path, ci=False)
    assert local.returncode == 0, local.stdout[-2000:]
    assert "2 skipped" in local.stdout
    under_ci = _pytest_without_tools(tmp_path, ci=True)
    assert under_ci.returncode == 1, under_ci.stdout[-2000:]
    assert "2 errors" in under_ci.stdout  # failed in set-up: never passed, never skipped
    assert "redis-server is not installed (CI is set" in under_ci.stdout
    assert "openssl" in under_ci.stdout
