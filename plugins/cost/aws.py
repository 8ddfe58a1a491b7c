"""The ``aws`` cost model: what a round costs on AWS Lambda (or actor VMs), a learner instance
and, with the Redis transport, an ElastiCache node. Items and prices: ``docs/scalers.md``.

Every invocation AWS bills is charged: a successful one for its billed duration (GB-s), its
request and its init phase; a function error or timeout for the time it ran; one the caller
cancelled for the time up to the function timeout, because on AWS it keeps running after the
caller gives up and only the elapsed time is known here. The learner instance and the Redis
node bill the round's time per hour (``RoundRecord.sim_time_s``, from which the coordinator
leaves evaluation out). Evaluation time (``RoundRecord.eval_s``) is measured but not charged:
runs with more rounds would otherwise pay for more evaluations. The Hessian
probe's time is its own item, ``probe_usd``.

``estimate_round_usd`` is the one estimate the budget allocator uses, for the stop rule and
for the largest affordable actor count alike, so it must never be below what the round will
be charged yet tight enough for the last rounds to shrink N and spend the budget. It is an
upper envelope of the recent rounds: the highest per-actor bill times N, plus the round's
charged time as a straight line in N (learner time grows with the batch on a CPU) fitted on
recent rounds and raised by its largest residual, all times ``estimate_margin``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from kernel.roles import PluginContext, Receipt, RoundRecord
from plugins.cost.time_model import TimeModel
from plugins.descriptors.aws_lambda import LAMBDA_CONFIG

#: When the default prices below were read (aws.amazon.com/lambda/pricing, /ec2/pricing/on-demand,
#: /elasticache/pricing; us-east-1, on-demand, Linux).
log = structlog.get_logger("plugins.cost.aws")

PRICES_READ = "2026-11"
GB_S_USD = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
REQUEST_USD = 0.20 / 1_000_000
#: Learner instance presets, $/h: a 2-vCPU CPU instance (c7i.large) and the paper's GPU
#: instance (p3.2xlarge, one V100).
LEARNER_USD_PER_H = {"cpu": 0.08925, "gpu": 3.06}
#: The smallest ElastiCache node (cache.t4g.micro), $/h.
REDIS_USD_PER_HOUR = 0.016
#: Function memory billed when neither ``cost.memory_mb`` nor the actors backend names one (a
#: backend without that key): what the ``lambda`` backend deploys by default.
DEFAULT_MEMORY_MB = LAMBDA_CONFIG["memory_mb"].default

#: Failure reasons of calls that never started a function: AWS bills nothing for a throttled
#: or rejected request, but the engine cannot always tell, so these pay the request only.
NEVER_RAN = ("throttl", "connect", "credentials", "weights_gone", "service_error",
             "ResourceNotFound", "AccessDenied", "InvalidParameter", "InvalidRequestContent",
             "RequestTooLarge")


def learner_usd_per_h(cfg: dict[str, Any]) -> float:
    """The learner's price: ``learner_usd_per_h`` where given (a price is the plan's own
    choice, so it needs no preset named beside it), else the ``learner`` preset (``cpu``
    unset). A preset and a price both given disagree unless the preset is ``custom``."""
    preset, price = cfg["learner"], cfg["learner_usd_per_h"]
    if preset in (None, "custom") and price is not None:
        return float(price)
    if preset == "custom":
        raise ValueError("learner = 'custom' needs cost.learner_usd_per_h")
    if price is not None:
        raise ValueError(f"cost.learner_usd_per_h = {price} and learner = {preset!r}, which has "
                         "its own price: give one of them")
    return LEARNER_USD_PER_H[preset or "cpu"]


def validate(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan-time check: a learner price that the preset and the explicit key agree on, and a
    time model with all its constants."""
    learner_usd_per_h(section)
    TimeModel.from_config(section)


