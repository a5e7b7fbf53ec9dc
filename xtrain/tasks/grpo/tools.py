"""The tools of an agent's episodes (``grpo.tools``, ``xtrain predict --tools``): the user's Python
functions, found, described and run.

- found: ``path/to/tools.py:function`` (from the config's folder, else the current one) or
  ``package.module:function``, imported when the config is checked (``resolve``: before any model
  loads, in every process) as reward functions are; a missing one is one line at the dry run.
- described: each one's JSON schema from its signature and docstring (transformers'
  ``get_json_schema``: type hints and an ``Args:`` line per argument), or the ``data.tools`` file's
  schema of that name, which wins; the schemas go to the chat template as ``tools=``.
- run (``Runner.call``): in a thread of the training process (no sandbox: they are the user's own
  functions; an ``async def`` tool runs in that thread's own event loop), with a time limit per
  call. What the model reads back is text: a string returned as
  it is, anything else as JSON; an exception, an unknown function, arguments that do not fit, or a
  call past its time limit become an ``error: ...`` result, as a real agent would see them. A
  result longer than ``RESULT_CHARS`` is cut (a tool that floods), what a tool prints is kept out
  of the console (counted), and a tool whose calls keep hanging stops the run in one line naming
  it (``ToolHung``: its threads cannot be stopped; the last checkpoint stays). What happened goes
  into one line per tool after an evaluation (``Runner.notes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.tasks.grpo.rewards import find_function

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig

KEY = "grpo.tools"
HINT = "grpo.tools takes path/to/tools.py:function or package.module:function"
RESULT_CHARS = 20_000  # a result past this is cut: a flooding tool cannot fill the episode's memory
HUNG_LIMIT = 4  # calls of one tool still running after their time limit: the run stops
Schema = dict[str, Any]


class ToolHung(XtrainError):
    """A tool whose calls do not come back (one line naming it; the run stops, resumable)."""


@dataclass(frozen=True)
class Tool:
    name: str  # what the model calls it: the function's name in the spec
    spec: str  # as grpo.tools names it
    fn: Callable[..., Any]
    schema: Schema  # {"type": "function", "function": {name, description, parameters}}


def specs(value: str | list[str] | None) -> list[str]:
    """``grpo.tools`` (one spec or a list) as a list."""
    return [value] if isinstance(value, str) else list(value or [])


def schema_of(fn: Callable[..., Any], name: str, spec: str, key: str = KEY) -> Schema:
    """``fn``'s JSON schema from its signature and docstring (transformers' ``get_json_schema``),
    named ``name``; one line when it cannot be derived."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers' parsing errors: said in one line
        raise XtrainError(
            f"{key}: {spec} has no JSON schema from its signature and docstring: {e}",
            "give every argument a type hint and a line under 'Args:' in its docstring, or its "
            "schema in the data.tools file",
        ) from None
    schema["function"]["name"] = name
    schema["function"].pop("return", None)  # (not a part of OpenAI's schema; templates skip it)
    return schema


def resolve(tool_specs: list[str], schemas_file: str | None, key: str = KEY) -> list[Tool]:
    """The tools ``tool_specs`` names (``key``: where, in a refusal), each found and described
    (``data.tools`` schemas first)."""
    from xtrain.data.rows.tools import read_tools_file

    given = {s["function"]["name"]: s for s in read_tools_file(schemas_file, "data.tools") or []} if (
        schemas_file
    ) else {}  # fmt: skip
    out: list[Tool] = []
    for spec in tool_specs:
        fn = find_function(spec, key, HINT, "tool")
        name = spec.rpartition(":")[2]
        if any(t.name == name for t in out):
            raise XtrainError(f"{key}: two tools are named '{name}'", "the model calls a tool by its name")
        schema = given.get(name) or schema_of(fn, name, spec, key)
        out.append(Tool(name, spec, fn, schema))
    unknown = sorted(set(given) - {t.name for t in out})
    if unknown:
        raise XtrainError(
            f"data.tools declares {', '.join(unknown)}, which {KEY} does not name: the model would "
            "call a function that is not there",
            f"add it to {KEY}, or remove its schema from the file",
        )
    return out


def from_config(cfg: TrainConfig) -> list[Tool]:
    return resolve(specs(cfg.grpo.tools), cfg.data.tools)


def settings(cfg: TrainConfig) -> str:
    """The dry run's words on the episodes (after the generation settings; "" without tools)."""
    g = cfg.grpo
    if not specs(g.tools):
        return ""
    shown = ", ".join(_signature(t.schema) for t in from_config(cfg))
    return (
        f"; episodes of up to {g.max_turns} turns and {g.max_episode_length} tokens, "
        f"{g.max_tool_calls} tool calls of up to {g.tool_timeout:g} s each; tools: {shown}"
    )


