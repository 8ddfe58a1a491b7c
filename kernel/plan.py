"""Plans: TOML files that declare a run, validated completely before anything starts.

``load_plan`` reads the file (or takes a dict), applies ``--set`` overrides, checks every core
section against the fields below and every plugin section against the fields its plugin
declares, fills defaults, and returns the resolved plan. Any problem is one ``PlanError`` that
names the key path.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from kernel.registry import PluginError, Registry, default_registry
from kernel.schema import Field, PlanError, did_you_mean, validate_table

log = structlog.get_logger("kernel.plan")

RUN = {
    "name": Field("str", "nitro", "Run name; the run directory is runs/<name>-<timestamp>."),
    "seed": Field("int", 1, "Seed for the learner, actors and scalers.", min=0),
    "out_dir": Field("str", "runs", "Parent folder of run directories."),
    "device": Field("str", "auto", "torch device of the learner: auto (the learner plugin "
                    "picks; the built-in ones take CUDA for image inputs only), cpu, cuda, "
                    "cuda:N."),
    "torch_threads": Field(
        "int", 0, "CPU threads of the learner's torch (0: 1 for vector observations, where "
        "small minibatches lose to threading overhead; for pixels the cores local actor "
        "workers leave, at least 1, and every core with remote actors).", min=0),
    "log_level": Field("str", "info", "Terminal log level.", choices=("debug", "info", "warning")),
    "mode": Field(
        "str", "sync",
        "sync: publish, fan out, gather, update, measure, scale, in order; pipelined: the next "
        "fan-out samples (one version stale) while the learner trains; async: keep actors in flight, learn as batches arrive.",
        choices=("sync", "pipelined", "async"),
    ),
    "snapshot_at": Field(
        "float", None,
        "pipelined: the next fan-out takes the weights of the moment this fraction of the "
        "update's optimiser steps is done (e.g. 0.5: its policy lags the learner by half an "
        "update; a run replays exactly). 0: it starts as the update begins, with the previous "
        "weights. Unset: timed from the last round so its batches arrive as the update ends "
        "(fastest; by measured durations it does not replay, by the time model's it does). "
        "Needs a learner with snapshots (PPO); others use 0.",
        min=0, max=0.95,
    ),
}
STOP = {
    "max_rounds": Field("int", None, "Stop after this many rounds.", min=1),
    "max_env_steps": Field("int", None, "Stop once this many env steps were trained on.", min=1),
    "target_return": Field("float", None, "Stop when the eval return reaches this."),
    "budget_usd": Field(
        "float", None, "Dollar budget; stop before a round it cannot pay for.", min=0,
        min_exclusive=True,
    ),
    "max_wall_s": Field("float", None, "Stop after this many seconds.", min=0, min_exclusive=True),
}
ENV = {
    "provider": Field("str", "gymnasium", "env plugin: it declares the rest of this section "
                      "and builds the environments from it.", fixed_on_resume=True),
}
ALGO = {"name": Field("str", "ppo", "algo plugin.", fixed_on_resume=True)}
ACTORS = {
    "backend": Field("str", "local", "actors plugin: local, lambda."),
    "count": Field("int", 1, "Actors in round 1 (and every round with the fixed scaler).", min=1),
    "min": Field("int", 1, "Fewest actors a scaler may choose.", min=1),
    "max": Field("int", None, "Most actors a scaler may choose (default: count; 8 x count "
                 "for the adaptive scalers).", min=1),
    "steps": Field("int", 128, "Env steps per env per invocation.", min=1),
    "workers": Field("int", 0, "Local worker processes (0: one per core).", min=0, max=1024),
    "deadline_s": Field(
        "float", 300.0, "Gathering deadline per round; late actors are left behind.", min=0,
        min_exclusive=True,
    ),
    "max_lag": Field("int", 2, "async: drop batches more than this many versions old.", min=0),
    "batches_per_update": Field(
        "int", 0, "async: batches per learner update (0: the actor count).", min=0),
    "min_fraction": Field(
        "float", 0.5, "Fraction of batches a round needs before it may go on at the deadline.",
        min=0, max=1,
    ),
}
TRANSPORT = {"kind": Field("str", "memory", "transport plugin: memory, redis.")}
SCALER = {"name": Field("str", "fixed", "scaler plugin.")}
COST = {"name": Field("str", "aws", "cost plugin.")}
CHECKPOINT = {
    "every": Field("int", 0, "Write a checkpoint every k rounds (0: only on stop).", min=0),
    "keep": Field("int", 3, "Checkpoints kept.", min=1),
    "enabled": Field("bool", True, "Write checkpoints at all."),
    "exact_resume": Field("bool", False, "Actors start new episodes at every periodic "
                          "checkpoint, so a run resumed from one replays the rounds the "
                          "uninterrupted run played (episodes cut every `every` rounds)."),
}
LIST_ITEM = {"name": Field("str", doc="plugin name.")}
PROBE_ITEM = {
    "name": Field("str", doc="probe plugin."),
    "every": Field("int", 1, "Measure every k rounds.", min=1),
    "max_share": Field("float", None, "Skip a due measurement that, at this probe's last "
                       "charged time, would take its share of the run's simulated time past "
                       "this fraction (unset: never skip).", min=0, min_exclusive=True, max=1),
}

#: section -> (core fields, plugin kind, key naming the plugin)
SECTIONS: dict[str, tuple[dict[str, Field], str | None, str | None]] = {
    "run": (RUN, None, None),
    "stop": (STOP, None, None),
    "env": (ENV, "env", "provider"),
    "algo": (ALGO, "algo", "name"),
    "actors": (ACTORS, "actors", "backend"),
    "transport": (TRANSPORT, "transport", "kind"),
    "scaler": (SCALER, "scaler", "name"),
    "cost": (COST, "cost", "name"),
    "checkpoint": (CHECKPOINT, None, None),
}
LISTS: dict[str, tuple[dict[str, Field], str, list[dict[str, Any]]]] = {
    # Without [[probes]], evaluate every 10th round: every round would spend more time on
    # evaluation than on training for small envs.
    "probes": (PROBE_ITEM, "probe", [{"name": "eval", "every": 10}]),
    "sinks": (LIST_ITEM, "sink", [{"name": "console"}]),
}


def fixed_on_resume(registry: Registry, *plans: Mapping[str, Any]) -> set[str]:
    """Key paths (``env.id``, ``algo.hidden_sizes``, ...) that a resume may not change, as the
    core sections and the plans' plugins mark their fields (``Field.fixed_on_resume``). Read
    from raw tables too: a key a table leaves out names its default plugin."""
    keys: set[str] = set()
    for plan in plans:
        for section, (core, kind, selector) in SECTIONS.items():
            fields = dict(core)
            if kind is not None and selector is not None:
                data = plan.get(section)
                name = (data if isinstance(data, Mapping) else {}).get(
                    selector, core[selector].default)
                if name in registry.names(kind):
                    fields.update(registry.get(kind, name).config)
            keys.update(f"{section}.{key}" for key, f in fields.items() if f.fixed_on_resume)
    return keys


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(str(p), "a readable plan file", note=exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise PlanError(str(p), "a UTF-8 text file", note="undecodable bytes") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(str(p), "valid TOML", note=str(exc)) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``key.path=value``; the value is read as TOML, or taken as a bare string if it is not
    (so ``--set env.id=Acrobot-v1`` works after the shell ate the quotes)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise PlanError(f"--set {item}", "key.path=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


#: What an embedding caller may pass as overrides: ``--set`` strings (one, or several), a
#: ``{"key.path": value}`` mapping, or None for none.
Overrides = Mapping[str, Any] | Iterable[str] | str | None


def override_pairs(overrides: Overrides) -> list[tuple[list[str], Any]]:
    """``--set`` strings or a ``{"key.path": value}`` mapping as (path, value) pairs. A lone
    string is one override, not an iterable of one-letter ones."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [parse_override(overrides)]
    if isinstance(overrides, Mapping):
        return [(k.split("."), v) for k, v in overrides.items()]
    return [parse_override(item) for item in overrides]


