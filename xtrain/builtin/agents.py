"""``builtin:tool-calls`` and ``builtin:tiny-agent``: a deterministic tool-calling data set and a
tiny llama whose tokenizer carries its own tools-aware chat template, for the built-in agent job
(examples/agent-tools.yaml, docs/agents.md). The template (``TEMPLATE``) is ChatML with the tools
listed in one short system line (``tools: get_weather(city) ...``) and calls written as Qwen
writes them (``<tool_call>{"name", "arguments"}</tool_call>``, which ``xtrain predict`` parses):
a real template's instructions would make every row ~350 tokens of the tiny model's vocabulary,
and the job minutes long on a CPU. The template keeps to the Jinja llama.cpp implements (its
engine has no ``list`` filter on a mapping: the argument names come from ``.keys()``), so the
exported GGUF answers tool requests in llama.cpp too (tests/test_llamacpp.py). The families' real
templates are tested apart (tests/test_agents.py, xtrain/data/templates).

Each row is one OpenAI-style conversation with the three tools it may call::

    system: "tools: get_weather(city) get_time(city) set_timer(minutes)"  (the template's)
    user: "what is the weather like in paris?"
    assistant: tool_calls [get_weather {"city": "paris"}]
    tool: {"city": "paris", "sky": "sunny", "temp_c": 21}
    assistant: "it is sunny in paris, 21 degrees."

The question decides the tool (weather, time, timer) and holds its argument, so a model that
learns the task calls the right function with the right arguments (call exact match near 0
untrained, near 1 after a short LoRA run) and answers from the result. The tokenizer's BPE is
trained on the stories and reviews of the other built-ins and on these conversations as the
template renders them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_CITIES = ["paris", "tokyo", "lima", "oslo", "cairo", "delhi", "rome", "quito", "seoul", "dakar"]
_MINUTES = [5, 10, 15, 20, 25, 30, 45, 60]
_SKIES = ["sunny", "cloudy", "rainy", "windy", "snowy"]


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """One function the rows may call, in the OpenAI tools shape chat templates take."""
    return {"type": "function", "function": dict(name=name, description=description, parameters=parameters)}


_TIMER = {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}
TOOLS: list[dict[str, Any]] = [
    _tool("get_weather", "the weather now in a city", _CITY),
    _tool("get_time", "the local time in a city", _CITY),
    _tool("set_timer", "start a timer", _TIMER),
]

_ASK = {
    "get_weather": [
        "what is the weather like in {city}?",
        "is it raining in {city} today?",
        "how warm is it in {city}?",
        "tell me the weather in {city}.",
    ],
    "get_time": [
        "what time is it in {city}?",
        "what is the local time in {city}?",
        "tell me the time in {city}.",
        "is it late in {city} now?",
    ],
    "set_timer": [
        "set a timer for {minutes} minutes.",
        "start a {minutes} minute timer.",
        "remind me in {minutes} minutes.",
        "time {minutes} minutes for me.",
    ],
}

TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\ntools:' }}{%- for tool in tools %}"
    "{{- ' ' + tool.function.name + '(' + (tool.function.parameters.properties.keys() | join(', ')) + ')' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{- '<tool_call>' + {'name': call.function.name, 'arguments': call.function.arguments} | tojson"
    " + '</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QUICKSTART_PROMPT = "what is the weather like in oslo?"  # the eval split's shape


def _call(rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any], str]:
    """(function, arguments, result, the answer from the result)."""
    name = rng.choice(sorted(_ASK))
    if name == "set_timer":
        minutes = rng.choice(_MINUTES)
        return (
            name,
            {"minutes": minutes},
            {"ok": True, "minutes": minutes},
            f"your timer is set for {minutes} minutes.",
        )
    city = rng.choice(_CITIES)
    if name == "get_weather":
        sky, temp = rng.choice(_SKIES), rng.randint(-5, 35)
        result = {"city": city, "sky": sky, "temp_c": temp}
        return name, {"city": city}, result, f"it is {sky} in {city}, {temp} degrees."
    time = f"{rng.randint(0, 23):02d}:{rng.choice(['00', '15', '30', '45'])}"
    return name, {"city": city}, {"city": city, "time": time}, f"it is {time} in {city}."


def tool_call_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows of ``{messages, tools}``: a question, the call (arguments as a JSON string, as
    OpenAI's API writes them), its result, the answer from it."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        name, args, result, answer = _call(rng)
        question = rng.choice(_ASK[name]).format(**args)
        call_id = f"call{k % 100000:05d}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        messages = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
            {"role": "assistant", "content": answer},
        ]
        out.append({"messages": messages, "tools": json.dumps(TOOLS)})
    return out


def build_tool_calls(folder: Path, version: int) -> None:
    """``builtin:tool-calls``: 800 training conversations and 100 eval ones (fresh draws), and
    ``eval-calls.jsonl``: the eval conversations cut after the call (``xtrain predict --data``
    scores the calls on it: ``call_exact_match``)."""
    splits = {
        "train": tool_call_examples(800, 1000 + version),
        "eval": tool_call_examples(100, 2000 + version),
    }
    splits["eval-calls"] = [{**r, "messages": r["messages"][:2]} for r in splits["eval"]]
    for split, rows in splits.items():
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def build_tokenizer() -> Any:
    """A byte-level BPE over the built-in corpus and the rendered conversations, with Qwen's
    special tokens and its chat template."""
    from tokenizers import AddedToken

    from xtrain.builtin.text import _corpus, byte_level_bpe, fast_tokenizer

    template = TEMPLATE
    draft = fast_tokenizer(byte_level_bpe(["a b"], 260, []), 64)  # renders text only
    rendered = [
        draft.apply_chat_template(r["messages"], tools=TOOLS, chat_template=template, tokenize=False)
        for r in tool_call_examples(400, 7)
    ]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = byte_level_bpe(_corpus() + rendered, 2000, specials)
    markers = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in markers])
    out = fast_tokenizer(tok, 1024, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out.chat_template = template
    return out


def build_tiny_agent(folder: Path) -> None:
    """``builtin:tiny-agent``: the tiny llama's shape (2 layers, hidden 64) with 1024 positions,
    random weights, and the tokenizer above."""
    import torch
    from transformers import LlamaForCausalLM

    from xtrain.builtin.text import tiny_llama_config

    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        config = tiny_llama_config(
            max_position_embeddings=1024,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
