"""``nitro sweep PLAN --seeds 1-10 --grid ... --out DIR``: a grid of settings x seeds, each run
its own ``python -m kernel run`` process.

A boosting claim needs many seeds of several settings run the same way, and a sweep of that size
takes hours here, so it must survive a Ctrl-C: every run writes to ``DIR/<setting>/seed-<s>``,
a run whose ``summary.json`` says it stopped by itself is never run again, and one that was
interrupted (its summary names a signal, or it has none) is started afresh. ``DIR/sweep.json``
records the plan, the grid, the seeds, the command and where each run lives, which is what
``nitro report DIR`` reads to group seeds by setting. Several sweeps may add settings or seeds
to one ``DIR`` at the same time (say, one per core with different seeds): each write of
``sweep.json`` merges with what the others wrote, under a lock.

Grid syntax (one ``--grid`` per axis; the settings are their cartesian product):

- ``--grid scaler.name=nitro,decay_only,fixed``: one key, one setting per value (a value is
  TOML, so ``[1, 2]`` and ``"a,b"`` keep their commas);
- ``--grid 'setting=fixed16:scaler.name=fixed,actors.count=16;nitro:scaler.name=nitro'``: named
  settings, each bundling several keys (``;`` between settings, ``,`` between keys; a bare name
  sets nothing and runs the plan as it is).

Every combination's plan is validated before the first run starts, so a typo in the last setting
fails in a second with one line, not after hours.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import itertools
import json
import math
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "sweep.json"
#: How long a run gets to write its summary after the sweep forwards a Ctrl-C, before it is
#: killed (the engine evaluates the policy at stop, which takes seconds on MuJoCo).
STOP_GRACE_S = 60.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class SweepError(Exception):
    """Bad arguments or a plan that fails for some setting: one line, exit 2."""


@dataclass(frozen=True)
class Setting:
    """One point of the grid: a label and the ``--set`` overrides that make it."""

    label: str
    overrides: tuple[str, ...] = ()

    @property
    def dirname(self) -> str:
        """The label as a directory name: anything a shell or a file system may trip on -> ``_``."""
        return re.sub(r"[^A-Za-z0-9._=+-]", "_", self.label)


@dataclass
class RunSpec:
    """One run of the sweep: where it goes and the command that makes it."""

    setting: Setting
    seed: int
    run_dir: Path
    argv: list[str]
    status: str = "pending"
    rc: int | None = None
    wall_s: float | None = None

    @property
    def log_path(self) -> Path:
        return self.run_dir.with_name(self.run_dir.name + ".log")


# -- parsing -----------------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``1-10``, ``1,3,5`` or ``1-3,7``: ascending, without repeats."""
    seeds: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise SweepError(f"--seeds {text}: expected integers like 1-10 or 1,2,5") from None
        if lo < 0 or hi < lo:
            raise SweepError(f"--seeds {text}: {part} is not an ascending range of seeds >= 0")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets, braces and quotes (TOML values keep their commas)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_axis(text: str) -> list[Setting]:
    """One ``--grid`` argument: ``key=v1,v2`` or ``setting=name:k=v,k=v;name2:...``."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise SweepError(f"--grid {text}: expected key=v1,v2 or setting=name:k=v;name2:k=v")
    if key == "setting":
        return [_named(item, text) for item in split_top(values, ";") if item]
    if key == "run.seed":
        raise SweepError(f"--grid {text}: seeds come from --seeds")
    return [Setting(f"{key}={value}", (f"{key}={value}",))
            for value in split_top(values, ",") if value]


def _named(item: str, text: str) -> Setting:
    name, _, body = item.partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise SweepError(f"--grid {text}: setting name {name!r} must be letters, digits, "
                         "'.', '_', '+' or '-'")
    overrides = tuple(o for o in split_top(body, ",") if o)
    for override in overrides:
        if "=" not in override:
            raise SweepError(f"--grid {text}: {override!r} in setting {name!r} is not key=value")
        if override.partition("=")[0].strip() == "run.seed":
            raise SweepError(f"--grid {text}: seeds come from --seeds")
    return Setting(name, overrides)


def combine(axes: Sequence[Sequence[Setting]]) -> list[Setting]:
    """The cartesian product of the axes, labels joined with ``,`` (later axes win a key)."""
    if not axes:
        return [Setting("plan")]
    settings = [Setting(",".join(s.label for s in combo),
                        tuple(o for s in combo for o in s.overrides))
                for combo in itertools.product(*axes)]
    seen: dict[str, str] = {}
    for s in settings:
        if s.dirname in seen:
            raise SweepError(f"settings {seen[s.dirname]!r} and {s.label!r} would share the "
                             f"directory {s.dirname!r}")
        seen[s.dirname] = s.label
    return settings


def toml_value(value: Any) -> str:
    """A Python value as the TOML text ``--set`` reads (for settings built in code)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise SweepError(f"cannot write {value!r} as TOML")


