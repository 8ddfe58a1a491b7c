"""An Atari learning curve: return against agent steps and wall time, kept round by round.

``run`` trains a plan (the Pong APPO plan by default) and stores its curve; ``store`` keeps the
curve of a run made elsewhere (a GPU machine, say) from its run directory. The stored rows are
every round's training-episode mean return (real game scores: the training envs end an episode
per lost life but report whole games), its agent steps and its wall time, and every
evaluation; RESULTS.md is rendered from them. Long: run by hand, never in CI.

    python perf/atari_curve.py run --name pong_appo --set stop.max_wall_s=10800
    python perf/atari_curve.py run --name pong_appo_seed2 --set run.seed=2 \\
        --set stop.max_env_steps=1228800 --compare pong_appo      # a held-out rerun
    python perf/atari_curve.py store --run /path/to/run --name pong_appo_h200 \\
        --machine "one NVIDIA H200 beside a 16-core Xeon" --like perf/results/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import common as c

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "pong-appo.toml"


def curve(run_dir: Path) -> dict[str, Any]:
    """Per-round rows and evaluations from a run's events."""
    rows, evals, start = [], [], None
    for line in (run_dir / "events.jsonl").open():
        e = json.loads(line)
        if e["event"] == "RunStarted" and start is None:
            start = e["ts"]
        elif e["event"] == "RoundFinished":
            # The event's own wall_s runs on across a resume (the pause left out); the
            # timestamp is the fallback for runs older than that field.
            wall = e.get("wall_s") or e["ts"] - (start or e["ts"])
            rows.append({"round": e["round"], "env_steps": e["env_steps"],
                         "return": e.get("episode_return_mean"), "wall_s": round(wall, 2)})
        elif e["event"] == "ProbeMeasured" and e["probe"] == "eval":
            evals.append({"round": e["round"], "return": e["values"].get("eval_return")})
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = (run_dir / "plan.toml").read_text()
    return {"rows": rows, "evals": evals, "plan": plan,
            "summary": {k: summary.get(k) for k in ("rounds", "env_steps", "wall_s",
                                                    "stop_reason", "best_eval_return",
                                                    "final_eval_return", "trained_fraction")}}


def figure(data: dict[str, Any], name: str) -> Path:
    """Return against agent steps: each round's training mean, and the evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r["return"] is not None]
    steps = {r["round"]: r["env_steps"] for r in data["rows"]}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["env_steps"] for r in rows], [r["return"] for r in rows], lw=1,
            label="training episodes (mean per round)")
    ax.plot([steps[e["round"]] for e in data["evals"]], [e["return"] for e in data["evals"]],
            "o", label="deterministic evaluation")
    ax.set_xlabel("agent steps")
    ax.set_ylabel("game score")
    ax.set_title(name)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = ROOT / "perf" / "figures" / f"atari_curve_{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def render(data: dict[str, Any]) -> str:
    """Milestones of the curve: the mean training return over each tenth of the run."""
    rows = [r for r in data["rows"] if r["return"] is not None]
    s = data["summary"]
    parts = [f"Machine: {data.get('machine_note') or 'this machine'}. {s['rounds']} rounds, "
             f"{s['env_steps']:,} agent steps ({4 * s['env_steps']:,} frames) in "
             f"{s['wall_s']:.0f} s; stopped by {s['stop_reason']}; trained on "
             f"{(s.get('trained_fraction') or 0):.0%} of the sampled steps."]
    if rows:
        tenth = max(1, len(rows) // 10)
        table = []
        for i in range(0, len(rows), tenth):
            chunk = rows[i:i + tenth]
            table.append([f"{chunk[0]['round']}–{chunk[-1]['round']}", chunk[-1]["env_steps"],
                          chunk[-1]["wall_s"],
                          sum(r["return"] for r in chunk) / len(chunk),
                          max(r["return"] for r in chunk)])
        parts.append("Training-episode return (game score), by tenths of the run:\n\n"
                     + c.md_table(["rounds", "agent steps", "wall s", "mean return",
                                   "best round's mean"], table))
    parts += [f"![curve]({Path(f).relative_to('perf')})" for f in data.get("figures", [])]
    if data["evals"]:
        parts.append("Deterministic evaluations: " + ", ".join(
            f"round {e['round']}: {e['return']:.1f}" for e in data["evals"]) + ".")
    if data.get("reference"):
        parts.append(f"Published reference: {data['reference']}")
    if data.get("compare"):
        parts.append(comparison(data, json.loads(
            (c.RESULTS / f"atari_curve_{data['compare']}.json").read_text())))
    return "\n\n".join(parts)


def comparison(data: dict[str, Any], other: dict[str, Any], bins: int = 10) -> str:
    """This run beside another of the same plan at equal agent steps: the mean training
    return over each tenth of this run's steps, and the best evaluation up to there."""

    def at(d: dict[str, Any], lo: int, hi: int) -> tuple[float | None, float | None]:
        rows = [r for r in d["rows"] if lo < r["env_steps"] <= hi and r["return"] is not None]
        steps = {r["round"]: r["env_steps"] for r in d["rows"]}
        evals = [e["return"] for e in d["evals"] if steps.get(e["round"], hi + 1) <= hi]
        return (sum(r["return"] for r in rows) / len(rows) if rows else None,
                max(evals) if evals else None)

    end = data["summary"]["env_steps"]
    table = []
    for i in range(bins):
        lo, hi = end * i // bins, end * (i + 1) // bins
        (ours, our_best), (theirs, their_best) = at(data, lo, hi), at(other, lo, hi)
        table.append([f"{lo:,}–{hi:,}", c.fmt(ours, 1), c.fmt(theirs, 1),
                      c.fmt(our_best, 1), c.fmt(their_best, 1)])
    name = data["compare"]
    return (f"Beside `{name}` at equal agent steps (mean training return in each tenth of "
            "this run's steps; best deterministic evaluation so far):\n\n"
            + c.md_table(["agent steps", "this run", name, "best eval, this run",
                          f"best eval, {name}"], table))


