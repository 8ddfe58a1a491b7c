"""Rewrite ``perf/RESULTS.md`` from ``perf/results/*.json`` and nothing else.

A benchmark stores its raw rows (one per seed or per repetition), the machine, the versions,
the load and the command; the page is rendered from those files, so a reader who recomputes
any figure from ``perf/results/`` gets the same number, and rendering twice gives the same page.
A benchmark with a ``render(data)`` function below (``RENDERERS``) has its table recomputed from
its rows here; others show the Markdown they stored beside their rows. A file that keeps only
aggregates is shown with a warning that it cannot be re-checked until it is measured again.

    python perf/render_results.py            # rewrite perf/RESULTS.md
    python perf/render_results.py --check    # exit 1 if the page is not what the files give
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import common as c

OUT = c.PERF / "RESULTS.md"
#: Section order on the page: quick, self-contained benchmarks first, the peers last; files
#: not named here follow in name order.
ORDER = ["cartpole_time", "local_sps", "dataplane", "fanout", "overlap", "atari_sps",
         "learner_bench", "learner_bench_xeon_amx", "atari_curve_pong_appo_h200",
         "atari_curve_pong_appo_h200_bf16_int8_seed3",
         "atari_curve_pong_appo_cpu", "atari_curve_pong_appo_cpu_seed2",
         "atari_curve_pong_appo_cpu_bf16", "atari_curve_pong_appo_cpu_bf16_int8",
         "atari_curve_pong_appo_cpu_bf16_int8_seed2", "atari_curve_pong_appo_cpu_bf16_int8_long_seed3",
         "atari_curve_spaceinvaders_appo_cpu",
         "gpu_check", "gpu_check_bf16", "gpu_check_scan", "boost_budget", "boost_paper",
         "boost_paper_model_cuda",
         "hessian_subsample", "hessian_batch", "rho_persistence", "boost_premise", "boost_premise_h3",
         "boost_premise_walker2d", "boost_premise_steps", "boost_premise_lr",
         "boost_premise_walker2d_steps", "boost_premise_walker2d_lr", "boost_front", "boost_intervals", "spend_check_churn", "spend_check_churn_fd9feb1",
         "spend_check_churn_35cb807", "spend_check_churn_4e5bed7", "spend_check", "spend_check_async_rerun",
         "spend_check_c02a9e6", "load",
         "soak", "compare_peers"]
#: Result name -> the perf module whose ``render(data)`` recomputes its tables from the rows.
RENDERERS = {"cartpole_time": "cartpole_time", "compare_peers": "compare_peers",
             "fanout": "fanout", "dataplane": "dataplane", "boost_paper": "boost",
             "boost_budget": "boost", "gpu_check": "gpu_check",
             "gpu_check_bf16": "gpu_check", "gpu_check_scan": "gpu_check", "atari_sps": "atari_sps",
             "hessian_batch": "hessian_batch", "rho_persistence": "rho_persistence",
             "boost_front": "boost_front",
             "boost_intervals": "boost_intervals"}
BOOST_PROTOCOL = re.compile(r"boost_(paper|budget)(_model(_cuda)?)?")
#: Keys under which a result keeps its raw per-seed or per-repeat rows.
RAW_KEYS = ("rows", "results", "runs", "repeats")
NOT_RECHECKABLE = ("**Not re-checkable until re-measured**: this file keeps only aggregates "
                   "or rendered text, no per-seed or per-repeat rows, so its figures and their "
                   "± cannot be recomputed from `perf/results/`.")


def has_raw_rows(data: dict[str, Any]) -> bool:
    return any(data.get(key) for key in RAW_KEYS)


def load_results(results: Path = c.RESULTS) -> dict[str, dict[str, Any]]:
    """Every stored result, by file stem, in page order."""
    found = {p.stem: json.loads(p.read_text(encoding="utf-8"))
             for p in sorted(results.glob("*.json"))}
    names = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)
    # the peers' tables (one per machine they ran on) close the page
    names = ([n for n in names if not n.startswith("compare_peers")]
             + [n for n in names if n.startswith("compare_peers")])
    return {n: found[n] for n in names}


def provenance(name: str, data: dict[str, Any], folder: str) -> list[str]:
    """Where, when and how the section was measured, as stored with it."""
    m = data.get("machine") or {}
    where = (f"{m['cpu']} ({m.get('cores', '?')} cores)" if m.get("cpu")
             else "machine not recorded")
    lines = [f"`{data.get('command', f'python perf/{name}.py')}` — {data.get('when', '?')}, "
             f"{where}, load average {m.get('loadavg', 'not recorded')}"
             + (" (quick)" if data.get("quick") else ""), ""]
    if data.get("versions"):
        lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()), ""]
    lines += [f"Raw data: `{folder}/{name}.json`.", ""]
    return lines


def renderer(name: str) -> str | None:
    """The module that renders ``name``: the equal-budget studies are one per task, price and
    clock (``boost_hopper_gpu_model``), all rendered by perf/boost_budget.py."""
    if name in RENDERERS:
        return RENDERERS[name]
    if name.startswith("atari_curve_"):
        return "atari_curve"
    if name.startswith("compare_peers"):  # one table per machine the peers ran on
        return "compare_peers"
    if name.startswith("boost_premise"):  # one result per task, horizon and use
        return "boost_premise"
    if name.startswith("spend_check"):  # one result per grid (code, load)
        return "spend_check"
    if BOOST_PROTOCOL.fullmatch(name):  # perf/boost.py, one result per protocol and clock
        return "boost"
    return "boost_budget" if c.BUDGET_STUDY.fullmatch(name) else None


def body(name: str, data: dict[str, Any]) -> str:
    """The section's tables: recomputed from the rows where a renderer exists."""
    raw = has_raw_rows(data)
    module = renderer(name)
    if raw and module is not None:
        return importlib.import_module(module).render(data)
    printed = (data.get("stdout") or data.get("report") or "").strip()
    text = (data.get("markdown") or (f"```\n{printed}\n```" if printed else "")
            or rows_table(data) or "(no table or text stored)")
    return text if raw else f"{NOT_RECHECKABLE}\n\n{text}"