def apply_overrides(data: dict[str, Any], overrides: Overrides) -> None:
    apply_pairs(data, override_pairs(overrides))


def apply_pairs(data: dict[str, Any], pairs: Iterable[tuple[list[str], Any]]) -> None:
    for path, value in pairs:
        node: Any = data
        for i, part in enumerate(path[:-1]):
            where = ".".join(path[: i + 1])
            if isinstance(node, list):
                node = _list_item(node, part, where)
            else:
                node = node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise PlanError(where, "a table to override a key in", node)
        last = path[-1]
        if isinstance(node, list):
            index = _index(last, ".".join(path), len(node))
            node[index] = value
        else:
            node[last] = value


def _index(part: str, where: str, length: int) -> int:
    if not part.isdigit() or int(part) >= length:
        raise PlanError(where, f"an index below {length}", part)
    return int(part)


def _list_item(node: list[Any], part: str, where: str) -> Any:
    return node[_index(part, where, len(node))]


def load_plan(
    source: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Overrides = (),
    registry: Registry | None = None,
) -> dict[str, Any]:
    """Read, override and validate a plan; return it resolved (every default filled)."""
    if isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
    else:
        raw = read_toml(source)
    registry = registry or default_registry()
    pairs = override_pairs(overrides)
    base = copy.deepcopy(raw)
    apply_pairs(raw, pairs)
    drop_replaced_plugin_keys(base, raw, [path for path, _ in pairs], registry)
    return validate_plan(raw, registry)


