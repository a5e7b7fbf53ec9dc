"""``xtrain predict`` for a GRPO result. ``--prompt``: as causal-lm's, a tools run's prompts as
episodes that run its own tools unless ``--tools`` names others (``prompt_answers``).
``--data FILE``: every prompt of a file in the shapes GRPO trains on (``rows.read_row``: text,
conversational or alpaca prompts), answered as the run's evaluation answers them: greedily, and
where the run had tools as episodes that call them (the run's own ``grpo.tools``, kept in its
record); each answer scored by the run's own reward functions (``grpo.rewards`` with their
weights, kept in its record: ``reward`` and ``rewards/NAME`` per row, their means over the file)
and against the row's answer column (``grpo.answer_column``) by exact match where the row has
one. A file of chat or prompt rows that GRPO does not read (messages, sharegpt, prompt/response,
text) is read as causal-lm reads it, exact match against its answers. The same reader gives
``xtrain export`` the run's eval prompts to answer in llama.cpp (a tools run's first turn: the
call, as llama.cpp's parser returns it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.contract import Example, Loaded, PredictRequest
    from xtrain.tasks.grpo.rewards import Reward
    from xtrain.tasks.grpo.tools import Tool

# the run record's key: {"answer_column", "tools": [absolute specs], and the rewards' settings
# (``REWARD_KEYS``, function specs absolute)}
RECORD = "grpo"
REWARD_KEYS = ("rewards", "reward_weights", "answer_pattern", "format_pattern", "length_target")
GRPO_COLUMNS = ("prompt", "instruction")  # a file in GRPO's own shapes has one
TOOLS = "grpo_tools"  # Loaded.parts: the run's tools, found once
REWARDS = "grpo_rewards"  # Loaded.parts: the run's reward functions, found once


def record_of(cfg: TrainConfig) -> dict[str, Any]:
    """What a GRPO run saves for ``--data`` (``Workload.record``): its answer column and its
    tools, ``file.py`` specs made absolute so they are found from any folder."""
    from xtrain.tasks.grpo import tools as tools_

    def absolute(spec: str) -> str:
        where, _, function = spec.rpartition(":")
        return f"{Path(where).expanduser().resolve()}:{function}" if where.endswith(".py") else spec

    g = cfg.grpo
    tools = [absolute(s) for s in tools_.specs(g.tools)]
    rewards = [absolute(s) for s in ([g.rewards] if isinstance(g.rewards, str) else g.rewards)]
    settings = {k: getattr(g, k) for k in REWARD_KEYS if k != "rewards"}
    return {RECORD: {"answer_column": g.answer_column, "tools": tools, "rewards": rewards, **settings}}


def run_tools(record: dict[str, Any]) -> list[Tool]:
    """The run's tools, found and described as training found them (one line when one is gone)."""
    from xtrain.tasks.grpo import tools as tools_

    specs = (record.get(RECORD) or {}).get("tools") or []
    return tools_.resolve(specs, None, "the run's grpo.tools") if specs else []


def read_prompt_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """The file's rows as prompts: a chat run's turns (with the run's tools' schemas), a plain
    run's text (turns without a template joined, as training joined them); the answer column
    the reference, the row itself kept for the rewards. A file without a prompt or instruction
    column: causal-lm's reader (its chat or prompt rows, their answers the references)."""
    from xtrain.data.rows.chat import Conversation
    from xtrain.tasks.contract import Example
    from xtrain.tasks.grpo import rows as rows_
    from xtrain.tasks.predicting import load_file

    ds, source, _ = load_file(cfg)
    if not any(c in ds.column_names for c in GRPO_COLUMNS):
        from xtrain.tasks.prompt_predict import read_text_file
        from xtrain.tasks.text.causal_lm import TOOL_USE

        return read_text_file(cfg, record, TOOL_USE)
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
        reference = None if answer is None else str(answer)
        out.append(Example(i, {"input": row.shown}, feed, reference, data=row))
    return out


