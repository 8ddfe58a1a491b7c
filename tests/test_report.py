"""``nitro report``: run directories in, figures and a summary table out."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from plugins.experiments.cli import register
from plugins.experiments.report import load_run, report, summary_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path: Path, *, name: str, scaler: str, seed: int, rounds: int = 6,
              simulate: bool = False, partial_tail: bool = False) -> Path:
    """A run directory as the engine leaves it (events.jsonl, plan.toml, summary.json)."""
    path.mkdir(parents=True)
    t0 = 1_000.0
    lines: list[dict[str, Any]] = [{"event": "RunStarted", "ts": t0, "run_id": f"{name}-x",
                                    "name": name, "run_dir": str(path)}]
    cost = 0.0
    for r in range(1, rounds + 1):
        actors = 4 if r <= 2 else 1
        round_usd = 0.001 * actors
        cost += round_usd
        lines += [
            {"event": "RoundStarted", "ts": t0 + r, "round": r, "actors": actors, "version": r},
            {"event": "CostCharged", "ts": t0 + r + 0.5, "round": r, "items": {},
             "round_usd": round_usd, "total_usd": cost},
            {"event": "ScaleDecided", "ts": t0 + r + 0.5, "round": r, "previous": actors,
             "actors": 4 if r < 2 else 1, "scaler": scaler,
             "detail": {"score": 1.0 if r < 2 else 0.1}},
            {"event": "RoundFinished", "ts": t0 + r + 0.6, "round": r, "actors": actors,
             "env_steps": 512 * r, "eval_return": 50.0 * r if r % 2 == 0 else None,
             "cost_usd": cost, "sim_time_s": 0.25 * r, "wall_s": 0.0},
        ]
    lines.append({"event": "RunStopped", "ts": t0 + rounds + 1, "reason": "max_rounds",
                  "rounds": rounds, "env_steps": 512 * rounds, "wall_s": rounds + 1.0})
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if partial_tail:
        text += '{"event": "RoundFini'
    (path / "events.jsonl").write_text(text)
    (path / "plan.toml").write_text(
        f'[run]\nname = "{name}"\nseed = {seed}\n\n[scaler]\nname = "{scaler}"\n\n'
        f"[actors]\nsimulate = {'true' if simulate else 'false'}\n"
    )
    (path / "summary.json").write_text(json.dumps({
        "name": name, "stop_reason": "max_rounds", "rounds": rounds, "env_steps": 512 * rounds,
        "best_eval_return": 50.0 * (rounds - rounds % 2), "final_eval_return": 300.0,
        "cost_usd": cost, "wall_s": rounds + 1.0,
    }))
    return path


def test_load_run_reads_series_and_wall_time(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "a", name="cp", scaler="nitro", seed=3,
                             partial_tail=True))
    assert run.rounds == [1, 2, 3, 4, 5, 6]
    assert run.env_steps[-1] == 3072
    assert run.wall_s[0] == pytest.approx(1.6)  # from RunStarted's ts, not RoundFinished.wall_s
    assert run.eval_return[:2] == [None, 100.0]
    assert run.score[0] == 1.0 and run.round_cost_usd[0] == pytest.approx(0.004)
    assert run.points(run.env_steps) == ([1024, 2048, 3072], [100.0, 200.0, 300.0])


def test_resumed_run_keeps_the_newest_rounds(tmp_path: Path) -> None:
    path = write_run(tmp_path / "a", name="cp", scaler="fixed", seed=1, rounds=4)
    with (path / "events.jsonl").open("a") as f:  # resumed from round 2's checkpoint
        for r in (3, 4, 5):
            f.write(json.dumps({"event": "RoundFinished", "ts": 2_000.0 + r, "round": r,
                                "actors": 2, "env_steps": 512 * r, "eval_return": None,
                                "cost_usd": 0.1, "sim_time_s": 1.0}) + "\n")
    run = load_run(path)
    assert run.rounds == [1, 2, 3, 4, 5]
    assert run.actors == [4, 4, 2, 2, 2]


def test_report_overlays_runs_and_writes_every_figure(tmp_path: Path) -> None:
    dirs = [write_run(tmp_path / "nitro", name="cartpole", scaler="nitro", seed=1,
                      simulate=True),
            write_run(tmp_path / "fixed", name="cartpole", scaler="fixed", seed=1),
            write_run(tmp_path / "fixed2", name="cartpole", scaler="fixed", seed=1)]
    figures, table = report(dirs, tmp_path / "out")
    names = sorted(p.name for p in figures)
    # One simulated run puts every run on the simulated-time axis.
    assert names == ["actors_per_round.png", "cost_per_round.png", "return_vs_cost.png",
                     "return_vs_env_steps.png", "return_vs_sim_time.png"]
    for path in figures:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
    lines = table.splitlines()
    assert lines[0].split() == ["run", "rounds", "env", "steps", "best", "eval", "final",
                                "eval", "cost", "$", "wall", "s", "stop"]
    assert "cartpole (nitro, seed 1)" in lines[2] and "3,072" in lines[2]
    # Identical labels are told apart by the directory name.
    assert "cartpole (fixed, seed 1) [fixed]" in table
    assert "cartpole (fixed, seed 1) [fixed2]" in table


def test_summary_table_without_summary_json(tmp_path: Path) -> None:
    path = write_run(tmp_path / "a", name="cp", scaler="fixed", seed=2)
    (path / "summary.json").unlink()
    run = load_run(path)
    run.label = "cp"
    row = summary_table([run]).splitlines()[2].split()
    assert row == ["cp", "6", "3,072", "300.0", "300.0", "0.0120", "6.6", "(no", "summary)"]


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="nitro")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return int(args.handler(args))


def test_command_defaults_to_the_run_directory(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_run(tmp_path / "a", name="cp", scaler="fixed", seed=2)
    assert cli("report", str(path)) == 0
    out = capsys.readouterr().out
    assert "cp (fixed, seed 2)" in out and "wrote " in out
    assert (path / "report" / "return_vs_wall_time.png").is_file()


def test_command_names_a_directory_that_is_not_a_run(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("report", str(tmp_path), "--out", str(tmp_path / "o")) == 2
    assert f"{tmp_path}: no events.jsonl" in capsys.readouterr().err


def test_runs_without_evaluation_draw_no_return_figures(tmp_path: Path) -> None:
    path = write_run(tmp_path / "a", name="cp", scaler="fixed", seed=1)
    lines = (path / "events.jsonl").read_text().splitlines()
    no_eval = [json.loads(line) | ({"eval_return": None} if "eval_return" in line else {})
               for line in lines]
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in no_eval))
    figures, _ = report([path], tmp_path / "out")
    assert sorted(p.name for p in figures) == ["actors_per_round.png", "cost_per_round.png"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "actors_per_round.png", "cost_per_round.png"]


def _drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Figures as they are saved (axes, lines and labels), before they are closed."""
    import plugins.experiments.report as rep

    figures: list[Any] = []
    save = rep._save

    def keep(fig: Any, path: Path, legend_ax: Any = None, handles: Any = None) -> Path:
        figures.append({"path": path.name, "axes": [
            {"xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
             "x": [list(line.get_xdata()) for line in ax.get_lines()]} for ax in fig.axes]})
        return save(fig, path, legend_ax, handles)

    monkeypatch.setattr(rep, "_save", keep)
    return figures


def test_actors_and_scores_end_at_the_last_round(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _drawn(monkeypatch)
    report([write_run(tmp_path / "a", name="cp", scaler="nitro", seed=1, rounds=6)],
           tmp_path / "out")
    (actors,) = [f for f in figures if f["path"] == "actors_per_round.png"]
    for ax in actors["axes"]:
        assert max(max(x) for x in ax["x"]) == 6


def test_cost_axes_share_one_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _drawn(monkeypatch)
    report([write_run(tmp_path / "a", name="cp", scaler="nitro", seed=1)], tmp_path / "out")
    labels = {f["path"]: f["axes"][0] for f in figures}
    assert labels["return_vs_cost.png"]["xlabel"] == "cumulative cost (US cents)"
    assert labels["cost_per_round.png"]["ylabel"] == "cost of the round (US cents)"
    # Cents on the axis: the run's total of $0.012 is drawn at 1.2, not 0.012.
    assert max(labels["return_vs_cost.png"]["x"][0]) == pytest.approx(1.2)


def test_colours_do_not_repeat_for_many_runs() -> None:
    from plugins.experiments.report import run_colors

    for n in (3, 10, 11, 20, 35):
        colours = [str(c) for c in run_colors(n)]
        assert len(set(colours)) == n, n
