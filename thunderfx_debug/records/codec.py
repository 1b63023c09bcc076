"""One JSON codec for the frozen records, driven by their dataclass fields and type hints.

A record class derives from `JsonRecord`: `to_json()` writes every field by its type (enums by value, tuples as
lists, nested records through their own `to_json`, a float that is not finite as its text, since JSON has none),
and `from_json(data, where)` reads them back, checking each against its type hint, so that a damaged or foreign dump
raises `DumpError` naming the field path (`graph.json.splits[0].timing.samples_ms: expected a list of numbers`)
instead of a KeyError. A key the class does not know is ignored (statistics written for readers, newer fields); a
missing key takes the field's default. Loading builds only the classes the hints name: nothing in the data chooses
a type, nothing is evaluated or imported.

Field metadata (`json_field`) covers the few forms that are not one key per field: a field written only where it is
not its default, a tuple of records written as an object of columns, a field not written at all (its value lives in
a file of its own), a default used only where an older dump lacks the key. A class whose JSON form differs further
overrides `from_json` (see `records.timing.Timing`).

Why not msgspec or cattrs (both installable): the records are read by renderers on laptops where the package's only
dependency is torch, the damaged-dump errors keep this package's field-path form, which tests and users rely on,
and the special forms above would need hooks of the library's own; dataclasses and typing do the rest here.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar

#: Bumped whenever the JSON form changes incompatibly; `load_report` refuses versions it cannot read. Version 2: a
#: timing's `samples_ms` may be a selection of the samples (see `Timing`); older readers would count those alone.
SCHEMA_VERSION = 2
#: The versions `load_report` reads: version 1 dumps hold every sample raw, which version 2 reads as it is.
READABLE_SCHEMA_VERSIONS = (1, 2)


class DumpError(ValueError):
    """A dump directory or file that cannot be read: missing, damaged, or of another schema version."""


class _NonNegative:
    """Annotated marker: a whole number >= 0."""


#: A count: a whole number >= 0 (a negative one in a dump is damage).
Count = Annotated[int, _NonNegative]

_FLOAT_TEXTS = ("inf", "-inf", "nan")
_NAMES = {bool: "bool", int: "int", float: "int or float", str: "str", type(None): "NoneType"}
_PLURALS = {bool: "booleans", int: "whole numbers", float: "numbers", str: "strings", type(None): "nulls"}


def json_field(default: Any = dataclasses.MISSING, *, omit_default: bool = False, columns: bool = False,
               written: bool = True, missing: Any = dataclasses.MISSING, required: bool = False,
               **kwargs: Any) -> Any:
    """A dataclass field with its JSON form.

    Args:
        default: the field's default (or `default_factory=` in kwargs), as for `dataclasses.field`.
        omit_default: written only where its value is not the default (older readers never saw the key).
        columns: a tuple of records written as one list per field of theirs (`{"seq": [1, 2], "name": [...]}`).
        written: False for a field that is not in the JSON (read from a file of its own by the loader).
        missing: the value read where the key is absent, for a field without a default that older dumps lack.
        required: the key must be there, though the field has a default for those who build the record.
    """
    metadata = {"omit_default": omit_default, "columns": columns, "written": written, "missing": missing,
                "required": required}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


class JsonRecord:
    """Base of the frozen records: their JSON form from their fields (see the module docstring).

    `JSON_DERIVED` names properties written after the fields for people and other tools reading the JSON; they are
    computed again from the fields, never read back."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        data = {}
        for field, hint in _fields(type(self)):
            value = getattr(self, field.name)
            if not field.metadata.get("written", True):
                continue
            if field.metadata.get("omit_default") and value == _default(field):
                continue
            if field.metadata.get("columns"):
                data[field.name] = _columns(value)
            else:  # a field of type Any is a value as the run had it (a number, a name, a repr): as JSON writes it
                data[field.name] = value if hint is Any else _encode(value)
        for name in self.JSON_DERIVED:
            data[name] = _encode(getattr(self, name))
        return data

    @classmethod
    def from_json(cls, data: Any, where: str):
        """Reads a record back; raises DumpError naming the field that is missing or of the wrong type."""
        return cls(**decode_fields(cls, data, where))


def decode_fields(cls: type, data: Any, where: str) -> dict[str, Any]:
    """The constructor arguments of `cls` read from the JSON object `data`, each checked against its type hint (a
    field that is not written, or whose key is absent and has a default, left to its default)."""
    if not isinstance(data, Mapping):
        raise DumpError(f"{where}: expected a JSON object, found {type(data).__name__}")
    values = {}
    for field, hint in _fields(cls):
        if not field.metadata.get("written", True):
            continue
        key = f"{where}.{field.name}"
        if field.name not in data:
            if field.metadata.get("missing", dataclasses.MISSING) is not dataclasses.MISSING:
                values[field.name] = field.metadata["missing"]
            elif field.metadata.get("required") or _default(field) is dataclasses.MISSING:
                raise DumpError(f"{where}: missing field {field.name!r}")
        elif field.metadata.get("columns"):
            values[field.name] = _decode_columns(typing.get_args(hint)[0], data[field.name], key)
        else:
            values[field.name] = _decoder(hint)(data[field.name], key)
    return values


