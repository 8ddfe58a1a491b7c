"""Declarative configuration fields and their validation.

Plan sections and plugin configurations are tables of ``Field``s. Validation fills defaults
and raises ``PlanError`` with the key path, what was expected and what was found, which is the
whole message a user sees for a bad plan.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REQUIRED: Any = object()

_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "table": "a table",
    "list[str]": "a list of strings",
    "list[int]": "a list of integers",
    "list[float]": "a list of numbers",
}


class PlanError(Exception):
    """A plan that cannot run. The message names the key path, the expectation and the finding."""

    def __init__(self, path: str, expected: str, found: Any = None, *, note: str = ""):
        self.path = path
        self.expected = expected
        self.found = found
        text = f"{path}: expected {expected}"
        if found is not None:
            text += f", found {describe(found)}"
        if note:
            text += f" ({note})"
        super().__init__(one_line(text))


def one_line(text: str) -> str:
    """The CLI prints a PlanError as one line, but keys, ``--set`` strings and validators' notes
    come from users and libraries and may hold newlines or control characters: escape those
    (``\\n``) so the message stays one line and cannot forge extra output lines."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def describe(value: Any) -> str:
    if isinstance(value, _Missing):
        return "nothing"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"a list {value!r}" if len(repr(value)) < 60 else "a list"
    return f"{value!r} ({type(value).__name__})"


class _Missing:
    pass


@dataclass(frozen=True)
class Field:
    #: One of ``_TYPE_WORDS``.
    type: str
    default: Any = REQUIRED
    doc: str = ""
    min: float | None = None
    max: float | None = None
    #: Allowed values, for strings with a fixed vocabulary.
    choices: tuple[Any, ...] | None = None
    #: ``min`` is exclusive (``> 0`` rather than ``>= 0``).
    min_exclusive: bool = False
    #: A resume may not change it: it fixes what the checkpoint's model sees or computes
    #: (the env and so its spaces, the algorithm, the network's shape).
    fixed_on_resume: bool = False

    def __post_init__(self) -> None:
        if self.type not in _TYPE_WORDS:
            raise ValueError(f"unknown field type {self.type!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def expectation(self) -> str:
        words = _TYPE_WORDS[self.type]
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        bounds = []
        if self.min is not None:
            bounds.append(f"{'>' if self.min_exclusive else '>='} {_num(self.min)}")
        if self.max is not None:
            bounds.append(f"<= {_num(self.max)}")
        return words + (" " + " and ".join(bounds) if bounds else "")

    def check(self, path: str, value: Any) -> Any:
        """Return the value, converted where lossless (int -> float), or raise PlanError."""
        kind = self.type
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlanError(path, self.expectation(), value)
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PlanError(path, self.expectation(), value)
            if isinstance(value, float) and math.isnan(value):
                raise PlanError(path, self.expectation(), value)
            value = float(value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise PlanError(path, self.expectation(), value)
        elif kind == "str":
            if not isinstance(value, str):
                raise PlanError(path, self.expectation(), value)
        elif kind == "table":
            if not isinstance(value, dict):
                raise PlanError(path, self.expectation(), value)
        else:
            item = Field(kind[5:-1])
            if not isinstance(value, list):
                raise PlanError(path, self.expectation(), value)
            value = [item.check(f"{path}[{i}]", v) for i, v in enumerate(value)]
            return value
        if self.choices is not None and value not in self.choices:
            raise PlanError(path, self.expectation(), value)
        if self.min is not None and (value < self.min or (self.min_exclusive and value == self.min)):
            raise PlanError(path, self.expectation(), value)
        if self.max is not None and value > self.max:
            raise PlanError(path, self.expectation(), value)
        return value


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"; did you mean 'id'?"`` for a near miss (a typo, a plural, a hyphen), else ``""``."""
    close = difflib.get_close_matches(word, [str(o) for o in options], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def defaults(fields: Mapping[str, Field]) -> dict[str, Any]:
    """What validation fills for the optional keys a table leaves out, read from the fields
    themselves: a plugin built from a hand-made config (a test, an embedding application)
    completes it from its own declaration instead of a second copy of each default."""
    return {key: copy.deepcopy(spec.default) for key, spec in fields.items()
            if not spec.required}


def validate_table(
    path: str,
    data: Any,
    fields: Mapping[str, Field],
    *,
    allow_extra: bool = False,
) -> dict[str, Any]:
    """Check ``data`` against ``fields``: no unknown keys, types and bounds, defaults filled."""
    if not isinstance(data, dict):
        raise PlanError(path, "a table", data)
    out: dict[str, Any] = {}
    for key, value in data.items():
        spec = fields.get(key)
        key_path = f"{path}.{key}" if path else key
        if spec is None:
            if allow_extra:
                out[key] = value
                continue
            known = ", ".join(sorted(fields)) or "no keys"
            raise PlanError(key_path, f"a known key (known: {known})",
                            note="unknown key" + did_you_mean(key, fields))
        out[key] = spec.check(key_path, value)
    for key, spec in fields.items():
        if key not in out:
            if spec.required:
                key_path = f"{path}.{key}" if path else key
                raise PlanError(key_path, spec.expectation(), _Missing(), note="required key")
            out[key] = spec.default
    return out
