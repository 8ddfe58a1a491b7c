"""Do the boosting rules' curves sit on or beyond the front of the fixed counts?

The equal-budget studies compare final returns. The claim boosting makes is about whole
curves: at every dollar spent (and every second of simulated time), a boosted run should hold
at least the return the best fixed count had reached by then. This reads the stored runs of
every study whose durations do not depend on the machine's load (the time-model and
GPU-timed studies, and the paper's protocol), takes the front of the study's fixed counts
(their pointwise best mean curve) and measures every other setting's mean curve against it,
seeds paired (``nitro report --front``, ``plugins/experiments/aggregate.py``). Rows:
``perf/results/boost_front.json`` (perf/RESULTS.md's section is rebuilt from them by
``render``); figures: ``perf/figures/boost_front/``.

    .venv/bin/python perf/boost_front.py

Nothing is run: the numbers come from ``perf/boost_runs/`` alone, so a later session that adds
seeds there reruns this to update them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common as c

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugins.experiments import aggregate as agg  # noqa: E402

STORED = ROOT / "perf" / "boost_runs"
FIGURES = ROOT / "perf" / "figures" / "boost_front"


@dataclass(frozen=True)
class Study:
    """A folder of stored runs, the fixed counts whose front it is measured against, the
    settings shown against it (None: every other one) and those that are ``nitro``'s default
    rule there (docs/boosting.md's table)."""

    slug: str
    title: str
    folder: str
    front: tuple[str, ...]
    shown: tuple[str, ...] | None = None
    default: tuple[str, ...] = ("anchored8_p4",)


#: The load-independent studies of docs/boosting.md. Studies 1 and 2 bill durations measured
#: on a machine whose load varied between seeds, so their curves are left out.
STUDIES = (
    Study("hopper_model", "Hopper-v5, study 3/7/13: GPU price, time model, minibatches of 256",
          "gpu-model", ("fixed4", "fixed8", "fixed16")),
    Study("hopper_cuda", "Hopper-v5, study 4/7: learner timed on an H200, minibatches of 256",
          "gpu-model-cuda", ("fixed4", "fixed8")),
    Study("hopper_cuda_mb32", "Hopper-v5, study 5/7: learner timed on an H200, 32 minibatches",
          "gpu-model-cuda-mb32", ("fixed8", "fixed16"), ("anchored8_p4", "nitro", "nitro_p4")),
    Study("walker2d", "Walker2d-v5, study 6/7/13: learner timed on an H200",
          "walker2d/gpu-model-cuda", ("fixed2", "fixed4", "fixed8")),
    Study("humanoid", "Humanoid-v5, study 8/13: GPU price, its own time model",
          "humanoid/gpu-model", ("fixed2", "fixed4", "fixed8", "fixed16"),
          default=("anchored8_p4", "anchored4_p4")),
    Study("halfcheetah", "HalfCheetah-v5, study 11 (held out)", "halfcheetah/gpu-model",
          ("fixed2", "fixed4", "fixed8", "fixed16")),
    Study("ant", "Ant-v5, study 12 (held out)", "ant/gpu-model", ("fixed4", "fixed8", "fixed16")),
    Study("hopper_clip", "Hopper-v5, study 16: study 3's setup, a clip range that follows "
          "the round", "gpu-model-clip", ("fixed8", "fixed16"),
          default=("anchored8_p4_clip",)),
    Study("hopper_clip_epyc", "Hopper-v5, study 16 on an AMD EPYC: the rerun, with fixed4 at the "
          "narrow range", "gpu-model-clip-epyc", ("fixed4", "fixed8"),
          default=("anchored8_p4_clip",)),
    Study("walker2d_clip", "Walker2d-v5, study 16: study 6's setup, a clip range that follows "
          "the round", "walker2d/gpu-model-cuda-clip", ("fixed8",),
          default=("anchored8_p4_clip",)),
    Study("walker2d_clip_epyc", "Walker2d-v5, study 16 on an AMD EPYC: the rerun, with fixed4 "
          "at both ranges", "walker2d/gpu-model-cuda-clip-epyc", ("fixed4", "fixed8"),
          default=("anchored8_p4_clip",)),
    Study("hopper_cuda_pipelined", "Hopper-v5, study 18: study 4's setup in pipelined rounds, "
          "clocked for their overlap", "gpu-model-cuda-pipelined", ("fixed8",)),
    Study("hopper_cuda_timed", "Hopper-v5, study 19: study 18 at the snapshot point PPO's "
          "plans time, by the time model", "gpu-model-cuda-timed", ("fixed8",)),
    Study("walker2d_cuda_timed", "Walker2d-v5, study 19: pipelined at the model-timed snapshot "
          "point", "walker2d/gpu-model-cuda-timed", ("fixed8",)),
    Study("humanoid_timed", "Humanoid-v5, study 19: study 8's setup, pipelined at the "
          "model-timed snapshot point", "humanoid/gpu-model-timed", ("fixed4",)),
    Study("hopper_cuda_timed_s20", "Hopper-v5, study 20: study 19 with the probe held to "
          "a tenth of the run, each seed's pair on one machine", "gpu-model-cuda-timed-s20",
          ("fixed8",), default=("anchored8_p4_share",)),
    Study("humanoid_timed_s20", "Humanoid-v5, study 20: study 19 with the probe held to "
          "a tenth of the run, each seed's pair on one machine", "humanoid/gpu-model-timed-s20",
          ("fixed4",), default=("anchored8_p4_share",)),
    Study("humanoid_clip", "Humanoid-v5, study 16: study 8's setup, a clip range that follows "
          "the round", "humanoid/gpu-model-clip", ("fixed4", "fixed8", "fixed16"),
          default=("anchored8_p4_clip", "anchored4_p4_clip")),
    Study("paper_hopper", "Hopper-v5, study 10: the paper's protocol (50 rounds), Lambda billed",
          "paper-model-cuda/Hopper-v5/aws-gpu", ("fixed8", "fixed16", "fixed32"),
          ("prototype", "prototype_fullbatch", "nitro", "decay_only", "hydrozoa", "kungfu",
           "no_boost"), ("nitro",)),
    Study("paper_walker2d", "Walker2d-v5, study 10: the paper's protocol, Lambda billed",
          "paper-model-cuda/Walker2d-v5/aws-gpu", ("fixed8", "fixed16", "fixed32"),
          default=("nitro",)),
    Study("paper_humanoid", "Humanoid-v5, study 10: the paper's protocol, Lambda billed",
          "paper-model-cuda/Humanoid-v5/aws-gpu", ("fixed8", "fixed16", "fixed32"),
          default=("nitro",)),
)
#: What a row keeps of a setting's gap (its curve goes to the figures only).
KEPT = ("mean_gap", "mean_gap_ci", "share_on_or_above", "share_above", "share_below",
        "front_share", "grid")


def study_groups(study: Study) -> list[agg.Group]:
    root = STORED / study.folder
    dirs = sorted(p.parent for p in root.glob("*/seed-*/summary.json"))
    groups = [g for g in agg.merge(agg.group_runs(dirs, "parent")) if g.runs]
    keep = set(study.front) | (set(study.shown) if study.shown else {g.label for g in groups})
    return [g for g in groups if g.label in keep]


def measure(study: Study) -> tuple[list[dict[str, Any]], list[Path]]:
    groups = study_groups(study)
    found = agg.fronts(groups, study.front, c.STUDY_INTERVAL)
    rows = [{"study": study.slug, "axis": axis, "setting": name, "seeds": gap["seeds"],
             **{key: gap[key] for key in KEPT}}
            for axis, by_setting in found.items() for name, gap in by_setting.items()]
    runs = [r for g in groups for r in g.runs]
    return rows, agg.front_figures(found, runs, FIGURES / study.slug)


def render(data: dict[str, Any]) -> str:
    """perf/RESULTS.md's section, rebuilt from the stored rows: each study's front tables,
    then docs/boosting.md's table of the default rules."""
    parts = []
    for study in data["studies"]:
        found: dict[str, dict[str, Any]] = {}
        for row in data["rows"]:
            if row["study"] == study["slug"]:
                found.setdefault(row["axis"], {})[row["setting"]] = {**row,
                                                                      "front": study["front"]}
        parts.append(f"**{study['title']}**\n\n{agg.front_markdown(found)}")
    parts.append("The default rule in each study:\n\n" + doc_table(data["rows"], data["studies"]))
    return "\n\n".join(parts)


def doc_table(rows: list[dict[str, Any]], studies: list[dict[str, Any]]) -> str:
    """docs/boosting.md's table: ``nitro``'s default rule in each study against the front,
    in dollars and in simulated time."""
    def num(v: float) -> str:
        return f"{v:+,.0f}".replace("-", "−")

    def cells(r: dict[str, Any]) -> list[str]:
        lo, hi = r["mean_gap_ci"]
        return [f"{num(r['mean_gap'])} [{num(lo)}, {num(hi)}]",
                f"{r['share_on_or_above']:.0%} / {r['share_below']:.0%}"]

    lines = ["| study | front | setting | seeds | gap, dollars [95 % CI] | on or above / below, "
             "dollars | gap, simulated time [95 % CI] | on or above / below, time |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for study in studies:
        for name in study["default"]:
            got = {r["axis"]: r for r in rows if r["study"] == study["slug"]
                   and r["setting"] == name}
            if "dollars" not in got or "sim_time" not in got:
                continue
            lines.append("| " + " | ".join([
                study["title"].split(":")[0], ", ".join(study["front"]), f"`{name}`",
                str(len(got["dollars"]["seeds"])), *cells(got["dollars"]),
                *cells(got["sim_time"])]) + " |")
    return "\n".join(lines)


def main() -> int:
    rows: list[dict[str, Any]] = []
    figures: list[Path] = []
    for study in STUDIES:
        c.log(f"front of {', '.join(study.front)}: {study.title}")
        found, paths = measure(study)
        rows += found
        figures += paths
    data = {
        "title": "Boosting rules against the front of the fixed counts, from the stored runs",
        "studies": [{"slug": s.slug, "title": s.title, "folder": f"perf/boost_runs/{s.folder}",
                     "front": list(s.front), "default": list(s.default)} for s in STUDIES],
        "rows": rows, "figures": [str(p.relative_to(ROOT)) for p in figures]}
    c.write_result("boost_front", data)
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
