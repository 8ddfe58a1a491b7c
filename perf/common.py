"""Helpers shared by the perf scripts: subprocess timing, the machine's description, result files.

Each benchmark runs what it measures as subprocesses (so start-up is part of what is measured and
nothing leaks between measurements), prints a table with ratios measured in the same run, and
writes its raw rows to ``perf/results/<name>.json``, from which ``perf/render_results.py``
renders ``perf/RESULTS.md``. ``NITRO_PERF_RESULTS`` points the results elsewhere (the quick
check writes under ``runs/`` so it never replaces the published measurements). Only stdlib
here: the peer scripts import nothing from this module.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
RESULTS = Path(os.environ.get("NITRO_PERF_RESULTS") or PERF / "results")
#: How the boosting studies read a bootstrap distribution into an interval. They were tabled
#: with the plain percentile interval before ``nitro report`` moved to the expanded one, and
#: seeds added later must stay comparable with the published tables (docs/boosting.md,
#: "Statistics", says what that interval's coverage is at five and ten seeds).
STUDY_INTERVAL = "percentile"
#: The result names of perf/boost_budget.py's equal-budget studies: one task, one learner price,
#: one clock, ``_mb32`` for the paper's minibatch count (``boost_hopper_gpu_model_cuda_mb32``) and
#: a ``--label`` last (``boost_hopper_cpu_idle``).
BUDGET_STUDY = re.compile(r"boost_[a-z0-9]+_(cpu|gpu)(_model(_cuda(_mb32)?)?)?(_[a-z0-9_]+)?")
PY = sys.executable


@dataclass
class Proc:
    """A finished subprocess: its exit code, output and wall time from spawn to exit."""

    rc: int
    stdout: str
    stderr: str
    process_s: float

    def last_json(self) -> dict[str, Any]:
        """The last stdout line that parses as a JSON object (how runners report)."""
        for line in reversed(self.stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue
        raise RuntimeError(f"no JSON result line (rc={self.rc}); stderr tail:\n"
                           f"{self.stderr[-2000:]}")


def run(cmd: Sequence[str], *, timeout: float | None = None, env: dict[str, str] | None = None,
        cwd: Path = ROOT) -> Proc:
    """Run ``cmd`` to completion, timing the whole process (start-up included)."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Proc(124, out, err + f"\n[timed out after {timeout} s]", time.perf_counter() - t0)
    return Proc(done.returncode, done.stdout, done.stderr, time.perf_counter() - t0)


def time_model_sets(constants: dict[str, float]) -> list[str]:
    """Plan overrides that bill a run from the time model with these constants (as
    ``perf/boost_budget.py fit`` keeps them in perf/results/time_model_<task>.json)."""
    return ['cost.time_model="model"', *(f"cost.{k}={v!r}" for k, v in constants.items())]


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def span(values: Sequence[float | None]) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None]
    return (min(vals), max(vals)) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b