def drop_replaced_plugin_keys(base: Mapping[str, Any], raw: dict[str, Any],
                              overridden: Iterable[list[str]], registry: Registry) -> list[str]:
    """Where an override names another plugin for a section (``--set scaler.name=fixed`` on a
    plan written for ``nitro``), drop the section's keys that came from the file and that
    neither the section nor the new plugin declares: they configured the plugin it replaced,
    so a grid over ``scaler.name`` runs on any plan. A key an override sets is never dropped
    (an unknown one still fails validation, naming it). Returns the dropped key paths."""
    explicit = {tuple(path) for path in overridden}
    dropped: list[str] = []
    for section, (core, kind, selector) in SECTIONS.items():
        data, before = raw.get(section), base.get(section)
        if kind is None or selector is None or not isinstance(data, dict):
            continue
        if (section,) in explicit:
            continue  # the whole table was given: every key in it is explicit
        if not isinstance(before, Mapping):
            before = {}
        default = core[selector].default
        name, old = data.get(selector, default), before.get(selector, default)
        if name == old or not isinstance(name, str) or name not in registry.names(kind):
            continue
        known = set(core) | set(registry.get(kind, name).config)
        for key in [k for k in data if k not in known and (section, k) not in explicit]:
            del data[key]
            dropped.append(f"{section}.{key}")
    if dropped:
        log.info("plan_keys_dropped", keys=dropped,
                 reason="they configured the plugin an override replaced")
    return dropped


def validate_plan(raw: dict[str, Any], registry: Registry) -> dict[str, Any]:
    known = set(SECTIONS) | set(LISTS)
    for key in raw:
        if key not in known:
            raise PlanError(
                key, f"a known section (known: {', '.join(sorted(known))})",
                note="unknown section" + did_you_mean(key, known),
            )
    plan: dict[str, Any] = {}
    for section, (core, kind, selector) in SECTIONS.items():
        data = raw.get(section, {})
        if section == "env" and section not in raw:
            raise PlanError("env", "a table with at least id", note="required section")
        plan[section] = _validate_section(section, data, core, kind, selector, registry)
    for section, (core, kind, default) in LISTS.items():
        items = raw.get(section, copy.deepcopy(default))
        if not isinstance(items, list):
            raise PlanError(section, f"an array of tables ([[{section}]])", items)
        plan[section] = [
            _validate_section(f"{section}[{i}]", item, core, kind, "name", registry)
            for i, item in enumerate(items)
        ]
    _cross_checks(plan)
    _plugin_checks(plan, registry)
    _finalize(plan)
    return plan