class RoundTimes:
    """Recent rounds' charged time against their actor count, and an upper envelope of it.

    With two or more distinct counts, a least-squares line (slope at least 0: more actors never
    make a round shorter) raised by its largest residual, so it lies on or above every recent
    round; with one count, that round's longest time, grown in proportion when N is larger
    (a line through the origin is the steepest a non-negative intercept allows). Below the
    smallest recent count the envelope stays at its value there: a line fitted on big rounds
    says nothing of a small round's fixed costs (the learner's per-update overhead), and a
    smaller round is never slower, so that value bounds it."""

    def __init__(self, keep: int):
        self.points: deque[tuple[int, float]] = deque(maxlen=keep)

    def add(self, actors: int, seconds: float) -> None:
        self.points.append((max(1, int(actors)), max(0.0, float(seconds))))

    def upper(self, actors: int) -> float:
        if not self.points:
            return 0.0
        n = np.array([p[0] for p in self.points], dtype=np.float64)
        y = np.array([p[1] for p in self.points], dtype=np.float64)
        if np.ptp(n) == 0:
            return float(y.max()) * max(1.0, actors / n[0])
        slope, intercept = np.polyfit(n, y, 1)
        if slope < 0:
            slope, intercept = 0.0, float(y.mean())
        residual = float(np.max(y - (intercept + slope * n)))
        at = max(float(actors), float(n.min()))
        return max(0.0, float(intercept + slope * at) + max(0.0, residual))


@dataclass(slots=True)
class _Bill:
    """One invocation's billed parts: duration (ms, init included), requests."""

    ms: float
    requests: int


