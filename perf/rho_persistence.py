"""Does the curvature signal persist from one probe to the next?

A boosting rule sizes round t+1 (or, probing every k-th round, the next k rounds) from the rho
measured after round t, which pays only if what rho says about the learning state is still
true when the boosted round runs. This reads kept runs (the ``hessian`` probe's values each
``RoundFinished`` event carries, which slimmed runs keep), fits log rho on a quadratic in the
round (rho drifts as training goes on), and reports per run how much of log rho the trend
explains, how far rho scatters around it, and the correlation of that scatter between
consecutive probes. Rows: perf/results/rho_persistence.json.

    .venv/bin/python perf/rho_persistence.py perf/boost_runs/paper-model-cuda/Hopper-v5/aws-gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "perf"))

from common import printed, write_result  # noqa: E402

#: The probe's values read: the paper's rho and the regularised one the default rule reads.
KEYS = ("hessian_ratio_prototype", "hessian_ratio")


def series(events: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, log rho) of the hessian probe's positive, finite values."""
    rounds, logs = [], []
    with events.open(encoding="utf-8") as fh:
        for line in fh:
            if '"RoundFinished"' not in line:
                continue
            e = json.loads(line)
            value = (e.get("probes") or {}).get(key)
            if value is not None and value > 0 and np.isfinite(value):
                rounds.append(float(e["round"]))
                logs.append(float(np.log(value)))
    return np.asarray(rounds), np.asarray(logs)


def persistence(rounds: np.ndarray, logs: np.ndarray) -> dict[str, float] | None:
    """Trend R^2, residual sd and lag-1 autocorrelation of the residuals, or None if too
    few probes to say."""
    if len(rounds) < 12:
        return None
    x = np.vstack([np.ones_like(rounds), rounds, rounds**2]).T
    coef, *_ = np.linalg.lstsq(x, logs, rcond=None)
    resid = logs - x @ coef
    total = float(((logs - logs.mean()) ** 2).sum())
    return {"probes": len(rounds), "spacing": float(np.median(np.diff(rounds))),
            "trend_r2": 1 - float((resid**2).sum()) / total if total > 0 else float("nan"),
            "resid_sd": float(resid.std()),
            "lag1": float(np.corrcoef(resid[:-1], resid[1:])[0, 1])}


def label(folder: Path) -> str:
    """The folder under perf/boost_runs/ (the study), or its full path for one elsewhere."""
    kept = ROOT / "perf" / "boost_runs"
    return str(folder.relative_to(kept)) if folder.is_relative_to(kept) else str(folder)


def rows_of(folders: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for folder in folders:
        for events in sorted(folder.glob("*/seed-*/events.jsonl")):
            for key in KEYS:
                stats = persistence(*series(events, key))
                if stats is not None:
                    rows.append({"folder": label(folder), "setting": events.parent.parent.name,
                                 "seed": int(events.parent.name.split("-")[1]), "rho": key,
                                 **stats})
    return rows


def render(data: dict[str, Any]) -> str:
    """Medians over each setting's runs, recomputed from the stored rows."""
    lines = ["Per run: log rho fitted on a quadratic in the round; the trend's R², the residuals' "
             "standard deviation (in log, so 0.35 is about ±40 %) and their correlation between "
             "consecutive probes (`spacing` rounds apart). Medians over the runs of a setting.",
             "",
             "| folder | setting | rho | runs | spacing | trend R² | residual sd (log) "
             "| lag-1 correlation |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in data.get("rows", []):
        groups.setdefault((r["folder"], r["setting"], r["rho"]), []).append(r)
    for (folder, setting, rho), runs in groups.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("spacing", "trend_r2", "resid_sd", "lag1")}
        name = "paper's" if rho == "hessian_ratio_prototype" else "regularised"
        lines.append(f"| `{folder}` | `{setting}` | {name} | {len(runs)} "
                     f"| {med['spacing']:g} | {med['trend_r2']:.2f} | {med['resid_sd']:.2f} "
                     f"| {med['lag1']:+.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path,
                        help="folders of kept runs (SETTING/seed-N/events.jsonl)")
    args = parser.parse_args()
    data = {"rows": rows_of([f.resolve() for f in args.folders])}
    with printed() as out:
        print(render(data))
    write_result("rho_persistence", {**data, "report": out.getvalue(),
                                     "title": "Does rho persist from one probe to the next? "
                                              "(issue 16)"})


if __name__ == "__main__":
    main()
