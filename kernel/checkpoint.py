"""Checkpoints: everything a run needs to continue, written atomically, read with care.

A checkpoint is one codec payload (msgpack + numpy, never pickle) holding the run state
(round counter, env steps, cost ledger, histories), the learner's state (model, optimiser,
normalisation statistics, torch RNG), the scaler's, probes' and cost model's states where
they keep one, and the coordinator's RNG. It records the format and the Nitro version that
wrote it; a reader refuses a format it does not know, with a message saying so.

Files live in ``RUN_DIR/checkpoints/ckpt-<round>.nitro``; each is written to a temporary file,
fsynced, renamed, and the directory fsynced too (so the rename itself survives a power cut),
and a crash mid-write leaves the previous checkpoint intact. The payload is followed by its
SHA-256 and a marker, so a flipped bit is detected rather than loaded. A reader checks the
fields a resume needs and refuses a damaged file in one line; resuming falls back from a
damaged newest checkpoint to the previous good one, with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from kernel import codec
from kernel.contract import Roles
from kernel.roles import RoundRecord
from kernel.run_state import Counters, RunState
from kernel.schema import PlanError
from kernel.version import __version__

log = structlog.get_logger("kernel.checkpoint")

FORMAT = 1
SUFFIX = ".nitro"
#: Ends every checkpoint file, after the SHA-256 of the payload before it.
TRAILER = b"NITROSHA"
_DIGEST = 32
#: Top-level fields a resume reads, with their types.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": int, "nitro_version": str, "run_id": str, "run_state": dict, "history": list,
    "seen_requests": list, "learner": dict, "rng": str, "wall_s": (int, float),
}


class CheckpointError(Exception):
    """A checkpoint that cannot be read by this build (the message says why, in one line).

    ``damaged``: the file is corrupt or incomplete (an older checkpoint may do), as opposed to
    written by another format (every checkpoint of the run would be)."""

    def __init__(self, message: str, damaged: bool = True):
        super().__init__(message)
        self.damaged = damaged


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


@dataclass(frozen=True)
class RunParts:
    """What a checkpoint saves of a run: its identity, state, plugins and RNG."""

    run_id: str
    plan_name: str
    wall_s: float
    state: RunState
    roles: Roles
    rng_state: dict[str, Any]
    #: What the round scheduler had started for the next round (pipelined), or None.
    rounds: dict[str, Any] | None = None


@dataclass(frozen=True)
class Restored:
    state: RunState
    rng_state: dict[str, Any]
    wall_s: float
    rounds: dict[str, Any] | None = None


class Checkpointer:
    def __init__(self, run_dir: Path, every: int, keep: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.every = every
        self.keep = keep
        self.last_round: int | None = None

    def due(self, round_number: int) -> bool:
        return self.every > 0 and round_number > 0 and round_number % self.every == 0

    def save(self, run: RunParts, final: bool = False) -> Path | None:
        """Write a checkpoint of a run's current (between-rounds) state."""
        state, roles = run.state, run.roles
        if final and self.last_round == state.round:
            return None  # the periodic checkpoint of this round is the final one too
        body = {
            "format": FORMAT,
            "nitro_version": __version__,
            "run_id": run.run_id,
            "plan_name": run.plan_name,
            "final": final,
            "wall_s": run.wall_s,
            "run_state": _plain(dataclasses.replace(state, history=[], seen_requests=set())),
            "seen_requests": sorted(state.seen_requests)[-100_000:],
            "history": [_plain(r) for r in state.history],
            "learner": roles.learner.state(),
            "scaler": roles.scaler.state(),
            "cost": roles.cost.state(),
            "actors": roles.actors.state(),
            "probes": {slot.name: slot.probe.state() for slot in roles.probes},
            "rng": json.dumps(run.rng_state),
            "rounds": run.rounds,
        }
        payload = codec.encode("checkpoint", body)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"ckpt-{state.round:06d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            fh.write(payload)
            fh.write(hashlib.sha256(payload).digest() + TRAILER)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.dir)
        self.last_round = state.round
        self._prune()
        log.info("checkpoint_written", path=str(path), round=state.round, bytes=len(payload))
        return path

    def _prune(self) -> None:
        files = sorted(self.dir.glob(f"ckpt-*{SUFFIX}"))
        for old in files[: max(0, len(files) - self.keep)]:
            old.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (POSIX: the entry lives in the directory)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest(run_dir: Path) -> Path | None:
    files = sorted((Path(run_dir) / "checkpoints").glob(f"ckpt-*{SUFFIX}"))
    return files[-1] if files else None