class AwsCost:
    def __init__(self, ctx: PluginContext):
        cfg = ctx.config
        actors = ctx.plan["actors"]
        self.gb_s_usd = float(cfg["gb_s_usd"] or GB_S_USD[cfg["architecture"]])
        self.request_usd = float(cfg["request_usd"])
        self.learner_usd_per_h = learner_usd_per_h(cfg)
        transport = ctx.plan["transport"]["kind"]
        self.redis_usd_per_hour = float(cfg["redis_usd_per_hour"]) if transport == "redis" \
            else 0.0
        # memory_mb, timeout_s, simulate and sim_cold_start_s are the actors backend's keys (a
        # backend may have none of them); the rest of the section is the kernel's.
        self.memory_gb = float(cfg["memory_mb"] or actors.get("memory_mb")
                               or DEFAULT_MEMORY_MB) / 1024
        self.function_timeout_s = float(cfg["function_timeout_s"] or actors.get("timeout_s")
                                        or actors["deadline_s"])
        self.kind = str(cfg["actors_kind"])
        self.vm_usd_per_hour = float(cfg["vm_usd_per_hour"])
        self.vm_startup_s = float(cfg["vm_startup_s"])
        self.actors_per_vm = int(cfg["actors_per_vm"])
        self.margin = float(cfg["estimate_margin"])
        self.stall_s = float(cfg["stall_s"])
        #: Durations from the work done instead of the clock (``plugins/cost/time_model.py``).
        self.model = TimeModel.from_config(cfg)
        self.cold_start_s = float(actors.get("sim_cold_start_s") or 0.0)
        #: What the time model needs to price a round before it runs: an invocation's env
        #: steps, each Hessian probe's samples and Lanczos step cap, each gns probe's samples
        #: (samples 0: the whole batch).
        # num_envs is the env provider's key (gymnasium's); without it, one env per actor.
        self.invocation_steps = int(actors["steps"]) * int(ctx.plan["env"].get("num_envs") or 1)
        probes = ctx.plan["probes"]
        self.hessian_caps = [(int(p["samples"]), int(p["max_steps"]))
                             for p in probes if p["name"] == "hessian"]
        self.gns_samples = [int(p["samples"]) for p in probes if p["name"] == "gns"]
        if self.model is not None and self.gns_samples and not self.model.models_gns:
            # Said once, at the start: such a run's dollars move with the machine's load.
            log.warning("gns_probe_billed_as_measured",
                        why="cost.model_gns_s and cost.model_gns_s_per_sample are unset")
        #: Simulated cloud: Lambda bills the init phase of a cold start, so the simulated cold
        #: starts (functions beyond the warm pool, ``RoundRecord.sim_cold_starts``, the count
        #: the clock reads too) are billed; real receipts' ``init_ms`` is billed otherwise.
        self.simulate = bool(actors.get("simulate"))
        self.vms = 0  # VMs running after the last round (serverful baseline)
        keep = int(cfg["estimate_rounds"])
        self.times = RoundTimes(keep)
        #: Mean bill of one successful actor (GB-s, request, init) in each recent round: N
        #: actors' bills sum to about N times their mean, so the highest recent mean bounds
        #: them more tightly than the slowest actor would.
        self.per_actor: deque[float] = deque(maxlen=keep)
        #: The time model's update and probe seconds of the round charged last: a pipelined
        #: round's sampling hides behind what of them was left when its fan-out started.
        self.trained_s: tuple[float, float] = (0.0, 0.0)
        #: The time model's slowest invocation of the round charged last (cold start aside).
        self.sampled_s: float | None = None

    # -- prices -------------------------------------------------------------------------------

    def actor_usd(self, duration_ms: float, requests: int = 1) -> float:
        """One Lambda invocation: GB-s of the duration rounded up to 1 ms, plus its requests."""
        billed_ms = math.ceil(duration_ms - 1e-9)
        return billed_ms / 1000 * self.memory_gb * self.gb_s_usd + requests * self.request_usd

    def time_usd_per_s(self) -> float:
        """What one second of the round costs besides the actors: learner and Redis node."""
        return (self.learner_usd_per_h + self.redis_usd_per_hour) / 3600

    def vms_for(self, actors: int) -> int:
        return math.ceil(actors / self.actors_per_vm)

    def init_usd(self) -> float:
        """The billed init phase of one simulated cold start (no request price of its own)."""
        return math.ceil(self.cold_start_s * 1000) / 1000 * self.memory_gb * self.gb_s_usd

    def bill(self, receipt: Receipt, slowest_ok_ms: float) -> _Bill:
        """What AWS bills for one invocation (see the module docstring for each case)."""
        init = 0.0 if self.simulate else receipt.init_ms
        requests = max(1, receipt.attempts - receipt.throttles)
        ran_ms = max(float(receipt.billed_ms), receipt.duration_ms + init)
        if receipt.cancelled:
            return _Bill(max(ran_ms, self.function_timeout_s * 1000 + init), requests)
        if receipt.ok:
            return _Bill(ran_ms, requests)
        error = receipt.error or ""
        if ran_ms > 0:
            return _Bill(ran_ms, requests)
        if "timeout" in error.lower() or "timed out" in error.lower():
            return _Bill(self.function_timeout_s * 1000 + init, requests)
        if any(word.lower() in error.lower() for word in NEVER_RAN):
            return _Bill(0.0, requests)
        # A function error with no reported duration ran for part of a normal invocation.
        return _Bill(slowest_ok_ms, requests)

    # -- the CostModel role -------------------------------------------------------------------

    def charge(self, record: RoundRecord, receipts: Sequence[Receipt]) -> dict[str, float]:
        cold = record.sim_cold_starts if self.simulate and self.kind != "vm" else 0
        probe_s = max(0.0, record.probe_s - record.eval_s)
        if self.model is not None:
            receipts, probe_s = self._model_round(record, receipts, cold, probe_s)
        # sim_time_s is the round's training time: the coordinator leaves evaluation out.
        charged_s = max(0.0, record.sim_time_s)
        probe_s = min(charged_s, probe_s)
        if self.kind == "vm":
            return self._charge_vms(record, charged_s, probe_s)
        # A run's first round, timed by the clock, holds one-off start-up work (the learner's
        # first update builds its kernels and thread pools, each worker its envs and policy)
        # that no later round repeats: in the envelope it would raise every estimate for eight
        # rounds, and a small budget would end with a round's worth unspent. Until a later
        # round is charged the estimate takes the last record at its word, round 1 included.
        warm_up = record.round == 1 and self.model is None
        if not warm_up:
            self.times.add(record.actors, charged_s - (self.cold_start_s if cold else 0.0))
        items = self._actor_items(receipts, keep=not warm_up)
        items["cold_start_usd"] = cold * self.init_usd()
        items.update(self._time_items(charged_s, probe_s))
        return items

    def _model_round(self, record: RoundRecord, receipts: Sequence[Receipt], cold: int,
                     probe_s: float) -> tuple[list[Receipt], float]:
        """Put the time model's durations in place of the measured ones: the invocations'
        (and so their bills), the probe's, and the round's simulated time, which the
        coordinator adds to the run's clock after charging."""
        assert self.model is not None
        modelled = self.model.receipts(receipts)
        record.actor_durations_ms = [r.duration_ms for r in modelled if r.ok]
        self.sampled_s = max(record.actor_durations_ms, default=0.0) / 1000
        actor_s = self.sampled_s + (self.cold_start_s if cold else 0.0)
        # A record built without its probe runs (by hand, or restored from an old
        # checkpoint) keeps its measured probe time.
        if record.probe_runs:
            probe_s = self.model.charge_probes(record.probe_runs)
        update_s = self.model.update_s(record.env_steps)
        record.overlap_s = record.overlapped_s(actor_s, *self.trained_s)
        self.trained_s = (update_s, probe_s)
        record.sim_time_s = actor_s - record.overlap_s + update_s + probe_s
        return modelled, probe_s

    def _actor_items(self, receipts: Sequence[Receipt], keep: bool = True) -> dict[str, float]:
        """The round's actor bills by item; ``keep``: the mean bill of one actor joins the
        recent ones the estimate takes the highest of."""
        slowest = max((r.duration_ms for r in receipts if r.ok), default=0.0)
        items = {"actors_usd": 0.0, "failed_usd": 0.0, "cancelled_usd": 0.0}
        succeeded = 0
        for receipt in receipts:
            bill = self.bill(receipt, slowest)
            usd = self.actor_usd(bill.ms, bill.requests)
            if receipt.cancelled:
                items["cancelled_usd"] += usd
            elif receipt.ok:
                items["actors_usd"] += usd
                succeeded += 1
            else:
                items["failed_usd"] += usd
        if succeeded and keep:
            self.per_actor.append(items["actors_usd"] / succeeded)
        return items

    def _time_items(self, charged_s: float, probe_s: float) -> dict[str, float]:
        items = {"learner_usd": (charged_s - probe_s) / 3600 * self.learner_usd_per_h,
                 "probe_usd": probe_s / 3600 * self.learner_usd_per_h}
        if self.redis_usd_per_hour:
            items["redis_usd"] = charged_s / 3600 * self.redis_usd_per_hour
        return items

    def _charge_vms(self, record: RoundRecord, charged_s: float,
                    probe_s: float) -> dict[str, float]:
        self.times.add(record.actors, charged_s)
        vms = self.vms_for(record.actors)
        started = max(0, vms - self.vms)
        self.vms = vms
        if started:
            # The round's actors cannot start before their VM: the start-up delays the round
            # as much as it costs (the coordinator adds sim_time_s after charging).
            record.sim_time_s += self.vm_startup_s
            charged_s += self.vm_startup_s
        vm_s = vms * (charged_s - (self.vm_startup_s if started else 0.0)) \
            + started * self.vm_startup_s
        return {"actors_usd": vm_s / 3600 * self.vm_usd_per_hour,
                **self._time_items(charged_s, probe_s)}

    def estimate_actor_usd(self, record: RoundRecord | None) -> float | None:
        """Cost of one more actor: the highest recent mean bill of one actor (VM share for
        vm)."""
        if record is None or not record.actor_durations_ms:
            return None
        if self.kind == "vm":
            return record.sim_time_s / self.actors_per_vm / 3600 * self.vm_usd_per_hour
        if self.per_actor:
            return max(self.per_actor)
        return self.actor_usd(float(np.mean(record.actor_durations_ms)))

    def estimate_round_usd(self, record: RoundRecord, actors: int) -> float:
        """Upper envelope of a round like the recent ones (``record`` the last) with ``actors``
        actors, times the margin: never below what such a round has been charged so far."""
        times = self.times
        if not times.points:  # nothing charged yet: take the record at its word
            times = RoundTimes(1)
            times.add(record.actors, record.sim_time_s)
        seconds = times.upper(actors)
        cold = max(0, actors - record.warm_pool) if self.simulate else 0
        if cold:
            seconds += self.cold_start_s
        if self.kind == "vm":
            vms = self.vms_for(actors)
            started = max(0, vms - self.vms)
            actors_usd = (vms * seconds + started * self.vm_startup_s) / 3600 \
                * self.vm_usd_per_hour
            seconds += self.vm_startup_s if started else 0.0
        else:
            per_actor = self.estimate_actor_usd(record) or self.actor_usd(0.0)
            actors_usd = actors * per_actor + cold * self.init_usd()
        envelope = self.margin * (actors_usd + seconds * self.time_usd_per_s())
        bound = self.model_round_usd(actors, cold)
        return envelope if bound is None else max(envelope, bound)

    def stall_usd(self, actors: int) -> float:
        """What ``stall_s`` more of the clock adds to a round of ``actors`` actors: the learner
        and Redis, and the actors (local actors and a local Lambda endpoint share the stalled
        machine; on AWS their part is a margin). Nothing under the time model, whose durations
        follow the work done, not the clock."""
        if self.model is not None:
            return 0.0
        if self.kind == "vm":
            actors_per_s = self.vms_for(actors) * self.vm_usd_per_hour / 3600
        else:
            actors_per_s = actors * self.memory_gb * self.gb_s_usd
        return self.stall_s * (self.time_usd_per_s() + actors_per_s)

    def modelled_timing(self) -> tuple[float, float] | None:
        """The model's slowest invocation and update of the round charged last (None without
        the model, or before a round was charged)."""
        if self.model is None or self.sampled_s is None:
            return None
        return self.sampled_s, self.trained_s[0]

    def model_round_usd(self, actors: int, cold: int) -> float | None:
        """Under the time model a round's price is known before it runs, except for how many
        Lanczos steps the Hessian probe takes: at their cap this is an upper bound (None without
        the model). The envelope of recent rounds alone is not: with the probe every k-th round
        it can be fitted on rounds without one and let a probing round overspend the budget."""
        if self.model is None or self.kind == "vm" or not self.invocation_steps:
            return None
        m = self.model
        ms = m.invocation_ms(self.invocation_steps)
        batch = actors * self.invocation_steps
        seconds = ms / 1000 + m.update_s(batch) + self.model_probes_s(batch) \
            + (self.cold_start_s if cold else 0.0)
        return actors * self.actor_usd(ms) + cold * self.init_usd() \
            + seconds * self.time_usd_per_s()

    def model_probes_s(self, batch: int) -> float:
        """The most the modelled probes can take in a round that trains on ``batch`` samples:
        every one of them due, each Hessian probe at its step cap (a gns probe the model does
        not time is measured, and left to the envelope)."""
        assert self.model is not None
        m = self.model

        def used(samples: int) -> int:
            return batch if samples == 0 else min(samples, batch)

        seconds = sum(m.hessian_s(used(samples), steps) for samples, steps in self.hessian_caps)
        if m.models_gns:
            seconds += sum(m.gns_probe_s(used(samples)) for samples in self.gns_samples)
        return seconds

    def estimate_first_round_usd(self, actors: int) -> float:
        """Before any round nothing is measured: with measured durations only the requests and
        the simulated cold starts are certain, so round 1 runs unless those alone exceed the
        budget. The time model knows the whole round in advance (the probe at its step cap),
        so under it a budget too small for round 1 is never overspent."""
        cold = actors if self.simulate else 0
        bound = self.model_round_usd(actors, cold)
        if bound is not None:
            return bound
        return actors * (self.request_usd + (self.init_usd() if self.simulate else 0.0)) \
            + (self.cold_start_s if cold else 0.0) * self.time_usd_per_s()

    # -- checkpoints --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"vms": self.vms,
                "times": [list(p) for p in self.times.points],
                "per_actor": list(self.per_actor), "trained_s": list(self.trained_s),
                "sampled_s": self.sampled_s}

    def load_state(self, state: dict[str, Any]) -> None:
        self.vms = int(state["vms"])
        for actors, seconds in state["times"]:
            self.times.add(int(actors), float(seconds))
        self.per_actor.extend(float(v) for v in state["per_actor"])
        # checkpoints from before pipelined rounds were credited their overlap lack it
        update_s, probe_s = state.get("trained_s", (0.0, 0.0))
        self.trained_s = (float(update_s), float(probe_s))
        sampled_s = state.get("sampled_s")
        self.sampled_s = None if sampled_s is None else float(sampled_s)
