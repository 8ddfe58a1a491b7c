"""Run every benchmark in perf/ and render ``perf/RESULTS.md`` from the results (``make bench``).

Each ``perf/*.py`` script (except helpers) runs as its own subprocess with its defaults and
writes its raw rows to ``perf/results/<stem>.json``; a script that writes no result file gets
one holding its output, marked on the page as not re-checkable. The page is then rendered by
``perf/render_results.py`` from the files alone.

    python perf/run_all.py                 # everything, full size (hours: includes the peers)
    python perf/run_all.py --quick         # every script with --quick, under 15 minutes; writes
                                           # runs/bench-quick/ (results + RESULTS.md), never
                                           # the published perf/results/
    python perf/run_all.py --only cartpole_time local_sps
    python perf/run_all.py --collect       # only re-render RESULTS.md from perf/results/*.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import common as c
import render_results as rr

#: Modules in perf/ that are not benchmarks themselves.
HELPERS = {"common", "run_all", "ppo_minimal", "render_results"}
#: Scripts left out of ``--quick`` (``--only`` still runs them): the boosting study runs
#: several simulated-cloud runs per scaler even at its smallest, the soak is long by design,
#: and the GPU check is for a machine with a GPU. Scripts without a ``--quick`` are left out
#: too: at full size they would not fit the quick check's 15 minutes.
NOT_QUICK = {"soak", "gpu_check"}
#: Scripts with a make target of their own (``make boost``: hours at full size), run here only
#: when ``--only`` names them.
SEPARATE = {"boost"}
QUICK_DIR = c.ROOT / "runs" / "bench-quick"


def scripts() -> list[str]:
    present = sorted(p.stem for p in c.PERF.glob("*.py") if p.stem not in HELPERS)
    return [s for s in rr.ORDER if s in present] + [s for s in present if s not in rr.ORDER]


def supports(script: str, flag: str) -> bool:
    return flag in (c.PERF / f"{script}.py").read_text(encoding="utf-8")


def run_script(script: str, quick: bool, timeout: float, results: Path) -> dict[str, Any]:
    """Run one benchmark; a failure or a script without a result file still leaves a file."""
    cmd = [c.PY, str(c.PERF / f"{script}.py")]
    if quick and supports(script, "--quick"):
        cmd.append("--quick")
    command = " ".join(["python", f"perf/{script}.py", *cmd[2:]])
    result_file = results / f"{script}.json"
    result_file.unlink(missing_ok=True)  # a failed run must not leave an old result standing
    c.log(f"run {command}")
    proc = c.run(cmd, timeout=timeout, env={"NITRO_PERF_RESULTS": str(results)})
    c.log(f"  rc={proc.rc} in {proc.process_s:.0f} s")
    failed = ({"rc": proc.rc, "stderr": proc.stderr.strip()[-3000:]} if proc.rc != 0 else None)
    if not result_file.exists():
        c.write_result(script, {"title": script, "command": command, "quick": quick,
                                "stdout": (proc.stdout.strip() or proc.stderr.strip())[-6000:],
                                "failed": failed}, results=results)
    elif failed:
        c.update_result(result_file, {"failed": failed})
    return {"script": script, "rc": proc.rc, "process_s": proc.process_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="pass --quick to every script; results under runs/bench-quick/")
    parser.add_argument("--only", nargs="+", default=None, help="scripts to run (stems)")
    parser.add_argument("--skip", nargs="+", default=[], help="scripts not to run")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing; re-render RESULTS.md from perf/results/")
    parser.add_argument("--timeout", type=float, default=7200.0, help="per script, seconds")
    args = parser.parse_args()
    results = QUICK_DIR / "results" if args.quick else c.RESULTS
    out = QUICK_DIR / "RESULTS.md" if args.quick else rr.OUT
    results.mkdir(parents=True, exist_ok=True)

    ran: list[dict[str, Any]] = []
    if not args.collect:
        skip = set(args.skip) | (NOT_QUICK if args.quick and args.only is None else set())
        skip |= SEPARATE if args.only is None else set()
        if args.quick and args.only is None:
            skip |= {s for s in scripts() if not supports(s, "--quick")}
            c.log(f"--quick leaves out: {', '.join(sorted(skip))}")
        todo = [s for s in scripts() if (args.only is None or s in args.only) and s not in skip]
        timeout = min(args.timeout, 600.0) if args.quick else args.timeout
        for script in todo:
            ran.append(run_script(script, args.quick, timeout, results))
    rr.write(out, results)
    failed = [r["script"] for r in ran if r["rc"] != 0]
    print(f"wrote {Path(out).resolve().relative_to(c.ROOT)}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
