"""Agent rows: tool schemas, tool calls, tool results and reasoning, read into the one
``chat.Conversation`` that every chat row becomes (docs/agents.md).

The shapes read (each row's turns, ``data.messages_column`` or sharegpt's ``conversations``):

- OpenAI messages: an assistant turn with ``tool_calls`` (``[{id?, type?, function: {name,
  arguments}}]``, ``arguments`` an object or a JSON string), ``{"role": "tool", "content": ...,
  "tool_call_id"?, "name"?}`` results;
- LLaMA-Factory sharegpt: ``function_call`` turns (the value a JSON ``{name, arguments}`` or a list
  of them) and ``observation`` turns (the result);
- reasoning on an assistant turn: ``reasoning_content`` (DeepSeek, Qwen3), ``thinking`` or
  ``reasoning``;
- the tool schemas: the row's ``data.tools_column`` (``tools``: a list or a JSON string of
  ``{type: function, function: {...}}`` or bare ``{name, description, parameters}`` objects), else
  the one file ``data.tools`` for the whole data set.

What comes out is what transformers' chat templates expect: ``tools`` as
``{"type": "function", "function": {...}}``, each call ``{"id", "type": "function", "function":
{"name", "arguments": dict}}`` (an id made up where the row has none: ``call00001``, nine letters
and digits as Mistral's template wants), each result ``{"role": "tool", "content": str,
"tool_call_id", "name"}``, reasoning as ``reasoning_content``. A row without any of these goes
through ``chat.parse_conversation`` unchanged.

Checked here, one line naming the row (``BadConversation``): a call whose arguments are not a
JSON object, a result with no call before it or whose id matches no call, a conversation that
ends on a result (training: nothing after it to learn). ``undeclared`` lists the calls to
functions the row's tools do not declare (the data check's warning).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows.chat import BadConversation, Conversation, Encoded, Render, encode, parse_conversation
from xtrain.encoding import read_text
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import DataConfig

FUNCTION_CALL, OBSERVATION = "function_call", "observation"  # LLaMA-Factory's sharegpt speakers
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
AGENT_ROLES = ("tool", FUNCTION_CALL, OBSERVATION)
TEXT_ROLES = ("system", "user", "assistant")


def _where(row: int, source: str) -> str:
    return f"row {row} of {source}"


def without_nulls(value: Any) -> Any:
    """JSON objects without their null keys, all the way down: ``datasets`` reads a column of
    objects as one struct, so a key one row has appears as null in every other (a tool's
    ``properties``, a call's ``arguments``). A null the data means is kept by writing the
    object as a JSON string."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def read_tools(value: Any, where: str, name: str = "tools") -> list[dict[str, Any]] | None:
    """A tools cell (or the ``data.tools`` file's content) as ``[{type: function, function}]``;
    None where it holds none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise BadConversation(f"{where}: field '{name}' is not JSON ({e.msg} at char {e.pos})") from None
    else:
        value = without_nulls(value)
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        raise BadConversation(f"{where}: field '{name}' must be a list of function schemas")
    out = []
    for k, item in enumerate(items):
        function = item.get("function") if isinstance(item, dict) else None
        function = function if isinstance(function, dict) else item
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadConversation(f"{where}: {name}[{k}] is not a function schema with a name")
        out.append({"type": "function", "function": function})
    return out or None


def tools_file(setting: str | None) -> list[dict[str, Any]] | None:
    """``data.tools``: a JSON file of the tool schemas every row may call (rows with their own
    tools column keep theirs)."""
    return None if setting is None else read_tools_file(setting, "data.tools")


def read_tools_file(setting: str, key: str) -> list[dict[str, Any]] | None:
    """A JSON file of tool schemas (``data.tools``, ``xtrain predict --tools``), checked."""
    path = Path(setting).expanduser()
    if not path.is_file():
        raise XtrainError(
            f"{key} file {setting} not found", "give a JSON file holding a list of function schemas"
        )
    return read_tools(read_text(path, "tools file"), f"{key} {setting}", "tools")


def row_tools(ds: Dataset, d: DataConfig, source: str) -> list[list[dict[str, Any]] | None]:
    """Each row's tools: its ``data.tools_column`` cell, else the ``data.tools`` file's."""
    shared = tools_file(d.tools)
    if d.tools_column not in ds.column_names:
        return [shared] * len(ds)
    cells = ds[d.tools_column]
    return [read_tools(cell, _where(i, source), d.tools_column) or shared for i, cell in enumerate(cells)]


def is_agent(cell: Any) -> bool:
    """Whether a conversation cell holds tool turns, calls or reasoning."""
    if not isinstance(cell, list):
        return False
    for turn in cell:
        if isinstance(turn, dict) and (
            turn.get("role") in AGENT_ROLES
            or turn.get("tool_calls")
            or any(turn.get(k) is not None for k in REASONING_KEYS)
        ):
            return True
    return False


def _text(content: Any, where: str, k: int, allow_empty: bool) -> str:
    if content is None and allow_empty:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise BadConversation(f"{where}: turn {k} content must be text")
    return content


def _arguments(value: Any, where: str, k: int, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as e:
            raise BadConversation(
                f"{where}: turn {k} calls '{name}' with arguments that are not JSON ({e.msg} at char {e.pos})"
            ) from None
    elif isinstance(value, dict):
        value = without_nulls(value)
    if not isinstance(value, dict):
        raise BadConversation(f"{where}: turn {k} calls '{name}' with arguments that are not a JSON object")
    return value


def _calls(raw: Any, where: str, k: int, made: int) -> list[dict[str, Any]]:
    """A turn's calls, checked: ``made`` calls came before (numbering made-up ids)."""
    if isinstance(raw, str):  # sharegpt function_call: JSON text
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise BadConversation(
                f"{where}: turn {k} is a function call that is not JSON ({e.msg} at char {e.pos})"
            ) from None
    raw = [raw] if isinstance(raw, dict) else raw
    if not isinstance(raw, list) or not raw:
        raise BadConversation(f"{where}: turn {k} tool_calls must be a non-empty list of calls")
    out = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else call
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadConversation(f"{where}: turn {k} has a tool call without a function name")
        name = function["name"]
        args = function.get("arguments", function.get("parameters"))
        given = call.get("id") if isinstance(call, dict) else None
        call_id = str(given) if given not in (None, "") else f"call{made + len(out) + 1:05d}"
        out.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": _arguments(args, where, k, name)},
            }
        )
    return out