def store(run_dir: Path, name: str, machine_note: str | None, command: str | None,
          like: Path | None = None, title: str | None = None,
          compare: str | None = None, reference: str | None = None) -> Path:
    """Keep the run's curve. A run made elsewhere names its own command, and ``like`` a result
    measured on the same kind of machine, whose machine and versions replace this one's.
    ``compare`` names a stored curve of the same plan to set this one beside (a held-out
    rerun on another seed, say); ``reference``, a published result to read the curve against."""
    result = {"title": title or f"Atari learning curve: {name}", **curve(run_dir),
              "machine_note": machine_note}
    if compare:
        result["compare"] = compare
    if reference:
        result["reference"] = reference
    result["figures"] = [str(figure(result, name).relative_to(ROOT))]
    path = c.write_result(f"atari_curve_{name}", result)
    # What write_result records of this machine and this command, replaced for a run made
    # elsewhere.
    elsewhere: dict[str, Any] = {"command": command} if command else {}
    if like is not None:
        other = json.loads(like.read_text())
        elsewhere.update(machine=other.get("machine"), versions=other.get("versions"))
    if elsewhere:
        c.update_result(path, elsewhere)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "store"))
    parser.add_argument("--name", required=True, help="result name: atari_curve_<name>")
    parser.add_argument("--plan", type=Path, default=PLAN)
    parser.add_argument("--set", action="append", default=[], help="plan override (repeat)")
    parser.add_argument("--run", type=Path, help="store: the run directory")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "atari_curve")
    parser.add_argument("--machine", help="store: where the run was made")
    parser.add_argument("--title", help="the section's title in RESULTS.md")
    parser.add_argument("--command", help="store: the command that made the run")
    parser.add_argument("--like", type=Path, help="store: a result from the same kind of "
                        "machine, whose machine and versions the curve takes")
    parser.add_argument("--reference", help="a published result for the same game and step "
                        "count, with its source, shown beside the curve")
    parser.add_argument("--compare", metavar="NAME", help="a stored curve of the same plan "
                        "(atari_curve_NAME) to compare with at equal agent steps")
    args = parser.parse_args()
    if args.action == "run":
        run_dir = args.out / args.name
        cmd = [sys.executable, "-m", "kernel", "run", str(args.plan), "--out", str(run_dir),
               "--force", *[a for s in args.set for a in ("--set", s)]]
        done = subprocess.run(cmd, cwd=ROOT)
        if done.returncode != 0:
            return done.returncode
        path = store(run_dir, args.name, args.machine, None, title=args.title,
                     compare=args.compare, reference=args.reference)
    else:
        if args.run is None:
            parser.error("store needs --run DIR")
        path = store(args.run, args.name, args.machine, args.command, args.like, args.title,
                     args.compare, args.reference)
    print(render(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
