"""Property: whatever plan, override or file a user throws at the CLI, the answer is exit code 2
with one line naming the problem (or 0 for a plan that happens to be valid), never a traceback.

Plans are mutations of the real default plan: keys from its sections and from the plugins'
declared fields get random values of random types; keys are deleted; unknown keys, unknown
sections and whole replacement sections appear; ``--set`` strings are random paths and values;
the file itself may be random bytes. Most examples call ``kernel.cli.main`` in-process; a few
go through a real ``python -m kernel`` process. A plan that happens to be valid is only ever
validated, never run.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import io
import math
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kernel import codec
from kernel.cli import main
from kernel.plan import LISTS, SECTIONS, load_plan
from kernel.registry import default_registry
from kernel.schema import Field, PlanError
from tests.conftest import ROOT, run_cli

CARTPOLE = ROOT / "plans" / "cartpole.toml"
BASE = tomllib.loads(CARTPOLE.read_text())
#: Cheap-to-build env ids (validation builds one env), plus what a user might mistype.
ENV_IDS = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0", "CartPole-v9",
           "cartpole", "", "ALE/NoSuchGame-v5")
#: CI runs a fixed, reproducible sample; NITRO_FUZZ_EXAMPLES=5000 explores new ones.
EXAMPLES = int(os.environ.get("NITRO_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(max_examples=EXAMPLES or 500, deadline=None, derandomize=EXAMPLES is None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = settings(FUZZ, max_examples=EXAMPLES or 100)


def _fields() -> dict[str, dict[str, Field]]:
    """Every key a section may hold: core fields plus every registered plugin's fields."""
    registry = default_registry()
    out: dict[str, dict[str, Field]] = {}
    for section, (core, kind, _) in SECTIONS.items():
        fields = dict(core)
        if kind:
            for name in registry.names(kind):
                fields.update(registry.get(kind, name).config)
        out[section] = fields
    for section, (core, kind, _) in LISTS.items():
        fields = dict(core)
        for name in registry.names(kind):
            fields.update(registry.get(kind, name).config)
        out[section] = fields
    return out


FIELDS = _fields()
SELECTORS = {"env": ("provider", "env"), "algo": ("name", "algo"),
             "actors": ("backend", "actors"), "transport": ("kind", "transport"),
             "scaler": ("name", "scaler"), "cost": ("name", "cost"),
             "probes": ("name", "probe"), "sinks": ("name", "sink")}

# -- values ------------------------------------------------------------------------------------

text = st.text(max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-3, max_value=5000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    text,
    st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1)),
    st.dates(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(text, inner, max_size=3)),
    max_leaves=6,
)


def plausible(field: Field) -> st.SearchStrategy[Any]:
    """Values near what the field accepts: its choices, its bounds and one past them."""
    edges: list[Any] = []
    if field.choices:
        edges += list(field.choices)
    for bound in (field.min, field.max):
        if bound is not None:
            edges += [bound, bound - 1, bound + 1] if field.type == "int" else \
                [float(bound), bound - 1e-9, bound + 1e-9, math.nextafter(bound, math.inf)]
    if field.type == "int":
        edges += [0, 1, -1]
    elif field.type == "float":
        edges += [0.0, float("inf"), float("-inf"), float("nan"), 1e308]
    elif field.type == "str":
        edges += ["", "auto"]
    elif field.type.startswith("list"):
        edges += [[], ["a"], [1, 2], [1.5]]
    elif field.type == "table":
        edges += [{}, {"a": 1}]
    return st.sampled_from(edges) if edges else values


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    plan = copy.deepcopy(BASE)
    plan["stop"] = {"max_rounds": 1}
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(["value", "plausible", "plausible", "delete", "unknown_key",
                                   "unknown_section", "section", "selector", "env_id"]))
        section = draw(st.sampled_from(sorted(FIELDS)))
        if section in LISTS:
            items = plan.setdefault(section, [])
            if not isinstance(items, list) or not items or not isinstance(items[0], dict):
                plan[section] = items = [{"name": draw(st.sampled_from(
                    default_registry().names(LISTS[section][1])))}]
            table = items[draw(st.integers(0, len(items) - 1))]
        else:
            table = plan.setdefault(section, {})
            if not isinstance(table, dict):
                plan[section] = table = {}
        key = draw(st.sampled_from(sorted(FIELDS[section])))
        if op == "value":
            table[key] = draw(values)
        elif op == "plausible":
            table[key] = draw(plausible(FIELDS[section][key]))
        elif op == "delete":
            table.pop(key, None)
        elif op == "unknown_key":
            table[draw(text)] = draw(values)
        elif op == "unknown_section":
            plan[draw(text)] = draw(values)
        elif op == "section":
            plan[section] = draw(values)
        elif op == "selector" and section in SELECTORS:
            selector, kind = SELECTORS[section]
            table[selector] = draw(st.sampled_from(default_registry().names(kind)) | text)
        elif op == "env_id":
            plan.setdefault("env", {})
            if isinstance(plan["env"], dict):
                plan["env"]["id"] = draw(st.sampled_from(ENV_IDS) | text)
    return plan