# ---- writing --------------------------------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # JSON has no infinity
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _columns(records: tuple[Any, ...]) -> dict[str, list[Any]]:
    row_type = type(records[0]) if records else None
    names = [f.name for f in dataclasses.fields(row_type)] if row_type else []
    return {name: [_encode(getattr(r, name)) for r in records] for name in names}


# ---- reading --------------------------------------------------------------------------------------------------------


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


Decoder = Callable[[Any, str], Any]


@functools.cache
def _decoder(hint: Any) -> Decoder:
    """A function (value, where) -> the value as `hint` says, or DumpError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda value, where: value
    if origin is Annotated:
        return _count if _NonNegative in args[1:] else _decoder(args[0])
    if origin in (typing.Union, types.UnionType):
        members = tuple(a for a in args if a is not type(None))
        # An optional value, or a number of one of several kinds (a tensor's range: bool, int or float)
        inner = _decoder(members[0]) if len(members) == 1 else functools.partial(_scalar, kinds=members)
        return lambda value, where: None if value is None else inner(value, where)
    if origin is tuple:
        return functools.partial(_sequence, item=args[0])
    if origin in (Mapping, dict):
        item = _decoder(args[1])
        return lambda value, where: {k: item(v, f"{where}.{k}") for k, v in _typed(value, dict, where).items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return functools.partial(_enum, hint)
    if isinstance(hint, type) and issubclass(hint, JsonRecord):
        return lambda value, where: hint.from_json(_typed(value, dict, where), where)
    if hint in _NAMES:
        return functools.partial(_scalar, kinds=(hint,))
    raise TypeError(f"no JSON form for {hint!r}")  # a record declared with a type the codec does not know


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise DumpError(f"{where}: expected {kind.__name__}, found {type(value).__name__} {value!r:.80}")
    return value


_NOT = object()


def _scalar_or_not(value: Any, kinds: tuple[type, ...]) -> Any:
    """`value` as the first of `kinds` it is (an int read as a float where only a float fits), else _NOT."""
    if isinstance(value, bool):
        return value if bool in kinds else _NOT
    if isinstance(value, int):
        return value if int in kinds else float(value) if float in kinds else _NOT
    if isinstance(value, float):
        return value if float in kinds else _NOT
    if isinstance(value, str):
        return value if str in kinds else float(value) if float in kinds and value in _FLOAT_TEXTS else _NOT
    return _NOT


def _scalar(value: Any, where: str, kinds: tuple[type, ...]) -> Any:
    result = _scalar_or_not(value, kinds)
    if result is _NOT:
        names = " or ".join(dict.fromkeys(name for k in kinds for name in _NAMES[k].split(" or ")))
        raise DumpError(f"{where}: expected {names}, found {type(value).__name__} {value!r:.80}")
    return result


def _count(value: Any, where: str) -> int:
    value = _scalar(value, where, (int,))
    if value < 0:
        raise DumpError(f"{where}: expected a count >= 0, found {value}")
    return value


def _enum(kind: type[enum.Enum], value: Any, where: str) -> enum.Enum:
    value = _scalar(value, where, (str,))
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise DumpError(f"{where}: {value!r} is not one of {allowed}") from None


def _scalar_kinds(hint: Any) -> tuple[type, ...] | None:
    """The JSON scalar types a hint allows (None among them for an optional one), or None for other hints."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return members if all(m in _NAMES for m in members) else None


def _sequence(value: Any, where: str, item: Any) -> tuple[Any, ...]:
    values = _typed(value, list, where)
    kinds = _scalar_kinds(item)
    if kinds is None:  # records, enums, counts: each item names its index where it is wrong
        decode = _decoder(item)
        return tuple(decode(v, f"{where}[{i}]") for i, v in enumerate(values))
    result = tuple(None if v is None and type(None) in kinds else _scalar_or_not(v, kinds) for v in values)
    if any(r is _NOT for r in result):
        raise DumpError(f"{where}: expected a list of {' or '.join(_PLURALS[k] for k in kinds)}")
    return result


def _decode_columns(row_type: type, value: Any, where: str) -> tuple[Any, ...]:
    """Records written as columns (`JsonRecord.to_json` of a `columns` field); an empty object is no records."""
    columns = _typed(value, dict, where)
    if not columns:
        return ()
    lists = {}
    for field, hint in _fields(row_type):
        if field.name not in columns and _default(field) is not dataclasses.MISSING:
            continue  # the record's default
        if field.name not in columns:
            raise DumpError(f"{where}: missing field {field.name!r}")
        lists[field.name] = _sequence(columns[field.name], f"{where}.{field.name}", hint)
    if len({len(v) for v in lists.values()}) > 1:
        names = ", ".join(f.name for f, _ in _fields(row_type))
        raise DumpError(f"{where}: its columns {names} must have the same length")
    rows = len(next(iter(lists.values()))) if lists else 0
    return tuple(row_type(**{name: values[i] for name, values in lists.items()}) for i in range(rows))
