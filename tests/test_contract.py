"""Plugins are checked against their role's protocol when they are built."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel.contract import ROLE_SPECS, Bound, PluginContractError
from tests.conftest import ROOT


def test_a_plugin_without_a_required_method_fails_at_build_with_one_line(tmp_path: Path
                                                                          ) -> None:
    """A third-party scaler registered through an entry point but lacking ``decide`` stops the
    run before round 1 with one line naming the plugin and the method, exit status 2."""
    site = tmp_path / "site"
    (site / "lazy_scaler").mkdir(parents=True)
    (site / "lazy_scaler" / "__init__.py").write_text(textwrap.dedent("""
        from kernel.registry import Plugin

        class Lazy:
            def __init__(self, ctx):
                pass
            def choose(self, ctx):  # not the protocol's name
                return 1

        PLUGINS = [Plugin("lazy", "scaler", "lazy_scaler:Lazy", "Forgets decide().")]
    """))
    dist = site / "lazy_scaler-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lazy-scaler\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nitro.plugins]\nlazy = lazy_scaler:PLUGINS\n")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kernel", "run", str(ROOT / "plans" / "cartpole.toml"),
         "--out", str(out), "--set", "scaler.name=lazy", "--set", "sinks=[]"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={"PYTHONPATH": f"{site}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("nitro:")]
    assert errors == ["nitro: scaler plugin 'lazy' (Lazy) lacks decide(), required by the "
                      "Scaler protocol"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (out / "events.jsonl").exists() or "RoundStarted" not in \
        (out / "events.jsonl").read_text()


def test_optional_capabilities_have_the_declared_defaults() -> None:
    class Minimal:
        def decide(self, ctx: object) -> int:
            return 1

    bound = Bound("scaler", "minimal", Minimal())
    assert bound.adaptive is True and bound.last_detail == {}
    assert bound.state() is None and bound.load_state({}) is None
    with pytest.raises(AttributeError, match="not part of the Scaler protocol"):
        _ = bound.invoke
    with pytest.raises(PluginContractError):
        Bound("algo", "empty", object())


def test_every_builtin_plugin_meets_its_protocol() -> None:
    """Each descriptor's class has what its role requires (checked on the class, so no torch
    model or worker pool is built)."""
    from kernel.registry import default_registry

    for plugin in default_registry().all():
        if plugin.kind not in ROLE_SPECS or plugin.source != "nitro-rl":
            continue
        factory = plugin.load()
        if not isinstance(factory, type):
            continue  # a function factory: its product is checked when a run builds it
        missing = [m for m in ROLE_SPECS[plugin.kind].required if not hasattr(factory, m)]
        assert not missing, f"{plugin.kind}/{plugin.name} lacks {missing}"


def test_the_protocols_are_the_contract() -> None:
    """A role's spec is read off its protocol: methods are required, a ``Capability`` is
    optional with its default, and a role may make a lifecycle capability required."""
    from typing import Protocol

    from kernel.contract import role_spec
    from kernel.roles import Capability, Lifecycle, nothing

    class Reader(Lifecycle, Protocol):
        def read(self) -> int: ...

        def state(self) -> dict: ...

        peek = Capability(nothing)
        eager = Capability(False)

    spec = role_spec(Reader)
    assert spec.protocol == "Reader"
    assert set(spec.required) == {"read", "state"}
    assert spec.optional == {"start": nothing, "close": nothing, "load_state": nothing,
                             "peek": nothing, "eager": False}
    # The transport's weights_payload, which the local backend reads, is in its protocol and
    # so required: a transport without it fails when built, not in the first round.
    assert "weights_payload" in ROLE_SPECS["transport"].required
    with pytest.raises(PluginContractError, match="lacks weights_payload"):
        Bound("transport", "half", type("Half", (), {
            m: (lambda self: None) for m in ROLE_SPECS["transport"].required
            if m != "weights_payload"})())