KEY_PATHS = sorted({f"{s}.{k}" for s, fields in FIELDS.items() for k in fields}
                   | {"probes.0.name", "sinks.0.name", "probes.7.every", "run.name.x"})
override_values = st.one_of(
    st.sampled_from(["1", "0", "-1", "true", "nan", "inf", "[1, 2]", "{a = 1}", '"x"', "'",
                     "[", "{", "1979-05-27", "ppo", "", "=", "[[x]]", "9" * 40]),
    st.text(max_size=10),
)
overrides = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEY_PATHS), override_values),
    st.builds(lambda k, v: f"{k}={v}", st.text(max_size=12), override_values),
    st.text(max_size=20),
)


# -- running the CLI ---------------------------------------------------------------------------

def cli(*argv: str) -> tuple[int, str]:
    """``kernel.cli.main`` in-process: (exit code, stderr). A traceback fails the test."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's way out
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


def assert_refused(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("nitro: "), err


def is_valid(path: Path, sets: list[str]) -> bool:
    try:
        load_plan(path, sets)
    except PlanError:
        return False
    return True


def write(tmp_path: Path, plan: dict[str, Any]) -> Path:
    try:
        doc = tomli_w.dumps(plan)
    except (TypeError, ValueError):
        assume(False)  # not expressible in TOML (tomli_w refuses it): nothing to test
        raise AssertionError("unreachable") from None
    path = tmp_path / "plan.toml"
    path.write_text(doc, encoding="utf-8")
    return path


@FUZZ
@given(plan=plans(), sets=st.lists(overrides, max_size=2))
def test_validate_answers_ok_or_one_line(tmp_path: Path, plan: dict[str, Any],
                                         sets: list[str]) -> None:
    path = write(tmp_path, plan)
    code, err = cli("validate", str(path), *(f"--set={s}" for s in sets))
    if code == 0:
        assert err.strip().endswith(": ok") and "Traceback" not in err
        assert is_valid(path, sets)
    else:
        assert_refused(code, err)


@FUZZ
@given(plan=plans(), sets=st.lists(overrides, max_size=2))
def test_run_refuses_bad_plans_before_starting(tmp_path: Path, plan: dict[str, Any],
                                               sets: list[str]) -> None:
    path = write(tmp_path, plan)
    sets = [*sets, "stop.max_rounds=1", "actors.steps=8"]
    assume(not is_valid(path, sets))  # a valid plan would train: validate covers those
    out = tmp_path / "out"
    code, err = cli("run", str(path), "--out", str(out), *(f"--set={s}" for s in sets))
    assert_refused(code, err)
    assert not out.exists()  # refused before anything was written


@SMALL
@given(data=st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_random_bytes_as_the_plan_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "plan.toml"
    path.write_bytes(data)
    for command in ("validate", "run"):
        extra = ["--out", str(tmp_path / "out"), "--set=stop.max_rounds=1"] \
            if command == "run" else []
        code, err = cli(command, str(path), *extra)
        if code == 0:  # only a valid plan could pass, and it would not be random bytes
            pytest.fail(f"random bytes validated: {data!r}")
        assert_refused(code, err)


@SMALL
@given(payload=st.binary(max_size=200) | st.sampled_from([
    codec.encode("checkpoint", {"format": 99}), codec.encode("weights", {}), b"",
    codec.encode("checkpoint", {"format": "1"})]))
def test_resume_from_a_damaged_checkpoint(tmp_path: Path, payload: bytes) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.toml").write_text(CARTPOLE.read_text())
    (run_dir / "checkpoints" / "ckpt-000001.nitro").write_bytes(payload)
    code, err = cli("run", "--resume", str(run_dir))
    assert_refused(code, err)


@pytest.mark.parametrize("args", [
    ["validate", "{plan}", "--set=actors.count=[1, {{a = 1}}]"],
    ["validate", "{garbage}"],
    ["run", "{plan}", "--set=env.id=NoSuchEnv-v0", "--set=stop.max_rounds=1"],
    ["run", "{plan}", "--set=probes.3.name=x"],
    ["validate", "{plan}", "--set=run.seed=1e400"],
])
def test_real_process_answers_in_one_line(tmp_path: Path, args: list[str]) -> None:
    garbage = tmp_path / "garbage.toml"
    garbage.write_bytes(b"\x80\x04\x95[[[\xff= ]]\n\x00")
    argv = [a.format(plan=CARTPOLE, garbage=garbage) for a in args]
    proc = run_cli(*argv, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nitro: "), proc.stderr


def test_a_valid_mutant_still_validates(tmp_path: Path) -> None:
    """The generator's base is valid, so 0 is reachable (the property is not vacuous)."""
    plan = copy.deepcopy(BASE)
    plan["stop"] = {"max_rounds": 1}
    code, err = cli("validate", str(write(tmp_path, plan)))
    assert code == 0, err
