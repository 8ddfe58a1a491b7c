"""One source for each default.

The algorithm descriptors (plan fields, torch-free so ``validate`` never imports torch) and the
algorithms' config dataclasses (what ``algos/`` users construct directly) declare the same
fields with the same defaults; plugins read a validated section by key, and a plugin built
from a hand-made config completes it from its own descriptor, never from a literal of its own.
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from kernel.registry import default_registry
from kernel.roles import PluginContext
from kernel.schema import Field, defaults
from tests.conftest import ROOT

#: algo plugin -> its config dataclass ("module:Class"); the learner builds it from the section.
ALGO_CONFIGS = {"ppo": "algos.ppo:PPOConfig", "impala": "algos.impala:IMPALAConfig",
                "appo": "algos.appo:APPOConfig"}
#: Python annotation -> the plan field type that carries it.
PLAN_TYPES = {float: "float", int: "int", bool: "bool", str: "str"}


def _load(target: str) -> type:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _plan_type(annotation: Any) -> str:
    """``float | None`` -> "float", ``tuple[int, ...]`` -> "list[int]"."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and len(args) == 1:
        return _plan_type(args[0])
    if typing.get_origin(annotation) in (tuple, list):
        return f"list[{PLAN_TYPES[typing.get_args(annotation)[0]]}]"
    return PLAN_TYPES[annotation]


def drift(config_class: type, fields: dict[str, Field]) -> list[str]:
    """Every way the plan fields and the dataclass disagree, one line each."""
    hints = typing.get_type_hints(config_class)
    declared = {f.name: f for f in dataclasses.fields(config_class)}
    out = [f"{k}: only in the plan fields" for k in fields.keys() - declared.keys() - {"name"}]
    out += [f"{k}: only in {config_class.__name__}" for k in declared.keys() - fields.keys()]
    for key in sorted(declared.keys() & fields.keys()):
        default = declared[key].default
        default = list(default) if isinstance(default, tuple) else default
        if default != fields[key].default or type(default) is not type(fields[key].default):
            out.append(f"{key}: default {fields[key].default!r} in the plan, {default!r} in "
                       f"{config_class.__name__}")
        if _plan_type(hints[key]) != fields[key].type:
            out.append(f"{key}: type {fields[key].type} in the plan, {hints[key]} in "
                       f"{config_class.__name__}")
    return sorted(out)


@pytest.mark.parametrize("algo", sorted(ALGO_CONFIGS))
def test_algo_plan_fields_are_the_config_dataclass(algo: str) -> None:
    plugin = default_registry().get("algo", algo)
    assert drift(_load(ALGO_CONFIGS[algo]), plugin.config) == []


def test_a_drifted_default_is_caught() -> None:
    from algos.ppo import PPOConfig

    fields = dict(default_registry().get("algo", "ppo").config)
    fields["gamma"] = Field("float", 0.98, "Discount factor.")
    fields["clip_coef"] = Field("int", 0, "Surrogate clipping coefficient.")
    fields["extra"] = Field("int", 1, "Not in the dataclass.")
    del fields["ent_coef"]
    assert drift(PPOConfig, fields) == [
        "clip_coef: default 0 in the plan, 0.2 in PPOConfig",
        "clip_coef: type int in the plan, <class 'float'> in PPOConfig",
        "ent_coef: only in PPOConfig",
        "extra: only in the plan fields",
        "gamma: default 0.98 in the plan, 0.99 in PPOConfig",
    ]


def test_every_algo_plugin_of_ours_is_checked() -> None:
    ours = {p.name for p in default_registry().all()
            if p.kind == "algo" and p.source == "nitro-rl"}
    assert ours == set(ALGO_CONFIGS)


# -- plugins read their section by key -----------------------------------------------------------

#: Files whose plugins read only validated sections by key (``cfg["key"]``).
BY_KEY = [*(f"plugins/scalers/{m}.py" for m in ("base", "curvature", "noise", "reward",
                                                  "schedules", "validation")),
          "plugins/probes/evaluation.py", "plugins/probes/hessian.py",
          "plugins/learners/onpolicy.py", "plugins/cost/aws.py", "plugins/cost/prototype.py",
          "plugins/sinks/jsonl_file.py", "plugins/sinks/csv_file.py",
          "plugins/sinks/tensorboard_file.py", "plugins/transports/memory.py",
          "plugins/transports/redis_stream.py"]
CONFIG_NAMES = {"cfg", "config", "stop"}


def _fallbacks(path: Path) -> list[str]:
    """``cfg.get("key", default)``, ``ctx.config.get(...)`` and ``self.stop.get(...)``."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"):
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name in CONFIG_NAMES:
            hits.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return hits


def test_plugins_read_validated_sections_by_key() -> None:
    assert [hit for name in BY_KEY for hit in _fallbacks(ROOT / name)] == []


def test_a_hand_made_scaler_config_takes_the_descriptors_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Change a declared default and a scaler built without the key follows it: the value
    lives in the descriptor only."""
    from plugins.descriptors import boost
    from plugins.scalers import GnsScaler, HydrozoaScaler, NitroScaler, ScheduleScaler

    monkeypatch.setitem(boost.NITRO_CONFIG, "window", Field("int", 9, "Window.", min=1))
    monkeypatch.setitem(boost.GNS_SCALER_CONFIG, "threshold", Field("float", 2.5, "z."))
    monkeypatch.setitem(boost.HYDROZOA_CONFIG, "every", Field("int", 3, "Rounds.", min=1))
    monkeypatch.setitem(boost.SCHEDULE_CONFIG, "steps", Field("list[int]", [2, 4], "Counts."))

    def build(cls: type) -> Any:
        return cls(PluginContext(name="s", config={"name": "s"}, plan={"actors": {"count": 2}},
                                 run_id="t", run_dir=None, seed=0, bus=None))

    assert build(NitroScaler).window.maxlen == 9
    assert build(GnsScaler).threshold == 2.5
    assert build(HydrozoaScaler).every == 3
    assert build(ScheduleScaler).steps == [2, 4]


def test_defaults_are_fresh_copies() -> None:
    fields = {"steps": Field("list[int]", [], "Counts."), "id": Field("str", doc="Required.")}
    first = defaults(fields)
    first["steps"].append(1)
    assert defaults(fields) == {"steps": []}
