"""A run's directory: where it is, what may be written there, and when.

A run directory is a contract (``plan.toml``, ``events.jsonl``, ``log.jsonl``,
``summary.json``, ``checkpoints/``), so these rules keep it whole: a new run never lands in a
non-empty directory unless told to replace the run there, a resume that does not fit the
checkpoint changes nothing, sink output stays inside the directory, and files a reader may open
at any moment are replaced atomically.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomli_w

from kernel import logs
from kernel.jsonsafe import drop_none, json_safe
from kernel.schema import PlanError, describe

#: What a run writes into its directory; ``force`` clears these (and only these) before a new
#: run takes over a directory, so no old checkpoint can be resumed as if it were the new run's.
RUN_FILES = ("plan.toml", "events.jsonl", "log.jsonl", "summary.json")
#: Sink keys that name a file or folder in the run directory.
SINK_PATH_KEYS = ("path", "dir")


def new_run_id(name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)[:40]
    return f"{safe}-{secrets.token_hex(4)}"


def write_atomic(path: Path, text: str) -> None:
    """A reader (or a resume after a crash) sees the old file or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def new_run_dir(plan: dict[str, Any], out_dir: str | os.PathLike[str] | None,
                 force: bool) -> Path:
    """The directory of a new run. A chosen one must be new or empty unless ``force``: a run
    written over another would mix their journals and leave the old checkpoints resumable.
    The default one is made unique (two runs started in the same second)."""
    if out_dir is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        base = Path(plan["run"]["out_dir"]) / f"{plan['run']['name']}-{stamp}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return path
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise PlanError("--out", "a directory", str(path), note="a file is in the way")
    if not force and path.is_dir() and any(path.iterdir()):
        raise PlanError("--out", "a new or empty directory", str(path),
                        note="not empty: --force starts a new run there, deleting its "
                             "checkpoints, journal and summary")
    return path


def clear_previous_run(run_dir: Path) -> None:
    """``force``: the files of a run found in ``run_dir`` go; anything else stays."""
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def check_sink_paths(plan: dict[str, Any], run_dir: Path) -> None:
    """A sink's file or folder is named relative to the run directory and stays inside it."""
    root = run_dir.resolve()
    for i, item in enumerate(plan["sinks"]):
        for key in SINK_PATH_KEYS:
            value = item.get(key)
            if not isinstance(value, str):
                continue
            target = (root / value).resolve()
            if Path(value).is_absolute() or not value or not target.is_relative_to(root) \
                    or target == root:
                raise PlanError(f"sinks[{i}].{key}", "a relative path inside the run directory",
                                value)


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Key paths to values; ``env.kwargs`` stays one value (gymnasium takes it whole)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping) and key != "kwargs":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume_fits(saved: dict[str, Any], plan: dict[str, Any],
                      fixed: Collection[str]) -> None:
    """Refuse overrides that change what the checkpoint's model was trained on or for:
    the key paths in ``fixed`` (``kernel.plan.fixed_on_resume``) and the keys inside them."""
    before = _flat({k: v for k, v in saved.items() if isinstance(v, Mapping)})
    after = _flat({k: v for k, v in plan.items() if isinstance(v, Mapping)})
    for key in sorted(set(before) | set(after)):
        if before.get(key) == after.get(key):
            continue
        if key in fixed or any(key.startswith(f"{path}.") for path in fixed):
            raise PlanError(
                key, f"the checkpoint's value {describe(before.get(key))}", after.get(key),
                note="a resume continues the same env, spaces and algorithm; start a new run "
                     "to change it")


class RunFiles:
    """The run log, the event journal, the resolved plan and the summary of one run."""

    def __init__(self, run_dir: Path, run_id: str):
        self.run_dir = run_dir
        self.run_id = run_id
        self._journal: Any = None

    @property
    def is_open(self) -> bool:
        return self._journal is not None

    def open(self, plan: dict[str, Any], *, force: bool, append: bool) -> None:
        """Start writing: ``force`` first clears a previous run's files; a resumed run
        (``append``) adds to its journal."""
        if force:
            clear_previous_run(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        logs.open_run_log(self.run_id, self.run_dir / "log.jsonl")
        # Line-buffered: whoever tails the journal (a dashboard, a test) sees each event at once.
        self._journal = (self.run_dir / "events.jsonl").open("a" if append else "w",
                                                             encoding="utf-8", buffering=1)
        write_atomic(self.run_dir / "plan.toml", tomli_w.dumps(drop_none(logs.redact(plan))))

    def journal(self, event: Any) -> None:
        """``events.jsonl`` is complete by contract: every event, in order, before observers."""
        if self._journal is not None:
            self._journal.write(json.dumps(json_safe(event.to_dict())) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.run_dir / "summary.json",
                     json.dumps(json_safe(summary), indent=2) + "\n")

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        logs.close_run_log(self.run_id)
