"""Agent and reasoning rows (docs/agents.md): tools, tool calls, tool results and thinking read
into one conversation, rendered by the real chat templates xtrain ships (Qwen2.5, Qwen3, Llama
3.1/3.2, Mistral, SmolLM2: xtrain/data/templates) with the tiny built-in tokenizer, what trains,
and the dry run's one-line checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xtrain.data import templates
from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows import chat
from xtrain.data.rows import tools as agent_rows
from xtrain.errors import RowError, XtrainError

pytestmark = pytest.mark.usefixtures("private_caches")

WEATHER = {
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOLS = [{"type": "function", "function": WEATHER}]
CALL_ID = "abcdefgh1"  # nine letters and digits: what Mistral's template wants
PARIS = {"city": "paris"}
RESULT = "sunny, 21 degrees"
ANSWER = "It is sunny in paris."


def openai_row(reasoning: str | None = None, system: bool = False) -> list[dict]:
    call = {
        "id": CALL_ID,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "paris"}'},
    }
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    if reasoning:
        turn["reasoning_content"] = reasoning
    head = [{"role": "system", "content": "You help with the weather."}] if system else []
    return [
        *head,
        {"role": "user", "content": "weather in paris?"},
        turn,
        {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT},
        {"role": "assistant", "content": ANSWER},
    ]


def sharegpt_row() -> list[dict]:
    """LLaMA-Factory's sharegpt with function_call / observation turns (read through formats)."""
    return [
        {"from": "human", "value": "weather in paris?"},
        {
            "from": "function_call",
            "value": json.dumps({"name": "get_weather", "arguments": {"city": "paris"}}),
        },
        {"from": "observation", "value": RESULT},
        {"from": "gpt", "value": ANSWER},
    ]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The built-in agent model's (any tokenizer renders), from the session's offline cache."""
    from transformers import AutoTokenizer

    from xtrain import builtin

    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"
    return AutoTokenizer.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-agent", cache))


def trained_text(tokenizer, enc: chat.Encoded) -> str:
    return tokenizer.decode([t for t in enc.labels if t != IGNORE_INDEX])


def encode(tokenizer, name: str, cell: list[dict], tools=TOOLS, **kw) -> chat.Encoded:
    render = chat.renderer(tokenizer, templates.named(name), name, kw.pop("kwargs", None))
    conv = agent_rows.parse_text(cell, 0, "a.jsonl", tools)
    return chat.encode(render, tokenizer, conv, "row 0 of a.jsonl", **kw)


# ---------------------------------------------------------------------------------------------
# Reading: every shape into one conversation


_names = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
_values = st.one_of(st.integers(-1000, 1000), st.text(max_size=12), st.booleans(), st.none())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=_names, args=st.dictionaries(_names, _values, max_size=4), as_text=st.booleans(), bare=st.booleans()
)
def test_calls_read_the_same_from_every_spelling(name, args, as_text, bare):
    """arguments as an object or a JSON string, calls with or without the ``function`` wrapper,
    tools as a list or a JSON string: one conversation."""
    function = {"name": name, "arguments": json.dumps(args) if as_text else args}
    call = function if bare else {"type": "function", "function": function}
    schema = {"name": name, "parameters": {"type": "object"}}
    tools = (
        json.dumps([schema]) if as_text else [schema if bare else {"type": "function", "function": schema}]
    )
    turns = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call]}]
    turns += [{"role": "tool", "content": {"ok": True}}, {"role": "assistant", "content": "done"}]
    conv = agent_rows.parse_text(turns, 3, "a.jsonl", agent_rows.read_tools(tools, "row 3"))
    (made,) = conv.messages[1]["tool_calls"]
    # objects lose their null keys (what datasets fills in across rows); JSON text keeps them
    kept = args if as_text else {k: v for k, v in args.items() if v is not None}
    assert made == {"id": "call00001", "type": "function", "function": {"name": name, "arguments": kept}}
    assert conv.messages[2] == {
        "role": "tool",
        "content": '{"ok": true}',
        "tool_call_id": "call00001",
        "name": name,
    }
    assert conv.tools == [{"type": "function", "function": schema}]
    assert agent_rows.undeclared(conv) == []


@settings(max_examples=40, deadline=None)
@given(text=st.text(min_size=1, max_size=20))
def test_arguments_that_are_not_a_json_object_are_one_line_naming_the_row(text):
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return
    call = {"function": {"name": "f", "arguments": text}}
    turns = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call]}]
    turns.append({"role": "tool", "content": "x"})
    if not text.strip():  # an empty string: no arguments
        turns.append({"role": "assistant", "content": "ok"})
        assert (
            agent_rows.parse_text(turns, 7, "a.jsonl").messages[1]["tool_calls"][0]["function"]["arguments"]
            == {}
        )
        return
    with pytest.raises(RowError) as e:
        agent_rows.parse_text(turns, 7, "a.jsonl")
    assert "row 7 of a.jsonl" in e.value.message and "turn 1 calls 'f'" in e.value.message
    assert "\n" not in e.value.message


def test_sharegpt_function_calls_read_as_openai_messages():
    from xtrain.config.schema import DataConfig
    from xtrain.data.rows import formats

    turns = formats.chat_turns(DataConfig(), "sharegpt", {"conversations": sharegpt_row()}, 0, "s.jsonl")
    shared = agent_rows.parse_text(turns, 0, "s.jsonl", agent_rows.read_tools(json.dumps([WEATHER]), "row 0"))
    openai = agent_rows.parse_text(openai_row(), 0, "o.jsonl", TOOLS)
    ids = {"id": "call00001"}
    expected = [
        {**t, **({"tool_calls": [{**t["tool_calls"][0], **ids}]} if "tool_calls" in t else {})}
        for t in openai.messages
    ]
    expected[2] = {**expected[2], "tool_call_id": "call00001"}
    assert shared.messages == expected and shared.tools == openai.tools


@pytest.mark.parametrize(
    ("turns", "says"),
    [
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}], "no tool call before it"),
        (
            [{"role": "user", "content": "x"},
             {"role": "assistant", "tool_calls": [{"name": "f", "id": "a"}]},
             {"role": "tool", "tool_call_id": "b", "content": "r"}, {"role": "assistant", "content": "y"}],
            "call id 'b', and no call has it",
        ),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"name": "f"}]},
             {"role": "tool", "content": "r"}],
            "ends on a tool result",
        ),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}], "empty assistant answer"),
        ([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}], "role 'robot'"),
    ],
)  # fmt: skip
def test_bad_agent_rows_are_one_line_naming_the_row(turns, says):
    with pytest.raises(RowError) as e:
        agent_rows.parse_agent(turns, 4, "a.jsonl")
    assert says in e.value.message and "row 4 of a.jsonl" in e.value.message
    assert "\n" not in e.value.message


def test_a_call_to_an_undeclared_function_is_counted():
    turns = openai_row()
    other = [{"type": "function", "function": {"name": "get_time"}}]
    assert agent_rows.undeclared(agent_rows.parse_text(turns, 0, "a.jsonl", other)) == ["get_weather"]


# ---------------------------------------------------------------------------------------------
# Rendering through the real templates: the call and the answer train, the result does not


CALL_TEXT = {
    "qwen2.5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>',
    "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>',
    "llama3.1": '{"name": "get_weather", "parameters": {"city": "paris"}}',
    "llama3.2": '{"name": "get_weather", "parameters": {"city": "paris"}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "paris"}, "id": "'
    + CALL_ID
    + '"}]',
}


@pytest.mark.parametrize("name", sorted(CALL_TEXT))
def test_the_call_and_the_answer_train_the_result_and_schemas_do_not(tokenizer, name):
    enc = encode(tokenizer, name, openai_row())
    learned = trained_text(tokenizer, enc)
    assert CALL_TEXT[name] in learned and ANSWER in learned
    assert RESULT not in learned and "the weather in a city" not in learned and "paris?" not in learned
    assert RESULT in enc.text and "the weather in a city" in enc.text  # rendered, not trained
    last = encode(tokenizer, name, openai_row(), train_on="last_assistant")
    assert CALL_TEXT[name] not in trained_text(tokenizer, last) and ANSWER in trained_text(tokenizer, last)
    everything = encode(tokenizer, name, openai_row(), train_on="all")
    assert all(t != IGNORE_INDEX for t in everything.labels)


@pytest.mark.parametrize("name", ["smollm2", "chatml"])
def test_a_template_without_tools_is_one_line_naming_it_and_the_row(tokenizer, name):
    with pytest.raises(XtrainError) as e:
        encode(tokenizer, name, openai_row())
    assert f"data.chat_template={name} cannot render them" in e.value.message
    assert "row 0 of a.jsonl" in e.value.message and "\n" not in e.value.message
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert trained_text(tokenizer, encode(tokenizer, name, plain, tools=None)) == "hello<|im_end|>"


def test_qwen3_reasoning_trains_and_thinking_off_reaches_the_template(tokenizer):
    enc = encode(tokenizer, "qwen3", openai_row(reasoning="I should ask the weather tool."))
    learned = trained_text(tokenizer, enc)
    assert "<think>\nI should ask the weather tool.\n</think>" in learned
    off = encode(tokenizer, "qwen3", openai_row(), kwargs={"enable_thinking": False})
    assert off.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = encode(tokenizer, "qwen3", openai_row())
    assert on.prompt.endswith("<|im_start|>assistant\n")


def test_qwen3_drops_earlier_reasoning_as_the_template_does(tokenizer):
    """An earlier turn's reasoning is not rendered once a later question follows: it trains as
    the whole conversation renders it (without it); the last turn's reasoning trains."""
    turns = [
        {"role": "user", "content": "one?"},
        {"role": "assistant", "content": "first", "reasoning_content": "early thought"},
        {"role": "user", "content": "two?"},
        {"role": "assistant", "content": "second", "reasoning_content": "late thought"},
    ]
    enc = encode(tokenizer, "qwen3", turns, tools=None)
    learned = trained_text(tokenizer, enc)
    assert "early thought" not in enc.text and "first<|im_end|>" in learned
    assert "<think>\nlate thought\n</think>\n\nsecond<|im_end|>" in learned