def run_rewards(record: dict[str, Any]) -> list[Reward]:
    """The run's reward functions with their weights, found as training found them ([] for a run
    whose record predates them: its answers are scored by exact match alone)."""
    from xtrain.config.schema import GrpoConfig
    from xtrain.tasks.grpo import rewards

    saved = record.get(RECORD) or {}
    if not saved.get("rewards"):
        return []
    g = GrpoConfig(answer_column=saved.get("answer_column", "answer"))
    for key in REWARD_KEYS:
        if key in saved:
            setattr(g, key, saved[key])
    schemas = [t.schema for t in run_tools(record)] or None
    return rewards.resolve(g, schemas)


def scored(
    found: list[Reward], examples: list[Example], outputs: list[dict[str, Any]], episodes: list[Any] | None
) -> None:
    """Each output of a GRPO row given its rewards, as training scores a completion: ``reward``
    (the weighted sum, a function's None counting 0) and ``rewards/NAME`` (None: no reward)."""
    import math

    import torch

    from xtrain.tasks.grpo import loss, rewards

    rows = [e.data for e in examples]
    if not found or not rows or any(r is None for r in rows):
        return
    prompts = [r.prompt for r in rows]
    texts = [o["output"] for o in outputs]
    completions: list[Any] = (
        [e.messages for e in episodes] if episodes is not None
        else [[{"role": "assistant", "content": t}] for t in texts] if rows[0].conversational else texts
    )  # fmt: skip
    names = sorted({k for r in rows for k in r.columns})
    columns = {k: [r.columns.get(k) for r in rows] for k in names}
    if episodes is not None:
        columns["tool_calls"] = [e.calls for e in episodes]
    where = [e.row for e in examples]
    try:
        values = [rewards.call(r, prompts, completions, columns, 0, where) for r in found]
    except rewards.RewardError as e:
        said = e.message.replace(" at step 0", "")
        raise rewards.RewardError(said, "fix the function, then predict again") from None
    per_fn = torch.tensor(values, dtype=torch.float64).T
    total = loss.total_rewards(per_fn, torch.tensor([r.weight for r in found], dtype=torch.float64))
    for i, o in enumerate(outputs):
        o["reward"] = float(total[i])
        for r, v in zip(found, per_fn[i].tolist(), strict=True):
            o[f"rewards/{r.metric}"] = None if math.isnan(v) else v


def answer_prompts(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, Any]]:
    """A batch of prompts answered greedily (or sampled as ``request`` says); a tools run's as
    episodes calling its tools: the final answer, and the calls with their results; each scored
    by the run's reward functions (``scored``)."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks.grpo.episodes import predict_episodes
    from xtrain.tasks.prompt_predict import chat_render, text_answer
    from xtrain.tasks.text.causal_lm import TOOL_USE

    if TOOLS not in loaded.parts:
        loaded.parts[TOOLS] = run_tools(loaded.parts)
        loaded.parts[REWARDS] = run_rewards(loaded.parts)
    tools = loaded.parts[TOOLS]
    agents = bool(tools) and bool(loaded.parts.get("chat")) and all(e.data is not None for e in examples)
    if not agents:
        outputs: list[dict[str, Any]] = text_answer(loaded, examples, request, TOOL_USE)
        scored(loaded.parts[REWARDS], examples, outputs, None)
        return outputs
    render, stop = chat_render(loaded)
    texts = []
    for e in examples:
        conv = e.feed
        texts.append(chat_data.with_tools(render, conv, f"row {e.row}")(conv.messages, True))
    episodes = dataclasses.replace(
        request, prompts=[str(e.shown["input"]) for e in examples], functions=tools,
        tools=[t.schema for t in tools],
    )  # fmt: skip
    done: list[Any] = []
    rows = predict_episodes(loaded, texts, render, stop, episodes, done)
    outputs = [{"output": r["output"], "calls": r["calls"]} for r in rows]
    scored(loaded.parts[REWARDS], examples, outputs, done)
    return outputs


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
