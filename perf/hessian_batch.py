"""Does rho depend on how many samples it is measured on?

The paper's rule measures rho on the round's whole batch, so a round of more actors is also
a Hessian taken on more samples. If rho moved with the sample count alone, the rule would read
its own last decision back as curvature: a boosted round would raise (or lower) the score that
sizes the next one. This trains Hopper-v5 in the paper's protocol (one env and 512 steps per
actor, 10 epochs of 32 minibatches) at a fixed N, and after every update takes the Hessian of
the same loss at the same parameters on nested random subsamples of the batch (1,024 samples up
to the whole batch), then prints, per sample count, rho and lambda_min relative to the smallest
count, round by round. Rows: perf/results/hessian_batch.json.

    .venv/bin/python perf/hessian_batch.py                      # N = 32, 8 rounds
    .venv/bin/python perf/hessian_batch.py --actors 64 --rounds 16 --seed 2 --append
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

import boost  # noqa: E402
from common import RESULTS, log, printed, write_result  # noqa: E402

from kernel.engine import Engine  # noqa: E402
from kernel.plan import load_plan  # noqa: E402
from kernel.registry import Plugin, default_registry  # noqa: E402
from kernel.roles import PluginContext, ProbeContext  # noqa: E402
from plugins.descriptors.boost import HESSIAN_CONFIG  # noqa: E402
from plugins.probes.hessian import HessianProbe  # noqa: E402

#: What each probe reports, kept per sample count.
KEYS = ("hessian_ratio", "hessian_ratio_prototype", "lambda_max", "lambda_min",
        "lanczos_steps", "hessian_samples")


def probe_at(samples: int) -> type:
    """A hessian probe class fixed at ``samples`` (0: the whole batch), so several can run on
    the same round, each under its own name."""

    class SampledHessian:
        def __init__(self, ctx: PluginContext):
            self.inner = HessianProbe(PluginContext(
                name=ctx.name, config={**ctx.config, "samples": samples, "warm_start": False},
                plan=ctx.plan, run_id=ctx.run_id, run_dir=ctx.run_dir, seed=ctx.seed,
                bus=ctx.bus))
            self.every = self.inner.every

        def measure(self, ctx: ProbeContext) -> dict[str, float]:
            return self.inner.measure(ctx)

    return SampledHessian


def rows_of(events_path: Path, run: str) -> list[dict[str, Any]]:
    """One row per (round, probe) with the probe's values, tagged with the run they are of."""
    rows = []
    with events_path.open() as fh:
        for line in fh:
            e = json.loads(line)
            if e["event"] == "ProbeMeasured" and e["probe"].startswith("hessian_"):
                rows.append({"run": run, "round": e["round"], "probe": e["probe"],
                             "probe_s": e["probe_s"], **{k: e["values"].get(k) for k in KEYS}})
    return rows


def relative(rows: list[dict[str, Any]], key: str) -> dict[int, list[float]]:
    """Per sample count, each round's ``key`` divided by the smallest count's that round."""
    by_round: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        if r.get(key) is not None and r.get("hessian_samples"):
            by_round.setdefault((r.get("run", ""), r["round"]), {})[
                int(r["hessian_samples"])] = float(r[key])
    out: dict[int, list[float]] = {}
    for values in by_round.values():
        base = values[min(values)]
        for samples, v in values.items():
            out.setdefault(samples, []).append(v / base)
    return dict(sorted(out.items()))


def render(data: dict[str, Any]) -> str:
    """The table, recomputed from the stored rows."""
    rows = data.get("rows", [])
    rho = relative(rows, "hessian_ratio")
    proto = relative(rows, "hessian_ratio_prototype")
    lmin = relative(rows, "lambda_min")
    lmax = relative(rows, "lambda_max")
    secs: dict[int, list[float]] = {}
    absolute: dict[int, list[float]] = {}
    for r in rows:
        if r.get("hessian_samples"):
            secs.setdefault(int(r["hessian_samples"]), []).append(float(r["probe_s"]))
            if r.get("hessian_ratio_prototype") is not None:
                absolute.setdefault(int(r["hessian_samples"]), []).append(
                    float(r["hessian_ratio_prototype"]))
    runs = "; ".join(f"{r['run']}: {r['rounds']} rounds, a batch of {r['batch']:,} samples"
                     for r in data.get("runs", []))
    lines = [f"Hopper-v5, the paper's protocol at a fixed N ({runs}). Each value is the median "
             "over rounds of its ratio to the same round's value on the fewest samples (rounds "
             "where rho rose with the samples, of all rounds, in brackets).",
             "",
             "| samples | rho (regularised) | rho (prototype's) | prototype's rho, median "
             "| lambda_max | lambda_min | probe s, median |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for samples in rho:
        up = sum(v > 1 for v in proto[samples])
        lines.append(
            f"| {samples:,} | x{statistics.median(rho[samples]):.2f} "
            f"| x{statistics.median(proto[samples]):.2f} ({up}/{len(proto[samples])}) "
            f"| {statistics.median(absolute.get(samples, [float('nan')])):.2f} "
            f"| x{statistics.median(lmax[samples]):.2f} "
            f"| x{statistics.median(lmin[samples]):.2f} "
            f"| {statistics.median(secs.get(samples, [float('nan')])):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--append", action="store_true",
                        help="keep the stored runs of other seeds and N beside this one")
    args = parser.parse_args()

    p = boost.PAPER
    batch = args.actors * p.steps_per_actor
    counts = [s for s in (1024, 2048, 4096, 8192, 16384, 32768) if s < batch] + [0]
    registry = default_registry()
    for s in counts:
        registry.register(Plugin(f"hessian_{s or 'all'}", "probe", probe_at(s),
                                 f"The hessian probe on {s or 'all'} samples.",
                                 config=HESSIAN_CONFIG))
    raw = boost.base_plan(p, "Hopper-v5", "aws-gpu", None, "sync", 0)
    raw["run"]["seed"] = args.seed
    raw["stop"]["max_rounds"] = args.rounds
    raw["actors"].update(count=args.actors, min=args.actors, max=args.actors)
    raw["probes"] = [{"name": f"hessian_{s or 'all'}"} for s in counts]
    plan = load_plan(raw, [], registry)
    run = f"seed {args.seed}, N = {args.actors}"
    with tempfile.TemporaryDirectory() as tmp:
        log(f"Hopper, paper protocol, {args.actors} actors, {args.rounds} rounds, "
            f"samples {counts}")
        asyncio.run(Engine(plan, out_dir=Path(tmp) / "run", registry=registry).run())
        rows = rows_of(Path(tmp) / "run" / "events.jsonl", run)
    data = {"runs": [], "rows": []}
    stored = RESULTS / "hessian_batch.json"
    if args.append and stored.is_file():
        kept = json.loads(stored.read_text())
        data = {"runs": [r for r in kept.get("runs", []) if r["run"] != run],
                "rows": [r for r in kept.get("rows", []) if r.get("run") != run]}
    data["runs"].append({"run": run, "seed": args.seed, "actors": args.actors, "batch": batch,
                         "rounds": args.rounds})
    data["rows"].extend(rows)
    with printed() as out:
        print(render(data))
    write_result("hessian_batch", {**data, "report": out.getvalue(),
                                   "title": "Rho against the samples it is measured on "
                                            "(issue 16)"})


if __name__ == "__main__":
    main()
