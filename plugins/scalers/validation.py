"""Plan-time rules for scalers: room to boost when actors.max is unset, and the probe a
measuring scaler reads added to a plan that has none."""

from __future__ import annotations

from typing import Any

from plugins.descriptors.boost import (
    GNS_SCALER_CONFIG,
    KUNGFU_CONFIG,
    NITRO_CONFIG,
    NO_BOOST_CONFIG,
)

#: When a plan leaves actors.max unset, an adaptive scaler gets room to boost.
ADAPTIVE_MAX_FACTOR = 8

#: The probe value each measuring scaler reads by default (its descriptor's ``signal``;
#: critical_batch and grow have no such key and always read the gns probe's parts), and the probe
#: that reports it.
DEFAULT_SIGNAL = {"nitro": NITRO_CONFIG["signal"].default,
                  "prototype": NITRO_CONFIG["signal"].default,
                  "prototype_compat": NITRO_CONFIG["signal"].default,
                  "no_boost": NO_BOOST_CONFIG["signal"].default,
                  "gns": GNS_SCALER_CONFIG["signal"].default,
                  "kungfu": KUNGFU_CONFIG["signal"].default, "critical_batch": "gns",
                  "grow": "gns"}
SIGNAL_PROBE = {"hessian_ratio": "hessian", "gns": "gns"}


def validate_adaptive(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Plan-time defaults for scalers that change N: with actors.max unset they would be pinned
    to the start count, so they get ADAPTIVE_MAX_FACTOR x count; and the probe they read is
    added (``validate_probe``)."""
    actors = plan["actors"]
    if actors["max"] is None:
        actors["max"] = max(actors["min"], ADAPTIVE_MAX_FACTOR * actors["count"])
    validate_probe(section, plan)


def validate_schedule(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """A schedule in budget spent (``at``) needs a budget to measure it against and one step
    fraction fewer than counts, rising within (0, 1): a wrong length or order would silently
    run another schedule than the one written."""
    validate_adaptive(section, plan)
    at = [float(x) for x in section["at"]]
    if not at:
        return
    from kernel.schema import PlanError

    steps = section["steps"]
    if len(at) != len(steps) - 1:
        raise PlanError("scaler.at", f"one fraction fewer than scaler.steps ({len(steps)} "
                        f"counts, so {max(0, len(steps) - 1)} fractions)", at,
                        note="each fraction starts the next count")
    if any(not 0.0 < x < 1.0 for x in at) or any(b <= a for a, b in zip(at, at[1:], strict=False)):
        raise PlanError("scaler.at", "rising fractions of the budget, each in (0, 1)", at)
    if section["direction"] == "descend":
        raise PlanError("scaler.direction", "'ascend' with scaler.at (steps run in the "
                        "order written)", "descend")
    if plan["stop"]["budget_usd"] is None:
        raise PlanError("stop.budget_usd", "a budget for scaler.at to be a fraction of",
                        note="set stop.budget_usd, or schedule in rounds with scaler.every")


def validate_probe(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Add the probe a scaler reads (nitro, prototype, no_boost: hessian; gns, kungfu: gns) with
    its defaults when the plan has none and the scaler reads its default signal."""
    default = DEFAULT_SIGNAL.get(section["name"])
    signal = section.get("signal")
    if default is None or (signal is not None and signal != default):
        return
    probe = SIGNAL_PROBE[default]
    if not any(item["name"] == probe for item in plan["probes"]):
        from kernel.plan import PROBE_ITEM
        from kernel.registry import default_registry
        from kernel.schema import validate_table

        fields = {**PROBE_ITEM, **default_registry().get("probe", probe).config}
        item: dict[str, Any] = {"name": probe}
        if (section["name"] == "nitro" and section.get("rule") == "anchored"
                and not section.get("prototype_compat")):
            item["every"] = ANCHORED_PROBE_EVERY
            item["max_share"] = ANCHORED_PROBE_SHARE
        plan["probes"].insert(0, validate_table(f"probes[{probe}]", item, fields))


#: The anchored rule holds N between measurements, so the Hessian it adds to a plan measures
#: every 4th round: in the equal-budget studies probing every round cost 4-15 % of a run's
#: dollars, and the window rule did better measured every 4th round in all four of them.
ANCHORED_PROBE_EVERY = 4
#: And skips a measurement that would take the probe past a tenth of the run's simulated time:
#: every 4th round it costs 2.5 % on Hopper-v5 and Walker2d-v5, but on Humanoid-v5 (a larger
#: network, a cheap round) it reached 11 %; a skipped measurement holds N 4 rounds more.
ANCHORED_PROBE_SHARE = 0.1
