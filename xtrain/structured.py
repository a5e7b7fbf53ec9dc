"""The one reader of the structured files xtrain reads: YAML (train configs, ``key=value``
overrides, accelerate's default config) and JSON (facts snapshots, checkpoint state).

- YAML through PyYAML's ``SafeLoader`` only (plain data: no ``!!python`` tags), with the
  refusals PyYAML does not make: a key written twice in one mapping (PyYAML keeps the last one
  silently), nesting deeper than ``MAX_DEPTH`` (PyYAML's composer recurses: a deep file ends
  in ``RecursionError``), and aliases that expand to more than ``MAX_NODES`` values or into
  themselves ("billion laughs": ``b: &b [*a, *a, ...]`` nine times over is a few lines that
  expand to billions; PyYAML builds shared objects, but whatever walks or prints them expands
  them). The expansion is measured on the composed node graph, before anything is built.
- JSON with the same two refusals (``json`` recurses too).
- Typed fields: ``field_error`` says in one line why a value is not of a dataclass field's type
  (the value cut to ~80 characters: ``errors.shown``).

Every refusal is one ``XtrainError`` line naming the file (``name``: "config file F"), and the
key and line where known. Imports nothing heavy: config loading imports no torch.
"""

from __future__ import annotations

import json
import types
import typing
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError, shorten

if TYPE_CHECKING:
    import yaml

# Deeper than any real config, snapshot or state (they nest 3-4 levels), far below Python's stack
MAX_DEPTH = 64
# Values (scalars, lists, mappings, keys) a YAML document may hold once its aliases are expanded:
# a real config or accelerate file holds a few hundred.
MAX_NODES = 10_000


class StructureError(ValueError):
    """A document PyYAML or json would read but xtrain refuses (the subclasses say why)."""


class TooDeep(StructureError):
    """Nesting beyond MAX_DEPTH (``line``: where it went too deep, 1-based, when known)."""

    def __init__(self, line: int | None = None) -> None:
        super().__init__(f"nests deeper than {MAX_DEPTH} levels")
        self.line = line


class TooLarge(StructureError):
    """Aliases that expand to more than MAX_NODES values (``line``: the anchored value's, 1-based)."""

    def __init__(self, line: int | None = None) -> None:
        super().__init__(f"expands to more than {MAX_NODES} values through its aliases (*name)")
        self.line = line


class SelfAlias(StructureError):
    """An alias inside the value of its own anchor (``a: &x [*x]``): it expands without end."""

    def __init__(self, line: int | None = None) -> None:
        super().__init__("has an alias inside its own anchor's value (it expands without end)")
        self.line = line


class DuplicateKey(StructureError):
    """A mapping with the same key twice (``lines``: both places, 1-based, when known)."""

    def __init__(self, key: Any, lines: tuple[int, int] | None = None) -> None:
        super().__init__(f"has the key {key!r} twice")
        self.key, self.lines = key, lines


