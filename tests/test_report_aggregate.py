"""``nitro report SWEEP``: seeds aggregated per setting, intervals, paired differences, bands."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugins.experiments.aggregate import (
    Group,
    bootstrap_ci,
    counterpart,
    describe,
    front_gap,
    fronts,
    iqm,
    markdown,
    paired,
    summarize,
    t_interval,
    tails,
)
from plugins.experiments.report import load_run
from tests.conftest import run_cli

#: perf/'s scripts (boost, boost_budget, common) import each other by bare name, as when run.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path: Path, *, scaler: str, seed: int, slope: float, rounds: int = 10,
              actors: int = 4, reason: str = "budget", budget: float | None = 0.01,
              invocations: bool = False) -> Path:
    """A run directory as the engine leaves it: periodic evaluations on even rounds and the
    evaluation at stop as a ProbeMeasured after the last RoundFinished (which has none)."""
    path.mkdir(parents=True)
    t0 = 1_000.0
    lines: list[dict[str, Any]] = [{"event": "RunStarted", "ts": t0, "run_id": "x"}]
    cost = 0.0
    for r in range(1, rounds + 1):
        cost += 0.001
        if invocations:  # what makes a real boosted run's events.jsonl large
            lines += [{"event": "InvocationFinished", "ts": t0 + r, "round": r,
                       "request_id": f"r{r}-a{a}", "ok": True, "env_steps": 512,
                       "duration_ms": 900.0, "billed_ms": 900} for a in range(actors)]
        lines += [
            {"event": "CostCharged", "ts": t0 + r, "round": r, "round_usd": 0.001,
             "total_usd": cost, "items": {}},
            {"event": "RoundFinished", "ts": t0 + r, "round": r, "actors": actors,
             "env_steps": 1000 * r, "cost_usd": cost, "sim_time_s": 2.0 * r,
             "eval_return": slope * r if r % 2 == 0 and r < rounds else None},
        ]
    final = slope * rounds + 1
    lines.append({"event": "ProbeMeasured", "ts": t0 + rounds + 1, "round": rounds,
                  "probe": "eval", "probe_s": 0.1, "values": {"eval_return": final}})
    (path / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    stop = f"[stop]\nbudget_usd = {budget}\n" if budget else ""
    (path / "plan.toml").write_text(f'[run]\nname = "t"\nseed = {seed}\n\n[scaler]\nname = '
                                    f'"{scaler}"\n\n[actors]\nsimulate = true\n\n{stop}')
    (path / "summary.json").write_text(json.dumps({
        "stop_reason": reason, "rounds": rounds, "env_steps": 1000 * rounds,
        "final_eval_return": final, "best_eval_return": final, "cost_usd": cost,
        "sim_time_s": 2.0 * rounds, "wall_s": 1.0, "actors_per_round": [actors] * rounds}))
    return path


def write_sweep(root: Path, settings: dict[str, dict[int, float]], **kw: Any) -> Path:
    """A sweep directory: ``settings`` maps a label to seed -> the slope of its return."""
    manifest: dict[str, Any] = {"plan": "p.toml", "settings": {}}
    for label, seeds in settings.items():
        runs = {}
        for seed, slope in seeds.items():
            write_run(root / label / f"seed-{seed}", scaler=label, seed=seed, slope=slope, **kw)
            runs[str(seed)] = {"dir": f"{label}/seed-{seed}", "status": "finished"}
        manifest["settings"][label] = {"overrides": [], "dir": label, "runs": runs}
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def test_iqm_and_bootstrap_match_their_definitions() -> None:
    x = np.arange(1.0, 11.0)  # 10 values: a quarter (2) cut from each end -> mean of 3..8
    assert iqm(x) == pytest.approx(5.5)
    assert iqm(np.array([0.0, 0.0, 1.0, 1000.0])) == pytest.approx(0.5)
    assert iqm(np.array([1.0, 2.0, 30.0])) == pytest.approx(11.0)  # below 4: the mean
    ci = bootstrap_ci(list(x), interval="percentile")
    assert ci == bootstrap_ci(list(x), interval="percentile")  # seeded
    # The bootstrap distribution of the mean of 1..10 has sd ~ 2.87 / sqrt(10) = 0.91.
    assert ci[0] == pytest.approx(5.5 - 1.96 * 0.908, abs=0.15)
    assert ci[1] == pytest.approx(5.5 + 1.96 * 0.908, abs=0.15)
    # Expanded (the default): read at Phi(-sqrt(10/9) t_9) = 0.86 % and 99.14 %, i.e. at
    # 5.5 -+ 2.384 x 0.908, which for a symmetric sample is the Student t interval itself.
    assert tails(10) == pytest.approx((0.856, 99.144), abs=0.002)
    assert tails(10, "percentile") == pytest.approx((2.5, 97.5))
    wide = bootstrap_ci(list(x))
    assert wide == pytest.approx(t_interval(list(x)), abs=0.2)
    assert wide[0] < ci[0] and wide[1] > ci[1]
    with pytest.raises(ValueError, match="interval must be one of"):
        tails(10, "bca")
    assert bootstrap_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)
    assert bootstrap_ci([3.0]) is None
    d = describe([1.0, None, 3.0, float("nan")])
    assert d["n"] == 2 and d["mean"] == 2.0
    rows = [{"seed": s, "v": v} for s, v in ((1, 10.0), (2, 20.0), (3, 5.0))]
    base = [{"seed": s, "v": v} for s, v in ((1, 4.0), (2, 16.0), (4, 100.0))]
    diff = paired(rows, base, "v")
    assert diff["seeds"] == [1, 2] and diff["mean"] == pytest.approx(5.0)
    assert diff["mean_ci"] == pytest.approx((4.0, 6.0))
    # differences 6 and 4: sd 1.414, t1 = 12.706, half-width 12.706 x 1.414 / sqrt 2
    assert diff["mean_ci_t"] == pytest.approx((5.0 - 12.706, 5.0 + 12.706))


def test_evaluation_at_stop_is_the_last_point(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", scaler="nitro", seed=1, slope=10.0))
    assert run.eval_return[-1] == 101.0  # from the ProbeMeasured after round 10
    assert run.points(run.cost_usd)[0][-1] == pytest.approx(0.01)


def test_report_aggregates_a_sweep_per_setting(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep", {
        "fixed16": {1: 10.0, 2: 12.0, 3: 8.0, 4: 11.0},
        "nitro": {1: 15.0, 2: 16.0, 3: 13.0, 4: 14.0},
    })
    # An interrupted run has no place in a statistic.
    interrupted = sweep / "nitro" / "seed-5"
    write_run(interrupted, scaler="nitro", seed=5, slope=99.0, reason="signal SIGINT")
    manifest = json.loads((sweep / "sweep.json").read_text())
    manifest["settings"]["nitro"]["runs"]["5"] = {"dir": "nitro/seed-5"}
    (sweep / "sweep.json").write_text(json.dumps(manifest))

    out_json = tmp_path / "agg.json"
    proc = run_cli("report", str(sweep), "--target", "100", "--baseline", "fixed16",
                   "--json", str(out_json), "--out", str(tmp_path / "figs"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| nitro | 4 |" in proc.stdout and "| fixed16 | 4 |" in proc.stdout
    assert "nitro seed 5: not finished" in proc.stdout
    agg = json.loads(out_json.read_text())
    rows = {(r["setting"], r["seed"]): r for r in agg["rows"]}
    assert len(rows) == 8
    r = rows[("nitro", 1)]  # returns 15 r: 120 at round 8 is the first at or above 100
    assert r["final_eval_return"] == 151.0 and r["reached_target"] is True
    assert r["env_steps_to_target"] == 8000 and r["cost_to_target_usd"] == pytest.approx(0.008)
    assert r["sim_time_to_target_s"] == pytest.approx(16.0)
    assert r["budget_spent"] == pytest.approx(1.0)
    # fixed16 seed 3 (returns 8 r) ends at 81, below the target: not reached, no cost to it
    assert rows[("fixed16", 3)]["final_eval_return"] == 81.0
    assert rows[("fixed16", 3)]["reached_target"] is False
    nitro = agg["settings"]["nitro"]
    final = nitro["metrics"]["final_eval_return"]
    assert final["mean"] == pytest.approx(np.mean([151, 161, 131, 141]))
    assert final["iqm"] == pytest.approx(np.mean([141, 151]))
    assert final["mean_ci"][0] <= final["mean"] <= final["mean_ci"][1]
    d = nitro["vs_baseline"]["final_eval_return"]
    assert d["n"] == 4 and d["mean"] == pytest.approx(np.mean([50, 40, 50, 30]))
    assert d["mean_ci"][0] > 0  # every seed gained: the interval excludes zero
    # differences 50, 40, 50, 30: mean 42.5, sd 9.574, t3 = 3.182 -> half-width 15.23
    assert d["mean_ci_t"] == pytest.approx((42.5 - 15.23, 42.5 + 15.23), abs=0.01)
    assert "Paired by seed, setting − fixed16" in proc.stdout
    assert "bootstrap intervals at the expanded quantiles" in proc.stdout
    assert "| nitro | 4 | +42.5 [" in proc.stdout and "| [+27.3, +57.7] |" in proc.stdout
    for name in ("bands_return_vs_env_steps", "bands_return_vs_cost",
                 "bands_return_vs_sim_time", "final_eval_by_setting"):
        assert (tmp_path / "figs" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    # The plain percentile interval on request: the same bootstrap, read at 2.5 and 97.5 %,
    # so narrower than the default expanded one, which the JSON names.
    assert agg["bootstrap"]["interval"] == "expanded"
    plain_json = tmp_path / "plain.json"
    plain = run_cli("report", str(sweep), "--baseline", "fixed16", "--interval", "percentile",
                    "--json", str(plain_json), "--no-figures", timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    narrow = json.loads(plain_json.read_text())
    assert narrow["bootstrap"]["interval"] == "percentile"
    assert "plain percentile-bootstrap intervals, narrower than 95 %" in plain.stdout
    lo, hi = narrow["settings"]["nitro"]["vs_baseline"]["final_eval_return"]["mean_ci"]
    assert d["mean_ci"][0] < lo and hi <= d["mean_ci"][1]  # 50 is the largest difference


def test_the_table_shows_the_least_and_most_of_its_budget_any_seed_spent() -> None:
    """Equal budget holds only if every run spent nearly all of it and none more, so the
    table shows the extremes, read away from 100 %: 99.996 % is not "100.00 %" and 100.004 %
    is not "within budget"."""
    rows = [{"setting": "nitro", "seed": 1, "stop_reason": "budget", "budget_spent": 0.9542},
            {"setting": "nitro", "seed": 2, "stop_reason": "budget", "budget_spent": 0.99996},
            {"setting": "fixed8", "seed": 1, "stop_reason": "budget", "budget_spent": 1.00004},
            {"setting": "unbudgeted", "seed": 1, "stop_reason": "max_rounds"}]
    agg = summarize(rows, ["nitro", "fixed8", "unbudgeted"], None, None)
    assert agg["settings"]["nitro"]["budget_spent_range"] == [0.9542, 0.99996]
    assert agg["settings"]["unbudgeted"]["budget_spent_range"] is None
    table = markdown(agg)
    assert "| budget spent | stop |" in table
    assert "| 95.42–99.99 % | budget |" in table
    assert "| 100.01 % | budget |" in table
    assert "| - | max_rounds |" in table
    plain = summarize(rows[-1:], ["unbudgeted"], None, None)
    assert "budget spent" not in markdown(plain)  # no budget anywhere: no column


def test_a_baseline_named_by_one_axis_pairs_within_the_others(tmp_path: Path) -> None:
    # A grid of scalers x tasks: a return on task B says nothing against one on task A, so
    # ``--baseline fixed8`` sets each setting beside fixed8 on its own task.
    sweep = write_sweep(tmp_path / "sweep", {
        "fixed8,env.id=A-v0": {1: 10.0, 2: 12.0, 3: 8.0},
        "nitro,env.id=A-v0": {1: 15.0, 2: 16.0, 3: 13.0},   # +50, +40, +50 over fixed8 on A
        "fixed8,env.id=B-v0": {1: 100.0, 2: 110.0, 3: 90.0},
        "nitro,env.id=B-v0": {1: 90.0, 2: 100.0, 3: 85.0},  # -100, -100, -50 on B
    })
    out_json = tmp_path / "agg.json"
    proc = run_cli("report", str(sweep), "--baseline", "fixed8", "--json", str(out_json),
                   "--no-figures", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    settings = json.loads(out_json.read_text())["settings"]
    a, b = settings["nitro,env.id=A-v0"], settings["nitro,env.id=B-v0"]
    assert a["baseline"] == "fixed8,env.id=A-v0" and b["baseline"] == "fixed8,env.id=B-v0"
    assert a["vs_baseline"]["final_eval_return"]["mean"] == pytest.approx(140 / 3)
    assert b["vs_baseline"]["final_eval_return"]["mean"] == pytest.approx(-250 / 3)
    assert "vs_baseline" not in settings["fixed8,env.id=B-v0"]  # a baseline of its own stratum
    assert "setting − its counterpart under fixed8" in proc.stdout
    assert "| nitro,env.id=B-v0 | fixed8,env.id=B-v0 | 3 | -83.3 [" in proc.stdout
    # A whole label is still the one baseline of every setting, as the user asked.
    proc = run_cli("report", str(sweep), "--baseline", "fixed8,env.id=A-v0", "--json",
                   str(out_json), "--no-figures", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    settings = json.loads(out_json.read_text())["settings"]
    assert {e.get("baseline") for e in settings.values()} == {None, "fixed8,env.id=A-v0"}
    assert "setting − fixed8,env.id=A-v0 (mean" in proc.stdout
    proc = run_cli("report", str(sweep), "--baseline", "fixed16", "--no-figures", timeout=120)
    assert proc.returncode == 2 and "--baseline 'fixed16' is not a setting" in proc.stderr
    # Returns of two tasks share no scale: one set of band figures per task, and a target
    # return per task (one target for both is named as a doubtful choice).
    for task in ("A-v0", "B-v0"):
        for run_dir in sweep.glob(f"*env.id={task}/seed-*"):
            plan = run_dir / "plan.toml"
            plan.write_text(plan.read_text() + f'\n[env]\nid = "{task}"\n')
    proc = run_cli("report", str(sweep), "--baseline", "fixed8", "--target", "100",
                   "--no-figures", timeout=120)
    assert proc.returncode == 0 and "one --target for 2 tasks (A-v0, B-v0)" in proc.stdout
    proc = run_cli("report", str(sweep), "--baseline", "fixed8", "--out",
                   str(tmp_path / "figs"), "--target", "A-v0=100,B-v0=1000", "--json",
                   str(out_json), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reached A-v0 100, B-v0 1000" in proc.stdout
    found = json.loads(out_json.read_text())
    rows = {(r["setting"], r["seed"]): r for r in found["rows"]}
    assert rows[("nitro,env.id=A-v0", 1)]["target"] == 100.0
    assert rows[("nitro,env.id=A-v0", 1)]["env_steps_to_target"] == 8000  # 120 at round 8
    assert rows[("fixed8,env.id=B-v0", 1)]["env_steps_to_target"] == 10_000  # 1,001 at stop
    assert found["settings"]["fixed8,env.id=B-v0"]["reached_target"] == 2  # 1,001 and 1,101
    assert found["settings"]["nitro,env.id=B-v0"]["reached_target"] == 1  # 901, 1,001, 851
    for bad in ("A-v0=x", "=100"):
        proc = run_cli("report", str(sweep), "--target", bad, "--no-figures", timeout=120)
        assert proc.returncode == 2 and "expected a return (1000) or env id=return" in proc.stderr
    proc = run_cli("report", str(sweep), "--target", "C-v0=5", "--no-figures", timeout=120)
    assert proc.returncode == 2 and "'C-v0', which no run trained on" in proc.stderr
    for task in ("A-v0", "B-v0"):
        figure = tmp_path / "figs" / task / "bands_return_vs_cost.png"
        assert figure.read_bytes()[:8] == PNG_MAGIC


def test_a_front_named_by_one_axis_is_drawn_per_task(tmp_path: Path) -> None:
    labels = ["fixed4,env.id=A-v0", "fixed8,env.id=A-v0", "nitro,env.id=A-v0",
              "fixed8,env.id=B-v0", "nitro,env.id=B-v0", "x,[1, 2]"]
    assert counterpart(labels, "nitro,env.id=B-v0", "fixed8") == "fixed8,env.id=B-v0"
    assert counterpart(labels, "nitro,env.id=B-v0", "fixed4") is None  # not run on B
    assert counterpart(labels, "nitro,env.id=B-v0", "env.id=A-v0") == "nitro,env.id=A-v0"
    assert counterpart(labels, "x,[1, 2]", "x") == "x,[1, 2]"  # a TOML value keeps its comma
    groups = front_groups(tmp_path, {
        "fixed4,env.id=A-v0": ({1: 10.0, 2: 12.0}, 10), "fixed8,env.id=A-v0": ({1: 11.0, 2: 9.0}, 10),
        "nitro,env.id=A-v0": ({1: 16.0, 2: 17.0}, 10),
        "fixed4,env.id=B-v0": ({1: 100.0, 2: 120.0}, 10),
        "fixed8,env.id=B-v0": ({1: 110.0, 2: 90.0}, 10),
        "nitro,env.id=B-v0": ({1: 60.0, 2: 70.0}, 10)})
    found = fronts(groups, ["fixed4", "fixed8"])["dollars"]
    assert set(found) == {"nitro,env.id=A-v0", "nitro,env.id=B-v0"}
    assert found["nitro,env.id=B-v0"]["front"] == ["fixed4,env.id=B-v0", "fixed8,env.id=B-v0"]
    assert found["nitro,env.id=A-v0"]["mean_gap_ci"][0] > 0  # above its own task's front
    assert found["nitro,env.id=B-v0"]["mean_gap_ci"][1] < 0  # below its own
    with pytest.raises(ValueError, match="no setting named 'fixed16'"):
        fronts(groups, ["fixed4", "fixed16"])


def front_groups(root: Path, settings: dict[str, tuple[dict[int, float], int]]) -> list[Group]:
    """Groups of runs: label -> (seed -> slope, rounds)."""
    return [Group(label, [load_run(write_run(root / label / f"seed-{seed}", scaler=label,
                                             seed=seed, slope=slope, rounds=rounds))
                          for seed, slope in seeds.items()])
            for label, (seeds, rounds) in settings.items()]


def test_front_gap_follows_the_best_fixed_curve_and_holds_a_run_that_ended(
        tmp_path: Path) -> None:
    # Against dollars (0.001 a round): fixed_a climbs 30 a round but its budget ends at round 5
    # (151 at stop), then holds; fixed_b climbs 20 a round to 201 at round 10; the rule 25 a
    # round to 251. On the grid 0.002, 0.003, ..., 0.010 the front is fixed_a's 60, 90, 120,
    # 151, 151, 151 and then fixed_b's 160, 180, 201; the rule's 50, 75, ..., 225, 251 sits
    # -10, -15, -20, -26, -1 below it and +24, +40, +45, +50 above.
    groups = front_groups(tmp_path, {"fixed_a": ({1: 30.0, 2: 30.0}, 5),
                                     "fixed_b": ({1: 20.0, 2: 20.0}, 10),
                                     "rule": ({1: 25.0, 2: 25.0}, 10)})
    gap = front_gap(groups, ["fixed_a", "fixed_b"], "rule", lambda r: r.cost_usd, points=9)
    assert gap is not None
    assert gap["curve"]["gap"] == pytest.approx([-10, -15, -20, -26, -1, 24, 40, 45, 50])
    assert gap["mean_gap"] == pytest.approx(87 / 9)
    assert gap["share_on_or_above"] == pytest.approx(4 / 9)
    assert gap["front_share"] == pytest.approx({"fixed_a": 6 / 9, "fixed_b": 3 / 9})
    # Identical seeds: no spread, so the intervals are the points and the shares follow.
    assert gap["mean_gap_ci"] == pytest.approx((87 / 9, 87 / 9))
    assert gap["share_above"] == pytest.approx(4 / 9)
    assert gap["share_below"] == pytest.approx(5 / 9)
    assert gap["grid"] == pytest.approx([0.002, 0.010])


def test_front_gap_pairs_seeds_and_names_what_is_missing(tmp_path: Path) -> None:
    # Every seed of the rule climbs 5 a round faster than the same seed of the front, while
    # seeds differ among themselves by far more: paired, the interval is the point itself.
    groups = front_groups(tmp_path, {"fixed": ({1: 10.0, 2: 20.0, 3: 30.0, 4: 40.0}, 10),
                                     "rule": ({1: 15.0, 2: 25.0, 3: 35.0, 4: 45.0, 5: 9.0}, 10)})
    gap = front_gap(groups, ["fixed"], "rule", lambda r: r.cost_usd)
    assert gap is not None and gap["seeds"] == [1, 2, 3, 4]  # seed 5 has no partner
    # 5 a round more, at rounds 2..10 of a linear grid: 5 x 6 on average
    assert gap["mean_gap"] == pytest.approx(30.0)
    assert gap["mean_gap_ci"] == pytest.approx((30.0, 30.0))
    assert gap["share_on_or_above"] == gap["share_above"] == 1.0
    with pytest.raises(ValueError, match="no setting named 'fixed9'"):
        front_gap(groups, ["fixed9"], "rule", lambda r: r.cost_usd)


def test_report_measures_settings_against_a_front(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep", {
        "fixed4": {1: 10.0, 2: 12.0, 3: 8.0}, "fixed8": {1: 11.0, 2: 9.0, 3: 12.0},
        "nitro": {1: 6.0, 2: 7.0, 3: 5.0}})
    out_json = tmp_path / "agg.json"
    proc = run_cli("report", str(sweep), "--front", "fixed4,fixed8", "--json", str(out_json),
                   "--out", str(tmp_path / "figs"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Against the front of fixed4, fixed8 in return against dollars" in proc.stdout
    assert "Against the front of fixed4, fixed8 in return against simulated time" in proc.stdout
    gap = json.loads(out_json.read_text())["front"]["dollars"]["nitro"]
    assert gap["share_below"] == 1.0 and gap["mean_gap_ci"][1] < 0  # below everywhere
    for name in ("front_gap_vs_dollars", "front_gap_vs_sim_time"):
        assert (tmp_path / "figs" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    proc = run_cli("report", str(sweep), "--front", "fixed4,fixed16", "--no-figures",
                   timeout=120)
    assert proc.returncode == 2 and "no setting named 'fixed16'" in proc.stderr


def test_boost_reports_its_settings_against_the_fixed_counts(tmp_path: Path) -> None:
    import boost

    groups = front_groups(tmp_path / "runs", {"fixed8": ({1: 10.0, 2: 12.0}, 10),
                                              "fixed16": ({1: 9.0, 2: 13.0}, 10),
                                              "nitro": ({1: 14.0, 2: 15.0}, 10)})
    boost.front_report(groups, tmp_path / "report")
    text = (tmp_path / "report" / "front.md").read_text()
    assert text.startswith("Against the front of fixed8, fixed16 in return against dollars")
    assert "| nitro | 2 |" in text and "| fixed8 |" not in text  # the front is not its own row
    assert (tmp_path / "report" / "front_gap_vs_dollars.png").read_bytes()[:8] == PNG_MAGIC
    boost.front_report(groups[:2], tmp_path / "only-fixed")  # nothing to set against them
    assert not (tmp_path / "only-fixed").exists()


def test_boost_front_measures_the_stored_studies(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import boost_front
    import common

    stored = tmp_path / "boost_runs"
    front_groups(stored / "task", {"fixed4": ({1: 10.0, 2: 12.0}, 10),
                                   "fixed8": ({1: 11.0, 2: 9.0}, 10),
                                   "anchored8_p4": ({1: 16.0, 2: 17.0}, 10)})
    monkeypatch.setattr(boost_front, "STORED", stored)
    monkeypatch.setattr(boost_front, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(boost_front, "ROOT", tmp_path)
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(boost_front, "STUDIES", (boost_front.Study(
        "task", "Task-v0, study 0: a test", "task", ("fixed4", "fixed8")),))
    assert boost_front.main() == 0
    data = json.loads((tmp_path / "results" / "boost_front.json").read_text())
    got = {r["axis"]: r for r in data["rows"]}
    assert set(got) == {"dollars", "sim_time"} and got["dollars"]["setting"] == "anchored8_p4"
    # fixed4's mean climbs 11 a round, fixed8's 10: fixed4 is the front everywhere, and the
    # rule gains 16 - 10 = 6 a round on seed 1, 17 - 12 = 5 on seed 2; over rounds 2..10 of a
    # linear grid (6 on average) that is 36 and 30, 33 on average
    assert got["dollars"]["mean_gap"] == pytest.approx(33.0)
    assert got["dollars"]["front_share"] == {"fixed4": 1.0, "fixed8": 0.0}
    table = boost_front.doc_table(data["rows"], data["studies"])
    assert boost_front.render(json.loads(json.dumps(data))).endswith(table)  # from rows alone
    assert "| Task-v0, study 0 | fixed4, fixed8 | `anchored8_p4` | 2 | +33 [+30, +36] | " \
        "100% / 0% |" in table
    assert (tmp_path / "figures" / "task" / "front_gap_vs_dollars.png").is_file()


def test_boost_intervals_sets_a_t_interval_beside_the_bootstrap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The t quantile matches the table at its end and the expansion beyond it; the intervals
    are recomputed from the stored per-seed differences; a study's rows pair by seed."""
    import boost_intervals as bi
    import common

    from plugins.experiments import aggregate as agg

    assert agg.t975(30) == 2.042 and agg.t975(31) == pytest.approx(2.0395, abs=5e-4)
    assert agg.t975(120) == pytest.approx(1.9799, abs=5e-4)
    with pytest.raises(ValueError, match="at least 1"):
        agg.t975(0)
    # differences 1, 2, 3, 4 (mean 2.5, sd 1.291): t3 = 3.182, half-width 3.182 * 0.6455
    lo, hi = agg.t_interval([1.0, 2.0, 3.0, 4.0])
    assert (lo, hi) == pytest.approx((2.5 - 2.0540, 2.5 + 2.0540), abs=1e-3)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    rows = [{"setting": s, "seed": seed, "m": v} for s, seed, v in
            [("a", 1, 5.0), ("a", 2, 6.0), ("a", 3, None), ("b", 1, 4.0), ("b", 2, 3.0),
             ("b", 3, 1.0), ("a", 4, 9.0)]]
    (tmp_path / "study.json").write_text(json.dumps({"rows": rows}))
    assert bi.differences("study", "a", "b", "m") == [{"seed": 1, "diff": 1.0},
                                                      {"seed": 2, "diff": 3.0}]
    monkeypatch.setattr(bi, "COMPARISONS", (("study", "a", "b", "m", "placebo"),))
    assert bi.main() == 0
    data = json.loads((tmp_path / "boost_intervals.json").read_text())
    assert bi.render(data) == data["markdown"]
    # mean 2, t1 = 12.706 x sd 1.414 / sqrt 2 = 12.706: [-10.706, +14.706]
    # Two seeds: the expanded bootstrap reads the extremes, as the percentile one does.
    assert "| placebo | study | a − b | m | 2 | +2.0 | [+1.0, +3.0] * | [+1.0, +3.0] * | " \
        "[-10.7, +14.7] |" in data["markdown"]
    assert data["coverage"] == []  # no equal-budget study stored: nothing to pool
    # An equal-budget study: its pair of settings is audited and pooled for the coverage.
    study = [{"setting": s, "seed": seed, "final_eval_return": v + (10.0 if s == "y" else 0.0)}
             for s in ("x", "y") for seed, v in enumerate((1.0, 4.0, 2.0, 8.0, 5.0), 1)]
    study[5]["final_eval_return"] += 3.0  # y - x: 13, 10, 10, 10, 10
    (tmp_path / "boost_task_gpu_model.json").write_text(json.dumps({"rows": study}))
    assert bi.audit_pairs() == [("boost_task_gpu_model", "y", "x")]
    assert bi.main() == 0
    data = json.loads((tmp_path / "boost_intervals.json").read_text())
    assert bi.render(data) == data["markdown"]
    assert data["pool_size"] == 5 and data["pool_pairs"] == 1
    assert [cov["seeds"] for cov in data["coverage"]] == [5, 10]
    assert "(1 paired differences of the final return): 1 exclude zero by the percentile " \
        "bootstrap, 1 by the expanded bootstrap, 1 by Student t" in data["markdown"]
    # The pool, centred and scaled, has mean zero: a t interval on draws from it covers
    # zero about 95 % of the time (5 values, so its coverage is coarse).
    t_share = data["coverage"][1]["covered"]["t"] / data["coverage"][1]["draws"]
    assert 0.85 < t_share <= 1.0