def test_mistral_wants_nine_character_call_ids(tokenizer):
    row = openai_row()
    row[1]["tool_calls"][0]["id"] = row[2]["tool_call_id"] = "call_1"
    with pytest.raises(RowError) as e:
        encode(tokenizer, "mistral", row)
    assert "row 0 of a.jsonl: the chat template refused it: Tool call IDs" in e.value.message
    del row[1]["tool_calls"][0]["id"], row[2]["tool_call_id"]  # made up where the row has none
    assert "call00001" in trained_text(tokenizer, encode(tokenizer, "mistral", row))


def test_named_templates_and_their_spellings():
    assert chat.load_template("qwen") == chat.load_template("qwen2.5") == templates.named("QWEN2.5")
    assert chat.load_template("llama3") == templates.named("llama3.1")
    with pytest.raises(XtrainError, match="qwen2.5"):
        chat.load_template("no-such-template")


# ---------------------------------------------------------------------------------------------
# The run's rows and the data check


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(data: Path, *extra: str):
    from xtrain.tasks.validation import load_config

    base = ["model.name_or_path=builtin:tiny-agent", "model.task=causal-lm", f"data.train={data}"]
    return load_config(None, [*base, "data.eval=null", "data.max_length=1024", *extra])


SHAPES = {
    "openai": lambda: {"messages": openai_row(), "tools": TOOLS},
    "trl": lambda: {"messages": openai_row(system=True), "tools": json.dumps(TOOLS)},
    "sharegpt": lambda: {"conversations": sharegpt_row(), "tools": json.dumps([WEATHER])},
    "reasoning": lambda: {"messages": openai_row(reasoning="ask the tool"), "tools": TOOLS},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_row_shape_trains_on_the_tiny_model(tmp_path, shape):
    from support.workloads import build_workload

    rows = [SHAPES[shape]() for _ in range(2)] + [{**SHAPES[shape](), "tools": None}]
    data = _write_rows(tmp_path / "agent.jsonl", rows)
    extra = ["data.chat_template=qwen3" if shape == "reasoning" else "data.chat_template=qwen2.5"]
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS), encoding="utf-8")
    workload = build_workload(_cfg(data, *extra, f"data.tools={tmp_path / 'tools.json'}"))
    tok = workload.tokenizer
    example = workload.train_dataset[0]
    learned = tok.decode([t for t in example["labels"] if t != IGNORE_INDEX])
    assert CALL_TEXT["qwen2.5"] in learned and ANSWER in learned and RESULT not in learned
    third = workload.train_dataset[2]  # no tools in its row: the data.tools file's
    assert tok.decode(third["input_ids"]).count("get_weather") == 2  # the schema and the call
    batch = workload.collator([workload.train_dataset[i] for i in range(3)])
    assert workload.model(**batch).loss.isfinite()


