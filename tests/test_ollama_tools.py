"""``xtrain export --to ollama`` with tools (issue 43): the Modelfile's Go template carries the tool
schemas, the assistant's calls and the tool results in the run's template family's format (Qwen,
Llama 3.1/3.2, Mistral, the built-in agent model's), rendered here by a small Go-template evaluator
(tests/support/gotemplate.py; Go is not installed) and compared with the Jinja template training
rendered with, conversation by conversation. The JSON the evaluator writes is Jinja's (``tojson``
spacing): what is compared is everything around it. A template without tools, or with a tool
format not written for Ollama, keeps its template without tools and the export says so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.gotemplate import Template

from xtrain.data import templates as shipped
from xtrain.export import ollama, templates

BOS, EOS = "<|begin_of_text|>", "</s>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_timer",
            "description": "start a timer",
            "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}},
        },
    },
]


def _call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


USER = {"role": "user", "content": "what is the weather in oslo?"}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [_call("get_weather", {"city": "oslo"}, "a1b2c3d4e")],
}
RESULT = {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": '{"temp": 3}'}
ANSWER = {"role": "assistant", "content": "It is 3 degrees in oslo."}
AGAIN = {"role": "user", "content": "and a timer for 5 minutes?"}
TWO_CALLS = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        _call("get_weather", {"city": "oslo"}, "a1b2c3d4e"),
        _call("set_timer", {"minutes": 5}, "f5g6h7i8j"),
    ],
}
TWO_RESULTS = [RESULT, {"role": "tool", "tool_call_id": "f5g6h7i8j", "name": "set_timer", "content": "ok"}]
SYSTEM = {"role": "system", "content": "You answer briefly."}

# (tools, messages): what each family's template is checked on
CONVERSATIONS = [
    (None, [USER]),
    (None, [USER, ANSWER, AGAIN]),
    (TOOLS, [USER]),
    (TOOLS, [USER, CALL, RESULT]),
    (TOOLS, [USER, CALL, RESULT, ANSWER, AGAIN]),
]
PARALLEL = [(TOOLS, [USER, TWO_CALLS, *TWO_RESULTS]), (TOOLS, [USER, TWO_CALLS, *TWO_RESULTS, ANSWER, AGAIN])]
WITH_SYSTEM = [(None, [SYSTEM, USER]), (TOOLS, [SYSTEM, USER, CALL, RESULT])]


def _jinja(source: str):
    from transformers.utils.chat_template_utils import _compile_jinja_template

    compiled = _compile_jinja_template(source)

    def render(messages, generation, tools=None):
        return compiled.render(
            messages=messages, tools=tools, add_generation_prompt=generation, bos_token=BOS, eos_token=EOS
        )

    return render


def _go_json(indent_tools: bool):
    """Jinja's ``tojson`` spacing (Llama 3 writes the schemas with ``indent=4``)."""

    def dump(value: Any) -> str:
        indent = 4 if indent_tools and isinstance(value, dict) and "function" in value else None
        return json.dumps(value, ensure_ascii=False, indent=indent)

    return dump


def _ollama_data(tools, messages) -> dict[str, Any]:
    system = next((m["content"] for m in messages if m["role"] == "system"), "")
    return {"System": system, "Messages": messages, "Tools": tools or []}


def _turns(source: str):
    render = _jinja(source)
    found = templates.derive(lambda m, g: render(m, g))
    assert found is not None
    return ollama.ollama_turns(found, BOS, True, templates.tool_family(source, found))


