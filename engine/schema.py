"""TOML tables <-> frozen dataclasses, with errors a user can act on.

A settings class declares each field with `setting(default, doc, min=..., max=...)`;
`from_table` checks unknown keys (suggesting a close known one), types, bounds and the
class's own cross-field checks (`__post_init__` raising FieldError), and reports the first
problem as a ConfigError naming where, the key, the bad value and what was expected.
A field whose type is itself a settings class is a nested table (a device preset's [slurm]),
read by the same rules, its keys named dotted ('slurm.partition') in errors, `--set` and the
editor (`lookup`, `assign`, `leaves`).
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
            max: float | None = None, above: float | None = None, aka: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its one-line doc and numeric bounds (min/max inclusive,
    `above` exclusive). `aka`: the names other tools give the setting (Hugging Face's
    gradient_accumulation_steps for accumulation), which an unknown key is matched against
    where spelling alone would not find it."""
    meta = {"doc": doc, "min": min, "max": max, "above": above, "aka": tuple(aka)}
    if isinstance(default, (list, dict)):
        frozen = tuple(default) if isinstance(default, list) else types.MappingProxyType(dict(default))
        return dataclasses.field(default_factory=lambda: frozen, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """name -> (field, resolved type annotation), in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}


def table_class(annotation: Any) -> type | None:
    """The settings class of a nested table's field ([slurm]), else None."""
    return annotation if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else None


def lookup(cls: type, key: str) -> tuple[dataclasses.Field, Any] | None:
    """(field, type) of a key, dotted into nested tables ('slurm.partition'); None if no such key."""
    head, dot, rest = key.partition(".")
    found = fields(cls).get(head)
    if found is None or not dot:
        return found
    inner = table_class(found[1])
    return lookup(inner, rest) if inner else None


def leaves(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """Every setting that holds a value, a nested table's by its dotted name ('slurm.time')."""
    out = {}
    for name, (field, annotation) in fields(cls).items():
        inner = table_class(annotation)
        if inner:
            out.update({f"{name}.{key}": spec for key, spec in leaves(inner).items()})
        else:
            out[name] = (field, annotation)
    return out


def assign(table: dict, key: str, value: Any) -> None:
    """Set a dotted key in a table, the nested tables on its way made where missing."""
    head, dot, rest = key.partition(".")
    if not dot:
        table[head] = value
        return
    if not isinstance(table.get(head), dict):
        table[head] = {}
    assign(table[head], rest, value)


def value_at(table: dict, key: str) -> Any:
    """A dotted key's value in a table; None where it is not there."""
    value: Any = table
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def expected(annotation: Any, field: dataclasses.Field | None = None) -> str:
    """Plain words for what a field accepts."""
    meta = field.metadata if field else {}
    inner = table_class(annotation)
    if inner:
        return "a table of " + ", ".join(fields(inner))
    lo, hi, above = meta.get("min"), meta.get("max"), meta.get("above")
    origin = get_origin(annotation)
    if _union(annotation):   # 'an integer >= 0 or 'auto''
        return " or ".join(expected(a, field) for a in get_args(annotation))
    if origin is Literal:
        choices = get_args(annotation)
        return repr(choices[0]) if len(choices) == 1 else "one of " + ", ".join(repr(c) for c in choices)
    if annotation is bool:
        return "true or false"
    if annotation in (int, float):
        noun = "an integer" if annotation is int else "a number"
        if above is not None:
            return f"{noun} > {above:g}" + (f" and <= {hi:g}" if hi is not None else "")
        if lo == 1 and hi is not None and annotation is int:
            return f"a positive integer up to {hi}"
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
    if _union(annotation):   # the first of its types the value is (an interval, or 'auto')
        for alternative in get_args(annotation):
            try:
                return _check_value(name, value, alternative, field)
            except FieldError:
                continue
        raise bad
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


# Where the keys of a table may have been meant for another one: (the other table's keys, how
# to write a key there). The keys are a settings class or a list of names; `how` is a format
# with {key}, e.g. (TrainSettings, "{key} is a workload preset's [train] setting").
Elsewhere = typing.Sequence[tuple[Any, str]]

_CLOSE = 0.6     # difflib's ratio for "did you mean": batchsize/batch_size is 0.95, seeed/seed 0.89
_NEAREST = 0.4   # below this a key is nothing like the one typed: list a few keys instead


def names(keys: Any, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """name -> the other names it goes by, for a settings class (its fields' `aka`), a mapping
    of that kind, or plain names; each name written with `prefix` ('train.')."""
    if isinstance(keys, type) and dataclasses.is_dataclass(keys):   # a nested table's keys dotted too
        keys = {**{name: f.metadata.get("aka", ()) for name, (f, _) in fields(keys).items()},
                **{name: f.metadata.get("aka", ()) for name, (f, _) in leaves(keys).items()}}
    if not (isinstance(keys, typing.Mapping) and all(isinstance(v, tuple) for v in keys.values())):
        keys = {name: () for name in keys}   # names, or a mapping of names to something else
    return {prefix + name: tuple(aka) for name, aka in keys.items()}


def _likeness(typed: str, name: str, aka: tuple[str, ...]) -> float:
    """How likely `typed` meant `name`: 3 the same, 2 another tool's name for it, 1.5 the start
    of it ('nproc' for nproc_per_node), else difflib's ratio of the two (0 to 1). Dotted names
    ('train.lr', as --set writes them) are compared by their last part."""
    typed, name = typed.rpartition(".")[2].lower(), name.rpartition(".")[2]
    if typed == name:
        return 3.0
    if typed in aka:
        return 2.0
    if len(typed) >= 3 and name.startswith(typed):
        return 1.5
    return difflib.SequenceMatcher(None, typed, name).ratio()


def nearest(typed: str, groups: typing.Sequence[dict[str, tuple[str, ...]]],
            cutoff: float = _CLOSE, n: int = 3) -> list[tuple[int, str]]:
    """(group, name) of the known keys `typed` most likely meant, best first, at most n: those
    as likely as the best (a group listed earlier wins a tie), down to `cutoff`."""
    ranked = sorted((-_likeness(typed, name, aka), g, i, name) for g, group in enumerate(groups)
                    for i, (name, aka) in enumerate(group.items()))
    scored = [(-score, g, name) for score, g, _, name in ranked if -score >= cutoff]
    if scored and scored[0][0] > 1:   # same, aka or prefix: only those as good as the best
        scored = [s for s in scored if s[0] == scored[0][0]]
    return [(g, name) for _, g, name in scored[:n]]


def _related(typed: str, name: str) -> bool:
    """Whether a loosely alike name shares something a person would see: its first two letters
    ('lrate', 'lr') or three in a row ('warmup', 'warmup_steps'). difflib's ratio alone finds
    'nosuch' 0.5 alike 'nnodes' and 'epochs', which no one typing it meant."""
    typed, name = typed.rpartition(".")[2].lower(), name.rpartition(".")[2].lower()
    if typed[:2] == name[:2]:
        return True
    match = difflib.SequenceMatcher(None, typed, name).find_longest_match()
    return match.size >= 3


def _quoted(names: list[str]) -> str:
    names = [f"'{n}'" for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def suggest(typed: str, known: Any, prefix: str = "", elsewhere: Elsewhere = ()) -> str:
    """What to say of an unknown key: the known key it was most likely meant to be (here, or in
    another table or kind of preset, and how to write it there), else a few known keys."""
    here = names(known)
    groups = [here, *(names(keys) for keys, _ in elsewhere)]
    best = nearest(typed, groups)
    if best:
        group, name = best[0]
        if group == 0:
            return "did you mean " + _quoted([prefix + n for g, n in best if g == 0]) + "?"
        how = elsewhere[group - 1][1].format(key=name)
        return how if name == typed.rpartition(".")[2] else f"did you mean '{name}'? {how}"
    weak = [prefix + n for _, n in nearest(typed, [here], cutoff=_NEAREST) if _related(typed, n)]
    if weak:
        return f"did you mean {_quoted(weak)}?"
    first = [prefix + n for n in list(here)[:3]]
    more = f" and {len(here) - len(first)} more" if len(here) > len(first) else ""
    return "known keys include " + ", ".join(first) + more


def unknown_key(where: str, key: str, known: Any, prefix: str = "",
                elsewhere: Elsewhere = ()) -> ConfigError:
    """The error for a key no table has: `known` are this table's keys (a settings class or
    names), `elsewhere` the other tables a user may have meant it for."""
    return ConfigError(where, prefix + key, "unknown key; " + suggest(key, known, prefix, elsewhere))


def from_table(cls: type, table: dict, *, where: str, prefix: str = "",
               elsewhere: Elsewhere = ()) -> Any:
    """Build a settings dataclass from a TOML table, or raise ConfigError. `elsewhere`: the
    tables an unknown key may belong to instead (see unknown_key)."""
    spec = fields(cls)
    for key in table:
        if key not in spec:
            raise unknown_key(where, key, cls, prefix, elsewhere)
    values = {}
    for name, (field, annotation) in spec.items():
        inner = table_class(annotation)
        if name in table and inner:   # a nested table: its own keys, named 'slurm.partition'
            if not isinstance(table[name], dict):
                raise ConfigError(where, prefix + name, f"got {describe(table[name])}, expected "
                                                        f"{expected(annotation)} ([{prefix}{name}])")
            outside = "at the top level" if not prefix else f"in [{prefix[:-1]}]"
            values[name] = from_table(inner, table[name], where=where, prefix=f"{prefix}{name}.",
                                      elsewhere=((cls, "{key} belongs " + outside + ", not in ["
                                                  + prefix + name + "]"), *elsewhere))
        elif name in table:
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
    """The TOML table for a settings dataclass (tuples as lists, mappings and nested settings
    as tables)."""
    table = {}
    for name in fields(type(obj)):
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = to_table(value)
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, typing.Mapping):
            value = dict(value)
        table[name] = value
    return table


def parse_value(text: str, annotation: Any = None) -> Any:
    """A `--set` value: TOML syntax (3, 1e-3, true, ["a"]), or the bare text for a string field;
    for a list of strings, words as a person types them too (`native-crash@40`, `a,b`,
    `[a, b]`: the shell has already taken any quotes away)."""
    if annotation is str or get_origin(annotation) is Literal:
        if not (text.startswith('"') or text.startswith("'")):
            return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # nested past reason: the type check says
        if _strings(annotation):
            inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
            return [word.strip().strip("'\"") for word in inner.split(",") if word.strip()]
        return text


def _union(annotation: Any) -> bool:
    """Whether a field takes one of several types (int | Literal['auto'])."""
    return get_origin(annotation) in (typing.Union, types.UnionType)


def _strings(annotation: Any) -> bool:
    """Whether a field is a list (or tuple) of strings."""
    args = get_args(annotation)
    return get_origin(annotation) in (list, tuple) and bool(args) and args[0] is str \
        and all(a in (str, Ellipsis) for a in args)
