"""The spec reference, generated from the models themselves: every field of a job
spec and of an entitlement with its type, default, bounds and one line of meaning
(the ``#:`` comment above the field, or its ``description``). ``plait explain`` prints
it (``plait explain job.update.max_unavailable``, as ``kubectl explain`` does), and
``docs/spec-reference.md`` is this module's Markdown, kept equal by a test.
"""

from __future__ import annotations

import ast
import enum
import inspect
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import annotated_types
import pydantic
from pydantic.fields import FieldInfo

from plait.errors import NotFound
from plait.model.entitlement import Entitlement
from plait.model.job import JobSpec

#: the documents a user writes, by the name ``plait explain`` knows them by
ROOTS: dict[str, type[pydantic.BaseModel]] = {"job": JobSpec, "entitlement": Entitlement}


@dataclass(frozen=True)
class Field:
    path: str
    #: its type, in words
    kind: str
    default: str
    bounds: str
    meaning: str
    #: the model of a nested object (its fields are explained under ``path``)
    model: type[pydantic.BaseModel] | None


def explain(path: str) -> tuple[str, list[Field]]:
    """What ``path`` (``job``, ``job.update``, ``entitlement.quota.machines``) is: a
    paragraph, and the fields it holds (or the one field it names)."""
    root, *parts = path.strip().split(".")
    model = ROOTS.get(root)
    if model is None:
        raise NotFound("document", f"{root} (known: {', '.join(ROOTS)})")
    done = root
    for part in parts:
        found = {f.path.rsplit(".", 1)[-1]: f for f in fields(model, done)}
        if part not in found:
            raise NotFound("field", f"{done}.{part}", f"{done} has no field {part!r} (its "
                                                      f"fields: {', '.join(found)})")
        field = found[part]
        done = field.path
        if field.model is None:
            if part != parts[-1]:
                raise NotFound("field", f"{done}.{parts[parts.index(part) + 1]}")
            return field.meaning, [field]
        model = field.model
    return _doc(model), fields(model, done)


def fields(model: type[pydantic.BaseModel], prefix: str) -> list[Field]:
    comments = _comments(model)
    found = []
    for name, info in model.model_fields.items():
        nested = _model_of(info.annotation)
        meaning = info.description or comments.get(name) or (
            _doc(nested).split(". ")[0] if nested is not None else "")
        meaning = meaning.replace("``", "`")
        found.append(Field(f"{prefix}.{name}", _type(info.annotation), _default(info),
                           _bounds(info), meaning, nested))
    return found


def markdown() -> str:
    """The whole reference, one table per object."""
    out = ["# Spec reference", "",
           "Every field of a job spec and of an entitlement, generated from the models",
           "(`plait explain PATH` prints the same, e.g. `plait explain job.update`).", ""]
    todo = [(name, model) for name, model in ROOTS.items()]
    while todo:
        path, model = todo.pop(0)
        out += [f"## `{path}`", "", _doc(model), "",
                "| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        nested: list[tuple[str, type[pydantic.BaseModel]]] = []
        for f in fields(model, path):
            cells = [f"`{f.path.rsplit('.', 1)[-1]}`", f.kind, f.default or "required",
                     f.bounds, f.meaning]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            if f.model is not None:
                nested.append((f.path, f.model))
        out.append("")
        todo = nested + todo
    return "\n".join(out).rstrip() + "\n"


# -- what a field says about itself ----------------------------------------------------------
def _doc(model: type[Any]) -> str:
    return " ".join(inspect.cleandoc(model.__doc__ or "").split()).replace("``", "`")


@cache
def _comments(model: type[Any]) -> dict[str, str]:
    """The ``#:`` comment above each field of the class (and of its bases)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls is object or not issubclass(cls, pydantic.BaseModel) or cls.__module__.startswith(
                "pydantic"):
            continue
        try:
            lines, _ = inspect.getsourcelines(cls)
        except (OSError, TypeError):
            continue
        source = textwrap.dedent("".join(lines))
        tree = ast.parse(source)
        text = source.splitlines()
        for node in ast.iter_child_nodes(tree.body[0]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                above: list[str] = []
                k = node.lineno - 2
                while k >= 0 and text[k].strip().startswith("#:"):
                    above.insert(0, text[k].strip()[2:].strip())
                    k -= 1
                if above:
                    found[node.target.id] = " ".join(above)
    return found


def _model_of(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The model a field holds: itself, or inside ``X | None`` or a list of X."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type(a) for a in args)
    if origin is tuple:
        return f"list of {_type(args[0])}" if args else "list"
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return f"map of {_type(args[0])} to {_type(args[1])}" if args else "map"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return " or ".join(repr(m.value) for m in annotation)
        if issubclass(annotation, pydantic.BaseModel):
            return "object"
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return ""
    value = info.get_default(call_default_factory=True)
    if isinstance(value, pydantic.BaseModel):
        return "(see its fields)"
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if isinstance(value, tuple) and value and isinstance(value[0], pydantic.BaseModel):
        return ", ".join(str(v) for v in value)
    if isinstance(value, Mapping | tuple) and not value:
        return "empty"
    return "null" if value is None else repr(value)


def _bounds(info: FieldInfo) -> str:
    said = _said(info.metadata)
    origin, args = typing.get_origin(info.annotation), typing.get_args(info.annotation)
    if origin in (typing.Union, types.UnionType):  # (``X | None``: X's own constraints)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            origin, args = typing.get_origin(inner[0]), typing.get_args(inner[0])
    if origin is tuple and args:
        item = _said(_constraints(args[0]))
        said += [f"each {w}" for w in item]
    elif origin is not None and isinstance(origin, type) and issubclass(origin, Mapping) \
            and len(args) == 2:
        said += [f"keys {w}" for w in _said(_constraints(args[0]))]
        said += [f"values {w}" for w in _said(_constraints(args[1]))]
    return ", ".join(dict.fromkeys(said))


def _constraints(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Annotated:
        return list(typing.get_args(annotation)[1:])
    return []


def _said(metadata: list[Any]) -> list[str]:
    said = []
    for m in metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None:
                said.append(f"{word} {value:g}")
        if isinstance(m, annotated_types.MinLen) and m.min_length:
            said.append(f"at least {m.min_length} long")
        if isinstance(m, annotated_types.MaxLen):
            said.append(f"at most {m.max_length:,} long")
        if isinstance(m, pydantic.StringConstraints):
            if m.min_length:
                said.append(f"at least {m.min_length:,} characters")
            if m.max_length is not None:
                said.append(f"at most {m.max_length:,} characters")
    return said
