"""Does the Hessian probe's subsample rank rounds like the full batch does?

The scaler reads rho through a min-max window, so what matters is the *ranking* of rho across
rounds, not its exact value. This runs a short Hopper-v5 run (plans/hopper-nitro.toml, 16
actors every round, so each batch is 8,192 samples) with two Hessian probes measuring the same
parameters after each update: the run's own, on its subsample, and a second one on the whole
batch. It prints both rhos per round and their Spearman rank correlation, and stores the rows
in perf/results/hessian_subsample.json.

    .venv/bin/python perf/hessian_subsample.py                 # 12 rounds, samples = 2048
    .venv/bin/python perf/hessian_subsample.py --samples 1024 --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel.engine import Engine  # noqa: E402
from kernel.plan import load_plan  # noqa: E402
from kernel.registry import Plugin, default_registry  # noqa: E402
from kernel.roles import PluginContext, ProbeContext  # noqa: E402
from perf.common import log, printed, write_result  # noqa: E402
from plugins.descriptors.boost import HESSIAN_CONFIG  # noqa: E402
from plugins.probes.hessian import HessianProbe  # noqa: E402

KEYS = ("hessian_ratio", "hessian_ratio_prototype", "lambda_max", "lambda_min",
        "lanczos_steps", "hessian_converged", "hessian_samples")


class FullBatchProbe:
    """The same probe on every sample of the batch; its values carry a ``full_`` prefix so
    they sit beside the subsample's in the round's record."""

    def __init__(self, ctx: PluginContext):
        self.inner = HessianProbe(PluginContext(
            name=ctx.name, config={**ctx.config, "samples": 0}, plan=ctx.plan,
            run_id=ctx.run_id, run_dir=ctx.run_dir, seed=ctx.seed, bus=ctx.bus))
        self.every = self.inner.every

    def measure(self, ctx: ProbeContext) -> dict[str, float]:
        return {f"full_{k}": v for k, v in self.inner.measure(ctx).items()}


def spearman(x: list[float], y: list[float]) -> float:
    """Rank correlation (no ties expected among continuous rhos)."""
    if len(x) < 3:
        return math.nan
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def rows_of(events_path: Path) -> list[dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    with events_path.open() as fh:
        for line in fh:
            e = json.loads(line)
            if e["event"] == "ProbeMeasured" and e["probe"] in ("hessian", "hessian_full"):
                row = rows.setdefault(e["round"], {"round": e["round"]})
                prefix = "full_" if e["probe"] == "hessian_full" else ""
                row.update(e["values"])
                row[f"{prefix}probe_s"] = e["probe_s"]
            elif e["event"] == "RoundFinished" and e["round"] in rows:
                rows[e["round"]].update(round_s=e["round_s"], env_steps=e["round_env_steps"])
    return [rows[k] for k in sorted(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--samples", type=int, default=int(HESSIAN_CONFIG["samples"].default))
    parser.add_argument("--actors", type=int, default=16)
    args = parser.parse_args()

    registry = default_registry()
    registry.register(Plugin("hessian_full", "probe", FullBatchProbe,
                             "The hessian probe on the whole batch.", config=HESSIAN_CONFIG))
    raw = tomllib.loads((ROOT / "plans" / "hopper-nitro.toml").read_text())
    raw["stop"]["max_rounds"] = args.rounds
    raw["scaler"] = {"name": "fixed"}
    raw["actors"].update(count=args.actors, max=args.actors)
    raw["sinks"] = []
    raw["probes"] = [{"name": "hessian", "samples": args.samples}, {"name": "hessian_full"}]
    plan = load_plan(raw, [], registry)
    with tempfile.TemporaryDirectory() as tmp:
        log(f"Hopper, {args.actors} actors, {args.rounds} rounds, subsample {args.samples}")
        asyncio.run(Engine(plan, out_dir=Path(tmp) / "run", registry=registry).run())
        rows = rows_of(Path(tmp) / "run" / "events.jsonl")

    usable = [r for r in rows if "hessian_ratio" in r and "full_hessian_ratio" in r]
    rho_sub = [r["hessian_ratio"] for r in usable]
    rho_full = [r["full_hessian_ratio"] for r in usable]
    with printed() as out:
        print(f"{'round':>5} {'batch':>6} {'rho sub':>8} {'rho full':>8} {'l_min sub':>9} "
              f"{'l_min full':>10} {'steps':>9} {'probe s':>13} {'round s':>7}")
        for r in usable:
            print(f"{r['round']:>5} {r['full_hessian_samples']:>6.0f} {r['hessian_ratio']:>8.3f} "
                  f"{r['full_hessian_ratio']:>8.3f} {r['lambda_min']:>9.4f} "
                  f"{r['full_lambda_min']:>10.4f} "
                  f"{r['lanczos_steps']:>4.0f}/{r['full_lanczos_steps']:<4.0f} "
                  f"{r['probe_s']:>6.3f}/{r['full_probe_s']:<6.3f} {r['round_s']:>7.2f}")
        rho_s = spearman(rho_sub, rho_full)
        print(f"Spearman rank correlation of rho, subsample vs full batch, over {len(usable)} "
              f"rounds: {rho_s:.3f}")
    write_result("hessian_subsample", {
        "rounds": args.rounds, "samples": args.samples, "actors": args.actors,
        "spearman": rho_s, "rows": rows, "report": out.getvalue(),
    })


if __name__ == "__main__":
    main()