def ok_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that finished (a failed run keeps its row, with ``error``, but no numbers)."""
    return [r for r in rows if "error" not in r]


def by_seed(rows: Iterable[dict[str, Any]], key: str) -> dict[int, float]:
    """seed -> the value of ``key`` in the finished runs that have one."""
    return {r["seed"]: r[key] for r in ok_rows(rows) if r.get(key) is not None}


def seed_list(seeds: Iterable[int]) -> str:
    """Seeds as a reader scans them: runs of consecutive seeds collapse to ``a–b``."""
    ordered, parts = sorted(set(seeds)), []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}–{ordered[j]}")
        i = j + 1
    return ", ".join(parts) if parts else "none"


def seed_ratio(ours: Iterable[dict[str, Any]], theirs: Iterable[dict[str, Any]], key: str,
               names: tuple[str, str] = ("nitro", "peer"),
               stat: Callable[[Sequence[float]], float] = statistics.median,
               unit: str = "seeds") -> tuple[float | None, str | None]:
    """``stat`` of ours over ``stat`` of theirs, or None and the reason it is refused.

    Seeds differ in luck (CartPole's steps to 475 spread 8x between seeds), so a ratio over
    two different seed sets measures the seeds as much as the libraries: it is refused unless
    both sides finished the very same seeds."""
    a, b = by_seed(ours, key), by_seed(theirs, key)
    if not a or not b:
        return None, f"{names[0] if not a else names[1]} has no {key} in its finished runs"
    if set(a) != set(b):
        return None, (f"{unit} differ: {names[0]} {seed_list(a)}, "
                      f"{names[1]} {seed_list(b)}")
    return ratio(stat(list(a.values())), stat(list(b.values()))), None


def ratio_interval(ours: Iterable[dict[str, Any]], theirs: Iterable[dict[str, Any]], key: str,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of the ratio of medians, resampling seeds in pairs (the same
    seed on both sides, as the runs were made); None unless both sides have the same seeds."""
    a, b = by_seed(ours, key), by_seed(theirs, key)
    if set(a) != set(b) or len(a) < 2:
        return None
    seeds = sorted(a)
    rng = random.Random(seed)
    boot = []
    for _ in range(draws):
        pick = rng.choices(seeds, k=len(seeds))
        den = statistics.median(b[s] for s in pick)
        if den:
            boot.append(statistics.median(a[s] for s in pick) / den)
    if not boot:
        return None
    boot.sort()
    return boot[int(0.025 * (len(boot) - 1))], boot[int(round(0.975 * (len(boot) - 1)))]


def ratio_text(ours: Iterable[dict[str, Any]], theirs: Iterable[dict[str, Any]], key: str,
               names: tuple[str, str] = ("nitro", "peer"), unit: str = "seeds"
               ) -> tuple[float | None, str]:
    """The ratio of medians over the same seeds with its paired-bootstrap interval, as a
    table cell (a dash and the reason when the seed sets differ), and the bare ratio."""
    ours, theirs = list(ours), list(theirs)
    value, reason = seed_ratio(ours, theirs, key, names, unit=unit)
    if reason is not None:
        return None, ratio_cell(None, reason)
    ci = ratio_interval(ours, theirs, key)
    return value, fmt(value) + ("" if ci is None else f" [{fmt(ci)}]")


def ratio_cell(value: float | None, reason: str | None) -> str:
    """A ratio for a table, or a visible dash with the reason it is missing."""
    return fmt(value) if reason is None else f"— ({reason})"


def bootstrap_interval(values: Sequence[float],
                       stat: Callable[[Sequence[float]], float] = statistics.median,
                       draws: int = 2000, level: float = 0.95, seed: int = 0
                       ) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of ``stat`` over seeds (None below two values).

    Seeded, so the page renders the same interval from the same rows every time."""
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 2:
        return None
    rng = random.Random(seed)
    boot = sorted(stat(rng.choices(vals, k=len(vals))) for _ in range(draws))
    tail = (1.0 - level) / 2
    return boot[int(tail * (draws - 1))], boot[int(round((1 - tail) * (draws - 1)))]


def with_interval(values: Sequence[float | None], digits: int = 2) -> str:
    """``median [lo–hi]`` with the 95% bootstrap interval of the median, for a table cell."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    ci = bootstrap_interval(vals)
    mid = fmt(statistics.median(vals), digits)
    return mid if ci is None else f"{mid} [{fmt(ci, digits)}]"


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    if isinstance(value, tuple) and len(value) == 2:
        return f"{fmt(value[0], digits)}–{fmt(value[1], digits)}"
    return str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (also readable as plain text on a terminal)."""
    cells = [[fmt(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM, OS and Python: what a reader needs to compare numbers."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "ram_gib": ram_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in load] if load else None,
    }


def versions(python: str = PY, packages: Sequence[str] = (
        "torch", "gymnasium", "mujoco", "numpy", "nitro-rl")) -> dict[str, str | None]:
    """Installed versions as seen by ``python`` (another venv's interpreter for peers)."""
    code = ("import json,sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
            "out={}\nfor p in sys.argv[1:]:\n  try: out[p]=version(p)\n"
            "  except PackageNotFoundError: out[p]=None\nprint(json.dumps(out))")
    proc = run([python, "-c", code, *packages], timeout=60)
    try:
        return proc.last_json()
    except RuntimeError:
        return {p: None for p in packages}


def write_result(name: str, result: dict[str, Any], results: Path | None = None) -> Path:
    """Save one benchmark's raw result (with when, where, on what and how it was measured)."""
    folder = results or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    result = {"name": name, "when": now(), "command": command_line(), "machine": machine(),
              "versions": versions(), **result}
    return _write_json(folder / f"{name}.json", result)


def update_result(path: Path, changes: dict[str, Any]) -> Path:
    """Add keys to a stored result (run_all marks a script that failed after writing one)."""
    return _write_json(path, {**json.loads(path.read_text(encoding="utf-8")), **changes})


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


class _Tee(io.StringIO):
    def __init__(self, out: Any):
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        return super().write(text)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def printed() -> Iterator[io.StringIO]:
    """Stdout as it is printed, also kept: for benchmarks whose report is their printed text,
    stored beside their raw rows."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee


def now() -> str:
    """The time stamp every stored result carries."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def command_line() -> str:
    """This benchmark's command as a reader would type it from the repository root."""
    return shlex.join(["python", _rel(sys.argv[0]), *sys.argv[1:]])


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else path


def log(msg: str) -> None:
    """Progress on stderr so stdout stays the table."""
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()
