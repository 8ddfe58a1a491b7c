"""``docs/plan.md`` generated from the schema itself, so the reference cannot drift."""

from __future__ import annotations

from kernel.plan import LISTS, SECTIONS
from kernel.registry import Registry
from kernel.schema import Field

INTRO = """# Plan reference

A plan is a TOML file that declares a run. `python -m kernel validate PLAN` checks it and prints
it resolved (every default filled); `--set key.path=value` overrides any key with a TOML value
(`--set stop.max_env_steps=150000`, `--set env.id=Acrobot-v1`, `--set probes.0.every=2`).
A bad plan exits with status 2 and one line naming the key path, what was expected and what
was found. An override that names another plugin for a section (`--set scaler.name=fixed` on a
plan written for `nitro`, `--set algo.name=impala` on one written for `ppo`) drops the keys the
file gave that section which the new plugin does not declare, and logs them
(`plan_keys_dropped`): they configured the plugin it replaced, so a grid over plugins runs on
any plan. A key an override sets itself must fit the new plugin.

This page is generated from the code (`python -m kernel plugins --markdown`); a test keeps it
current. Keys a plugin adds are listed under the plugin, and are valid in the section that
names it.
"""


#: What a reader of a list section needs beyond its default.
LIST_NOTES = {
    "probes": (
        "A plan without `[[probes]]` evaluates the policy (10 deterministic episodes) every "
        "10th round and when the run stops (the summary's `final_eval_return` is the policy "
        "it ends with): an evaluation every round would cost small envs more time than "
        "training. Evaluation time is measured but never charged to the budget. "
        "`probes = []` turns evaluation off (then "
        "`stop.target_return` never triggers); `[[probes]] name = \"eval\" every = 1` "
        "evaluates every round."
    ),
}


def _row(key: str, spec: Field) -> str:
    default = "required" if spec.required else (
        "unset" if spec.default is None else f"`{_toml(spec.default)}`")
    return f"| `{key}` | {spec.expectation()} | {default} | {spec.doc} |"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def _table(fields: dict[str, Field]) -> list[str]:
    out = ["| key | expects | default | meaning |", "|---|---|---|---|"]
    out += [_row(k, v) for k, v in fields.items()]
    return out


def render(registry: Registry) -> str:
    lines = [INTRO]
    for section, (core, kind, selector) in SECTIONS.items():
        lines += [f"## `[{section}]`", ""]
        lines += _table(core)
        lines.append("")
        if kind:
            lines += _plugins(registry, kind, f"[{section}] {selector} = ")
    for section, (core, kind, default) in LISTS.items():
        lines += [f"## `[[{section}]]`", "",
                  f"An array of tables; default: `{default}`.", ""]
        if section in LIST_NOTES:
            lines += [LIST_NOTES[section], ""]
        lines += _table(core)
        lines.append("")
        lines += _plugins(registry, kind, "name = ")
    return "\n".join(lines).rstrip() + "\n"


def _plugins(registry: Registry, kind: str, prefix: str) -> list[str]:
    lines: list[str] = []
    for name in registry.names(kind):
        plugin = registry.get(kind, name)
        if plugin.source != "nitro-rl":
            continue  # third-party plugins document themselves
        lines += [f"### `{prefix}\"{name}\"`", "", plugin.doc, ""]
        if plugin.config:
            lines += _table(plugin.config)
            lines.append("")
    return lines