def test_the_data_check_shows_a_calling_row_and_warns_of_undeclared_calls(tmp_path):
    from xtrain.tasks.text import causal_lm

    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    other = {"messages": openai_row(), "tools": [{"type": "function", "function": {"name": "get_time"}}]}
    rows = [plain, {"messages": openai_row(), "tools": TOOLS}, other, other]
    report = causal_lm.check_data(
        _cfg(_write_rows(tmp_path / "a.jsonl", rows), "data.chat_template=qwen2.5"), 10
    )
    example = report.example
    assert example.row == 1  # the first row that calls a tool, not the first row
    trained = "".join(p.text for p in example.pieces if p.trained)
    untrained = "".join(p.text for p in example.pieces if not p.trained)
    assert CALL_TEXT["qwen2.5"] in trained and RESULT in untrained and RESULT not in trained
    (warning,) = [n for n in report.notes if "get_weather" in n]
    assert "2 call(s) to 'get_weather'" in warning and "row 2 of" in warning


def test_the_data_check_names_a_template_without_tools(tmp_path):
    from xtrain.tasks.text import causal_lm

    data = _write_rows(tmp_path / "a.jsonl", [{"messages": openai_row(), "tools": TOOLS}])
    with pytest.raises(XtrainError) as e:
        causal_lm.check_data(_cfg(data, "data.chat_template=smollm2"), 10)
    assert (
        "row 0 of" in e.value.message and "data.chat_template=smollm2 cannot render them" in e.value.message
    )