def rows_table(data: dict[str, Any]) -> str:
    """The stored rows as they are, for a result that keeps rows but no table of its own."""
    rows = next((data[k] for k in RAW_KEYS if isinstance(data.get(k), list) and data[k]), [])
    rows = [r for r in rows if isinstance(r, dict)]
    headers = list(dict.fromkeys(k for r in rows for k, v in r.items()
                                 if v is None or isinstance(v, (int, float, str, bool))))
    if not headers:
        return ""
    return c.md_table(headers, [[r.get(h) for h in headers] for r in rows])


def section(name: str, data: dict[str, Any], folder: str = "perf/results") -> str:
    lines = [f"## {data.get('title', name)}", "", *provenance(name, data, folder),
             body(name, data)]
    if data.get("failed"):
        lines += ["", f"**Failed** (rc {data['failed'].get('rc')}):", "", "```",
                  str(data["failed"].get("stderr", "")).strip(), "```"]
    return "\n".join(lines) + "\n"


HEADER = """# Nitro benchmarks

Generated by `python perf/render_results.py` from `perf/results/*.json` only (`make bench`
measures everything and renders; `make bench-quick` is the small check after a change). Each
section names the command that measured it, when, the machine, its load and versions, and the
file that keeps its raw rows. A ratio divides numbers measured in the same run on the same
machine over the same seeds; where the seed sets differ the table shows "—" and why.
"""


def page(results: dict[str, dict[str, Any]], folder: Path = c.RESULTS) -> str:
    """The whole page; ``folder`` is named in each section as where its raw rows are."""
    where = folder.resolve()
    shown = where.relative_to(c.ROOT).as_posix() if where.is_relative_to(c.ROOT) else str(where)
    return HEADER + "\n" + "\n".join(section(n, d, shown) for n, d in results.items())


def write(out: Path = OUT, folder: Path = c.RESULTS) -> Path:
    out.write_text(page(load_results(folder), folder), encoding="utf-8")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if RESULTS.md differs from the rendering")
    args = parser.parse_args()
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == page(load_results(c.RESULTS))
        print("perf/RESULTS.md " + ("matches perf/results/" if same else
                                     "differs from perf/results/: run "
                                     "python perf/render_results.py"))
        return 0 if same else 1
    print(f"wrote {write().relative_to(c.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
