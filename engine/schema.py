"""TOML tables <-> frozen dataclasses, with errors a user can act on.

A settings class declares each field with `setting(default, doc, min=..., max=...)`;
`from_table` checks unknown keys (suggesting a close known one), types, bounds and the
class's own cross-field checks (`__post_init__` raising FieldError), and reports the first
problem as a ConfigError naming where, the key, the bad value and what was expected.
The same checks serve preset files, `--set` overrides and the TUI's editor.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import tomllib
import types
import typing
from typing import Any, Literal, get_args, get_origin

from engine.errors import ConfigError, describe


class FieldError(ValueError):
    """Raised by a settings class's __post_init__: which field, and what is wrong with it."""

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


def setting(default: Any = dataclasses.MISSING, doc: str = "", *, min: float | None = None,
            max: float | None = None, above: float | None = None) -> Any:
    """A dataclass field with its one-line doc and numeric bounds (min/max inclusive,
    `above` exclusive)."""
    meta = {"doc": doc, "min": min, "max": max, "above": above}
    if isinstance(default, (list, dict)):
        frozen = tuple(default) if isinstance(default, list) else types.MappingProxyType(dict(default))
        return dataclasses.field(default_factory=lambda: frozen, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """name -> (field, resolved type annotation), in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}


def expected(annotation: Any, field: dataclasses.Field | None = None) -> str:
    """Plain words for what a field accepts."""
    meta = field.metadata if field else {}
    lo, hi, above = meta.get("min"), meta.get("max"), meta.get("above")
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in get_args(annotation))
    if annotation is bool:
        return "true or false"
    if annotation in (int, float):
        noun = "an integer" if annotation is int else "a number"
        if above is not None:
            return f"{noun} > {above:g}" + (f" and <= {hi:g}" if hi is not None else "")
        if lo is not None and hi is not None:  # an integer bound in full: 2**64 - 1, not 1.84467e+19
            return f"{noun} from {lo if annotation is int else f'{lo:g}'} to " \
                   f"{hi if annotation is int else f'{hi:g}'}"
        if lo == 1 and annotation is int:
            return "a positive integer"
        if lo is not None:
            return f"{noun} >= {lo:g}"
        return noun
    if annotation is str:
        return "a string"
    if origin is tuple:
        return "a list of strings"
    if origin in (dict, collections.abc.Mapping) or annotation is typing.Mapping:
        return "a table of string values"
    return str(annotation)


def _check_value(name: str, value: Any, annotation: Any, field: dataclasses.Field) -> Any:
    """Return the value in the field's own type, or raise FieldError."""
    bad = FieldError(name, f"got {describe(value)}, expected {expected(annotation, field)}")
    origin = get_origin(annotation)
    if origin is Literal:
        if value not in get_args(annotation):
            raise bad
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
    elif annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad
        value = float(value)
    elif annotation is str:
        if not isinstance(value, str):
            raise bad
        return value
    elif origin is tuple:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise bad
        return tuple(value)
    elif origin in (dict, collections.abc.Mapping) or annotation is typing.Mapping:
        if not isinstance(value, dict):
            raise bad
        for key, item in value.items():
            if not isinstance(item, str):
                raise FieldError(f"{name}.{key}", f"got {describe(item)}, expected a string "
                                                  f"(the values of {name} are strings)")
        return types.MappingProxyType(dict(value))
    lo, hi, above = field.metadata.get("min"), field.metadata.get("max"), field.metadata.get("above")
    if (lo is not None and value < lo) or (hi is not None and value > hi) or \
            (above is not None and value <= above):
        raise bad
    return value


def unknown_key(where: str, key: str, known: typing.Iterable[str], prefix: str = "") -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else \
        "; known keys: " + ", ".join(prefix + k for k in known)
    return ConfigError(where, prefix + key, "unknown key" + hint)


def from_table(cls: type, table: dict, *, where: str, prefix: str = "") -> Any:
    """Build a settings dataclass from a TOML table, or raise ConfigError."""
    spec = fields(cls)
    for key in table:
        if key not in spec:
            raise unknown_key(where, key, spec, prefix)
    values = {}
    for name, (field, annotation) in spec.items():
        if name in table:
            try:
                values[name] = _check_value(name, table[name], annotation, field)
            except FieldError as e:
                raise ConfigError(where, prefix + e.key, e.problem) from None
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(where, prefix + name, f"missing, expected {expected(annotation, field)}")
    try:
        return cls(**values)
    except FieldError as e:
        raise ConfigError(where, prefix + e.key, e.problem) from None


def to_table(obj: Any) -> dict:
    """The TOML table for a settings dataclass (tuples as lists, mappings as tables)."""
    table = {}
    for name in fields(type(obj)):
        value = getattr(obj, name)
        if isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, typing.Mapping):
            value = dict(value)
        table[name] = value
    return table


def parse_value(text: str, annotation: Any = None) -> Any:
    """A `--set` value: TOML syntax (3, 1e-3, true, ["a"]), or the bare text for a string field."""
    if annotation is str or get_origin(annotation) is Literal:
        if not (text.startswith('"') or text.startswith("'")):
            return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # nested past reason: the type check says
        return text
