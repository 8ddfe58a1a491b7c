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

from kernel.plan import SECTIONS
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

#: Files whose plugins read validated sections by key (``cfg["key"]``, ``plan["run"]["name"]``).
BY_KEY = [*(f"plugins/scalers/{m}.py" for m in ("base", "curvature", "noise", "reward",
                                                  "schedules", "validation")),
          "plugins/probes/evaluation.py", "plugins/probes/hessian.py",
          "plugins/learners/onpolicy.py", "plugins/actors/aws_lambda.py",
          *(f"plugins/cost/{m}.py" for m in ("aws", "prototype", "time_model")),
          *(f"plugins/sinks/{m}.py" for m in ("console", "csv_file", "jsonl_file", "metrics",
                                              "mlflow_run", "tensorboard_file", "wandb_run")),
          "plugins/transports/memory.py", "plugins/transports/redis_stream.py"]
#: Tables validation fills completely: a plugin's own section (``cfg``, ``config``), the
#: resolved plan (every section is there, ``plan.get("env")`` is a fallback too) and the
#: kernel's sections no plugin adds keys to (run, stop, checkpoint).
CONFIG_NAMES = {"cfg", "config", "plan"} | {
    section for section, (_, kind, _) in SECTIONS.items() if kind is None}
#: Sections holding the kernel's keys and their plugin's (actors: the backend's keys): a
#: kernel key is always there, a key another plugin declares may be missing (read it with
#: ``.get(key)``; what stands in for it must not be a copy of a declared default).
MIXED_SECTIONS = {section: (core, kind) for section, (core, kind, _) in SECTIONS.items()
                  if kind is not None}


def _owner(node: ast.expr) -> str:
    """The table a ``.get`` reads: ``cfg``, ``ctx.config``, ``self.stop``, ``plan["actors"]``
    or ``plan.get("run", {})`` (the last two name the section)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        key = node.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    if isinstance(node, ast.Call) and _is_get(node) and node.args:
        key = node.args[0]
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    return ""


def _is_get(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get")


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except ValueError:
        return False, None


def _same(a: Any, b: Any) -> bool:
    """Equal as plan values: ``1769 == 1769.0``, but ``0`` is not ``False``."""
    return (isinstance(a, bool) == isinstance(b, bool)) and a == b


def declared_defaults(section: str, key: str) -> list[Any]:
    """Every default declared for ``section.key``: the kernel's, and each plugin's of the kind
    the section selects."""
    core, kind = MIXED_SECTIONS[section]
    fields = [core.get(key)] + [p.config.get(key) for p in default_registry().all()
                                if p.kind == kind]
    return [f.default for f in fields if f is not None and not f.required]


def _fallbacks(path: Path) -> list[str]:
    """Reads of a validated table that would hide a missing key: any ``.get`` on a table
    validation fills (``cfg.get("key", default)``, ``ctx.config.get(...)``, ``self.stop.get``,
    ``ctx.plan.get("env", {})``); on a section mixing kernel and plugin keys, ``.get`` of a
    kernel key (``actors.get("backend", "local")``) or with a copy of a declared default
    (``actors.get("memory_mb") or 1769``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    #: get call -> the literal an ``or`` chain falls back to after it
    fallback: dict[ast.Call, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            for value in node.values[:-1]:
                if _is_get(value):
                    fallback[value] = node.values[-1]  # type: ignore[index]
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not _is_get(node):
            continue
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        name = _owner(node.func.value)
        hit = name in CONFIG_NAMES
        if name in MIXED_SECTIONS and node.args and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value
            stand_ins = [*node.args[1:], *(k.value for k in node.keywords)]
            if node in fallback:
                stand_ins.append(fallback[node])
            copies = [value for ok, value in map(_literal, stand_ins) if ok
                      and any(_same(value, d) for d in declared_defaults(name, key))]
            hit = key in MIXED_SECTIONS[name][0] or bool(copies)
        if hit:
            hits.append((node.lineno, f"{path.name}:{node.lineno} {ast.unparse(node)}"))
    return [text for _, text in sorted(hits, key=lambda h: h[0])]


def test_plugins_read_validated_sections_by_key() -> None:
    assert [hit for name in BY_KEY for hit in _fallbacks(ROOT / name)] == []


def test_the_fallbacks_that_drift_are_caught(tmp_path: Path) -> None:
    source = tmp_path / "plugin.py"
    source.write_text(
        "def f(ctx, cfg, actors, env, stop, p):\n"
        "    a = ctx.plan.get('run', {}).get('name', 'nitro')\n"
        "    b = actors.get('backend', 'local')\n"
        "    c = actors.get('memory_mb') or 1769\n"
        "    d = cfg.get('deadline_s')\n"
        "    e = stop.get('max_rounds')\n"
        "    f = ctx.plan['actors'].get('workers')\n"
        "    g = actors.get('simulate', False)\n"
        "    h = env.get('kwargs', {})\n"
        "    # fine: another plugin's key, with no copy of its default\n"
        "    i = actors.get('memory_mb') or MEMORY_MB\n"
        "    j = actors.get('sim_cold_start_s') or 0.0\n"
        "    k = ctx.plan['env'].get('num_envs')\n"
        "    m = p.get('name', 'x')\n",
        encoding="utf-8")
    assert _fallbacks(source) == [
        "plugin.py:2 ctx.plan.get('run', {}).get('name', 'nitro')",
        "plugin.py:2 ctx.plan.get('run', {})",
        "plugin.py:3 actors.get('backend', 'local')",
        "plugin.py:4 actors.get('memory_mb')",
        "plugin.py:5 cfg.get('deadline_s')",
        "plugin.py:6 stop.get('max_rounds')",
        "plugin.py:7 ctx.plan['actors'].get('workers')",
        "plugin.py:8 actors.get('simulate', False)",
        "plugin.py:9 env.get('kwargs', {})",
    ]


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
