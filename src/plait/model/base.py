"""The base of every user-written value (specs a person or a program submits).

Values are frozen pydantic models: validated once, when they are built, with errors
that name the field; hashable, so the allocator can key its cache on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, get_args

import pydantic

from plait.errors import ValidationError


class Input(pydantic.BaseModel):
    """What a request carries: unknown fields are an error, a number is finite, and
    a number field takes a number: ``true`` is not 1, nor ``"3"`` 3 (YAML's ``yes``
    is a bool too), as Kubernetes refuses them (pydantic's lax mode took them)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    @pydantic.field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        kind = type(value)
        if (kind is bool or kind is str) and info.field_name in _numeric_fields(cls):
            raise ValueError(f"a number, not {value!r}"[:80])
        return value


class Value(Input):
    """A frozen, strictly-shaped value (an ``Input``): no text holds a NUL byte either
    (a C string ends there: a name that means one thing to plait and another to the
    kernel or a shell)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @pydantic.field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if _holds_nul(value):
            raise ValueError("text must not hold a NUL byte")
        return value


_NUMBERS = frozenset({int, float})
_numeric: dict[type, frozenset[str]] = {}


def _numeric_fields(cls: type[pydantic.BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` that hold a number and nothing else (None aside)."""
    found = _numeric.get(cls)
    if found is None:
        names = set()
        for name, f in cls.model_fields.items():
            kinds = {a for a in (get_args(f.annotation) or (f.annotation,))
                     if a is not type(None)}
            if kinds and kinds <= _NUMBERS:
                names.add(name)
        found = _numeric[cls] = frozenset(names)
    return found


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, tuple | list):
        return any(isinstance(v, str) and "\x00" in v for v in value)
    if isinstance(value, Mapping):
        return any("\x00" in k or (isinstance(v, str) and "\x00" in v)
                   for k, v in value.items() if isinstance(k, str))
    return False


V = TypeVar("V", bound=Value)


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def parse(kind: type[V], data: Any) -> V:
    """Build ``kind`` from plain data (a dict from JSON or YAML).

    Raises ``plait.errors.ValidationError`` naming the first offending field, e.g.
    ``resources.cpu: Input should be greater than 0``, and the others after it (a
    misspelt field is a required one missing and an unknown one given: both are said).
    """
    if not isinstance(data, dict):
        raise ValidationError("", f"{kind.__name__} must be an object, got {type(data).__name__}")
    try:
        return kind.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = exc.errors()

        def said(e: Any) -> str:
            msg = str(e["msg"])
            return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
        first = errors[0]
        msg = said(first)
        more = [f"{_dotted(tuple(e['loc']))}: {said(e)}" for e in errors[1:10]]
        if len(errors) > 10:
            more.append(f"and {len(errors) - 10} more")
        raise ValidationError(_dotted(tuple(first["loc"])),
                              "; ".join([msg, *more])) from None


def build(kind: type[V], **fields: Any) -> V:
    """Like ``parse`` for keyword arguments: ``build(Resources, cpu=1)``."""
    return parse(kind, fields)