FAMILIES = {
    "qwen2.5": ("qwen", CONVERSATIONS + PARALLEL + WITH_SYSTEM),
    "llama3.1": ("llama3", CONVERSATIONS + WITH_SYSTEM),  # one call per turn
    "llama3.2": ("llama3", CONVERSATIONS + WITH_SYSTEM),
    "mistral": ("mistral", CONVERSATIONS + PARALLEL),  # the system prompt joins the last user turn
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_familys_go_template_renders_tools_as_its_jinja_template(name):
    family, conversations = FAMILIES[name]
    source = shipped.named(name)
    turns = _turns(source)
    assert turns.tools == family
    go = ollama.go_template(turns)
    for marker in (
        "{{ if .ToolCalls }}",
        ".Function.Name",
        "{{ json",
        '{{ else if eq .Role "tool" }}',
        "$.Tools",
    ):
        assert marker in go or (marker == "$.Tools" and "{{ if .Tools }}" in go), marker
    template = Template(go, _go_json(family == "llama3"))
    render = _jinja(source)
    for tools, messages in conversations:
        expected = render(messages, True, tools).removeprefix(BOS)
        assert template.render(_ollama_data(tools, messages)) == expected, (name, tools is not None, messages)


def test_the_builtin_agent_models_own_format_is_carried():
    from xtrain.builtin.agents import TEMPLATE

    turns = _turns(TEMPLATE)
    assert turns.tools == "xtrain"
    template = Template(ollama.go_template(turns), _go_json(False))
    render = _jinja(TEMPLATE)
    for tools, messages in CONVERSATIONS + PARALLEL:
        expected = render(messages, True, tools)
        assert template.render(_ollama_data(tools, messages)) == expected


@pytest.mark.parametrize("name", ["chatml", "smollm2"])
def test_a_template_without_tools_keeps_its_template_and_says_so(name):
    source = shipped.named(name)
    turns = _turns(source)
    assert turns.tools is None
    go = ollama.go_template(turns)
    assert ".Tools" not in go and ".ToolCalls" not in go
    assert ollama.tools_note(source) == (
        "the Modelfile's template carries no tools: the run's chat template renders none"
    )
    template = Template(go, _go_json(False))
    for _, messages in CONVERSATIONS[:2]:
        assert template.render(_ollama_data(None, messages)) == _jinja(source)(messages, True)


def test_a_tool_format_not_written_for_ollama_is_named_in_the_note():
    # ChatML whose tools go in a system line of names only: renders tools, but no known format
    source = (
        "{%- if tools %}{{ '<|im_start|>system\\nfunctions: ' "
        "+ (tools | map(attribute='function.name') | join(',')) + '<|im_end|>\\n' }}{%- endif %}"
        "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    turns = _turns(source)
    assert turns.tools is None and ".Tools" not in ollama.go_template(turns)
    assert "not one of the tool formats written for Ollama" in ollama.tools_note(source)


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory) -> Path:
    """A run on the built-in agent model, its adapter saved as training saves it (random non-zero
    LoRA weights: what export reads is the folder), its record naming the agent data."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xtrain import builtin

    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"
    base = builtin.ensure_builtin_model("builtin:tiny-agent", cache)
    run = tmp_path_factory.mktemp("agent-run")
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
    peft.save_pretrained(run / "adapter")
    AutoTokenizer.from_pretrained(base).save_pretrained(run / "adapter")
    record = {"task": "causal-lm", "chat": True, "data": {"train": "builtin:tool-calls"}}
    (run / "adapter" / "xtrain_run.json").write_text(json.dumps(record))
    return run


@pytest.mark.usefixtures("private_caches")
def test_an_agent_run_exports_a_modelfile_with_tools_and_a_gguf_with_its_template(agent_run, tmp_path):
    pytest.importorskip("gguf")
    from xtrain import builtin
    from xtrain.builtin.agents import TEMPLATE
    from xtrain.export import parity
    from xtrain.export.pipeline import ExportRequest, export

    result = export(ExportRequest(str(agent_run), "ollama", tmp_path / "o", gguf_type="f16"))
    assert [c.name for c in result.checks][-2:] == ["template", "template"]  # the GGUF's, the Modelfile's
    assert not [n for n in result.notes if "tools" in n]
    text = (tmp_path / "o" / "Modelfile").read_text()
    go = text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    assert go.startswith("{{ if .Tools }}<|im_start|>system\ntools:{{ range .Tools }}")
    assert "<tool_call>" in go and '{{ else if eq .Role "tool" }}' in go
    assert parity.gguf_template(tmp_path / "o" / "model-f16.gguf") == TEMPLATE  # the tools-aware template
    # a row of the agent data renders through the Modelfile's template as through training's
    row = json.loads((builtin.ensure_builtin_data("builtin:tool-calls") / "eval.jsonl").open().readline())
    tools, messages = json.loads(row["tools"]), row["messages"][:3]
    for m in messages:
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    expected = _jinja(TEMPLATE)(messages, True, tools)
    assert Template(go, _go_json(False)).render(_ollama_data(tools, messages)) == expected
