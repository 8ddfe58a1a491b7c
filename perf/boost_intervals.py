"""How wide is a 95 % interval over ten seeds? A placebo, and the verdicts checked both ways.

Every paired difference on docs/boosting.md carries a percentile-bootstrap interval over the
seeds (``nitro report``'s). With ten seeds that interval is known to be narrower than its
nominal level: it resamples the ten values themselves, so it has no room for the tails the
t distribution gives a mean of ten. This measures how much that matters here.

The placebo: a spend schedule (``spend2to8``, ``spend4to8``) runs its first count exactly as
the fixed count does until its first switch, so anything decided before the switch (the cost,
simulated time and env steps to the target return, reached long before it) differs from that
fixed count's runs only by chance: here, by float rounding on another machine, which the
dynamics amplify within a few rounds. An interval that excludes zero on such a difference is a
false alarm. The verdicts: the paired differences the page's conclusions rest on, with the
percentile interval beside a Student t interval on the same differences.

    .venv/bin/python perf/boost_intervals.py

Nothing is run: the differences come from the per-seed rows the studies stored in
``perf/results/boost_*.json`` (so adding seeds there and rerunning this updates it); the rows
kept in ``perf/results/boost_intervals.json`` are the per-seed differences, and perf/RESULTS.md's
section is recomputed from them by ``render``.
"""

from __future__ import annotations

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
        ("boost_ant_gpu_model", "anchored8_p4", "fixed8", "final_eval_return"))),
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
    """The two intervals of every comparison, recomputed from the stored differences."""
    def num(v: float) -> str:
        return f"{v:+.5f}" if abs(v) < 0.1 else f"{v:+,.1f}"

    lines = ["| kind | study | setting − baseline | metric | seeds | mean | percentile bootstrap "
             "[95 %] | Student t [95 %] |", "|---|---|---|---|---:|---:|---:|---:|"]
    for comp in data["comparisons"]:
        diffs = [r["diff"] for r in data["rows"] if r["comparison"] == comp["id"]]
        if len(diffs) < 2:
            continue
        cells = []
        for ci in (agg.bootstrap_ci(diffs), agg.t_interval(diffs)):
            assert ci is not None
            mark = " *" if excludes_zero(ci) else ""
            cells.append(f"[{num(ci[0])}, {num(ci[1])}]{mark}")
        lines.append(f"| {comp['kind']} | {comp['study']} | {comp['setting']} − "
                     f"{comp['baseline']} | {comp['metric']} | {len(diffs)} | "
                     f"{num(float(np.mean(diffs)))} | {cells[0]} | {cells[1]} |")
    lines.append("")
    lines.append("`*`: the interval excludes zero. A placebo's difference is chance alone.")
    return "\n".join(lines)


def main() -> int:
    comparisons, rows = [], []
    for i, (study, setting, baseline, metric, kind) in enumerate(COMPARISONS):
        comparisons.append({"id": i, "study": study, "setting": setting, "baseline": baseline,
                            "metric": metric, "kind": kind})
        rows += [{"comparison": i, **d} for d in differences(study, setting, baseline, metric)]
    data = {"title": "Ten-seed intervals: a placebo, and the verdicts by percentile bootstrap "
                     "and by Student t", "comparisons": comparisons, "rows": rows}
    text = render(data)
    c.write_result("boost_intervals", {**data, "markdown": text})
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