# ---------------------------------------------------------------------------------------------
# Predict: calls parsed from each template's format, scored against a row's reference call


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "paris"}, "id": "abcdefgh1"}]',
        ' [{"name": "get_weather", "arguments": {"city": "paris"}}]',  # Mistral's marker decoded away
        '{"name": "get_weather", "parameters": {"city": "paris"}}',  # Llama 3.1
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "paris"}}',
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"paris\\"}"}',  # cut short
    ],
)
def test_a_call_reads_back_from_every_template_format(text):
    from xtrain.tasks.text import tool_calls

    assert tool_calls.parse(text) == [{"name": "get_weather", "arguments": PARIS}]


def test_answers_in_words_are_not_calls_and_scores_compare_calls():
    from xtrain.tasks.prompt_predict import text_score
    from xtrain.tasks.text import tool_calls
    from xtrain.tasks.text.causal_lm import TOOL_USE

    assert tool_calls.parse("It is sunny in paris.") is None
    assert tool_calls.parse("<tool_call>\nnot json\n</tool_call>") is None
    ref = tool_calls.reference([{"function": {"name": "get_weather", "arguments": PARIS}}])
    good = CALL_TEXT["qwen2.5"]
    wrong = good.replace("paris", "lima")
    scores = text_score([ref, ref, ref, "a word"], [good, wrong, "no call", "a word"], TOOL_USE)
    assert scores["call_exact_match"] == pytest.approx(1 / 3) and scores["exact_match"] == 0.25
    assert "call_exact_match" not in text_score(["a word"], ["a word"], TOOL_USE)


@pytest.mark.parametrize("name", [n for n in templates.NAMES if n != "qwen3"])
def test_shipped_templates_export_to_ollamas_turns(tokenizer, name):
    """A run trained with a shipped template exports its turns to an Ollama Modelfile (plain
    conversations; Qwen3's think block, rendered only on the last turn, is refused by export)."""
    from xtrain.export import templates as export_templates

    assert export_templates.derive(chat.renderer(tokenizer, templates.named(name))) is not None