# -- validation and the run list ---------------------------------------------------------------


def validate(plan: str, settings: Sequence[Setting], common: Sequence[str], seed: int) -> None:
    """Load every setting's plan as its run will: the first bad one raises, naming it."""
    from kernel.plan import load_plan
    from kernel.registry import PluginError
    from kernel.schema import PlanError

    for s in settings:
        try:
            load_plan(plan, [*common, *s.overrides, f"run.seed={seed}"])
        except (PlanError, PluginError) as exc:
            raise SweepError(f"setting {s.label!r}: bad plan: {exc}") from None


def run_list(plan: str, settings: Sequence[Setting], seeds: Iterable[int],
             common: Sequence[str], out: Path, python: str = sys.executable) -> list[RunSpec]:
    """Settings x seeds, the setting's overrides after the common ones, the seed last."""
    runs = []
    for s in settings:
        for seed in seeds:
            run_dir = out / s.dirname / f"seed-{seed}"
            argv = [python, "-m", "kernel", "run", plan, "--out", str(run_dir)]
            for override in [*common, *s.overrides, f"run.seed={seed}"]:
                argv += ["--set", override]
            runs.append(RunSpec(s, seed, run_dir, argv))
    return runs


def run_state(run_dir: Path) -> str:
    """``finished`` (stopped by its own rule), ``failed`` (stopped by an error: rerunning
    would fail again), or ``unfinished`` (no summary, or interrupted by a signal)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return "unfinished"
    reason = str(summary.get("stop_reason", ""))
    if reason.startswith("signal") or reason == "cancelled":
        return "unfinished"
    if reason.startswith("error") or reason == "actors_failing" or not summary.get("env_steps"):
        return "failed"
    return "finished"


# -- the manifest ------------------------------------------------------------------------------


@dataclass
class Manifest:
    """``DIR/sweep.json``: enough to find, regroup and rerun every run of the sweep."""

    out: Path
    plan: str
    plan_sha256: str
    common: list[str]
    grid: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load_or_new(cls, out: Path, plan: str, common: Sequence[str]) -> Manifest:
        digest = hashlib.sha256(Path(plan).read_bytes()).hexdigest()
        path = out / MANIFEST
        if not path.is_file():
            return cls(out, plan, digest, list(common))
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("plan_sha256") != digest:
            raise SweepError(f"{path} was made from another plan ({data.get('plan')}); use "
                             "another --out")
        if list(data.get("set", [])) != list(common):
            raise SweepError(f"{path} was made with --set {data.get('set')}; resume with the "
                             "same --set (or use another --out)")
        return cls(out, plan, digest, list(common), list(data.get("grid", [])),
                   list(data.get("commands", [])), dict(data.get("settings", {})))

    def add(self, grid: Sequence[str], command: str, runs: Sequence[RunSpec]) -> None:
        """Merge this invocation's settings and seeds (a sweep grows by more seeds/settings)."""
        self.grid += [g for g in grid if g not in self.grid]
        self.commands.append(command)
        for run in runs:
            entry = self.settings.setdefault(run.setting.label, {
                "overrides": list(run.setting.overrides), "dir": run.setting.dirname,
                "runs": {}})
            if entry["overrides"] != list(run.setting.overrides):
                raise SweepError(f"setting {run.setting.label!r} is already in "
                                 f"{self.out / MANIFEST} with other keys: "
                                 f"{entry['overrides']}")
            entry["runs"].setdefault(str(run.seed), {"dir": _rel(run.run_dir, self.out)})

    def record(self, run: RunSpec) -> None:
        entry = self.settings[run.setting.label]["runs"][str(run.seed)]
        entry.update(status=run.status, rc=run.rc, wall_s=run.wall_s,
                     command=shlex.join(["python", *run.argv[1:]]))

    def write(self) -> Path:
        """Write the manifest, merged with what is on disk under a lock: two sweeps adding
        settings or seeds to one folder at once (one per core, say) would otherwise each
        write back the manifest they loaded, and the last writer would drop the other's runs."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / MANIFEST
        with (self.out / (MANIFEST + ".lock")).open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.is_file():
                self.merge(json.loads(path.read_text(encoding="utf-8")))
            seeds = sorted({int(s) for e in self.settings.values() for s in e["runs"]})
            data = {"plan": self.plan, "plan_sha256": self.plan_sha256, "set": self.common,
                    "grid": self.grid, "seeds": seeds, "commands": self.commands,
                    "settings": self.settings}
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            tmp.replace(path)
        return path

    def merge(self, disk: dict[str, Any]) -> None:
        """Take in what another sweep wrote since this one loaded: its settings, its seeds, and
        the outcome of runs this one has not run itself."""
        self.grid += [g for g in disk.get("grid", []) if g not in self.grid]
        self.commands += [c for c in disk.get("commands", []) if c not in self.commands]
        for label, entry in disk.get("settings", {}).items():
            mine = self.settings.setdefault(label, entry)
            if mine is entry:
                continue
            for seed, run in entry.get("runs", {}).items():
                known = mine["runs"].get(seed)
                if known is None or ("status" not in known and "status" in run):
                    mine["runs"][seed] = run


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


# -- execution ---------------------------------------------------------------------------------


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the sweep; the runs in flight were asked to stop."""