def _result(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def parse_agent(
    cell: Any, row: int, source: str, tools: list[dict[str, Any]] | None = None, complete: bool = True
) -> Conversation:
    """A text conversation with tool turns, calls or reasoning, checked and normalised (module
    docstring); ``complete``: a training row (one that ends on a tool result is refused)."""
    where = _where(row, source)
    if not isinstance(cell, list) or not cell:
        raise BadConversation(f"{where}: messages must be a non-empty list of {{role, content}} turns")
    out: list[dict[str, Any]] = []
    calls: dict[str, str] = {}  # id -> function name, of every call so far
    open_ids: list[str] = []  # calls of the last calling turn not answered yet
    seen_user = False
    for k, turn in enumerate(cell):
        if not isinstance(turn, dict) or "role" not in turn:
            raise BadConversation(f"{where}: turn {k} is not a {{role, content}} object")
        role = turn["role"]
        if role not in TEXT_ROLES + AGENT_ROLES:
            roles = ", ".join(TEXT_ROLES + AGENT_ROLES)
            raise BadConversation(f"{where}: turn {k} has role {role!r} (roles: {roles})")
        if role in ("assistant", FUNCTION_CALL) and not seen_user:
            raise BadConversation(f"{where}: the assistant speaks in turn {k} before any user turn")
        seen_user |= role == "user"
        if role in ("tool", OBSERVATION):
            out.append(_tool_turn(turn, where, k, calls, open_ids))
            continue
        raw_calls = turn.get("content") if role == FUNCTION_CALL else turn.get("tool_calls")
        if role == FUNCTION_CALL:
            message: dict[str, Any] = {"role": "assistant", "content": ""}
        else:
            message = {"role": role, "content": _text(turn.get("content"), where, k, role == "assistant")}
        if raw_calls:
            found = _calls(raw_calls, where, k, len(calls))
            calls.update((c["id"], c["function"]["name"]) for c in found)
            open_ids = [c["id"] for c in found]
            message["tool_calls"] = found
        reasoning = next((turn[key] for key in REASONING_KEYS if turn.get(key) is not None), None)
        if reasoning is not None and message["role"] == "assistant":
            message["reasoning_content"] = _text(reasoning, where, k, False)
        if message["role"] == "assistant" and not message["content"].strip() and not raw_calls:
            raise BadConversation(f"{where}: turn {k} is an empty assistant answer")
        out.append(message)
    if not any(t["role"] == "assistant" for t in out):
        raise BadConversation(f"{where} has no assistant turn: nothing to learn")
    if complete and out[-1]["role"] == "tool":
        raise BadConversation(
            f"{where} ends on a tool result: the answer from it is missing, nothing after it to learn",
            "add the assistant's answer after the result, or end the row at the call",
        )
    return Conversation(out, tools=tools)


def _tool_turn(
    turn: dict[str, Any], where: str, k: int, calls: dict[str, str], open_ids: list[str]
) -> dict[str, Any]:
    """A tool result, matched to its call: by ``tool_call_id``, else the next unanswered call."""
    given = turn.get("tool_call_id")
    if given not in (None, ""):
        call_id = str(given)
        if call_id not in calls:
            raise BadConversation(
                f"{where}: turn {k} is the result of call id {call_id!r}, and no call has it"
            )
        if call_id in open_ids:
            open_ids.remove(call_id)
    elif open_ids:
        call_id = open_ids.pop(0)
    else:
        raise BadConversation(f"{where}: turn {k} is a tool result with no tool call before it to answer")
    content = turn.get("content", turn.get("value"))
    return {"role": "tool", "content": _result(content), "tool_call_id": call_id, "name": calls[call_id]}


def parse_text(
    cell: Any, row: int, source: str, tools: list[dict[str, Any]] | None = None, complete: bool = True
) -> Conversation:
    """Any causal-lm chat row: with tools, calls or reasoning through ``parse_agent``, else the
    plain conversation ``chat.parse_conversation`` reads (unchanged)."""
    if tools or is_agent(cell):
        return parse_agent(cell, row, source, tools, complete)
    return parse_conversation(cell, row, source, allow_images=False)


def undeclared(conv: Conversation) -> list[str]:
    """The functions a conversation calls that its tools do not declare (none without tools)."""
    if not conv.tools:
        return []
    declared = {t["function"]["name"] for t in conv.tools}
    return [
        c["function"]["name"]
        for t in conv.messages
        for c in t.get("tool_calls") or ()
        if c["function"]["name"] not in declared
    ]


def has_calls(conv: Conversation) -> bool:
    return any(t.get("tool_calls") for t in conv.messages)


def text_chat_rows(
    cells: list[Any],
    render: Render,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    source: str,
    tools: list[Any] | None = None,
    train_on: str = "all_assistant",
) -> list[dict[str, list[int]]]:
    """causal-lm chat: every conversation (a ``messages`` cell of row i of ``source``, with its
    ``tools``) checked, rendered and labelled, cut to ``max_length``; one whose answers all lie
    past the cut is dropped (as causal-lm does)."""
    rows = []
    for row, cell in enumerate(cells):
        enc = text_chat_encoded(cell, row, render, tokenizer, source, tools[row] if tools else None, train_on)
        ids, labels = enc.input_ids[:max_length], enc.labels[:max_length]
        if all(t == IGNORE_INDEX for t in labels[1:]):  # the model shifts: position 0 never counts
            continue
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
    return rows


def text_chat_encoded(
    cell: Any,
    row: int,
    render: Render,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    tools: list[dict[str, Any]] | None = None,
    train_on: str = "all_assistant",
) -> Encoded:
    """One causal-lm chat row (a ``messages`` cell, its ``tools``) checked (agent rows: ``tools.py``),
    rendered and labelled, not yet cut."""
    conv = parse_text(cell, row, source, tools)
    return encode(render, tokenizer, conv, f"row {row} of {source}", train_on=train_on)
