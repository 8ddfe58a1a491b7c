"""Issue 5: strict alternation of sampling and training against the overlapped modes.

The same plan runs twice on this machine: once in ``sync`` mode (actors wait while the learner
trains, the learner waits while actors sample) and once overlapped (``pipelined`` for PPO,
``async`` for APPO): the next fan-out samples while the learner trains. From each run's
``events.jsonl`` it prints env steps per second of training (env steps / time from the first
to the last round), the learner's busy fraction (learner time / round time, averaged) and the
actors' idle time, and the ratios overlapped / strict; and what the simulated cloud makes of
the same rounds: simulated seconds and dollars per env step (a pipelined fan-out started
during the previous update is clocked only for the sampling that update did not hide).

    python perf/overlap.py            # Hopper-v5 PPO and APPO, 40 rounds each
    python perf/overlap.py --quick    # 12 rounds
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import common as c

#: (title, plan, strict mode, overlapped mode, probes). The nitro case keeps its Hessian probe
#: every 4th round: the scaler waits for its decision where the probe runs and is asked ahead
#: elsewhere, so it overlaps three rounds in four.
CASES = [
    ("PPO, Hopper-v5", "plans/hopper.toml", "sync", "pipelined", "[]"),
    ("PPO + nitro (Hessian every 4th round), Hopper-v5", "plans/hopper-nitro.toml", "sync",
     "pipelined", '[{name = "hessian", every = 4}]'),
    ("APPO, Hopper-v5", "plans/hopper-appo.toml", "sync", "async", "[]"),
]


#: What the simulated columns mean, with the results.
CLOCK_NOTE = (
    "Simulated seconds and dollars are the simulated cloud's: a plan with `actors.simulate = "
    "true` (hopper-nitro) clocks a round by its slowest invocation's measured duration, "
    "crediting a pipelined round the sampling the previous update hid; one without "
    "(hopper, hopper-appo) clocks the round's wall time. Durations are measured on this "
    "machine, where overlapped actors share its cores with the learner and run slower, so "
    "their billed durations grow with the overlap; the time model (`cost.time_model`) "
    "removes that.")


def measure(plan: str, mode: str, rounds: int, out: Path, probes: str = "[]"
            ) -> dict[str, float]:
    proc = c.run([sys.executable, "-m", "kernel", "run", plan, "--out", str(out),
                  "--set", f"run.mode={mode}", "--set", f"stop.max_rounds={rounds}",
                  "--set", f"probes={probes}",
                  "--set", "sinks=[]"], timeout=1800)
    if proc.rc != 0:
        raise RuntimeError(f"{plan} {mode} failed: {proc.stderr[-2000:]}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    finished = [e for e in events if e["event"] == "RoundFinished"]
    # Skip round 1: it holds the workers' cold starts in every mode.
    steady = finished[1:]
    span_s = steady[-1]["ts"] - finished[0]["ts"]
    steps = sum(e["round_env_steps"] for e in steady)
    sim_s = steady[-1]["sim_time_s"] - finished[0]["sim_time_s"]
    usd = steady[-1]["cost_usd"] - finished[0]["cost_usd"]
    return {
        "env_steps_per_s": steps / span_s if span_s > 0 else float("nan"),
        "sim_s_per_k_steps": 1000 * sim_s / steps,
        "usd_per_m_steps": 1e6 * usd / steps,
        "overlap_s": sum(e.get("overlap_s", 0.0) for e in steady),
        "learner_busy": sum(e["learner_busy"] for e in steady) / len(steady),
        "actor_idle_s": sum(e["actor_idle_s"] for e in steady),
        "rounds": len(finished),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (12 if args.quick else 40)
    rows, raw = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (title, plan, strict_mode, overlap_mode, probes) in enumerate(CASES):
            c.log(f"{title}: {strict_mode}")
            strict = measure(plan, strict_mode, rounds, Path(tmp) / f"{i}-{strict_mode}", probes)
            c.log(f"{title}: {overlap_mode}")
            over = measure(plan, overlap_mode, rounds, Path(tmp) / f"{i}-{overlap_mode}", probes)
            raw += [{"case": title, "plan": plan, "mode": strict_mode, **strict},
                    {"case": title, "plan": plan, "mode": overlap_mode, **over}]
            rows.append([
                title, f"{strict_mode} / {overlap_mode}",
                f"{c.fmt(strict['env_steps_per_s'], 0)} / {c.fmt(over['env_steps_per_s'], 0)}",
                c.fmt(c.ratio(over["env_steps_per_s"], strict["env_steps_per_s"])),
                f"{c.fmt(strict['learner_busy'])} / {c.fmt(over['learner_busy'])}",
                c.fmt(c.ratio(over["learner_busy"], strict["learner_busy"])),
                f"{c.fmt(strict['actor_idle_s'], 1)} / {c.fmt(over['actor_idle_s'], 1)}",
                f"{c.fmt(strict['sim_s_per_k_steps'], 3)} / "
                f"{c.fmt(over['sim_s_per_k_steps'], 3)}",
                c.fmt(c.ratio(over["sim_s_per_k_steps"], strict["sim_s_per_k_steps"])),
                f"{c.fmt(strict['usd_per_m_steps'], 4)} / {c.fmt(over['usd_per_m_steps'], 4)}",
                c.fmt(c.ratio(over["usd_per_m_steps"], strict["usd_per_m_steps"])),
            ])
    headers = ["algorithm", "modes (strict / overlapped)", "env steps/s", "ratio",
               "learner busy", "ratio", "actor idle s", "simulated s per 1k steps", "ratio",
               "$ per 1M steps", "ratio"]
    table = c.md_table(headers, rows)
    print(table)
    c.write_result("overlap", {
        "title": "Overlap of fan-out and training (issue 5)",
        "markdown": f"{rounds} rounds per run, round 1 (cold starts) excluded. {CLOCK_NOTE}"
                    f"\n\n{table}",
        "quick": args.quick, "rows": raw,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
