"""How wide is a 95 % interval over ten seeds? Its coverage, a placebo, and every verdict
checked three ways.

Every paired difference on docs/boosting.md carries a percentile-bootstrap interval over the
seeds. With ten seeds that interval is known to be narrower than its nominal level: it
resamples the ten values themselves, so it has no room for the tails the t distribution gives
a mean of ten. This measures how much that matters here, and sets beside it the two remedies:
Student t, and the expanded percentile interval (``nitro report``'s default since, the same
bootstrap read at quantiles widened as t widens; plugins/experiments/aggregate.py).

Coverage: how often each interval holds the true mean, on data shaped like ours. Every pair of
settings in a stored equal-budget study that shares at least five seeds gives paired
differences of the final return; each pair's differences, centred on their mean and scaled by
their standard deviation, join one pool whose mean is zero by construction. Draws of 5 and 10
values from that pool (with replacement, seeded) stand in for a study's seeds; the share of
draws whose interval contains zero is the coverage. Standardising within pairs of 5-10 seeds
trims the pool's tails, so if anything it flatters every method.

The audit: every such pair's difference, with the three intervals, so a verdict ("the
interval excludes zero") can be read under each.

The placebo: a spend schedule (``spend2to8``, ``spend4to8``) runs its first count exactly as
the fixed count does until its first switch, so anything decided before the switch (the cost,
simulated time and env steps to the target return, reached long before it) differs from that
fixed count's runs only by chance: here, by float rounding on another machine, which the
dynamics amplify within a few rounds. An interval that excludes zero on such a difference is a
false alarm. The verdicts: the paired differences the page's conclusions rest on, under the
same three intervals.

    .venv/bin/python perf/boost_intervals.py

Nothing is run: the differences come from the per-seed rows the studies stored in
``perf/results/boost_*.json`` (so adding seeds there and rerunning this updates it); the rows
kept in ``perf/results/boost_intervals.json`` are the per-seed differences, and perf/RESULTS.md's
section is recomputed from them by ``render``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import common as c
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugins.experiments import aggregate as agg  # noqa: E402

#: What a spend schedule does before its first switch, reached by then in every seed: the
#: cost, simulated time and env steps to the study's target return.
TO_TARGET = ("cost_to_target_usd", "sim_time_to_target_s", "env_steps_to_target")
WALKER, HOPPER = "boost_walker2d_gpu_model_cuda", "boost_hopper_gpu_model"
#: (study result, setting, baseline, metric, kind). ``placebo``: the two settings run the same
#: process for everything the metric measures; ``verdict``: a difference a conclusion rests on.
COMPARISONS = (
    *((WALKER, "spend2to8", "fixed2", m, "placebo") for m in TO_TARGET),
    *((HOPPER, "spend4to8", "fixed4", m, "placebo") for m in TO_TARGET),
    *((study, setting, baseline, metric, "verdict") for study, setting, baseline, metric in (
        (HOPPER, "anchored8_p4", "fixed8", "final_eval_return"),
        (HOPPER, "anchored8_p4", "fixed8", "cost_to_target_usd"),
        (HOPPER, "spend4to8", "fixed8", "final_eval_return"),
        (HOPPER, "decay_only", "fixed8", "final_eval_return"),
        (WALKER, "anchored8_p4", "fixed8", "final_eval_return"),
        (WALKER, "anchored8_p4", "fixed8", "cost_to_target_usd"),
        (WALKER, "spend2to8", "fixed8", "final_eval_return"),
        ("boost_humanoid_gpu_model", "anchored8_p4", "fixed4", "final_eval_return"),
        ("boost_humanoid_gpu_model", "fixed8", "fixed4", "final_eval_return"),
        ("boost_humanoid_gpu_model", "fixed2", "fixed4", "final_eval_return"),
        ("boost_halfcheetah_gpu_model", "anchored8_p4", "fixed8", "cost_to_target_usd"),
        ("boost_ant_gpu_model", "anchored8_p4", "fixed8", "final_eval_return"),
        ("boost_hopper_gpu_model_clip_epyc", "grow8_clip", "fixed4", "cost_to_target_usd"),
        ("boost_walker2d_gpu_model_cuda_clip_epyc", "grow8_clip", "fixed4", "final_eval_return"),
        ("boost_walker2d_gpu_model_cuda_clip_epyc", "grow8_clip", "fixed4",
         "cost_to_target_usd"))),
)


def differences(study: str, setting: str, baseline: str, metric: str
                ) -> list[dict[str, Any]]:
    """Per seed, ``setting`` minus ``baseline`` in ``metric``, over the seeds both have."""
    rows = json.loads((c.RESULTS / f"{study}.json").read_text())["rows"]
    pairs = agg.seed_differences([r for r in rows if r["setting"] == setting],
                                 [r for r in rows if r["setting"] == baseline], metric)
    return [{"seed": seed, "diff": diff} for seed, diff in pairs]


def excludes_zero(ci: tuple[float, float] | None) -> bool:
    return ci is not None and (ci[0] > 0 or ci[1] < 0)


def render(data: dict[str, Any]) -> str:
    """The three intervals of every comparison, recomputed from the stored differences, and
    the coverage table."""
    def num(v: float) -> str:
        return f"{v:+.5f}" if abs(v) < 0.1 else f"{v:+,.1f}"

    def cells(diffs: list[float]) -> list[str]:
        out = []
        for ci in three_intervals(diffs):
            out.append(f"[{num(ci[0])}, {num(ci[1])}]{' *' if excludes_zero(ci) else ''}")
        return out

    head = ("| percentile bootstrap [95 %] | expanded bootstrap [95 %] | Student t [95 %] |",
            "---:|---:|---:|")
    lines = ["| kind | study | setting − baseline | metric | seeds | mean " + head[0],
             "|---|---|---|---|---:|---:|" + head[1]]
    audit: list[tuple[dict[str, Any], list[float]]] = []
    for comp in data["comparisons"]:
        diffs = [r["diff"] for r in data["rows"] if r["comparison"] == comp["id"]]
        if len(diffs) < 2:
            continue
        if comp["kind"] == "audit":
            audit.append((comp, diffs))
            continue
        lines.append(f"| {comp['kind']} | {comp['study']} | {comp['setting']} − "
                     f"{comp['baseline']} | {comp['metric']} | {len(diffs)} | "
                     f"{num(float(np.mean(diffs)))} | " + " | ".join(cells(diffs)) + " |")
    lines += ["", "`*`: the interval excludes zero. A placebo's difference is chance alone."]
    if data.get("coverage"):
        lines += ["", "Coverage of the true mean (zero) on draws from the pooled, standardised "
                  f"paired differences ({data['pool_size']:,} values from {data['pool_pairs']} "
                  "pairs of settings):", "",
                  "| seeds | draws | percentile bootstrap | expanded bootstrap | Student t |",
                  "|---:|---:|---:|---:|---:|"]
        for cov in data["coverage"]:
            lines.append(f"| {cov['seeds']} | {cov['draws']:,} | " + " | ".join(
                f"{cov['covered'][m] / cov['draws']:.1%}" for m in METHODS) + " |")
    if audit:
        verdicts = [[excludes_zero(ci) for ci in three_intervals(d)] for _, d in audit]
        held = [sum(v[i] for v in verdicts) for i in range(3)]
        lines += ["", f"Every pair of settings in the equal-budget studies with at least five "
                  f"seeds in common ({len(audit)} paired differences of the final return): "
                  f"{held[0]} exclude zero by the percentile bootstrap, {held[1]} by the "
                  f"expanded bootstrap, {held[2]} by Student t. Where the three disagree (the "
                  "percentile interval excludes zero, one or both of the others do not):", "",
                  "| study | setting − baseline | seeds | mean " + head[0],
                  "|---|---|---:|---:|" + head[1]]
        for (comp, diffs), v in zip(audit, verdicts, strict=True):
            if v[0] and not all(v):
                lines.append(f"| {comp['study']} | {comp['setting']} − {comp['baseline']} | "
                             f"{len(diffs)} | {num(float(np.mean(diffs)))} | "
                             + " | ".join(cells(diffs)) + " |")
    return "\n".join(lines)


#: The intervals compared, in the order of the tables' columns.
METHODS = ("percentile", "expanded", "t")


def three_intervals(diffs: list[float]) -> list[tuple[float, float]]:
    found = [agg.bootstrap_ci(diffs, interval="percentile"),
             agg.bootstrap_ci(diffs, interval="expanded"), agg.t_interval(diffs)]
    assert all(ci is not None for ci in found)
    return found  # type: ignore[return-value]


def audit_pairs() -> list[tuple[str, str, str]]:
    """(study, setting, baseline) for every pair of a study's settings with five seeds in
    common, each pair once (the later-named setting minus the earlier)."""
    pairs = []
    for path in sorted(c.RESULTS.glob("boost_*.json")):
        if not c.BUDGET_STUDY.fullmatch(path.stem):
            continue
        rows = json.loads(path.read_text())["rows"]
        seeds: dict[str, set[Any]] = {}
        for r in rows:
            if r.get("final_eval_return") is not None:
                seeds.setdefault(r["setting"], set()).add(r["seed"])
        for a, b in itertools.combinations(sorted(seeds), 2):
            if len(seeds[a] & seeds[b]) >= 5:
                pairs.append((path.stem, b, a))
    return pairs


def coverage(pool: np.ndarray, seeds: int, draws: int = 2_000, resamples: int = 2_000,
             seed: int = 0) -> dict[str, Any]:
    """How many of ``draws`` samples of ``seeds`` values from ``pool`` (mean zero) have each
    interval around zero. The bootstrap draws once per sample and is read both ways."""
    rng = np.random.default_rng(seed)
    covered = dict.fromkeys(METHODS, 0)
    for _ in range(draws):
        x = rng.choice(pool, seeds)
        means = x[rng.integers(0, seeds, (resamples, seeds))].mean(axis=1)
        for method in ("percentile", "expanded"):
            lo, hi = np.percentile(means, agg.tails(seeds, method))
            covered[method] += int(lo <= 0 <= hi)
        lo, hi = agg.t_interval(list(x)) or (np.nan, np.nan)
        covered["t"] += int(lo <= 0 <= hi)
    return {"seeds": seeds, "draws": draws, "resamples": resamples, "covered": covered}


def main() -> int:
    comparisons, rows = [], []
    audit = [(study, setting, baseline, "final_eval_return", "audit")
             for study, setting, baseline in audit_pairs()]
    pool = []
    for i, (study, setting, baseline, metric, kind) in enumerate([*COMPARISONS, *audit]):
        comparisons.append({"id": i, "study": study, "setting": setting, "baseline": baseline,
                            "metric": metric, "kind": kind})
        found = differences(study, setting, baseline, metric)
        rows += [{"comparison": i, **d} for d in found]
        diffs = np.array([d["diff"] for d in found])
        if kind == "audit" and diffs.std(ddof=1) > 0:
            pool.append((diffs - diffs.mean()) / diffs.std(ddof=1))
    pooled = np.concatenate(pool) if pool else np.zeros(0)
    data = {"title": "Ten-seed intervals: coverage, a placebo, and the verdicts by percentile "
                     "bootstrap, expanded bootstrap and Student t",
            "comparisons": comparisons, "rows": rows, "pool_size": int(pooled.size),
            "pool_pairs": len(pool),
            "coverage": [coverage(pooled, n) for n in (5, 10)] if pool else []}
    text = render(data)
    c.write_result("boost_intervals", {**data, "markdown": text})
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
