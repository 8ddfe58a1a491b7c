"""The ``aws`` cost model and the simulated cloud clock, against hand-computed values."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.roles import PluginContext, Receipt, RoundRecord
from plugins.actors_local import LocalBackend
from plugins.cost_aws import GB_S_USD, PRICES_READ, REQUEST_USD, AwsCost

X86, ARM = 0.0000166667, 0.0000133334


def cost_model(plan_actors: dict[str, Any] | None = None, **config: Any) -> AwsCost:
    plan = {"actors": {"memory_mb": 1024, "sim_cold_start_s": 1.0, **(plan_actors or {})}}
    return AwsCost(PluginContext(name="aws", config={"name": "aws", **config}, plan=plan,
                                 run_id="t", run_dir=None, seed=0, bus=None))


def receipt(i: int, ms: float, ok: bool = True) -> Receipt:
    return Receipt(request_id=f"r{i}", ok=ok, duration_ms=ms if ok else 0.0)


def record(durations: list[float], *, actors: int | None = None, sim_time_s: float = 0.0,
           learner_s: float = 0.0, probe_s: float = 0.0) -> RoundRecord:
    return RoundRecord(round=1, actors=actors or len(durations), env_steps=0,
                       batches=len(durations), round_s=0.0, learner_s=learner_s,
                       probe_s=probe_s, actor_durations_ms=durations, cold_starts=0,
                       eval_return=None, episode_return_mean=None, probes={},
                       sim_time_s=sim_time_s)


class StubTransport:
    def public_spec(self) -> dict[str, str]:
        return {"kind": "inline"}


def local_backend(**config: Any) -> LocalBackend:
    cfg = {"workers": 1, "deadline_s": 60.0, "sim_invoke_latency_s": 0.03,
           "sim_cold_start_s": 1.0, "simulate": True, **config}
    return LocalBackend(PluginContext(name="local", config=cfg, plan={}, run_id="t",
                                      run_dir=None, seed=0, bus=None,
                                      transport=StubTransport()))


def test_default_prices_are_the_dated_us_east_1_list() -> None:
    assert GB_S_USD == {"x86_64": X86, "arm64": ARM}
    assert REQUEST_USD == pytest.approx(0.20e-6)
    assert PRICES_READ


@pytest.mark.parametrize(("arch", "price"), [("x86_64", X86), ("arm64", ARM)])
def test_lambda_invocation_bills_gb_seconds_rounded_up_to_1_ms(arch: str, price: float) -> None:
    model = cost_model(architecture=arch)
    # 100.2 ms is billed as 101 ms; 1 GB of memory.
    assert model.actor_usd(100.2) == pytest.approx(0.101 * 1.0 * price + 0.2e-6, rel=1e-12)
    assert model.actor_usd(100.0) == pytest.approx(0.100 * price + 0.2e-6, rel=1e-12)
    big = cost_model({"memory_mb": 3072}, architecture=arch)
    assert big.actor_usd(1000.0) == pytest.approx(3.0 * price + 0.2e-6, rel=1e-12)


def test_simulated_round_time_and_cost_by_hand() -> None:
    backend = local_backend()
    model = cost_model({"simulate": True}, learner_usd_per_hour=0.36)
    # Round 1: three actors into an empty warm pool: latency + slowest + one cold start.
    r1 = [receipt(0, 100.0), receipt(1, 250.0), receipt(2, 80.4)]
    actor_s = backend.simulated_actor_s(r1)
    assert actor_s == pytest.approx(0.03 + 0.250 + 1.0)
    rec = record([100.0, 250.0, 80.4], learner_s=0.5, probe_s=0.22)
    rec.sim_time_s = actor_s + rec.learner_s + rec.probe_s  # what the coordinator does
    items = model.charge(rec, r1)
    gb_s = (0.100 + 0.250 + 0.081) * 1.0
    assert items["actors_usd"] == pytest.approx(gb_s * X86 + 3 * 0.2e-6, rel=1e-12)
    # The learner bills the round's simulated time, probe time included: 2.0 s at $0.36/h.
    assert rec.sim_time_s == pytest.approx(2.0)
    assert items["learner_usd"] == pytest.approx(2.0 / 3600 * 0.36, rel=1e-12)
    # Three simulated cold starts, each an init phase of 1 s billed at 1 GB (Lambda bills init).
    assert items["cold_start_usd"] == pytest.approx(3 * 1.0 * X86, rel=1e-12)

    # Round 2: two actors, both warm; a failed invocation still pays its request.
    r2 = [receipt(0, 40.0), receipt(1, 0.0, ok=False)]
    assert backend.simulated_actor_s(r2) == pytest.approx(0.03 + 0.040)
    items = model.charge(record([40.0], actors=2, sim_time_s=1.0), r2)
    assert items["actors_usd"] == pytest.approx(0.040 * X86 + 2 * 0.2e-6, rel=1e-12)
    assert items["cold_start_usd"] == 0.0
    # Round 3: four actors, one beyond the warm pool of three: a cold start again.
    r3 = [receipt(i, 10.0 * (i + 1)) for i in range(4)]
    assert backend.simulated_actor_s(r3) == pytest.approx(0.03 + 0.040 + 1.0)
    items = model.charge(record([10.0, 20.0, 30.0, 40.0], sim_time_s=1.5), r3)
    assert items["cold_start_usd"] == pytest.approx(1 * 1.0 * X86, rel=1e-12)
    # No actor came back: only the invoke latency.
    assert backend.simulated_actor_s([receipt(0, 0.0, ok=False)]) == pytest.approx(0.03)


def test_serverful_vms_bill_hours_and_start_up_when_the_count_grows() -> None:
    model = cost_model(actors_kind="vm", vm_usd_per_hour=0.36, vm_startup_s=30.0,
                       actors_per_vm=4, learner_usd_per_hour=0.18)
    # 6 actors: 2 new VMs, billed 10 s of round + 30 s of start-up each; the start-up delays
    # the round, so the learner waits (and pays) 40 s.
    rec = record([1.0] * 6, sim_time_s=10.0)
    items = model.charge(rec, [receipt(i, 1.0) for i in range(6)])
    assert items["actors_usd"] == pytest.approx((2 * 10 + 2 * 30) / 3600 * 0.36)
    assert rec.sim_time_s == pytest.approx(40.0)
    assert items["learner_usd"] == pytest.approx(40 / 3600 * 0.18)
    # 5 actors: still 2 VMs, nothing starts.
    rec = record([1.0] * 5, sim_time_s=10.0)
    assert model.charge(rec, [])["actors_usd"] == pytest.approx(20 / 3600 * 0.36)
    assert rec.sim_time_s == 10.0
    # 9 actors: 3 VMs, one new.
    rec = record([1.0] * 9, sim_time_s=10.0)
    assert model.charge(rec, [])["actors_usd"] == pytest.approx((30 + 30) / 3600 * 0.36)


def test_estimates_are_pessimistic_by_hand() -> None:
    model = cost_model(learner_usd_per_hour=0.36, estimate_margin=1.5)
    rec = record([100.0, 200.0], sim_time_s=2.0, learner_s=0.5)
    actual = sum(model.charge(rec, [receipt(0, 100.0), receipt(1, 200.0)]).values())
    assert model.estimate_actor_usd(rec) == pytest.approx(model.actor_usd(150.0))
    # The same round again: the slowest bill for each actor, the same time, times 1.5.
    same = model.estimate_round_usd(rec, 2)
    assert same == pytest.approx(1.5 * (2 * model.actor_usd(200.0) + 2.0 / 3600 * 0.36))
    assert same >= actual
    # Four actors: learner time grows by 0.25 s per extra actor, and four exceed any count
    # seen so far (a cold start of 1 s).
    four = model.estimate_round_usd(rec, 4)
    assert four == pytest.approx(1.5 * (4 * model.actor_usd(200.0) + 3.5 / 3600 * 0.36))
    # A fast round does not make the next estimate optimistic: the recent worst case holds.
    fast = record([10.0, 10.0], sim_time_s=0.5, learner_s=0.1)
    model.charge(fast, [receipt(0, 10.0), receipt(1, 10.0)])
    assert model.estimate_round_usd(fast, 2) == pytest.approx(same)
    assert model.estimate_actor_usd(record([])) is None
