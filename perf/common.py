"""Helpers shared by the perf scripts: subprocess timing, the machine's description, result files.

Each benchmark runs what it measures as subprocesses (so start-up is part of what is measured and
nothing leaks between measurements), prints a table with ratios measured in the same run, and
writes ``perf/results/<name>.json`` that ``perf/run_all.py`` turns into ``perf/RESULTS.md``.
Only stdlib here: the peer scripts import nothing from this module, and run_all may run before
the project is installed.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
RESULTS = PERF / "results"
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


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def span(values: Sequence[float | None]) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None]
    return (min(vals), max(vals)) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b


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


def write_result(name: str, result: dict[str, Any]) -> Path:
    """Save one benchmark's result for run_all (with when, where and how it was measured)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"name": name, "when": now(), "command": command_line(), "machine": machine(),
              **result}
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


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