def _strict_loader() -> type:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that counts its nesting and refuses a key written twice."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.depth = 0

        def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise TooDeep(self.peek_event().start_mark.line + 1)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor` merges on purpose; explicit keys override it
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKey(key, (seen[key], line))
                    seen[key] = line
                except TypeError:
                    continue  # an unhashable key: SafeLoader refuses it below, with its mark
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


_LOADER: type | None = None


def _children(node: yaml.Node) -> list[yaml.Node]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_expansion(root: yaml.Node | None) -> None:
    """Refuse a composed YAML node graph that, with its aliases expanded, holds more than
    ``MAX_NODES`` nodes, nests deeper than ``MAX_DEPTH`` or reaches itself. An alias is the same
    node object as its anchor, so each node's expanded size is counted once (memoised) and the
    walk costs the graph's size, not the expansion's. Iterative: no recursion to exhaust."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    open_: set[int] = set()  # nodes whose children are being counted: meeting one again is a cycle
    stack: list[tuple[yaml.Node | None, bool]] = [(root, False)]
    while stack:
        node, finish = stack.pop()
        key = id(node)
        line = node.start_mark.line + 1
        if finish:
            kids = [done[id(k)] for k in _children(node)]
            size = 1 + sum(s for s, _ in kids)
            depth = 1 + max((d for _, d in kids), default=0)
            if size > MAX_NODES:
                raise TooLarge(line)
            if depth > MAX_DEPTH:
                raise TooDeep(line)
            done[key] = (size, depth)
            open_.discard(key)
            continue
        if key in done:
            continue
        if key in open_:
            raise SelfAlias(line)
        open_.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_:
                raise SelfAlias(child.start_mark.line + 1)
            if id(child) not in done:
                stack.append((child, False))


def load_yaml(text: str) -> Any:
    """Plain data from YAML text; raises ``yaml.YAMLError`` or a ``StructureError`` (a key
    twice, too deep, aliases that expand too far or into themselves) before building anything."""
    global _LOADER
    if _LOADER is None:
        _LOADER = _strict_loader()
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(text: str, name: str) -> Any:
    """``load_yaml`` with every refusal as one line naming ``name`` (e.g. "config file F")."""
    import yaml

    try:
        return load_yaml(text)
    except DuplicateKey as e:
        where = f" (lines {e.lines[0]} and {e.lines[1]})" if e.lines else ""
        raise XtrainError(
            f"{name} has the key {e.key!r} twice{where}", "keep one of them: YAML would silently use the last"
        ) from None
    except TooDeep as e:
        raise XtrainError(
            f"{name} nests deeper than {MAX_DEPTH} levels" + (f" at line {e.line}" if e.line else ""),
            "a config is a few levels deep: check the brackets and indentation",
        ) from None
    except (TooLarge, SelfAlias) as e:
        raise XtrainError(
            f"{name} {e}" + (f" at line {e.line}" if e.line else ""),
            "write the values out, or alias whole sections only: a config holds a few hundred values",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise XtrainError(f"{name} is not valid YAML{at}: {problem}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def load_json(text: str) -> Any:
    """Plain data from JSON text; raises ``json.JSONDecodeError``, ``DuplicateKey`` or ``TooDeep``."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:  # json's decoder recurses per level; Python's limit stops it cleanly
        raise TooDeep() from None
    stack = [(data, 1)]  # the same limit as YAML's, counted without recursion
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooDeep()
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
    return data


def read_json(text: str, name: str, hint: str | None = None) -> Any:
    """``load_json`` with every refusal as one line naming ``name`` (e.g. "facts file F")."""
    try:
        return load_json(text)
    except json.JSONDecodeError as e:
        raise XtrainError(f"{name} is not valid JSON (line {e.lineno}: {e.msg})", hint) from None
    except StructureError as e:
        raise XtrainError(f"{name} {e}", hint) from None


def field_error(value: Any, tp: Any) -> str | None:
    """Why ``value`` is not of type ``tp`` (int, float, str, bool, None, list[...], dict[...],
    tuple[...], unions; ``Any`` takes anything), or None when it is. JSON's numbers: an int is a
    valid float; a bool is never a number."""
    if tp is Any or tp is object:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = [field_error(value, t) for t in typing.get_args(tp)]
        return None if None in errors else errors[0]
    if tp is type(None):
        return None if value is None else f"null expected, got {_show(value)}"
    if tp is bool:
        return None if isinstance(value, bool) else f"true or false expected, got {_show(value)}"
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"an integer expected, got {_show(value)}"
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"a number expected, got {_show(value)}"
    if tp is str:
        return None if isinstance(value, str) else f"text expected, got {_show(value)}"
    if origin in (list, tuple):
        if not isinstance(value, list):
            return f"a list expected, got {_show(value)}"
        args = typing.get_args(tp)
        item = args[0] if args and (origin is list or (len(args) == 2 and args[1] is Ellipsis)) else None
        if origin is tuple and item is None and args:
            if len(value) != len(args):
                return f"a list of {len(args)} expected, got {_show(value)}"
            return next((e for e in map(field_error, value, args) if e), None)
        return next((e for e in (field_error(v, item) for v in value) if e), None) if item else None
    if origin is dict:
        if not isinstance(value, dict):
            return f"a mapping expected, got {_show(value)}"
        _, item = typing.get_args(tp) or (str, Any)
        return next((e for e in (field_error(v, item) for v in value.values()) if e), None)
    return None  # other annotations: not checked here


def _show(value: Any) -> str:
    """A value of a JSON file (JSON's spelling: true, null) in an error line, cut to ~80 characters."""
    return shorten(json.dumps(value, default=str) if not isinstance(value, str) else repr(value))
