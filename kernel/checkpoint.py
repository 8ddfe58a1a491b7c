"""Checkpoints: everything a run needs to continue, written atomically, read with care.

A checkpoint is one codec payload (msgpack + numpy, never pickle) holding the run state
(round counter, env steps, cost ledger, histories), the learner's state (model, optimiser,
normalisation statistics, torch RNG), the scaler's, probes' and cost model's states where
they keep one, and the coordinator's RNG. It records the format and the Nitro version that
wrote it; a reader refuses a format it does not know, with a message saying so.

Files live in ``RUN_DIR/checkpoints/ckpt-<round>.nitro``; each is written to a temporary file
and renamed, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from kernel import __version__, codec
from kernel.coordinator import Counters, RunState
from kernel.roles import RoundRecord
from kernel.schema import PlanError

log = structlog.get_logger("kernel.checkpoint")

FORMAT = 1
SUFFIX = ".nitro"


class CheckpointError(Exception):
    """A checkpoint that cannot be read by this build (the message says why)."""


def _plain(value: Any) -> Any:
    """JSON-like copy of run state (sets become sorted lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return sorted(value)
    return value


def _state_of(obj: Any) -> Any:
    getter = getattr(obj, "state", None)
    return getter() if callable(getter) else None


class Checkpointer:
    def __init__(self, run_dir: Path, every: int, keep: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.every = every
        self.keep = keep
        self.last_round: int | None = None

    def due(self, round_number: int) -> bool:
        return self.every > 0 and round_number > 0 and round_number % self.every == 0

    def save(self, engine: Any, final: bool = False) -> Path | None:
        """Write a checkpoint of the engine's current (between-rounds) state."""
        roles = engine._roles
        if roles is None:
            return None
        state: RunState = engine.state
        if final and self.last_round == state.round:
            return None  # the periodic checkpoint of this round is the final one too
        body = {
            "format": FORMAT,
            "nitro_version": __version__,
            "run_id": engine.run_id,
            "plan_name": engine.plan["run"]["name"],
            "final": final,
            "wall_s": engine.wall_s(),
            "run_state": _plain(dataclasses.replace(state, history=[], seen_requests=set())),
            "seen_requests": sorted(state.seen_requests)[-100_000:],
            "history": [_plain(r) for r in state.history],
            "learner": roles.learner.state(),
            "scaler": _state_of(roles.scaler),
            "cost": _state_of(roles.cost),
            "actors": _state_of(roles.actors),
            "probes": {name: _state_of(p) for name, p in roles.probes},
            "rng": json.dumps(engine.coordinator_rng_state()),
        }
        payload = codec.encode("checkpoint", body)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"ckpt-{state.round:06d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        self.last_round = state.round
        self._prune()
        log.info("checkpoint_written", path=str(path), round=state.round, bytes=len(payload))
        return path

    def _prune(self) -> None:
        files = sorted(self.dir.glob(f"ckpt-*{SUFFIX}"))
        for old in files[: max(0, len(files) - self.keep)]:
            old.unlink(missing_ok=True)


def latest(run_dir: Path) -> Path | None:
    files = sorted((Path(run_dir) / "checkpoints").glob(f"ckpt-*{SUFFIX}"))
    return files[-1] if files else None


def read(path: Path) -> dict[str, Any]:
    try:
        payload = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        body = codec.decode(payload, kind="checkpoint", max_bytes=1 << 34)
    except codec.CodecError as exc:
        raise CheckpointError(
            f"{path}: not a checkpoint this build can read ({exc}); it may come from another "
            f"Nitro version (this is {__version__}, format {FORMAT})"
        ) from None
    if body.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {body.get('format')!r} written by Nitro "
            f"{body.get('nitro_version')!r}; this build ({__version__}) reads format {FORMAT}"
        )
    return body


def restore(engine: Any, body: dict[str, Any]) -> None:
    """Put a checkpoint's state back into a freshly built engine (before ``run``)."""
    roles = engine._roles
    raw = dict(body["run_state"])
    counters = Counters(**raw.pop("counters"))
    raw.pop("history", None)
    raw.pop("seen_requests", None)
    engine.state = RunState(
        **raw,
        counters=counters,
        history=[RoundRecord(**r) for r in body["history"]],
        seen_requests=set(body.get("seen_requests", [])),
    )
    roles.learner.load_state(body["learner"])
    for obj, key in ((roles.scaler, "scaler"), (roles.cost, "cost"), (roles.actors, "actors")):
        _load(obj, body.get(key))
    for name, probe in roles.probes:
        _load(probe, body.get("probes", {}).get(name))
    engine.restore_coordinator_rng(json.loads(body["rng"]))
    engine._wall_before = float(body.get("wall_s", 0.0))


def _load(obj: Any, state: Any) -> None:
    loader = getattr(obj, "load_state", None)
    if state is not None and callable(loader):
        loader(state)


def resume_engine(run_dir: Path, overrides: Iterable[str] = ()) -> Any:
    """An engine that continues the run in ``run_dir`` from its newest checkpoint."""
    from kernel.engine import Engine
    from kernel.plan import load_plan

    run_dir = Path(run_dir)
    if not (run_dir / "plan.toml").exists():
        raise PlanError(str(run_dir), "a run directory with plan.toml", note="--resume")
    path = latest(run_dir)
    if path is None:
        raise PlanError(str(run_dir), "a run directory with a checkpoint",
                        note="no checkpoints/ckpt-*.nitro: enable [checkpoint]")
    try:
        body = read(path)
    except CheckpointError as exc:
        raise PlanError("--resume", "a readable checkpoint", note=str(exc)) from None
    plan = load_plan(run_dir / "plan.toml", overrides)
    return Engine(plan, out_dir=run_dir, resume=body)
