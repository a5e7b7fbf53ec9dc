"""A small evaluator of Go's text/template, the subset the Ollama templates of xtrain/export use
(``if``/``else if``/``else``/``range``/``end``, variables declared and assigned, fields, ``$``,
``eq ne and or not len slice index json``), so tests render a Modelfile's TEMPLATE without Go.
Data are plain dicts: a Go field name is looked up as its snake_case key (``.ToolCalls`` ->
``tool_calls``, ``.Function.Name`` -> ``function.name``, ``.ID`` -> ``id``), as Ollama's types map
to the OpenAI-style rows. ``json`` is given by the caller (Jinja's ``tojson`` spacing, to compare
structure with the Jinja template and not Go's compact JSON)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\(|\)|,|:=|=|-?\d+|\$?[\w.$]*)')


def _snake(name: str) -> str:
    return {"ID": "id", "ToolCallID": "tool_call_id"}.get(name) or re.sub(
        r"(?<!^)([A-Z])", r"_\1", name
    ).lower()


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        for key in (name, _snake(name)):
            if key in obj:
                return obj[key]
        return None
    raise AssertionError(f"field {name} of {obj!r}")


def _truth(v: Any) -> bool:
    return bool(v) if v is not None else False


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if not m or not m.group(1):
            if text[at:].strip():
                raise AssertionError(f"cannot read {text[at:]!r}")
            break
        out.append(m.group(1))
        at = m.end()
    return out


class Template:
    def __init__(self, source: str, json: Callable[[Any], str]):
        parts = _ACTION.split(source)  # text, action, text, action, ...
        self.items = [(k % 2 == 1, p) for k, p in enumerate(parts)]
        self.json = json
        self.pos = 0
        self.tree = self._block(())
        assert self.pos == len(self.items), "unbalanced template"

    # parsing into nodes: ("text", s) ("expr", tokens) ("if", [(cond, body)...], else) ("range", ...)
    def _block(self, stops: tuple[str, ...]) -> list[Any]:
        nodes: list[Any] = []
        while self.pos < len(self.items):
            is_action, text = self.items[self.pos]
            if not is_action:
                nodes.append(("text", text))
                self.pos += 1
                continue
            toks = _tokens(text)
            if toks and toks[0] in stops or toks[:2] == ["else", "if"] and "else" in stops:
                return nodes
            self.pos += 1
            if toks[0] == "if":
                nodes.append(self._if(toks[1:]))
            elif toks[0] == "range":
                body = self._block(("end",))
                self.pos += 1
                nodes.append(("range", toks[1:], body))
            else:
                nodes.append(("expr", toks))
        assert not stops, f"missing {stops}"
        return nodes

    def _if(self, cond: list[str]) -> Any:
        branches, other = [], []
        body = self._block(("else", "end"))
        branches.append((cond, body))
        while True:
            toks = _tokens(self.items[self.pos][1])
            self.pos += 1
            if toks[0] == "end":
                return ("if", branches, other)
            if toks[:2] == ["else", "if"]:
                branches.append((toks[2:], self._block(("else", "end"))))
            else:
                other = self._block(("end",))

    def render(self, data: dict[str, Any]) -> str:
        out: list[str] = []
        self._run(self.tree, data, [{"$": data}], out)
        return "".join(out)

    def _run(self, nodes: list[Any], dot: Any, scopes: list[dict[str, Any]], out: list[str]) -> None:
        for node in nodes:
            if node[0] == "text":
                out.append(node[1])
            elif node[0] == "expr":
                toks = node[1]
                if len(toks) > 2 and toks[1] in (":=", "="):
                    value = self._eval(toks[2:], dot, scopes)
                    if toks[1] == ":=":
                        scopes[-1][toks[0]] = value
                    else:
                        next(s for s in reversed(scopes) if toks[0] in s)[toks[0]] = value
                else:
                    value = self._eval(toks, dot, scopes)
                    out.append("" if value is None else str(value))
            elif node[0] == "if":
                for cond, body in node[1]:
                    if _truth(self._eval(cond, dot, scopes)):
                        self._run(body, dot, [*scopes, {}], out)
                        break
                else:
                    self._run(node[2], dot, [*scopes, {}], out)
            else:  # range
                toks, body = node[1], node[2]
                names: list[str] = []
                if ":=" in toks:
                    names = [t for t in toks[: toks.index(":=")] if t != ","]
                    toks = toks[toks.index(":=") + 1 :]
                over = self._eval(toks, dot, scopes)
                pairs = sorted(over.items()) if isinstance(over, dict) else list(enumerate(over or []))
                for key, value in pairs:
                    scope = (
                        dict(zip(names, (key, value), strict=True))
                        if len(names) == 2
                        else dict.fromkeys(names, value)
                    )
                    self._run(body, value, [*scopes, scope], out)

    def _eval(self, toks: list[str], dot: Any, scopes: list[dict[str, Any]]) -> Any:
        args, at = [], 0
        while at < len(toks):
            t = toks[at]
            if t == "(":
                depth, end = 1, at + 1
                while depth:
                    depth += {"(": 1, ")": -1}.get(toks[end], 0)
                    end += 1
                args.append(("v", self._eval(toks[at + 1 : end - 1], dot, scopes)))
                at = end
                continue
            args.append(
                ("f", t)
                if re.fullmatch(r"[a-z]+", t) and t not in ("true", "false", "nil")
                else ("v", self._term(t, dot, scopes))
            )
            at += 1
        if args[0][0] == "f":
            return self._call(args[0][1], [v for _, v in args[1:]])
        assert len(args) == 1, toks
        return args[0][1]

    def _term(self, t: str, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        if t.startswith('"'):
            return bytes(t[1:-1], "utf-8").decode("unicode_escape")
        if re.fullmatch(r"-?\d+", t):
            return int(t)
        if t in ("true", "false", "nil"):
            return {"true": True, "false": False, "nil": None}[t]
        if t == ".":
            return dot
        head, *fields = t.split(".")
        value = next(s[head] for s in reversed(scopes) if head in s) if head.startswith("$") else dot
        for name in fields:
            value = _field(value, name)
        return value

    def _call(self, name: str, a: list[Any]) -> Any:
        if name == "and":
            return next((v for v in a if not _truth(v)), a[-1])
        if name == "or":
            return next((v for v in a if _truth(v)), a[-1])
        funcs: dict[str, Callable[..., Any]] = {
            "eq": lambda x, *ys: any(x == y for y in ys),
            "ne": lambda x, y: x != y,
            "not": lambda x: not _truth(x),
            "len": len,
            "slice": lambda x, i: x[i:],
            "index": lambda x, i: x[i],
            "json": self.json,
        }
        return funcs[name](*a)
