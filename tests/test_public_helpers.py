"""Helpers other modules use are public: no module imports another's ``_name``; the JSON and
TOML views of run records behave as the journal, the summary and ``validate`` need; a round's
``wall_s`` is the run's real elapsed time."""

from __future__ import annotations

import ast
import asyncio
import json
import math
from pathlib import Path

import numpy as np

from kernel.engine import Engine
from kernel.jsonsafe import drop_none, json_safe
from tests.conftest import ROOT

PACKAGES = ("kernel", "plugins", "algos", "envs")
OURS = PACKAGES


def _private_reaches(path: Path) -> list[str]:
    """``from ours import _x`` and ``ours_module._x`` in one file (dunders allowed)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OURS:
            for alias in node.names:
                modules.add(alias.asname or alias.name)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path}:{node.lineno} imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names
                           if a.name.split(".")[0] in OURS)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{path}:{node.lineno} reads {node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_into_another_modules_privates() -> None:
    reaches = [hit for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
               for hit in _private_reaches(path)]
    assert reaches == []


def test_json_safe_turns_what_strict_json_lacks_into_plain_values() -> None:
    record = {"loss": float("nan"), "gain": float("inf"), "steps": np.int64(7),
              "ratio": np.float32(0.5), "shape": (2, 3), 4: "four", "name": "x"}
    safe = json_safe(record)
    assert safe == {"loss": None, "gain": None, "steps": 7, "ratio": 0.5, "shape": [2, 3],
                    "4": "four", "name": "x"}
    assert type(safe["steps"]) is int
    json.dumps(safe, allow_nan=False)  # strict JSON accepts it


def test_drop_none_leaves_unset_keys_out_at_every_depth() -> None:
    plan = {"stop": {"max_rounds": None, "max_env_steps": 10},
            "probes": [{"name": "eval", "every": None}], "run": None}
    assert drop_none(plan) == {"stop": {"max_env_steps": 10}, "probes": [{"name": "eval"}]}


def test_round_finished_wall_s_is_the_runs_elapsed_time(tmp_path: Path) -> None:
    out = tmp_path / "run"
    engine = Engine.from_plan(ROOT / "plans" / "cartpole.toml",
                              {"stop.max_rounds": 3, "run.mode": "sync", "probes": [],
                               "sinks": []}, out_dir=out)
    summary = asyncio.run(engine.run())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    walls = [e["wall_s"] for e in events if e["event"] == "RoundFinished"]
    assert len(walls) == 3
    assert all(math.isfinite(w) and w > 0 for w in walls)
    assert walls == sorted(walls) and walls[0] < walls[-1]
    assert walls[-1] <= summary["wall_s"] + 0.01
