"""``nitro sweep``: a grid of settings x seeds as real kernel runs, resumable after Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from plugins.experiments.sweep import (
    MANIFEST,
    Setting,
    SweepError,
    combine,
    parse_axis,
    parse_seeds,
    run_outcome,
    toml_value,
)
from tests.conftest import PYTHON, ROOT, run_cli

#: CartPole, two tiny sync rounds on one simulated actor: a run is its start-up, ~5 s here.
TINY_PLAN = """\
sinks = []

[run]
name = "tiny"
mode = "sync"

[stop]
max_rounds = 2

[env]
id = "CartPole-v1"
num_envs = 1
normalize_obs = false
normalize_reward = false

[actors]
backend = "local"
count = 1
steps = 64
workers = 1
simulate = true

[scaler]
name = "fixed"

[[probes]]
name = "eval"
every = 100
episodes = 2

[checkpoint]
enabled = false
"""


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_PLAN)
    return path


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_seeds_and_grid_syntax() -> None:
    assert parse_seeds("1-3,7") == [1, 2, 3, 7]
    assert parse_seeds("5") == [5]
    with pytest.raises(SweepError):
        parse_seeds("3-1")
    axis = parse_axis("scaler.name=nitro,decay_only")
    assert axis == [Setting("scaler.name=nitro", ("scaler.name=nitro",)),
                    Setting("scaler.name=decay_only", ("scaler.name=decay_only",))]
    named = parse_axis('setting=fixed16:scaler.name=fixed,actors.count=16;'
                       'sched:scaler.name=schedule,scaler.steps=[8, 16];plain')
    assert named == [Setting("fixed16", ("scaler.name=fixed", "actors.count=16")),
                     Setting("sched", ("scaler.name=schedule", "scaler.steps=[8, 16]")),
                     Setting("plain", ())]
    both = combine([named[:2], parse_axis("actors.steps=64,128")])
    assert [s.label for s in both] == ["fixed16,actors.steps=64", "fixed16,actors.steps=128",
                                       "sched,actors.steps=64", "sched,actors.steps=128"]
    assert both[1].overrides == ("scaler.name=fixed", "actors.count=16", "actors.steps=128")
    assert both[1].dirname == "fixed16_actors.steps=128"
    with pytest.raises(SweepError, match="seeds come from --seeds"):
        parse_axis("setting=a:run.seed=3")
    with pytest.raises(SweepError, match="share the directory"):
        combine([[Setting("a b"), Setting("a_b")]])
    assert toml_value({"name": "eval", "every": 5, "x": [1.5, True]}) == \
        '{"name" = "eval", "every" = 5, "x" = [1.5, true]}'


def test_bad_grid_value_fails_before_any_run(plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    t0 = time.monotonic()
    # Only the last combination is bad: it must still be caught before the first run.
    proc = run_cli("sweep", str(plan), "--seeds", "1-2", "--grid", "scaler.name=fixed,nitr",
                   "--out", str(out), timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "scaler.name=nitr" in lines[0] and "did you mean 'nitro'" in lines[0]
    assert not out.exists()
    proc = run_cli("sweep", str(plan), "--grid", "scaler.nme=fixed", "--out", str(out),
                   timeout=60)
    assert proc.returncode == 2 and "scaler.nme" in proc.stderr and not out.exists()
    assert time.monotonic() - t0 < 30  # no run was started


def test_sweep_runs_the_grid_and_skips_finished_runs(plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = ("sweep", str(plan), "--seeds", "1-2", "--jobs", "2", "--out", str(out),
            "--grid", "setting=one:actors.count=1;two:actors.count=2,actors.max=2")
    proc = run_cli(*args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["seeds"] == [1, 2]
    assert set(manifest["settings"]) == {"one", "two"}
    for label, count in (("one", 1), ("two", 2)):
        entry = manifest["settings"][label]
        for seed in (1, 2):
            run = entry["runs"][str(seed)]
            assert run["status"] == "finished" and run["rc"] == 0
            run_dir = out / run["dir"]
            assert run_dir == out / label / f"seed-{seed}"
            resolved = tomllib.loads((run_dir / "plan.toml").read_text())
            assert resolved["run"]["seed"] == seed
            assert resolved["actors"]["count"] == count
            assert summary(run_dir)["stop_reason"] == "max_rounds"
            assert summary(run_dir)["actors_per_round"] == [count, count]
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/seed-*/summary.json")}
    assert len(stamps) == 4

    again = run_cli(*args, timeout=60)
    assert again.returncode == 0
    assert "4 already done, 0 to run" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    # The report reads the sweep back per setting: one row per seed, as each summary says.
    rows_file = tmp_path / "rows.json"
    rep = run_cli("report", str(out), "--baseline", "one", "--json", str(rows_file),
                  "--no-figures", timeout=120)
    assert rep.returncode == 0, rep.stderr[-2000:]
    rows = json.loads(rows_file.read_text())["rows"]
    assert sorted((r["setting"], r["seed"]) for r in rows) == \
        [("one", 1), ("one", 2), ("two", 1), ("two", 2)]
    for r in rows:
        s = summary(Path(r["run_dir"]))
        assert r["final_eval_return"] == s["final_eval_return"] is not None
        assert r["cost_usd"] == s["cost_usd"] and r["mean_actors"] == {"one": 1, "two": 2}[r["setting"]]


def test_interrupted_sweep_resumes_where_it_stopped(plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    long_plan = tmp_path / "long.toml"
    long_plan.write_text(plan.read_text().replace("max_rounds = 2", "max_wall_s = 4.0"))
    cmd = [PYTHON, "-m", "kernel", "sweep", str(long_plan), "--seeds", "1-2", "--out", str(out)]
    # started with SIGINT ignored, as a shell script's background job is: the sweep must
    # still stop on it, as `nitro run` does
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    events = out / "plan" / "seed-1" / "events.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if events.is_file() and "RoundFinished" in events.read_text():
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the first run never finished a round")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, stderr[-2000:]
    assert "rerun the same command to resume" in stdout
    assert summary(out / "plan" / "seed-1")["stop_reason"] == "signal SIGINT"
    runs = json.loads((out / MANIFEST).read_text())["settings"]["plan"]["runs"]
    assert runs["1"]["status"] == "interrupted"
    assert "status" not in runs["2"]  # never started

    resumed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "0 already done, 2 to run" in resumed.stdout
    for seed in (1, 2):
        assert summary(out / "plan" / f"seed-{seed}")["stop_reason"] == "max_wall_s"
    # Two attempts of seed 1 in its log, one of seed 2.
    assert (out / "plan" / "seed-1.log").read_text().count("# ") >= 2
    runs = json.loads((out / MANIFEST).read_text())["settings"]["plan"]["runs"]
    assert {runs[s]["status"] for s in ("1", "2")} == {"finished"}


def test_resume_refuses_other_common_overrides(plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({
        "plan": str(plan), "plan_sha256": hashlib.sha256(plan.read_bytes()).hexdigest(), "set": ["actors.steps=32"], "settings": {}}))
    proc = run_cli("sweep", str(plan), "--out", str(out), "--dry-run", timeout=60)
    assert proc.returncode == 2 and "same --set" in proc.stderr


def test_two_sweeps_writing_one_folder_keep_each_others_runs(plan: Path, tmp_path: Path) -> None:
    """Two sweeps adding runs to one folder at once (one per core) each load the manifest,
    run, and write it back: every write merges with what is on disk, so neither drops the
    other's runs (the last writer used to win)."""
    from plugins.experiments.sweep import Manifest, RunSpec

    out = tmp_path / "sweep"
    first = Manifest.load_or_new(out, str(plan), [])
    second = Manifest.load_or_new(out, str(plan), [])
    a = RunSpec(Setting("a", ("actors.count=1",)), 1, out / "a" / "seed-1", ["x", "run"])
    b = RunSpec(Setting("b", ("actors.count=2",)), 2, out / "b" / "seed-2", ["x", "run"])
    first.add([], "sweep a", [a])
    second.add([], "sweep b", [b])
    for manifest, run in ((first, a), (second, b)):
        run.status, run.rc, run.wall_s = "finished", 0, 1.0
        manifest.record(run)
    first.write()
    second.write()
    data = json.loads((out / "sweep.json").read_text())
    assert {label: sorted(e["runs"]) for label, e in data["settings"].items()} == \
        {"a": ["1"], "b": ["2"]}
    assert data["settings"]["a"]["runs"]["1"]["status"] == "finished"
    assert data["commands"] == ["sweep b", "sweep a"] and data["seeds"] == [1, 2]
    first.write()  # a later write of the first keeps the second's finished run
    data = json.loads((out / "sweep.json").read_text())
    assert data["settings"]["b"]["runs"]["2"]["status"] == "finished"


def test_each_finished_run_says_what_share_of_its_budget_it_spent(tmp_path: Path) -> None:
    """The line a sweep prints per run names the budget and the share spent, so a run that
    stopped short of it (or went past it) shows while the sweep is still going."""
    budgeted, unbudgeted = tmp_path / "a", tmp_path / "b"
    for run_dir, stop in ((budgeted, "budget_usd = 0.002"), (unbudgeted, "max_rounds = 2")):
        run_dir.mkdir()
        (run_dir / "plan.toml").write_text(f"[stop]\n{stop}\n")
        (run_dir / "summary.json").write_text(json.dumps(
            {"stop_reason": "budget", "rounds": 32, "final_eval_return": -6.6,
             "cost_usd": 0.0019907}))
    assert run_outcome(budgeted) == \
        " (budget, 32 rounds, final eval -6.6, $0.00199 of $0.002 (99.53 %))"
    assert run_outcome(unbudgeted) == " (budget, 32 rounds, final eval -6.6, $0.00199)"
