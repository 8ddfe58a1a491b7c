"""The critical-batch scaler: N = sqrt(B_noise c_round / c_sample) / samples per actor, with
the prices split from what rounds of different sizes were charged."""

from __future__ import annotations

import math

import numpy as np

from kernel.roles import PluginContext, RoundRecord, ScaleContext
from plugins.scalers import CriticalBatchScaler

PLAN = {"actors": {"count": 2, "min": 1, "max": 64}}


def scaler(smoothing: float = 0.5) -> CriticalBatchScaler:
    return CriticalBatchScaler(PluginContext(
        name="critical_batch", config={"name": "critical_batch", "smoothing": smoothing},
        plan=PLAN, run_id="t", run_dir=None, seed=0, bus=None))


def record(round_: int, actors: int, cost: float, g2: float | None = 2.0,
           trace: float | None = 8192.0, per_actor: int = 512) -> RoundRecord:
    probes = {} if g2 is None else {"grad_norm_sq": g2, "trace_sigma": trace}
    return RoundRecord(round=round_, actors=actors, env_steps=actors * per_actor,
                       batches=actors, round_s=1.0, learner_s=0.5, probe_s=0.1,
                       actor_durations_ms=[100.0] * actors, cold_starts=0, eval_return=None,
                       episode_return_mean=None, probes=probes, cost_usd=cost)


def decide(s: CriticalBatchScaler, history: list[RoundRecord], current: int = 2,
           affordable: int | None = None) -> int:
    return s.decide(ScaleContext(round=history[-1].round, current=current, n_min=1, n_max=64,
                                 history=history, budget_left_usd=None,
                                 cost_per_actor_usd=None, rng=np.random.default_rng(0),
                                 affordable=affordable))


def priced(fixed: float, per_actor: float, sizes: tuple[int, ...] = (2, 3)
           ) -> list[RoundRecord]:
    return [record(i + 1, n, fixed + per_actor * n) for i, n in enumerate(sizes)]


def test_the_size_follows_the_noise_scale_and_the_prices() -> None:
    # B_noise = 8192 / 2 = 4096 samples; c_round = 1e-4, c_sample = 1e-6 / 512:
    # B* = sqrt(4096 * 1e-4 * 512 / 1e-6) = 14,482 samples = 28.28 actors of 512.
    s = scaler()
    assert decide(s, priced(1e-4, 1e-6)) == 28
    assert math.isclose(s.last_detail["b_noise"], 4096.0)
    assert math.isclose(s.last_detail["c_round_usd"], 1e-4, rel_tol=1e-6)
    assert math.isclose(s.last_detail["b_star"], math.sqrt(4096 * 1e-4 * 512 / 1e-6),
                        rel_tol=1e-6)
    # Rounds four times dearer against samples: twice the batch.
    assert decide(scaler(), priced(4e-4, 1e-6)) == 57
    # An expensive learner instance makes the round's fixed part dear: boost to the limit.
    assert decide(scaler(), priced(1e-2, 1e-6)) == 64
    # Samples dear against rounds (a learner whose time grows with the batch): few actors.
    assert decide(scaler(), priced(1e-6, 1e-4)) == 1


def test_one_size_alone_cannot_split_the_price_so_it_explores_once() -> None:
    s = scaler()
    same = [record(1, 2, 1e-4 + 2e-6), record(2, 2, 1e-4 + 2e-6)]
    assert decide(s, same, current=2) == 3
    assert s.last_detail["exploring"] == 1.0
    assert decide(scaler(), same[:1] * 1, current=64) == 63


def test_the_budget_allocator_caps_the_wish() -> None:
    assert decide(scaler(), priced(1e-4, 1e-6), affordable=5) == 5


def test_the_two_parts_are_smoothed_apart_and_gaps_keep_n() -> None:
    s = scaler(smoothing=0.5)
    history = priced(1e-4, 1e-6)
    history[0].probes = {"grad_norm_sq": 2.0, "trace_sigma": 8192.0}
    decide(s, history[:1] + [record(2, 3, 1e-4 + 3e-6, g2=2.0)])
    # Second measurement: EMAs 0.5 * 2 + 0.5 * 6 = 4 and 8192: B_noise = 2048.
    n = decide(s, history[:1] + [record(2, 3, 1e-4 + 3e-6, g2=6.0)])
    assert math.isclose(s.last_detail["b_noise"], 2048.0)
    assert n == round(math.sqrt(2048 * 1e-4 * 512 / 1e-6) / 512)
    # A round without a measurement still answers from the averages so far ...
    assert decide(s, history[:1] + [record(3, 3, 1e-4 + 3e-6, g2=None)], current=7) == n
    # ... and with none yet (no probe, NaN, a non-positive |G|^2) the current N is kept.
    assert decide(scaler(), [record(1, 2, 1e-4, g2=float("nan"))], current=7) == 7
    assert decide(scaler(), [record(1, 2, 1e-4, g2=-1.0)], current=3) == 3


def test_its_state_survives_a_checkpoint() -> None:
    s = scaler()
    decide(s, priced(1e-4, 1e-6))
    again = scaler()
    again.load_state(s.state())
    later = priced(1e-4, 1e-6) + [record(3, 3, 1e-4 + 3e-6, g2=None)]
    assert decide(again, later) == decide(s, later)