def _signature(schema: Schema) -> str:
    f = schema["function"]
    return f"{f['name']}({', '.join((f.get('parameters') or {}).get('properties') or {})})"


# -- running ------------------------------------------------------------------------------------------
_current = threading.local()  # .tool: the tool a thread runs (its prints are counted, not shown)


class _Diverted:
    """``sys.stdout``/``sys.stderr`` while tools run: a tool thread's writes are counted and
    dropped, every other thread's go through (the progress display, the loop)."""

    def __init__(self, real: Any, printed: dict[str, int]) -> None:
        self.real, self.printed = real, printed

    def write(self, text: str) -> int:
        name = getattr(_current, "tool", None)
        if name is None:
            return self.real.write(text)
        self.printed[name] = self.printed.get(name, 0) + len(text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@dataclass
class Usage:
    """One tool's calls since the last notes: how many, and how many failed each way."""

    calls: int = 0
    raised: int = 0
    timed_out: int = 0
    cut: int = 0
    first_error: str = ""


@dataclass
class Result:
    text: str  # what the model reads
    ok: bool  # the function ran and returned in time


@dataclass
class Runner:
    """Runs the calls of an episode's turns (``call``), inside ``session`` (prints kept out)."""

    tools: list[Tool]
    timeout: float
    usage: dict[str, Usage] = field(default_factory=dict)
    printed: dict[str, int] = field(default_factory=dict)
    hung: dict[str, list[threading.Thread]] = field(default_factory=dict)
    where: str = ""  # the step, for ToolHung's line

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """While the calls of a turn run: what a tool thread prints is counted, not shown."""
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Diverted(saved[0], self.printed), _Diverted(saved[1], self.printed)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved

    def call(self, name: str, arguments: dict[str, Any]) -> Result:
        """One call, as the model reads its outcome (module docstring)."""
        tool = self.by_name.get(name)
        if tool is None:
            known = ", ".join(self.by_name) or "none"
            return Result(f"error: there is no tool named {name!r} (tools: {known})", False)
        usage = self.usage.setdefault(name, Usage())
        usage.calls += 1
        box: dict[str, Any] = {}

        def run() -> None:
            _current.tool = name
            try:
                value = tool.fn(**arguments)
                box["value"] = asyncio.run(value) if inspect.iscoroutine(value) else value  # an async tool
            except BaseException as e:  # noqa: BLE001 - the model reads it (SystemExit too)
                box["error"] = e

        thread = threading.Thread(target=run, name=f"xtrain-tool-{name}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            return self._timed_out(tool, usage, thread)
        if "error" in box:
            e = box["error"]
            text = f"error: {type(e).__name__}: {e}"
            usage.raised += 1
            usage.first_error = usage.first_error or text[7:]
            return Result(self._cut(text, usage), False)
        return Result(self._cut(as_text(box.get("value")), usage), True)

    def _timed_out(self, tool: Tool, usage: Usage, thread: threading.Thread) -> Result:
        usage.timed_out += 1
        running = [t for t in self.hung.get(tool.name, []) if t.is_alive()] + [thread]
        self.hung[tool.name] = running
        if len(running) >= HUNG_LIMIT:
            raise ToolHung(
                f"tool {tool.spec} hangs: {len(running)} of its calls are still running past "
                f"grpo.tool_timeout={self.timeout:g} s{self.where}",
                "fix the tool (or raise grpo.tool_timeout); the run resumes from its last checkpoint "
                "with the same command",
            )
        return Result(f"error: {tool.name} did not return within {self.timeout:g} s", False)

    @staticmethod
    def _cut(text: str, usage: Usage) -> str:
        if len(text) <= RESULT_CHARS:
            return text
        usage.cut += 1
        return f"{text[:RESULT_CHARS]} ... [cut: {len(text) - RESULT_CHARS} more characters]"

    def notes(self) -> list[str]:
        """One line per tool that failed, was cut or printed since the last notes (then reset)."""
        out = []
        for name, u in sorted(self.usage.items()):
            parts = []
            if u.raised:
                parts.append(f"{u.raised} raised (first: {u.first_error})")
            if u.timed_out:
                parts.append(f"{u.timed_out} did not return within grpo.tool_timeout={self.timeout:g} s")
            if u.cut:
                parts.append(f"{u.cut} results over {RESULT_CHARS} characters were cut")
            if parts:
                out.append(
                    f"grpo.tools: {name}: of {u.calls} calls, {'; '.join(parts)}: the model read each "
                    "as the call's result"
                )
        for name, size in sorted(self.printed.items()):
            out.append(
                f"grpo.tools: {name} printed {size} characters, not shown (what a tool returns is its result)"
            )
        self.usage = {}
        self.printed.clear()  # (in place: a session still running counts into it)
        return out


def as_text(value: Any) -> str:
    """A tool's return value as the model reads it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # circular, or a key JSON cannot hold
        return str(value)
