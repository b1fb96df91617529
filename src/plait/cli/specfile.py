"""Reading the files people hand the CLI (job specs, entitlements): bounded, text
only, and strict about what YAML lets slip.

* at most ``MAX_BYTES`` are read (the API takes no larger body): ``/dev/zero`` or a
  multi-gigabyte file is refused, not read into memory;
* a file that is not UTF-8 text is refused;
* a key given twice in one mapping is an error (YAML keeps the last one silently: a
  file with ``name: x`` and then ``name: web`` would update ``web``);
* nesting too deep for the parser is refused, not a traceback.

Imported by the fast ``plait job deploy`` too, so it loads nothing heavy until a
YAML file needs the YAML parser.
"""

from __future__ import annotations

import json
import os

#: the largest file read (the API refuses larger bodies anyway)
MAX_BYTES = 1 << 20
#: the deepest nesting of ``[`` and ``{`` accepted (a spec needs a handful; the C YAML
#: parser would overflow its stack on a few hundred thousand)
MAX_DEPTH = 64


class SpecError(ValueError):
    """A file that cannot be a spec; the message names the file and the problem."""


def read(path: str | os.PathLike[str]) -> str:
    """The file's text (``-``: standard input), at most ``MAX_BYTES``."""
    try:
        if str(path) == "-":
            import sys

            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise SpecError(f"{path} is larger than {MAX_BYTES // 1024} KiB: not a spec")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not UTF-8 text") from None
    if "\x00" in text:
        raise SpecError(f"{path} holds NUL bytes: not a spec")
    return text


def check_depth(text: str, path: str | os.PathLike[str]) -> None:
    """Refuse flow nesting (``[[[...``, ``{"a": {"a": ...``) deeper than ``MAX_DEPTH``,
    before any parser recurses into it; quoted strings and comments do not count."""
    depth = 0
    quote = ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1  # (an escaped character)
            elif c == quote == "'" and text.startswith("''", i):
                i += 1  # ('' is a quote inside a single-quoted string)
            elif c == quote:
                quote = ""
        elif c in "\"'" and (i == 0 or text[i - 1] in " \t\n[{,:"):
            quote = c  # (only where a quoted string may start: "it's" is plain text)
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n"):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(f"{path} is nested too deeply (more than {MAX_DEPTH} levels)")
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise SpecError(f"key {key!r} is given twice")
        found[key] = value
    return found


def parse_json(text: str, path: str | os.PathLike[str]) -> object:
    check_depth(text, path)
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except RecursionError:
        raise SpecError(f"{path} is nested too deeply") from None
    except ValueError as exc:
        raise SpecError(f"{path} is not valid JSON: {exc}") from None


def parse_yaml(text: str, path: str | os.PathLike[str]) -> list[object]:
    """Every document of a YAML text (a JSON text is YAML too), the empty ones left
    out."""
    check_depth(text, path)
    import yaml

    try:
        return [d for d in yaml.load_all(text, Loader=_loader()) if d is not None]
    except RecursionError:
        raise SpecError(f"{path} is nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None)
        if mark is not None and problem:  # (one line: where, then what)
            raise SpecError(f"{path} is not valid YAML: line {mark.line + 1}, column "
                            f"{mark.column + 1}: {problem}") from None
        raise SpecError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None


_LOADER: type | None = None


def _loader() -> type:
    """A safe YAML loader (the C one when built) that refuses duplicate keys and reads
    ``1e6`` as a number (``plait.yamlfloats``)."""
    global _LOADER
    if _LOADER is None:
        import yaml

        from plait.yamlfloats import with_floats

        base = with_floats(getattr(yaml, "CSafeLoader", yaml.SafeLoader))

        class UniqueKeys(base):  # type: ignore[misc,valid-type]
            def construct_mapping(self, node: yaml.MappingNode,
                                  deep: bool = False) -> dict[object, object]:
                seen: set[object] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # (``<<``: merged keys may be given again)
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        duplicate = key in seen
                    except TypeError:  # an unhashable key: the base loader says why
                        continue
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} is given twice", key_node.start_mark)
                    seen.add(key)
                return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]

        _LOADER = UniqueKeys
    return _LOADER
