"""``xtrain predict`` for a GRPO result. ``--prompt``: as causal-lm's, a tools run's prompts as
episodes that run its own tools unless ``--tools`` names others (``prompt_answers``).
``--data FILE``: every prompt of a file in the shapes GRPO
trains on (``rows.read_row``: text, conversational or alpaca prompts), answered as the run's
evaluation answers them: greedily, and where the run had tools as episodes that call them (the
run's own ``grpo.tools``, kept in its record), the final answer
scored against the row's answer column (``grpo.answer_column``) where the row has one. The same
reader gives ``xtrain export`` the run's eval prompts to answer in llama.cpp (a tools run's first
turn: the call, as llama.cpp's parser returns it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.contract import Example, Loaded, PredictRequest
    from xtrain.tasks.grpo.tools import Tool

RECORD = "grpo"  # the run record's key: {"answer_column": ..., "tools": [absolute specs]}
TOOLS = "grpo_tools"  # Loaded.parts: the run's tools, found once


def record_of(cfg: TrainConfig) -> dict[str, Any]:
    """What a GRPO run saves for ``--data`` (``Workload.record``): its answer column and its
    tools, ``file.py`` specs made absolute so they are found from any folder."""
    from xtrain.tasks.grpo import tools as tools_

    def absolute(spec: str) -> str:
        where, _, function = spec.rpartition(":")
        return f"{Path(where).expanduser().resolve()}:{function}" if where.endswith(".py") else spec

    tools = [absolute(s) for s in tools_.specs(cfg.grpo.tools)]
    return {RECORD: {"answer_column": cfg.grpo.answer_column, "tools": tools}}


def run_tools(record: dict[str, Any]) -> list[Tool]:
    """The run's tools, found and described as training found them (one line when one is gone)."""
    from xtrain.tasks.grpo import tools as tools_

    specs = (record.get(RECORD) or {}).get("tools") or []
    return tools_.resolve(specs, None, "the run's grpo.tools") if specs else []


def read_prompt_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """The file's rows as prompts: a chat run's turns (with the run's tools' schemas), a plain
    run's text (turns without a template joined, as training joined them); the answer column
    the reference."""
    from xtrain.data.rows.chat import Conversation
    from xtrain.tasks.contract import Example
    from xtrain.tasks.grpo import rows as rows_
    from xtrain.tasks.predicting import load_file

    ds, source, _ = load_file(cfg)
    column = (record.get(RECORD) or {}).get("answer_column", "answer")
    schemas = [t.schema for t in run_tools(record)] or None
    out = []
    for i, row in enumerate(rows_.read_rows(ds, source)):
        if not row.conversational:
            feed: Any = row.prompt
        elif record.get("chat"):
            feed = Conversation(list(row.prompt), tools=schemas)
        else:  # turns, no template: as training read them
            feed = rows_.untemplated(row.prompt)
        answer = row.columns.get(column)
        out.append(Example(i, {"input": row.shown}, feed, None if answer is None else str(answer)))
    return out


def answer_prompts(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, str]]:
    """A batch of prompts answered greedily (or sampled as ``request`` says); a tools run's as
    episodes calling its tools: the final answer, and the calls with their results."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks.grpo.episodes import predict_episodes
    from xtrain.tasks.prompt_predict import chat_render, text_answer
    from xtrain.tasks.text.causal_lm import TOOL_USE

    if TOOLS not in loaded.parts:
        loaded.parts[TOOLS] = run_tools(loaded.parts)
    tools = loaded.parts[TOOLS]
    if not tools or not loaded.parts.get("chat"):
        return text_answer(loaded, examples, request, TOOL_USE)
    render, stop = chat_render(loaded)
    texts = []
    for e in examples:
        conv = e.feed
        texts.append(chat_data.with_tools(render, conv, f"row {e.row}")(conv.messages, True))
    episodes = dataclasses.replace(
        request, prompts=[str(e.shown["input"]) for e in examples], functions=tools,
        tools=[t.schema for t in tools],
    )  # fmt: skip
    rows = predict_episodes(loaded, texts, render, stop, episodes)
    return [{"output": r["text"], "calls": r["calls"]} for r in rows]


def prompt_answers(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    """``--prompt`` texts answered as causal-lm answers them; on a run with tools and no
    ``--tools``, each an episode that runs the run's own tools (the calls and the answer shown)."""
    from xtrain.tasks.prompt_predict import text_predict
    from xtrain.tasks.text.causal_lm import TOOL_USE

    if request.functions is None and request.tools is None and loaded.parts.get("chat"):
        tools = run_tools(loaded.parts)
        if tools:
            request = dataclasses.replace(request, functions=tools, tools=[t.schema for t in tools])
    return text_predict(loaded, request, TOOL_USE)
