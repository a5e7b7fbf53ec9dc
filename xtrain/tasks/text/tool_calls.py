"""A model's tool calls read back from its text, in the formats the shipped templates teach
(xtrain/data/templates): Qwen's / Hermes' ``<tool_call>{"name", "arguments"}</tool_call>``,
Mistral's ``[TOOL_CALLS] [{"name", "arguments"}]`` (the marker may be decoded away as a special
token: a bare JSON list of calls reads the same), Llama 3.1's one ``{"name", "parameters"}``
object (after ``<|python_tag|>`` or alone). ``xtrain predict`` shows a parsed call, and ``--data``
scores calls against a row's reference call (name and arguments exact match). Pure functions."""

from __future__ import annotations

import json
import re
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"

Call = dict[str, Any]  # {"name": str, "arguments": dict}


def _call(obj: Any) -> Call | None:
    if not isinstance(obj, dict):
        return None
    function = obj.get("function") if isinstance(obj.get("function"), dict) else obj
    name = function.get("name")
    args = function.get("arguments", function.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    return {"name": name, "arguments": args}


def _calls(obj: Any) -> list[Call] | None:
    items = obj if isinstance(obj, list) else [obj]
    found = [_call(x) for x in items]
    return found if found and all(c is not None for c in found) else None  # type: ignore[return-value]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse(text: str) -> list[Call] | None:
    """The calls a generated text makes, or None when it makes none (an answer in words)."""
    text = text.strip()
    if "<tool_call>" in text:
        found = [_calls(_json(m)) for m in _TAGGED.findall(text)]
        return [c for group in found if group for c in group] or None
    if text.startswith(_MISTRAL):
        text = text[len(_MISTRAL) :].strip()
    if text.startswith(_PYTHON_TAG):
        text = text[len(_PYTHON_TAG) :].strip()
    if text[:1] in "[{":
        return _calls(_json(text))
    return None


def reference(calls: list[dict[str, Any]]) -> str:
    """A row's reference calls (``{"function": {...}}`` or ``{"name", "arguments"}``) as the text
    the scores compare: a JSON list of ``{"name", "arguments"}``."""
    found = _calls(calls) or []
    return json.dumps(found, ensure_ascii=False, sort_keys=True)


def shown(calls: list[Call]) -> str:
    """One line: ``get_weather {"city": "oslo"}; set_timer {"minutes": 5}``."""
    return "; ".join(f"{c['name']} {json.dumps(c['arguments'], ensure_ascii=False)}" for c in calls)


def call_exact_match(refs: list[str], outputs: list[str]) -> float | None:
    """The share of rows whose reference is a call list (``reference``) where the output makes
    exactly those calls (names and arguments); None when no reference is a call."""
    pairs = [(json.loads(r), o) for r, o in zip(refs, outputs, strict=True) if is_reference(r)]
    if not pairs:
        return None
    return sum(parse(o) == ref for ref, o in pairs) / len(pairs)


def is_reference(text: str | None) -> bool:
    if not text or not text.startswith("[{"):
        return False
    found = _json(text)
    return isinstance(found, list) and _calls(found) == found