def test_plain_run_dirs_group_by_parent_and_bad_baseline(tmp_path: Path) -> None:
    a = write_run(tmp_path / "fixed" / "s1", scaler="fixed", seed=1, slope=1.0)
    b = write_run(tmp_path / "fixed" / "s2", scaler="fixed", seed=2, slope=2.0)
    c = write_run(tmp_path / "nitro" / "s1", scaler="nitro", seed=1, slope=3.0)
    proc = run_cli("report", str(a), str(b), str(c), "--group-by", "parent", "--no-figures",
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| fixed | 2 |" in proc.stdout and "| nitro | 1 |" in proc.stdout
    proc = run_cli("report", str(a), "--group-by", "scaler", "--baseline", "nope",
                   "--no-figures", timeout=120)
    assert proc.returncode == 2 and "--baseline 'nope' is not a setting" in proc.stderr


def test_a_hundred_runs_report_in_seconds(tmp_path: Path) -> None:
    settings = {f"s{i}": {seed: 5.0 + seed for seed in range(1, 11)} for i in range(10)}
    sweep = write_sweep(tmp_path / "sweep", settings, rounds=50, actors=32, invocations=True)
    t0 = time.monotonic()
    proc = run_cli("report", str(sweep), "--target", "100", "--baseline", "s0", "--out",
                   str(tmp_path / "figs"), timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("| s") >= 19  # ten settings, nine differences
    # 100 runs x 50 rounds x 32 invocations (160,000 events), figures included; seconds on a
    # busy two-core machine.
    assert elapsed < 30, elapsed


def test_boost_protocols_build_valid_plans_and_render_from_rows(tmp_path: Path) -> None:
    import argparse

    import boost

    from kernel.plan import load_plan

    def args(**kw: Any) -> argparse.Namespace:
        base = dict(protocol="paper", quick=False, tasks=None, settings=None, costs=None,
                    seeds=None, rounds=None, steps_per_actor=None, start_actors=None,
                    min_actors=None, max_actors=None, eval_every=None, eval_episodes=None)
        return argparse.Namespace(**{**base, **kw})

    quick = boost.protocol_from(args(quick=True))
    assert quick.tasks == ("CartPole-v1",) and "fixed64" not in quick.settings
    assert "fixed2" in quick.settings and quick.rounds == 3
    # the quick budget protocol is an equal-budget one: its round cap is only a safety, far
    # above the ~50-160 rounds CartPole's $0.0003 buys, so every run stops by the budget
    assert boost.protocol_from(args(protocol="budget", quick=True)).rounds == \
        boost.QUICK_BUDGET_ROUNDS >= 400
    assert boost.protocol_from(args(rounds=7, max_actors=32)).max_actors == 32
    for name in ("paper", "budget"):
        p = boost.protocol_from(args(protocol=name))
        for cost in ("aws-cpu", "aws-gpu", "prototype"):
            plan = boost.base_plan(p, "Hopper-v5", cost, 0.01 if name == "budget" else None,
                                   "sync", 1)
            for label in p.settings:
                resolved = load_plan(plan, list(boost.setting(label).overrides))
                assert resolved["actors"]["steps"] == 512 and resolved["env"]["num_envs"] == 1
                if label.startswith("fixed"):
                    assert resolved["actors"]["count"] == int(label[5:])
            assert ("budget_usd" in plan["stop"]) == (name == "budget")
        for task in ("Hopper-v5", "Walker2d-v5"):  # Walker2d bills with Hopper's time model
            plan = boost.base_plan(p, task, "aws-gpu", None, "sync", 1, boost.CLOCKS[name])
            cost = load_plan(plan, list(boost.setting("nitro").overrides))["cost"]
            assert cost["time_model"] == "model" and cost["model_actor_ms_per_step"] > 0
    # the paper measured rho on the whole batch; the setting that does so keeps the evaluation
    plan = boost.base_plan(boost.PAPER, "Hopper-v5", "aws-gpu", None, "sync", 1)
    full = load_plan(plan, list(boost.setting("prototype_fullbatch").overrides))
    assert full["scaler"]["name"] == "prototype"
    assert [(q["name"], q.get("samples")) for q in full["probes"]] == [("eval", None),
                                                                       ("hessian", 0)]
    assert full["probes"][0]["every"] == 5 and full["probes"][0]["episodes"] == 10
    with pytest.raises(boost.SweepError, match="no time model for CartPole-v1"):
        boost.clock_costs("model", "CartPole-v1")

    rows = []
    for task in ("Hopper-v5", "Walker2d-v5"):
        for setting, gain in (("fixed16", 0.0), ("nitro", 50.0)):
            for seed in (1, 2, 3):
                rows.append({"task": task, "cost": "aws-gpu", "target": 1000.0,
                             "setting": setting, "seed": seed, "stop_reason": "max_rounds",
                             "final_eval_return": 900.0 + 10 * seed + gain,
                             "best_eval_return": 1000.0 + gain, "cost_usd": 0.01,
                             "sim_time_s": 100.0, "env_steps": 400_000, "mean_actors": 16.0,
                             "reached_target": seed > 1, "cost_to_target_usd": 0.008,
                             "sim_time_to_target_s": 80.0})
    data = {"protocol": vars(boost.PAPER), "mode": "sync", "baseline": "fixed16",
            "budgets": {}, "rows": rows}
    text = boost.render(data)
    assert text == boost.render(json.loads(json.dumps(data)))  # from stored rows alone
    assert "Evaluation (10 episodes, every 5 rounds" in text and "{" not in text
    assert "### Hopper-v5, cost model `aws-gpu`, target return 1000" in text
    assert "### Walker2d-v5, cost model `aws-gpu`" in text
    assert "| nitro | 3 | +50.0 [+50.0, +50.0]" in text


def test_boost_checks_every_task_before_the_first_run(tmp_path: Path) -> None:
    """A task the protocol cannot run fails before any run starts, naming what is missing, so a
    sweep over several tasks does not stop hours in at the last one."""
    import argparse

    import boost

    def prepare(protocol: boost.Protocol, **kw: Any) -> None:
        args = argparse.Namespace(**{"budget": None, "clock": "measured", **kw})
        boost.prepare(protocol, args, tmp_path)

    budget = boost.replace(boost.BUDGET, tasks=("Hopper-v5", "HalfCheetah-v5"))
    with pytest.raises(boost.SweepError, match="no default budget for HalfCheetah-v5"):
        prepare(budget)
    prepare(budget, budget=0.01)  # a budget given on the command line covers every task
    with pytest.raises(boost.SweepError, match="'Hoper-v5' is not a registered gymnasium id"):
        prepare(boost.replace(boost.PAPER, tasks=("Hopper-v5", "Hoper-v5")))
    assert not any(tmp_path.iterdir())  # nothing ran


def test_boost_fits_a_new_tasks_time_model_from_its_calibration_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A modelled clock on a task not studied yet: two real calibration runs (no-boost at 2 and
    16 actors, measured), a fit, and every run of the protocol billed by that model. The runs
    are cut from 20 rounds to 6 (the fit's least: five updates of each size, plus round 1)."""
    import argparse

    import boost
    import boost_budget
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(boost_budget, "CALIBRATION_ROUNDS", 6)
    task = "InvertedPendulum-v5"
    with pytest.raises(boost.SweepError, match=f"no time model for {task}"):
        boost.clock_costs("model", task)
    paper = boost.replace(boost.PAPER, tasks=(task,))
    boost.prepare(paper, argparse.Namespace(budget=None, clock="model"), tmp_path / "runs")
    fitted = json.loads((tmp_path / "results" / "time_model_invertedpendulum.json").read_text())
    assert fitted["runs"] == 2 and fitted["updates"] == 12 and fitted["probes"] == 12
    # the gns probe ran beside the Hessian's, at two sizes, so the model times it too
    assert fitted["gns_probes"] == 12
    # ... at a cost that never falls with the samples (a few microseconds a sample here, so a
    # loaded machine may leave only the fixed part: see the next test)
    gns = fitted["constants"]
    assert gns["model_gns_s_per_sample"] >= 0 and gns["model_gns_s"] >= 0
    assert gns["model_gns_s"] + 4096 * gns["model_gns_s_per_sample"] > 0
    assert sorted(p.parent.parent.name for p in
                  (tmp_path / "runs" / "calibration").rglob("summary.json")) == \
        ["probe_n16", "probe_n2"]
    cost = boost.clock_costs("model", task)
    assert cost["time_model"] == "model"
    assert cost["model_actor_ms_per_step"] > 0 and cost["model_learner_s_per_step"] > 0
    plan = boost.base_plan(paper, task, "aws-gpu", None, "sync", 1, "model")
    assert plan["cost"]["model_probe_s_per_sample_step"] == \
        fitted["constants"]["model_probe_s_per_sample_step"]


def test_a_time_models_lines_never_fall_nor_go_below_zero() -> None:
    import boost_budget

    line = boost_budget.line_through_medians
    rising = [(2, 1.0), (2, 1.2), (2, 9.0), (16, 3.0), (16, 2.9), (16, 3.1)]  # one outlier
    intercept, slope = line(rising, 3)
    assert (intercept, slope) == pytest.approx((1.2 - 2 * 1.8 / 14, 1.8 / 14))  # medians 1.2, 3
    # jitter larger than the growth: a falling line becomes a flat one through the medians
    assert line([(2, 0.030), (2, 0.031), (16, 0.025), (16, 0.026)], 2) == \
        pytest.approx((0.028, 0.0))
    # a line that would cross zero above x = 0 (here at x = 5) goes through the origin,
    # the least-squares slope of y = b x: (10 * 1 + 20 * 3) / (10² + 20²)
    assert line([(10, 1.0), (20, 3.0)], 1) == pytest.approx((0.0, 70 / 500))


def test_a_calibration_fits_probe_sizes_that_each_occur_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's samples x Lanczos steps vary with how fast each round's Lanczos converges,
    so two short calibration runs (Ant-v5's did) may see every size once: the fit takes them,
    and recovers the seconds they were made from."""
    import boost_budget
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")

    def run_one(task: str, pricing: str, budget: float, name: str, seed: int, run_dir: Path,
                sets: list[str]) -> int:
        actors = 2 if name == "probe_n2" else 16
        events = []
        for r in range(1, 11):
            steps = actors * 512
            events.append({"event": "InvocationFinished", "ok": True, "env_steps": 512,
                           "duration_ms": 512 * 0.2})
            events.append({"event": "RoundFinished", "round_env_steps": steps,
                           "learner_s": 0.01 + 6e-5 * steps})
            lanczos = 20 + 3 * r + actors  # a size of its own every round
            events.append({"event": "ProbeMeasured", "probe": "hessian",
                           "values": {"hessian_samples": 1024, "lanczos_steps": lanczos},
                           "probe_s": 0.005 + 3e-6 * 1024 * lanczos})
        run_dir.mkdir(parents=True)
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return 0

    monkeypatch.setattr(boost_budget, "run_one", run_one)
    path = boost_budget.calibrate("Ant-v5", tmp_path / "runs")
    constants = json.loads(path.read_text())["constants"]
    assert constants["model_probe_s_per_sample_step"] == pytest.approx(3e-6)
    assert constants["model_probe_s"] == pytest.approx(0.005)
    assert constants["model_learner_s_per_step"] == pytest.approx(6e-5)
    assert constants["model_actor_ms_per_step"] == pytest.approx(0.2)


def test_probe_cost_counts_a_probe_every_kth_round_over_all_rounds(tmp_path: Path) -> None:
    """A rule that probes one round in four pays the probe once per four rounds: the per-round
    shares are of the rounds it ran in, the all-rounds shares of every round's seconds. A
    round with an evaluation counts in the simulated share, whose bill leaves evaluation out
    (leaving it out read the share low where evaluations and probes coincide), and not in the
    wall shares, where its time would pass for probe time."""
    import boost_budget

    run_dir = tmp_path / "every4" / "seed-1"
    run_dir.mkdir(parents=True)
    events, sim = [], 0.0
    for r in range(1, 10):
        probed, evaluated = r % 4 == 1, r == 9
        probe_s = 1.0 if probed else 0.0
        sim += 2.0
        events.append({"event": "CostCharged", "round_usd": 0.01,
                       "items": {"probe_usd": 0.002 if probed else 0.0, "learner_usd": 0.008}})
        events.append({"event": "RoundFinished", "round_s": 5.0, "probe_s": probe_s,
                       "sim_time_s": sim, "eval_return": 1.0 if evaluated else None,
                       "probes": {"lanczos_steps": 20} if probed else {}})
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    cost = boost_budget.probe_cost([run_dir])["every4"]
    assert cost["rounds"] == 2  # rounds 1 and 5; round 9 probed but evaluated too
    assert cost["wall"]["median"] == pytest.approx(1.0 / 5.0)
    assert cost["sim"]["median"] == pytest.approx(0.2)  # the bill's split: 0.002 / 0.010
    assert cost["wall_all"] == pytest.approx(2.0 / (8 * 5.0))
    assert cost["sim_all"] == pytest.approx(3 * 0.2 * 2.0 / (9 * 2.0))
    assert cost["usd_share"] == pytest.approx(3 * 0.002 / (9 * 0.01))
    assert "| 5.0% | 6.7% | 6.7% |" in boost_budget.probe_table({"every4": cost})


def test_fit_gns_adds_the_gns_probes_constants_and_keeps_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model fitted before the gns probe had a time gets that probe's pair from two runs of
    it alone (1,024 and 4,096 samples); every constant already there stays as it was, so the
    studies billed by them replay. A task without a model is refused, not calibrated."""
    import boost_budget
    import common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    before = {"model_actor_ms": 0.0, "model_actor_ms_per_step": 0.2, "model_learner_s": 0.002,
              "model_learner_s_per_step": 6e-5, "model_probe_s": 0.01,
              "model_probe_s_per_sample_step": 3e-6}
    path = tmp_path / "results" / "time_model_hopper.json"
    path.write_text(json.dumps({"name": "time_model_hopper", "when": "earlier",
                                "constants": before, "runs": 14}))
    seen: list[str] = []

    def run_one(task: str, pricing: str, budget: float, name: str, seed: int, run_dir: Path,
                sets: list[str]) -> int:
        seen.append(name)
        samples = 1024 if name == "gns_n2" else 4096
        events = [{"event": "ProbeMeasured", "probe": "gns",
                   "values": {"gns": 100.0 + r, "gns_samples": samples},
                   "probe_s": 0.013 + 2e-6 * samples + (0.05 if r == 3 else 0.0)}
                  for r in range(1, 21)]  # one round slowed by a neighbour: the median ignores it
        run_dir.mkdir(parents=True)
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return 0

    monkeypatch.setattr(boost_budget, "run_one", run_one)
    boost_budget.calibrate_gns("Hopper-v5", tmp_path / "runs")
    assert seen == ["gns_n2", "gns_n16"]
    after = json.loads(path.read_text())
    assert {k: after["constants"][k] for k in before} == before
    assert after["constants"]["model_gns_s"] == pytest.approx(0.013)
    assert after["constants"]["model_gns_s_per_sample"] == pytest.approx(2e-6)
    assert (after["when"], after["runs"], after["gns_probes"]) == ("earlier", 14, 40)
    with pytest.raises(SystemExit, match="Swimmer-v5 has no time model"):
        boost_budget.calibrate_gns("Swimmer-v5", tmp_path / "runs")


def test_boost_adds_to_its_stored_result_and_never_drops_rows(tmp_path: Path) -> None:
    """A command that runs one task or setting keeps the stored rows it did not remake; a
    stored result of another scale is kept aside rather than mixed with the new rows."""
    import boost

    def row(task: str, setting: str, seed: int, value: float) -> dict[str, Any]:
        return {"task": task, "cost": "aws-gpu", "setting": setting, "seed": seed,
                "final_eval_return": value}

    def result(rows: list[dict[str, Any]], **protocol: Any) -> dict[str, Any]:
        return {"protocol": {**vars(boost.PAPER), **protocol}, "mode": "sync",
                "clock": "model_cuda", "budgets": {}, "rows": rows}

    path = tmp_path / "boost_paper_model_cuda.json"
    stored = [row("Hopper-v5", "nitro", 1, 10.0), row("Hopper-v5", "fixed16", 1, 20.0),
              row("Walker2d-v5", "nitro", 1, 30.0)]
    path.write_text(json.dumps(result(stored)))
    merged = boost.merged_with_stored(path, result([row("Hopper-v5", "nitro", 1, 11.0),
                                                    row("Hopper-v5", "nitro", 2, 12.0)]))
    got = {boost.row_key(r): r["final_eval_return"] for r in merged["rows"]}
    assert got == {("Hopper-v5", "aws-gpu", "nitro", 1): 11.0,  # remade: the new value
                   ("Hopper-v5", "aws-gpu", "nitro", 2): 12.0,
                   ("Hopper-v5", "aws-gpu", "fixed16", 1): 20.0,  # not remade: kept
                   ("Walker2d-v5", "aws-gpu", "nitro", 1): 30.0}
    assert merged["carried_over"] == ["Hopper-v5 fixed16", "Walker2d-v5 nitro"]

    other = result([row("Hopper-v5", "nitro", 1, 5.0)], rounds=30)
    assert boost.merged_with_stored(path, other) == other  # another scale: not mixed in
    assert not path.exists()
    (aside,) = tmp_path.glob("boost_paper_model_cuda.replaced-*.json")
    assert json.loads(aside.read_text())["rows"] == stored


def test_boost_keeps_a_folders_plan_when_its_options_differ(tmp_path: Path) -> None:
    """A runs folder made with other options is refused before its plan is touched, so the
    kept runs stay beside the plan they were made from and resume with the right options."""
    import boost

    plan_path = tmp_path / "plan.toml"
    made = boost.base_plan(boost.PAPER, "Hopper-v5", "aws-gpu", None, "sync", 0, "model_cuda")
    boost.write_plan(made, plan_path)
    kept = plan_path.read_text()
    (tmp_path / boost.MANIFEST).write_text("{}")
    other = boost.base_plan(boost.PAPER, "Hopper-v5", "aws-gpu", None, "sync", 1, "model_cuda")
    with pytest.raises(boost.SweepError, match="holds runs made from another plan"):
        boost.write_plan(other, plan_path)
    assert plan_path.read_text() == kept
    assert boost.write_plan(made, plan_path) == plan_path  # the same options resume


def test_boost_collect_reads_folders_made_with_other_options(tmp_path: Path) -> None:
    """``--collect`` runs nothing, so it reads every task's folder whatever options made its
    runs (two tasks swept with different ``--jobs`` have plans that differ in
    ``actors.workers``) and leaves their plans as they are."""
    import argparse

    import boost

    sweep_dir = tmp_path / "Hopper-v5" / "aws-gpu"
    made = boost.base_plan(boost.PAPER, "Hopper-v5", "aws-gpu", None, "sync", 1, "model_cuda")
    boost.write_plan(made, sweep_dir / "plan.toml")
    kept = (sweep_dir / "plan.toml").read_text()
    (sweep_dir / boost.MANIFEST).write_text("{}")
    p = boost.Protocol(**{**vars(boost.PAPER), "tasks": ("Hopper-v5",),
                          "costs": ("aws-gpu",), "settings": ("fixed16",)})
    args = argparse.Namespace(collect=True, jobs=1, workers=None, budget=None, target=None,
                              mode="sync", clock="model_cuda", slim=False, figures=False)
    assert boost.run_protocol(p, args, tmp_path) == []
    assert (sweep_dir / "plan.toml").read_text() == kept


def test_slimmed_runs_give_the_same_rows_and_bills(tmp_path: Path) -> None:
    """``perf/boost.py --slim`` drops the per-invocation events of kept runs; every row the
    protocol reports, and the prototype's bill read off them, must come out the same."""
    import boost

    run_dir = write_run(tmp_path / "r", scaler="nitro", seed=1, slope=10.0, invocations=True)
    events = run_dir / "events.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    third = next(i for i, line in enumerate(lines)
                 if '"RoundFinished"' in line and '"round": 3,' in line)
    lines.insert(third, json.dumps({"event": "ProbeMeasured", "ts": 1.0, "round": 3,
                                    "probe": "hessian", "probe_s": 0.5,
                                    "values": {"rho": 2.0}}) + "\n")
    events.write_text("".join(lines))
    before = load_run(run_dir)
    row = boost.seed_row("nitro", before, 50.0)
    bill = boost.rebilled(before).cost_usd
    size = (run_dir / "events.jsonl").stat().st_size
    boost.slim(run_dir)
    after = load_run(run_dir)
    assert (run_dir / "events.jsonl").stat().st_size < size / 2
    assert "InvocationFinished" not in (run_dir / "events.jsonl").read_text()
    assert boost.seed_row("nitro", after, 50.0) == row
    assert after.probe_s[2] == 0.5 and bill[2] - bill[1] < bill[1] - bill[0]
    assert boost.rebilled(after).cost_usd == bill