def execute(runs: Sequence[RunSpec], jobs: int, on_done: Callable[[RunSpec], None],
            poll_s: float = 0.2) -> None:
    """Run the pending runs, at most ``jobs`` at once. Each run is its own session (a Ctrl-C at
    the terminal reaches only the sweep), so the sweep forwards exactly one SIGINT to each run
    in flight, which then stops, evaluates and writes its summary; one that has not exited
    after ``STOP_GRACE_S`` is killed."""
    pending = [r for r in runs if r.status == "pending"]
    active: dict[subprocess.Popen[bytes], tuple[RunSpec, float]] = {}
    # SIGINT explicitly too, as `nitro run` does: a sweep started as a background job of a
    # script inherits SIGINT ignored, and would otherwise run to the end when asked to stop
    previous = {sig: signal.signal(sig, _raise_interrupt)
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while pending or active:
            while pending and len(active) < jobs:
                run = pending.pop(0)
                active[_start(run)] = (run, time.monotonic())
            for proc in [p for p in active if p.poll() is not None]:
                run, t0 = active.pop(proc)
                _finish(run, proc.returncode, time.monotonic() - t0)
                on_done(run)
            time.sleep(poll_s)
    except (KeyboardInterrupt, Interrupted):
        _stop_all(active, on_done)
        raise Interrupted from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise Interrupted


def _start(run: RunSpec) -> subprocess.Popen[bytes]:
    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)  # an interrupted attempt: its rounds would not be resumed
    run.run_dir.parent.mkdir(parents=True, exist_ok=True)
    with run.log_path.open("ab") as out:
        out.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(run.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(run.argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    run.status = "running"
    return proc


def _finish(run: RunSpec, rc: int, wall_s: float) -> None:
    run.rc, run.wall_s = rc, round(wall_s, 1)
    state = run_state(run.run_dir)
    run.status = {"finished": "finished", "failed": "failed"}.get(
        state, "interrupted" if rc in (130, -signal.SIGINT, -signal.SIGKILL) else "failed")


def _stop_all(active: dict[subprocess.Popen[bytes], tuple[RunSpec, float]],
              on_done: Callable[[RunSpec], None]) -> None:
    for proc in active:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc, (run, t0) in active.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _finish(run, proc.returncode, time.monotonic() - t0)
        on_done(run)


# -- the command -------------------------------------------------------------------------------


def sweep(plan: str, seeds: Sequence[int], grid: Sequence[str], common: Sequence[str],
          out: Path, jobs: int = 1, dry_run: bool = False, command: str = "",
          report: Callable[[str], None] = lambda line: None,
          extra_settings: Sequence[Setting] = ()) -> list[RunSpec]:
    """Validate, plan, skip what is finished, run the rest; returns every run with its status.

    ``extra_settings`` are settings built in code (``perf/boost.py``) added as one more axis
    beside the ``--grid`` ones. Raises ``SweepError`` before anything runs, ``Interrupted``
    after the runs in flight were stopped and recorded."""
    if not Path(plan).is_file():
        raise SweepError(f"{plan}: no such plan file")
    if jobs < 1:
        raise SweepError(f"--jobs {jobs}: expected at least 1")
    if not seeds:
        raise SweepError("--seeds: no seeds")
    axes = [parse_axis(g) for g in grid]
    if extra_settings:
        axes.append(list(extra_settings))
    settings = combine(axes)
    validate(plan, settings, common, seeds[0])
    runs = run_list(plan, settings, seeds, common, out)
    manifest = Manifest.load_or_new(out, plan, common)
    manifest.add([*grid, *(f"setting={s.label}" for s in extra_settings)], command, runs)
    for run in runs:
        state = run_state(run.run_dir)
        if state != "unfinished":
            run.status = state
            manifest.record(run)
    todo = [r for r in runs if r.status == "pending"]
    report(f"{len(settings)} settings x {len(seeds)} seeds = {len(runs)} runs; "
           f"{len(runs) - len(todo)} already done, {len(todo)} to run, {jobs} at a time")
    if dry_run:
        for run in todo:
            report("  " + shlex.join(run.argv))
        return runs
    manifest.write()
    done = [0]

    def on_done(run: RunSpec) -> None:
        done[0] += 1
        manifest.record(run)
        manifest.write()
        report(f"[{done[0]}/{len(todo)}] {run.setting.label} seed {run.seed}: {run.status} "
               f"in {run.wall_s:.0f} s{run_outcome(run.run_dir)}")

    execute(runs, jobs, on_done)
    return runs


def run_outcome(run_dir: Path) -> str:
    try:
        s = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return f" (no summary; see {run_dir}.log)"
    final = s.get("final_eval_return")
    cost = float(s.get("cost_usd") or 0.0)
    return (f" ({s.get('stop_reason')}, {s.get('rounds')} rounds, final eval "
            f"{'-' if final is None else format(final, '.1f')}, ${cost:.5f}"
            f"{_of_budget(run_dir, cost)})")


def _of_budget(run_dir: Path, cost: float) -> str:
    """The budget and the share of it spent, where the run had one: whether it spent what it
    was given is the first thing an equal-budget comparison asks of each run."""
    try:
        plan = tomllib.loads((run_dir / "plan.toml").read_text(encoding="utf-8"))
        budget = plan.get("stop", {}).get("budget_usd")
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    if not budget:
        return ""
    return f" of ${float(budget):g} ({percent_of_budget(cost / float(budget))} %)"


def percent_of_budget(share: float) -> str:
    """A share of the budget in percent, two decimals, rounded away from 100 %: a run under
    budget never reads 100.00 % or more, and one over it never reads 100.00 % or less."""
    hundredths = share * 10_000
    hundredths = math.floor(hundredths) if share <= 1.0 else math.ceil(hundredths)
    return f"{hundredths / 100:.2f}"


def _handle(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    command = shlex.join(["nitro", "sweep", *sys.argv[2:]]) if len(sys.argv) > 2 else "nitro sweep"
    try:
        runs = sweep(args.plan, parse_seeds(args.seeds), args.grid, args.overrides,
                     Path(args.out), args.jobs, args.dry_run, command, say)
    except SweepError as exc:
        sys.stderr.write(f"nitro sweep: {exc}\n")
        return 2
    except Interrupted:
        say(f"interrupted: rerun the same command to resume (finished runs are kept in "
            f"{args.out})")
        return 130
    failed = [r for r in runs if r.status == "failed"]
    for run in failed:
        say(f"failed: {run.setting.label} seed {run.seed} (log {run.log_path})")
    if not args.dry_run:
        say(f"wrote {Path(args.out) / MANIFEST}; report with: nitro report {args.out}")
    return 1 if failed else 0


def register(subparsers: Any) -> None:
    """Entry point of the ``nitro.commands`` group."""
    parser = subparsers.add_parser(
        "sweep", help="run a grid of settings x seeds, resumable",
        description="Run every setting of the grid for every seed, each as its own "
                    "`python -m kernel run` process writing DIR/<setting>/seed-<s>. Finished "
                    "runs (summary.json present, not interrupted) are skipped, so the same "
                    "command resumes a sweep after Ctrl-C. DIR/sweep.json lists the plan, grid, "
                    "seeds and run directories; `nitro report DIR` aggregates it.",
    )
    parser.add_argument("plan", help="plan.toml every run starts from")
    parser.add_argument("--seeds", default="1", help="seeds: 1-10, 1,2,5 or 1-3,7 "
                        "(default: 1)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="one axis: key=v1,v2,... or 'setting=name:k=v,k=v;name2:k=v' "
                             "(named settings bundling keys); repeat for a cartesian product")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE",
                        help="override for every run (a setting's keys win over it)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the sweep's directory")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at once (default: 1). Each run starts its own worker "
                             "processes (actors.workers, 0: one per core), so with more than "
                             "one job also --set actors.workers=1 or the runs fight for cores "
                             "and their wall times mean little")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate and list the runs still to do; run nothing")
    parser.set_defaults(handler=_handle)

