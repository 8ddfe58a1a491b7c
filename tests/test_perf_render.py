"""What perf/RESULTS.md may claim: ratios only over the same seeds, tables recomputed from the
stored raw rows, files without rows marked as such, and the same page every time.

The benchmarks themselves run in perf/ and are never timed here; the rows below have the
shape the benchmarks store.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))

import cartpole_time  # noqa: E402
import common as c  # noqa: E402
import compare_peers as cp  # noqa: E402
import dataplane  # noqa: E402
import fanout  # noqa: E402
import render_results as rr  # noqa: E402


def runs(impl: str, seeds, process_s, wall_s=None, **extra):
    return [{"impl": impl, "seed": s, "process_s": p, "wall_s": (wall_s or process_s)[i],
             "env_steps": 300_000, "sps": 300_000 / (wall_s or process_s)[i],
             "final_eval_return": 1000.0 + 100 * s, "reached": True, **extra}
            for i, (s, p) in enumerate(zip(seeds, process_s, strict=True))]


def test_seed_list_collapses_runs_of_consecutive_seeds():
    assert c.seed_list([3, 1, 2, 5, 7, 8]) == "1–3, 5, 7–8"
    assert c.seed_list([]) == "none"


def test_a_ratio_over_the_same_seeds_is_the_ratio_of_the_medians():
    ours = runs("nitro", [1, 2, 3], [10.0, 20.0, 30.0])
    theirs = runs("sb3", [3, 1, 2], [40.0, 20.0, 80.0])
    value, reason = c.seed_ratio(ours, theirs, "process_s")
    assert reason is None
    assert value == pytest.approx(20.0 / 40.0)


def test_a_ratio_over_different_seed_sets_is_refused_with_both_sets_named():
    value, reason = c.seed_ratio(runs("nitro", range(1, 21), [10.0] * 20),
                                 runs("sb3_1t", [1, 2, 3], [20.0] * 3), "process_s",
                                 ("nitro", "sb3_1t"))
    assert value is None
    assert reason == "seeds differ: nitro 1–20, sb3_1t 1–3"
    assert c.ratio_cell(value, reason).startswith("— (seeds differ")


def test_a_failed_run_takes_its_seed_out_of_the_comparison():
    ours = runs("nitro", [1, 2], [10.0, 12.0])
    theirs = runs("sb3", [1], [20.0]) + [{"impl": "sb3", "seed": 2, "error": "boom"}]
    value, reason = c.seed_ratio(ours, theirs, "process_s", ("nitro", "sb3"))
    assert value is None and "sb3 1" in reason and "nitro 1–2" in reason


def test_bootstrap_interval_is_seeded_and_holds_the_median():
    values = [1.5, 11.9, 5.2, 3.3, 2.8, 7.0, 4.1, 6.6, 2.2, 9.9]
    ci = c.bootstrap_interval(values)
    assert ci == c.bootstrap_interval(values)
    assert ci[0] <= statistics.median(values) <= ci[1]
    assert c.bootstrap_interval([4.0]) is None


def test_paired_ratio_interval_is_a_point_when_every_seed_has_the_same_ratio():
    ours = runs("nitro", [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    theirs = runs("sb3", [1, 2, 3, 4], [2.0, 4.0, 6.0, 8.0])
    assert c.ratio_interval(ours, theirs, "process_s") == (0.5, 0.5)


def peers_result(hopper: dict) -> dict:
    return {"results": {"hopper": hopper}, "seeds": {"hopper": [1, 2, 3]},
            "hopper_steps": 300_000, "history": [{"when": "t", "command": "c", "loadavg": None}]}


def test_peers_ratio_against_a_peer_run_on_fewer_seeds_uses_only_the_seeds_both_ran():
    hopper = {"nitro": runs("nitro", range(1, 21), [86.0 + s for s in range(20)]),
              "sb3": runs("sb3", range(1, 21), [180.0 + s for s in range(20)]),
              "sb3_1t": runs("sb3_1t", [1, 2, 3], [170.0, 171.0, 172.0]),
              "rllib": runs("rllib", [1, 2], [330.0, 340.0])}
    text = cp.render(peers_result(hopper))
    ratio_rows = text.split("Nitro / peer")[1].splitlines()
    row = next(line for line in ratio_rows if line.startswith("| sb3_1t |"))
    # Nitro's seeds 1-3 (86, 87, 88) against sb3_1t's: 87 / 171, never Nitro's 20-seed median
    assert row.split("|")[2].strip().startswith(c.fmt(87.0 / 171.0))
    assert "(seeds 1–3)" in row
    assert cp.ratios_of({"hopper": hopper})["hopper.process_s.nitro/sb3_1t"] == \
        pytest.approx(87.0 / 171.0)
    # below three shared seeds the ratio is refused, with the reason
    row = next(line for line in ratio_rows if line.startswith("| rllib |"))
    assert "— (seeds differ: nitro 1–20, rllib 1–2)" in row
    assert cp.ratios_of({"hopper": hopper})["hopper.process_s.nitro/rllib"] is None
    # the strongest layout is the one Nitro is slowest against on the seeds both ran
    best, why = cp.strongest_sb3(hopper)
    assert best == "sb3_1t" and "sb3, sb3_1t" in why


def test_peers_table_names_the_fastest_sb3_layout_and_divides_by_it():
    seeds = [1, 2, 3]
    hopper = {"nitro": runs("nitro", seeds, [80.0, 90.0, 100.0]),
              "sb3": runs("sb3", seeds, [180.0, 190.0, 200.0]),
              "sb3_1t": runs("sb3_1t", seeds, [170.0, 175.0, 185.0]),
              "sb3_subproc": runs("sb3_subproc", seeds, [150.0, 160.0, 200.0])}
    best, _ = cp.strongest_sb3(hopper)
    assert best == "sb3_subproc"
    text = cp.render(peers_result(hopper))
    row = next(line for line in text.splitlines()
               if line.startswith("| strongest SB3 layout (sb3_subproc) |"))
    assert row.split("|")[2].strip().startswith(c.fmt(90.0 / 160.0))


def test_peers_table_shows_process_and_run_time_for_every_implementation():
    seeds = [1, 2]
    hopper = {"nitro": runs("nitro", seeds, [86.0, 88.0], wall_s=[80.0, 81.0]),
              "rllib": runs("rllib", seeds, [330.0, 340.0], wall_s=[315.0, 320.0])}
    text = cp.render(peers_result(hopper))
    rllib = next(line for line in text.splitlines() if line.startswith("| rllib | 1–2"))
    assert "335" in rllib and "317.50" in rllib  # process and run medians side by side
    assert "own eval runner" in rllib  # the differences stand beside the numbers


def test_cartpole_table_is_recomputed_from_the_rows():
    rows = []
    for seed in range(1, 11):
        rows += runs("nitro", [seed], [5.0 + seed], wall_s=[1.0 + seed])
        rows += runs("ppo_minimal", [seed], [10.0 + seed], wall_s=[4.0 + seed])
    text = cartpole_time.render({"rows": rows, "baseline_threads": 1})
    headline = next(line for line in text.splitlines() if "headline" in line)
    assert "10.50" in headline and "15.50" in headline
    assert headline.split("|")[4].strip().startswith(c.fmt(10.5 / 15.5))
    assert "Seeds 1–10" in text and "**met**" in text


def test_fanout_headline_is_engine_over_the_sdk_floor_on_the_same_repetitions():
    def rep(way, seed, wall):
        return {"way": way, "seed": seed, "n": 256, "concurrency": 64, "wall_s": wall,
                "cpu_s": 0.1, "ok": 256, "invokes_per_s": 256 / wall}

    rows = [rep("engine", 1, 0.40), rep("sdk_floor", 1, 0.43), rep("prototype", 1, 22.0),
            rep("engine", 2, 0.50), rep("sdk_floor", 2, 0.45)]
    text = fanout.render({"rows": rows})
    headline = next(line for line in text.splitlines() if "engine / SDK floor" in line)
    # resampling the two repetitions in pairs spans their own ratios, 0.40/0.43 to 0.50/0.45
    assert headline.rstrip().endswith(c.fmt(statistics.median([0.40, 0.50])
                                            / statistics.median([0.43, 0.45])) + " [0.93–1.11]")
    history = next(line for line in text.splitlines() if "prototype / engine" in line)
    assert history.rstrip().endswith(c.fmt(22.0 / 0.40))  # on the repetition both ran


def test_dataplane_rows_say_which_direction_is_better_and_divide_one_way():
    rows = []
    for rep in (1, 2):
        rows += [dataplane.row("weights", "MB/s", "higher", "nitro", rep, 150.0),
                 dataplane.row("weights", "MB/s", "higher", "prototype", rep, 250.0),
                 dataplane.row("cpu", "ms CPU", "lower", "nitro", rep, 40.0),
                 dataplane.row("cpu", "ms CPU", "lower", "prototype", rep, 80.0)]
    text = dataplane.render({"rows": rows, "actors": 32, "reps": 2, "poll_ms": 5.0,
                             "stagger_ms": 10.0})
    lines = {line.split("|")[1].strip(): line for line in text.splitlines()
             if line.startswith("| weights") or line.startswith("| cpu")}
    assert "higher is better" in lines["weights"] and "| 0.60" in lines["weights"]
    assert "lower is better" in lines["cpu"] and "| 0.50" in lines["cpu"]
    assert "polls every 5 ms" in text


def write(folder: Path, name: str, data: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps({"name": name, **data}), encoding="utf-8")


def test_page_marks_files_without_raw_rows_and_renders_the_rest_from_rows(tmp_path):
    write(tmp_path, "overlap", {"title": "Overlap", "markdown": "| old | table |"})
    rows = []
    for seed in (1, 2):
        rows += runs("nitro", [seed], [6.0], wall_s=[3.0])
        rows += runs("ppo_minimal", [seed], [8.0], wall_s=[5.0])
    # a stale stored table must not reach the page: the rows decide
    write(tmp_path, "cartpole_time", {"title": "CartPole", "rows": rows,
                                      "markdown": "| stale | 99 |", "machine": {
                                          "cpu": "AMD EPYC", "cores": 2, "loadavg": [1, 1, 1]}})
    page = rr.page(rr.load_results(tmp_path), tmp_path)
    overlap = page[page.index("## Overlap"):]
    cartpole = page[page.index("## CartPole"):page.index("## Overlap")]
    assert rr.NOT_RECHECKABLE in overlap
    assert rr.NOT_RECHECKABLE not in cartpole and "stale" not in cartpole
    assert "AMD EPYC (2 cores)" in cartpole and f"{tmp_path}/cartpole_time.json" in cartpole
    # the same files give the same page
    assert page == rr.page(rr.load_results(tmp_path), tmp_path)


def test_printed_report_is_shown_and_kept(capsys):
    with c.printed() as text:
        print("held: level 128")
    assert text.getvalue() == "held: level 128\n"
    assert capsys.readouterr().out == "held: level 128\n"


def test_a_failed_script_is_marked_in_its_stored_result(tmp_path):
    path = c.write_result("overlap", {"title": "Overlap", "rows": [{"mode": "sync"}]},
                          results=tmp_path)
    c.update_result(path, {"failed": {"rc": 1, "stderr": "boom"}})
    page = rr.page(rr.load_results(tmp_path), tmp_path)
    assert "**Failed** (rc 1)" in page and "boom" in page
    assert json.loads(path.read_text())["rows"] == [{"mode": "sync"}]


def test_rows_without_a_table_of_their_own_are_shown_as_stored(tmp_path):
    write(tmp_path, "hessian_subsample", {"rows": [{"round": 1, "rho": 2.5},
                                                   {"round": 2, "rho": 4.0}]})
    page = rr.page(rr.load_results(tmp_path), tmp_path)
    assert "| round | rho |" in page and "| 2 | 4.00 |" in page
    assert rr.NOT_RECHECKABLE not in page


def test_hessian_batch_table_is_recomputed_from_its_rows(tmp_path):
    def row(rnd, samples, rho, lam_min):
        return {"round": rnd, "probe": f"hessian_{samples}", "probe_s": 0.5,
                "hessian_ratio": rho, "hessian_ratio_prototype": rho, "lambda_max": 1.0,
                "lambda_min": lam_min, "lanczos_steps": 9.0, "hessian_samples": samples}

    rows = [row(1, 1024, 2.0, -0.5), row(1, 4096, 3.0, -0.25),
            row(2, 1024, 4.0, -0.4), row(2, 4096, 4.0, -0.4)]
    rows += [{**r, "run": "seed 2, N = 8", "hessian_ratio": 9.0, "hessian_ratio_prototype": 9.0}
             for r in rows if r["round"] == 1]  # another run: rounds pair within their run
    for r in rows:
        r.setdefault("run", "seed 1, N = 8")
    runs = [{"run": f"seed {s}, N = 8", "seed": s, "actors": 8, "batch": 4096, "rounds": 2}
            for s in (1, 2)]
    write(tmp_path, "hessian_batch", {"runs": runs, "rows": rows})
    page = rr.page(rr.load_results(tmp_path), tmp_path)
    # 4,096 samples: rho x1.5, x1.0 and x1.0 (median x1.0), up in 1 of 3 rounds
    assert "| 4,096 | x1.00 | x1.00 (1/3) | 4.00 | x1.00 | x0.50 | 0.50 |" in page
    assert "| 1,024 | x1.00 | x1.00 (0/3) | 4.00 |" in page
    assert "seed 2, N = 8: 2 rounds, a batch of 4,096 samples" in page


def test_rho_persistence_finds_a_persistent_signal_and_renders_from_rows(tmp_path):
    import rho_persistence as rp

    rng = np.random.default_rng(0)
    rounds = np.arange(1.0, 61.0)
    ar = np.zeros(60)  # scatter that carries over half of itself to the next round
    for i in range(1, 60):
        ar[i] = 0.8 * ar[i - 1] + rng.normal(0, 0.2)
    stats = rp.persistence(rounds, 0.02 * rounds + ar)
    assert stats is not None and stats["lag1"] > 0.5 and stats["spacing"] == 1.0
    white = rp.persistence(rounds, 0.02 * rounds + rng.normal(0, 0.3, 60))
    assert white is not None and abs(white["lag1"]) < 0.3
    assert rp.persistence(rounds[:5], rounds[:5]) is None  # too few probes to say

    rows = [{"folder": "gpu-model", "setting": "nitro", "seed": s, "rho": "hessian_ratio",
             "probes": 40, "spacing": 4.0, "trend_r2": r2, "resid_sd": 0.3, "lag1": lag}
            for s, r2, lag in ((1, 0.5, 0.1), (2, 0.7, 0.3))]
    write(tmp_path, "rho_persistence", {"rows": rows})
    page = rr.page(rr.load_results(tmp_path), tmp_path)
    assert "| `gpu-model` | `nitro` | regularised | 2 | 4 | 0.60 | 0.30 | +0.20 |" in page


def test_boost_pooled_difference_standardises_each_study_and_pairs_by_seed():
    import boost_budget as bb

    def study(name, ours, theirs):
        rows = [{"setting": "a", "seed": s, "final_eval_return": v} for s, v in ours.items()]
        rows += [{"setting": "b", "seed": s, "final_eval_return": v} for s, v in theirs.items()]
        return {"name": name, "rows": rows}

    # study 1: b's returns have sd 100, a is +100 on both shared seeds (seed 3: b only)
    one = study("one", {1: 1100.0, 2: 1200.0}, {1: 1000.0, 2: 1100.0, 3: 1200.0})
    # study 2: sd 10, a is -10 on its one seed
    two = study("two", {7: 40.0}, {7: 50.0, 8: 60.0})
    got = bb.pooled_difference([one, two], "a", "b")
    sd2 = statistics.stdev([50.0, 60.0])
    assert got["seeds"] == 3
    assert got["standardised"] == pytest.approx((1.0 + 1.0 - 10.0 / sd2) / 3)
    assert got["studies"]["one"] == {"seeds": 2, "mean_difference": 100.0, "standardised": 1.0}
    lo, hi = got["interval"]
    assert lo <= got["standardised"] <= hi
    assert bb.pooled_difference([one], "a", "nobody") is None


def test_boost_study_settings_build_valid_plans():
    import boost_budget as bb

    from kernel.plan import load_plan

    raw = bb.PLAN.read_text()
    for name, sets in bb.SETTINGS.items():
        plan = load_plan(bb.PLAN, [*bb.COMMON, *sets])
        # the adaptive settings keep the start count their stored runs used, whatever the
        # plan's: 2 for the paper's rules and the schedules; fixedN, anchoredN, growN and the
        # calibrations (probe_nN, gns_nN) name theirs, as the spend schedules (spendNtoM) their
        # first step
        named = re.match(r"(fixed|anchored|grow|probe_n|gns_n|spend)(\d+)", name)
        if named:
            assert plan["actors"]["count"] == int(named.group(2)), name
        else:
            assert plan["actors"]["count"] == 2, name
        if name.startswith(("probe_n", "gns_n")):  # the probes a time model is fitted on
            every_round = {p["name"] for p in plan["probes"] if p["every"] == 1}
            assert every_round >= ({"gns"} if name.startswith("gns_n") else {"hessian", "gns"})
        if name.endswith("_lr"):
            assert plan["algo"]["lr_reference_minibatch"] == 64, name
        if name.endswith("_clip"):  # the plan's range at the anchor's samples (an adaptive
            # rule's own count: anchoredN, growN) or at 8 actors' (a fixed count beside the
            # rule around 8)
            own = name.startswith(("anchored", "grow"))
            anchor = plan["actors"]["count"] if own else 8
            assert plan["algo"]["clip_reference_batch"] == anchor * plan["env"]["num_envs"] * \
                plan["actors"]["steps"], name
        if name.startswith("spend"):
            steps = plan["scaler"]["steps"]
            assert steps[0] == plan["actors"]["count"] and len(plan["scaler"]["at"]) == \
                len(steps) - 1, name
        if name in ("nitro", "nitro_p4"):
            assert plan["scaler"]["rule"] == "window"
    assert 'rule = "anchored"' in raw


def test_a_labelled_study_keeps_its_own_folders_and_results_and_refuses_a_bad_label():
    import argparse

    import boost_budget as bb

    def args(*extra):
        return bb.argparse_parser().parse_args(["collect", "--pricing", "cpu", *extra])

    plain, labelled = args(), args("--label", "idle")
    assert bb.result_name(plain) == "boost_hopper_cpu"
    assert bb.result_name(labelled) == "boost_hopper_cpu_idle"
    root = Path("/stored")
    assert bb.task_dir(root, "Hopper-v5", "cpu", bb.variant(labelled)) == root / "cpu-idle"
    modelled = args("--clock", "model", "--label", "rerun-2")
    assert bb.result_name(modelled) == "boost_hopper_cpu_model_rerun_2"
    for bad in ("Idle", "-idle", "idle-", "a/b", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="lower-case letters"):
            bb.label_name(bad)


def test_spend_check_names_every_budget_ended_run_outside_95_to_100_percent():
    import spend_check

    def row(mode, scaler, spent, reason="budget"):
        return {"task": "Reacher-v5", "mode": mode, "scaler": scaler, "budget_usd": 0.002,
                "seed": 7, "cost_usd": spent * 0.002, "spent": spent, "stop_reason": reason,
                "rounds": 30, "invocations": 90, "invocations_cancelled": 0,
                "trained_fraction": 1.0}

    text = spend_check.render({"rows": [
        row("sync", "nitro", 0.99), row("sync", "max", 0.918), row("async", "kungfu", 1.0013),
        row("async", "hydrozoa", 0.40, reason="max_wall_s")]})
    assert "3 of 4 runs ended by the budget; 1 of those spent 95%-100% of it; 1 run(s) " \
        "spent more than the budget." in text
    assert "| Reacher-v5 | async | 2 | 40.00% | 70.06% | 100.13% | budget 1, max_wall_s 1 |" \
        in text
    outside = text.split("Outside 95-100 %: ")[1]
    assert "sync max seed 7 91.80%" in outside and "async kungfu seed 7 100.13%" in outside
    assert "nitro" not in outside and "hydrozoa" not in outside