def _validate_section(
    path: str,
    data: Any,
    core: dict[str, Field],
    kind: str | None,
    selector: str | None,
    registry: Registry,
) -> dict[str, Any]:
    if kind is None or selector is None:
        return validate_table(path, data, core)
    if not isinstance(data, dict):
        raise PlanError(path, "a table", data)
    name_field = core[selector]
    name = name_field.check(f"{path}.{selector}", data.get(selector, name_field.default))
    try:
        plugin = registry.get(kind, name)
    except PluginError as exc:
        names = registry.names(kind)
        raise PlanError(f"{path}.{selector}", f"a {kind} plugin ({', '.join(names)})", name,
                        note=did_you_mean(name, names).removeprefix("; ")) from exc
    overlap = set(plugin.config) & set(core)
    fields = {**core, **{k: v for k, v in plugin.config.items() if k not in overlap}}
    return validate_table(path, data, fields)


#: A run name becomes a directory name under run.out_dir and part of the run id (Redis keys):
#: no separators, no leading dot (no "..", no hidden folders), no control characters.
RUN_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._ -]{0,62}[A-Za-z0-9._-])?")


def _cross_checks(plan: dict[str, Any]) -> None:
    name = plan["run"]["name"]
    if not RUN_NAME.fullmatch(name):
        raise PlanError("run.name", "1-64 letters, digits, '_', '-', '.' or inner spaces, "
                        "not starting with '.' or '-'", name, note="it names a folder under run.out_dir")
    stop = plan["stop"]
    if all(stop[k] is None for k in ("max_rounds", "max_env_steps", "max_wall_s", "budget_usd")):
        raise PlanError(
            "stop", "at least one of max_rounds, max_env_steps, max_wall_s, budget_usd",
            note="a run needs an end",
        )
    ckpt = plan["checkpoint"]
    if ckpt["exact_resume"] and not (ckpt["enabled"] and ckpt["every"] > 0):
        raise PlanError("checkpoint.exact_resume", "false unless checkpoint.every > 0 with "
                        "checkpoints enabled", True,
                        note="episodes restart at periodic checkpoints, and this plan writes none")
    actors = plan["actors"]
    top = actors["max"] if actors["max"] is not None else max(actors["count"], actors["min"])
    if not actors["min"] <= actors["count"] <= top:
        raise PlanError(
            "actors.count",
            f"a count between actors.min ({actors['min']}) and actors.max ({top})",
            actors["count"],
        )


def _finalize(plan: dict[str, Any]) -> None:
    """Defaults that plugin validators may have chosen first (an adaptive scaler widens an
    unset actors.max); otherwise actors.max is the start count."""
    actors = plan["actors"]
    if actors["max"] is None:
        actors["max"] = max(actors["count"], actors["min"])


def _plugin_checks(plan: dict[str, Any], registry: Registry) -> None:
    checks = [(name, plan[name], kind, sel) for name, (_, kind, sel) in SECTIONS.items() if kind]
    for section, (_, kind, _) in LISTS.items():
        checks += [(f"{section}[{i}]", item, kind, "name") for i, item in enumerate(plan[section])]
    for path, section, kind, selector in checks:
        plugin = registry.get(kind, section[selector])  # type: ignore[index]
        try:
            plugin.validate(section, plan)
        except PlanError:
            raise
        except ValueError as exc:
            # The plugin's own check says what is wrong; the expectation names the plugin, not
            # its one-line description, which reads as nonsense after "expected".
            raise PlanError(path, f"a valid configuration of the {kind} plugin "
                            f"{plugin.name!r}", note=str(exc)) from None
