"""plugins/ shows its kinds: one subpackage per role, names that are clearly ours, and every
name the registry and the CLI hold resolves to code in that layout.

Factory strings (``"plugins.x:Y"``), entry points and defaults such as the local backend's
``handler`` name modules by text, so a module that moves leaves them pointing nowhere until
something imports them; these checks import them all.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from kernel.registry import Plugin, default_registry

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"

#: Modules directly in plugins/ that serve every role; any plugin goes into its role's package.
SHARED = {"__init__", "builtin", "registry_access"}

#: Import names of the libraries Nitro depends on (pyproject.toml, extras included): a module of
#: ours named like one of them reads, in an import line or a traceback, as the library itself.
LIBRARIES = {
    "msgpack", "numpy", "structlog", "torch", "gymnasium", "mujoco", "ale_py", "redis",
    "hiredis", "aiobotocore", "botocore", "aiohttp", "rich", "tensorboardX", "tensorboard",
    "matplotlib", "tomli_w", "pytest", "hypothesis", "moto", "onnx", "onnxruntime",
    "safetensors", "moviepy", "pygame", "wandb", "mlflow", "boto3",
}


def _modules() -> list[Path]:
    return [p for p in PLUGINS.rglob("*.py") if "__pycache__" not in p.parts]


def test_top_level_of_plugins_holds_only_shared_modules() -> None:
    loose = sorted(p.stem for p in PLUGINS.glob("*.py") if p.stem not in SHARED)
    assert loose == [], f"plugin modules outside a role package: {loose}"


def test_every_subpackage_is_a_light_package() -> None:
    """A subpackage's ``__init__`` imports nothing, so importing one plugin (or a descriptor's
    helper such as ``plugins.sinks.metrics``) never pulls in its siblings."""
    for package in (p for p in PLUGINS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = package / "__init__.py"
        assert init.is_file(), f"{package.relative_to(ROOT)} is not a package"
        lines = [line for line in init.read_text(encoding="utf-8").splitlines()
                 if line.startswith(("import ", "from "))]
        assert lines == [], f"{init.relative_to(ROOT)} imports: {lines}"


def test_no_plugin_module_takes_a_library_or_stdlib_name() -> None:
    clashes = sorted(str(p.relative_to(ROOT)) for p in _modules()
                     if p.stem in LIBRARIES or p.stem in sys.stdlib_module_names)
    assert clashes == []


def test_the_kernel_keeps_no_process_pool() -> None:
    """The warm worker pool belongs to the actor backends that use it: importing every kernel
    module imports no multiprocessing."""
    code = (
        "import importlib, pkgutil, sys, kernel\n"
        "for m in pkgutil.walk_packages(kernel.__path__, 'kernel.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print('multiprocessing' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert not (ROOT / "kernel" / "workers.py").exists()


def _ours() -> list[Plugin]:
    return [p for p in default_registry().all() if p.source == "nitro-rl"]


@pytest.mark.parametrize("plugin", _ours(), ids=lambda p: f"{p.kind}/{p.name}")
def test_builtin_descriptor_names_resolve(plugin: Plugin) -> None:
    assert callable(plugin.load())
    if isinstance(plugin.validator, str):
        module, _, name = plugin.validator.partition(":")
        assert callable(getattr(importlib.import_module(module), name))
    if plugin.actor is not None:
        assert callable(plugin.load_actor())


def test_module_names_in_defaults_and_entry_points_resolve() -> None:
    from plugins.actors.local import PRELOAD
    from plugins.descriptors.core import LOCAL_CONFIG

    for module in PRELOAD:
        importlib.import_module(module)
    module, _, name = LOCAL_CONFIG["handler"].default.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    for group in ("nitro.commands", "nitro.plugins"):
        for ep in entry_points(group=group):
            if ep.value.startswith("plugins."):
                assert ep.load() is not None, ep