def read(path: Path) -> dict[str, Any]:
    """Read, verify and check a checkpoint; ``CheckpointError`` (one line) otherwise."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from None
    payload = _verified(path, data)
    try:
        body = codec.decode(payload, kind="checkpoint")
    except codec.CodecError as exc:
        raise CheckpointError(
            f"{path}: not a checkpoint this build can read ({exc}); it may come from another "
            f"Nitro version (this is {__version__}, format {FORMAT})"
        ) from None
    if body.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {body.get('format')!r} written by Nitro "
            f"{body.get('nitro_version')!r}; this build ({__version__}) reads format {FORMAT}",
            damaged=False,
        )
    problem = _schema_problem(body)
    if problem is not None:
        raise CheckpointError(f"{path}: incomplete checkpoint: {problem}")
    return body


def _verified(path: Path, data: bytes) -> bytes:
    """The payload, once its SHA-256 matches. A file without the trailer (written before
    checksums) is passed on unverified: decoding and the schema check still apply."""
    if not data.endswith(TRAILER):
        return data
    payload = data[: -len(TRAILER) - _DIGEST]
    digest = data[-len(TRAILER) - _DIGEST: -len(TRAILER)]
    if len(data) < len(TRAILER) + _DIGEST or hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path}: checksum mismatch: the file is damaged")
    return payload


def _schema_problem(body: dict[str, Any]) -> str | None:
    """What a resume would trip over, in a few words; None when the body is complete."""
    for key, types in _FIELDS.items():
        if key not in body:
            return f"missing field {key!r}"
        if not isinstance(body[key], types) or isinstance(body[key], bool):
            return f"field {key!r} is {type(body[key]).__name__}"
    try:
        _run_state(body)
        json.loads(body["rng"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"run state does not fit this build ({type(exc).__name__}: {exc})"
    return None


def _run_state(body: dict[str, Any]) -> RunState:
    raw = dict(body["run_state"])
    counters = Counters(**raw.pop("counters"))
    raw.pop("history", None)
    raw.pop("seen_requests", None)
    history = [RoundRecord.from_plain(r) for r in body["history"]]
    if history and "warm_pool" not in body["history"][-1]:
        # Written before the records kept the simulated cloud's warm pool: as warm as the
        # most actors a round ran (the next round's cold starts read the last record's pool).
        history[-1].warm_pool = max(r.actors for r in history)
    return RunState(
        **raw,
        counters=counters,
        history=history,
        seen_requests=set(body.get("seen_requests", [])),
    )


def restore(body: dict[str, Any], roles: Roles) -> Restored:
    """Put a checkpoint's plugin state back into freshly built roles (before the first
    round); return the run's own state for the engine to continue from."""
    state = _run_state(body)
    roles.learner.load_state(body["learner"])
    for bound, key in ((roles.scaler, "scaler"), (roles.cost, "cost"), (roles.actors, "actors")):
        if body.get(key) is not None:
            bound.load_state(body[key])
    for slot in roles.probes:
        saved = body.get("probes", {}).get(slot.name)
        if saved is not None:
            slot.probe.load_state(saved)
    rounds = body.get("rounds")
    return Restored(state=state, rng_state=json.loads(body["rng"]),
                    wall_s=float(body.get("wall_s", 0.0)),
                    rounds=rounds if isinstance(rounds, dict) else None)


def find(run_dir: Path) -> dict[str, Any]:
    """The newest readable checkpoint of ``run_dir``; a ``PlanError`` naming what is missing.

    A damaged newest checkpoint (checksum, decoding, missing fields) is skipped with a
    warning for the previous good one; one written by another format is refused."""
    run_dir = Path(run_dir)
    if not (run_dir / "plan.toml").exists():
        raise PlanError(str(run_dir), "a run directory with plan.toml", note="--resume")
    files = sorted((run_dir / "checkpoints").glob(f"ckpt-*{SUFFIX}"), reverse=True)
    if not files:
        raise PlanError(str(run_dir), "a run directory with a checkpoint",
                        note="no checkpoints/ckpt-*.nitro: enable [checkpoint]")
    first: CheckpointError | None = None
    for path in files:
        try:
            body = read(path)
        except CheckpointError as exc:
            if not exc.damaged:
                raise PlanError("--resume", "a readable checkpoint", note=str(exc)) from None
            first = first or exc
            continue
        if first is not None:
            # Said once, when there is something to fall back to; a run with no good
            # checkpoint gets only the one-line refusal below.
            log.warning("checkpoint_damaged_fallback", path=str(path),
                        round=body["run_state"]["round"], skipped=str(first))
        return body
    assert first is not None
    raise PlanError("--resume", "a readable checkpoint", note=str(first)) from None
