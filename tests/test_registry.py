"""Plugins come from the nitro.plugins entry points and are checked when registered."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel.registry import Plugin, PluginError, Registry, default_registry
from kernel.schema import Field

BUILTINS = {
    ("algo", "ppo"), ("actors", "local"), ("transport", "memory"), ("scaler", "fixed"),
    ("probe", "eval"), ("sink", "console"), ("sink", "jsonl"), ("cost", "aws"),
    ("env", "gymnasium"),
}


def test_builtins_arrive_through_entry_points() -> None:
    registry = Registry()
    assert registry.load_entry_points() >= len(BUILTINS)
    found = {(p.kind, p.name) for p in registry.all()}
    assert BUILTINS <= found
    assert all(p.source == "nitro-rl" for p in registry.all() if (p.kind, p.name) in BUILTINS)


@pytest.mark.parametrize(
    ("plugin", "words"),
    [
        (Plugin("x", "widget", "a:b"), "unknown kind 'widget'"),
        (Plugin("", "sink", "a:b"), "non-empty identifier"),
        (Plugin("x", "sink", "nocolon"), "module:callable"),
        (Plugin("x", "sink", "a:b", config={"k": 3}), "config key 'k'"),  # type: ignore[dict-item]
    ],
)
def test_bad_descriptors_are_refused_by_name(plugin: Plugin, words: str) -> None:
    with pytest.raises(PluginError, match=words):
        Registry().register(plugin)


def test_duplicates_and_unknown_names() -> None:
    registry = Registry()
    registry.register(Plugin("x", "sink", "a:b", source="one"))
    with pytest.raises(PluginError, match="already registered by one"):
        registry.register(Plugin("x", "sink", "a:b", source="two"))
    with pytest.raises(PluginError, match="no scaler plugin named 'y'"):
        registry.get("scaler", "y")


def test_load_fails_with_the_plugin_named() -> None:
    plugin = Plugin("ghost", "probe", "no_such_module_xyz:make")
    with pytest.raises(PluginError, match="probe/ghost: cannot load"):
        plugin.load()


def test_third_party_entry_point_is_found_and_usable(tmp_path: Path) -> None:
    """A package on the path with a nitro.plugins entry point adds a scaler a plan can name."""
    pkg = tmp_path / "site"
    (pkg / "thirdparty_scaler").mkdir(parents=True)
    (pkg / "thirdparty_scaler" / "__init__.py").write_text(textwrap.dedent("""
        from kernel.registry import Plugin
        from kernel.schema import Field

        class Double:
            def __init__(self, ctx):
                self.last_detail = {}
            def decide(self, ctx):
                return ctx.current * 2

        PLUGINS = [Plugin("double", "scaler", "thirdparty_scaler:Double", "Doubles N.",
                          config={"unused": Field("int", 0, "nothing")})]
    """))
    dist = pkg / "thirdparty_scaler-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-scaler\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nitro.plugins]\ndouble = thirdparty_scaler:PLUGINS\n")
    code = textwrap.dedent("""
        from kernel.plan import load_plan
        from kernel.registry import default_registry
        p = default_registry().get("scaler", "double")
        print(p.source, p.doc)
        plan = load_plan("plans/cartpole.toml", {"scaler.name": "double", "scaler.unused": 2})
        print(plan["scaler"])
    """)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(pkg), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "thirdparty-scaler Doubles N." in out.stdout
    assert "'unused': 2" in out.stdout


def test_every_builtin_factory_resolves() -> None:
    for plugin in default_registry().all():
        if plugin.source == "nitro-rl":
            assert callable(plugin.load()), plugin.name
            for key, spec in plugin.config.items():
                assert isinstance(spec, Field), key


def test_a_broken_third_party_package_does_not_take_the_others_down(tmp_path: Path) -> None:
    """An entry point whose module cannot be imported (e.g. a package installed while workers
    were already running) is recorded and named, and every other plugin still works."""
    site = tmp_path / "site"
    dist = site / "ghostpkg-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ghostpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nitro.plugins]\nghost = ghost_module_xyz:PLUGINS\n")
    code = textwrap.dedent("""
        from kernel.registry import Registry, PluginError
        r = Registry(); r.load_entry_points()
        assert r.get("algo", "ppo").name == "ppo"
        assert "ghost" in r.broken and "ghost_module_xyz" in r.broken["ghost"]
        try:
            r.get("scaler", "ghostly")
        except PluginError as exc:
            assert "entry point 'ghost' failed to load" in str(exc), exc
            print("ok")
    """)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
