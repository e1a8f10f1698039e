"""Responses built once for every version: plain values in, the version's kio dataclass out.

A handler answers with nested dicts whose keys are the field names of Kafka's JSON schemas (as kio
spells them). ``build`` walks the response class of the requested version: it takes the fields that
version has, ignores the ones it lacks (a field added in a later version), fills the ones the handler
left out with the schema's default, and converts values to the schema's types (milliseconds to
timedeltas, ints to error codes, lists of dicts to tuples of the nested class). So one handler serves
Metadata v0 to v12 without a branch per version.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

_Converter = Callable[[Any], Any]


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """An instance of the kio dataclass ``cls`` from ``values`` (missing fields take their defaults)."""
    kwargs = {}
    for name, convert, required in _plan(typing.cast(Any, cls)):
        if name in values:
            kwargs[name] = convert(values[name])
        elif required:
            raise KeyError(f"{cls.__qualname__}.{name} has no default and no value was given")
    return cls(**kwargs)


@functools.cache
def _plan(cls: Any) -> tuple[tuple[str, _Converter, bool], ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, _converter(hints[f.name]), not has_default and not _is_optional(hints[f.name])))
    return tuple(out)


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _converter(hint: Any) -> _Converter:  # noqa: PLR0911 (one return per kind of schema type)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        convert = _converter(inner[0]) if len(inner) == 1 else _identity
        return lambda v: None if v is None else convert(v)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(item):
            nested = typing.cast(type[Any], item)
            return lambda v: tuple(x if isinstance(x, nested) else build(nested, x) for x in v)
        convert_item = _converter(item)
        return lambda v: tuple(convert_item(x) for x in v)
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint):
            nested_cls = hint
            return lambda v: v if isinstance(v, nested_cls) else build(nested_cls, v)
        if issubclass(hint, ErrorCode):
            return lambda v: v if isinstance(v, ErrorCode) else ErrorCode(int(v))
        if issubclass(hint, datetime.timedelta):
            return lambda v: v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=v)
        if hint is uuid.UUID:
            return lambda v: v if isinstance(v, uuid.UUID) else uuid.UUID(bytes=v)
    return _identity


def _identity(value: Any) -> Any:
    return value
