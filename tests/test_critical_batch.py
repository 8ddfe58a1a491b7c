"""The critical-batch scaler: N = sqrt(B_noise c_round / c_sample) / samples per actor."""

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


def record(round_: int, g2: float | None, trace: float | None, *, actors: int = 2,
           per_actor: int = 512) -> RoundRecord:
    probes = {} if g2 is None else {"grad_norm_sq": g2, "trace_sigma": trace}
    return RoundRecord(round=round_, actors=actors, env_steps=actors * per_actor,
                       batches=actors, round_s=1.0, learner_s=0.5, probe_s=0.1,
                       actor_durations_ms=[100.0] * actors, cold_starts=0, eval_return=None,
                       episode_return_mean=None, probes=probes)


def decide(s: CriticalBatchScaler, history: list[RoundRecord], round_usd, current: int = 2,
           affordable: int | None = None) -> int:
    return s.decide(ScaleContext(round=history[-1].round, current=current, n_min=1, n_max=64,
                                 history=history, budget_left_usd=None,
                                 cost_per_actor_usd=None, rng=np.random.default_rng(0),
                                 affordable=affordable, round_usd=round_usd))


def linear(fixed: float, per_actor: float):
    return lambda n: fixed + per_actor * n


def test_the_size_follows_the_noise_scale_and_the_prices() -> None:
    # B_noise = 8192 / 2 = 4096 samples; c_round = 1e-4, c_sample = 1e-6 / 512:
    # B* = sqrt(4096 * 1e-4 * 512 / 1e-6) = sqrt(2.097e8) = 14,482 samples = 28.28 actors.
    s = scaler()
    history = [record(1, 2.0, 8192.0)]
    assert decide(s, history, linear(1e-4, 1e-6)) == 28
    assert math.isclose(s.last_detail["b_noise"], 4096.0)
    assert math.isclose(s.last_detail["b_star"], math.sqrt(4096 * 1e-4 * 512 / 1e-6))
    # Rounds four times dearer against samples: twice the batch (clipped to N_max = 64 here).
    assert decide(scaler(), history, linear(4e-4, 1e-6)) == 57
    # A GPU-priced learner makes the round's fixed part dear: boost to the limit.
    assert decide(scaler(), history, linear(1e-2, 1e-6)) == 64
    # A learner whose time grows with the batch makes samples dear: few actors.
    assert decide(scaler(), history, linear(1e-6, 1e-4)) == 1


def test_the_budget_allocator_caps_the_wish() -> None:
    assert decide(scaler(), [record(1, 2.0, 8192.0)], linear(1e-4, 1e-6), affordable=5) == 5


def test_the_two_parts_are_smoothed_apart_and_gaps_keep_n() -> None:
    s = scaler(smoothing=0.5)
    prices = linear(1e-4, 1e-6)
    decide(s, [record(1, 2.0, 8192.0)], prices)
    # Second measurement: EMAs 0.5 * 2 + 0.5 * 6 = 4 and 0.5 * 8192 + 0.5 * 8192 = 8192.
    n = decide(s, [record(1, 2.0, 8192.0), record(2, 6.0, 8192.0)], prices)
    assert math.isclose(s.last_detail["b_noise"], 2048.0)
    assert n == round(math.sqrt(2048 * 1e-4 * 512 / 1e-6) / 512)
    # A round without a measurement still answers from the averages so far ...
    assert decide(s, [record(3, None, None)], prices, current=7) == n
    # ... and with none yet (no probe, NaN, a non-positive |G|^2) the current N is kept.
    fresh = scaler()
    assert decide(fresh, [record(1, float("nan"), 1.0)], prices, current=7) == 7
    assert decide(fresh, [record(1, -1.0, 1.0)], prices, current=3) == 3


def test_its_state_survives_a_checkpoint() -> None:
    s = scaler()
    decide(s, [record(1, 2.0, 8192.0)], linear(1e-4, 1e-6))
    again = scaler()
    again.load_state(s.state())
    assert decide(again, [record(2, None, None)], linear(1e-4, 1e-6)) == \
        decide(s, [record(2, None, None)], linear(1e-4, 1e-6))
