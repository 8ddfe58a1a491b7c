"""Damaged checkpoints: refused in one line, detected by checksum, skipped for the previous
good one; and a written checkpoint's rename is made durable."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from kernel import checkpoint, codec
from kernel.engine import Engine
from tests.conftest import ROOT, run_cli

CARTPOLE = str(ROOT / "plans" / "cartpole.toml")
SETS = {"stop.max_rounds": 2, "probes": [], "sinks": [], "actors.steps": 32,
        "checkpoint.every": 1, "checkpoint.keep": 3}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-round run with a checkpoint after each round (copied by each test)."""
    out = tmp_path_factory.mktemp("ckpt") / "run"
    asyncio.run(Engine.from_plan(CARTPOLE, SETS, out_dir=out).run())
    assert len(list((out / "checkpoints").glob("ckpt-*.nitro"))) == 2
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _rewrite(path: Path, body: dict) -> None:
    """Write ``body`` as a checkpoint with a valid checksum (the damage is in the fields)."""
    payload = codec.encode("checkpoint", body)
    import hashlib

    path.write_bytes(payload + hashlib.sha256(payload).digest() + checkpoint.TRAILER)


@pytest.mark.parametrize("damage", ["no_counters", "no_learner", "history_field", "rng"])
def test_missing_fields_are_refused_in_one_line(finished_run: Path, tmp_path: Path,
                                                damage: str) -> None:
    out = _copy(finished_run, tmp_path)
    for path in (out / "checkpoints").glob("ckpt-*.nitro"):
        body = dict(checkpoint.read(path))
        if damage == "no_counters":
            body["run_state"] = {k: v for k, v in body["run_state"].items() if k != "counters"}
        elif damage == "no_learner":
            del body["learner"]
        elif damage == "history_field":
            body["history"] = [{"round": 1}]
        else:
            body["rng"] = "{not json"
        _rewrite(path, body)
        with pytest.raises(checkpoint.CheckpointError, match="incomplete checkpoint"):
            checkpoint.read(path)
    result = run_cli("run", "--resume", str(out), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "incomplete checkpoint" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_flipped_bit_is_detected(finished_run: Path, tmp_path: Path) -> None:
    out = _copy(finished_run, tmp_path)
    path = checkpoint.latest(out)
    assert path is not None
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the model's weights: msgpack still decodes
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="checksum mismatch"):
        checkpoint.read(path)


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
        finished_run: Path, tmp_path: Path) -> None:
    out = _copy(finished_run, tmp_path)
    newest = checkpoint.latest(out)
    assert newest is not None and newest.name == "ckpt-000002.nitro"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    body = checkpoint.find(out)
    assert body["run_state"]["round"] == 1
    result = run_cli("run", "--resume", str(out), "--set", "stop.max_rounds=3", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "checkpoint_damaged_fallback" in output and "checksum mismatch" in output
    assert "Traceback" not in result.stderr
    # Every checkpoint damaged: a one-line refusal naming the newest one's problem.
    for path in (out / "checkpoints").glob("ckpt-*.nitro"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    result = run_cli("run", "--resume", str(out), timeout=120)
    assert result.returncode == 2 and "checksum mismatch" in result.stderr
    assert "Traceback" not in result.stderr


def test_another_format_is_refused_not_skipped(finished_run: Path, tmp_path: Path) -> None:
    """A newer Nitro's checkpoint is not damage: falling back would silently lose rounds."""
    out = _copy(finished_run, tmp_path)
    newest = checkpoint.latest(out)
    assert newest is not None
    body = dict(checkpoint.read(newest))
    body["format"] = 99
    _rewrite(newest, body)
    result = run_cli("run", "--resume", str(out), timeout=120)
    assert result.returncode == 2 and "format 99" in result.stderr


def test_the_rename_is_made_durable(finished_run: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After the atomic rename, the directory itself is fsynced (else a power cut may lose
    the new entry while the old file is already gone)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    out = tmp_path / "run"
    asyncio.run(Engine.from_plan(CARTPOLE, {**SETS, "stop.max_rounds": 1}, out_dir=out).run())
    folder = str((out / "checkpoints").resolve())
    assert folder in synced, synced
    last_file = max(i for i, p in enumerate(synced) if p.endswith(".tmp"))
    assert synced.index(folder, last_file) > last_file  # the directory, after the file
