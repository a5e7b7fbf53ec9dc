"""causal-lm reads the data formats users already have (data.row_format, docs/training.md#data-formats):
alpaca and sharegpt rows mapped onto the prompt/response and messages paths (loss on the answers
only), detected from the columns; a malformed row is one line naming the file, the row and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.workloads import build_workload

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows.formats import detect
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "examples" / "data" / "chat-template.jinja"

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

ALPACA = [
    {"instruction": "Name a colour.", "input": "", "output": "Red."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5", "system": "Answer briefly."},
    {"instruction": "Say hi.", "output": "Hi!"},  # no input field at all
]
SHAREGPT = [
    [{"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Red."}],
    [
        {"from": "system", "value": "Answer briefly."},
        {"from": "user", "value": "Add 2 and 3."},
        {"from": "assistant", "value": "5"},
        {"from": "human", "value": "And 4 and 4?"},
        {"from": "gpt", "value": "8"},
    ],
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(data: Path, *extra: str):
    base = ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", f"data.train={data}"]
    return load_config(None, [*base, "data.eval=null", "data.max_length=128", *extra])


def _learned(workload, i: int) -> str:
    labels = workload.train_dataset[i]["labels"]
    return workload.tokenizer.decode([t for t in labels if t != IGNORE_INDEX])


def _seen(workload, i: int) -> str:
    return workload.tokenizer.decode(workload.train_dataset[i]["input_ids"], skip_special_tokens=True)


@pytest.mark.parametrize(
    ("columns", "prompt_set", "expected"),
    [
        (["text"], False, "text"),
        (["instruction", "input", "output"], False, "alpaca"),
        (["instruction", "output", "text"], False, "alpaca"),  # tatsu-lab/alpaca's rendered text column
        (["conversations"], False, "sharegpt"),
        (["messages"], False, "messages"),
        (["messages", "text"], False, "text"),  # as before: a text column wins over messages
        (["prompt", "response"], False, "prompt_response"),
        (["q", "a"], True, "prompt_response"),
        (["body"], False, "text"),  # then the missing text column is the one-line error
    ],
)
def test_auto_detects_the_format_from_the_columns(columns, prompt_set, expected):
    assert detect("auto", columns, "text", "messages", prompt_set) == expected
    assert detect("sharegpt", columns, "text", "messages", prompt_set) == "sharegpt"  # a set one wins


def test_alpaca_without_a_chat_template_is_prompt_response_with_the_loss_on_the_output(tmp_path):
    workload = build_workload(_cfg(_jsonl(tmp_path / "a.jsonl", ALPACA)))
    eos = workload.tokenizer.eos_token
    assert not workload.chat  # builtin:tiny-llama has no chat template
    assert [_learned(workload, i) for i in range(3)] == [f"{r['output']}{eos}" for r in ALPACA]
    seen = [_seen(workload, i) for i in range(3)]
    assert seen[0] == "Name a colour.\n\nRed."  # an empty input adds nothing
    assert seen[1] == "Answer briefly.\n\nAdd the numbers.\n\n2 and 3\n\n5"
    assert seen[2] == "Say hi.\n\nHi!"
    batch = workload.collator([workload.train_dataset[i] for i in range(3)])
    assert workload.model(**batch).loss.isfinite()


def test_alpaca_with_a_chat_template_becomes_a_conversation(tmp_path):
    workload = build_workload(_cfg(_jsonl(tmp_path / "a.jsonl", ALPACA), f"data.chat_template={TEMPLATE}"))
    eos = workload.tokenizer.eos_token
    assert workload.chat  # xtrain predict renders prompts as user turns, as here
    assert [_learned(workload, i) for i in range(3)] == [f"{r['output']}{eos}" for r in ALPACA]
    second = workload.tokenizer.decode(workload.train_dataset[1]["input_ids"])
    assert "Answer briefly." in second and "Add the numbers.\n\n2 and 3" in second
    with pytest.raises(XtrainError, match="data.packing=concatenate would cut conversations") as e:
        build_workload(
            _cfg(tmp_path / "a.jsonl", f"data.chat_template={TEMPLATE}", "data.packing=concatenate")
        )
    assert "alpaca rows are chat conversations" in str(e.value)


def test_sharegpt_becomes_messages_with_the_loss_on_the_gpt_turns(tmp_path):
    data = _jsonl(tmp_path / "s.jsonl", [{"conversations": c} for c in SHAREGPT])
    workload = build_workload(_cfg(data, f"data.chat_template={TEMPLATE}"))
    eos = workload.tokenizer.eos_token
    assert workload.chat
    assert _learned(workload, 0) == f"Red.{eos}"
    assert _learned(workload, 1) == f"5{eos}8{eos}"  # both answers, neither question nor system
    with pytest.raises(XtrainError, match="no chat template") as e:  # sharegpt needs a template
        build_workload(_cfg(data))
    assert "data.chat_template" in str(e.value)


def test_a_set_row_format_reads_its_columns_or_says_which_are_missing(tmp_path):
    data = _jsonl(tmp_path / "t.jsonl", [{"text": "a story", "output": "x"}])
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(data, "data.row_format=alpaca"))
    assert "alpaca rows need 'instruction'" in str(e.value) and "has text, output" in str(e.value)
    pr = _jsonl(tmp_path / "pr.jsonl", [{"prompt": "Q: 2+2? A: ", "response": "4"}])
    workload = build_workload(_cfg(pr, "data.row_format=prompt-response"))  # the default columns
    assert _learned(workload, 0) == f"4{workload.tokenizer.eos_token}"


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"instruction": "Say hi.", "output": ""}, "field 'output' is missing or empty"),
        ({"output": "x"}, "field 'instruction' is missing or empty"),
        ({"conversations": [{"from": "tool", "value": "x"}]}, "conversations[0] field 'from' is 'tool'"),
        ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt"}]}, "[1] field 'value'"),
        ({"conversations": []}, "field 'conversations' must be a non-empty list"),
        ({"conversations": [{"from": "human", "value": "hi"}]}, "has no assistant turn"),
    ],
)  # fmt: skip
def test_a_malformed_row_is_one_line_naming_file_row_and_field(tmp_path, row, says):
    good = {"conversations": SHAREGPT[0]} if "conversations" in row else ALPACA[0]
    data = _jsonl(tmp_path / "rows.jsonl", [good, good, row])
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(data, f"data.chat_template={TEMPLATE}", "data.row_format=auto"))
    line = e.value.one_line()
    assert says in line and "row 2 of" in line and "rows.jsonl" in line and "\n" not in line


def test_a_bad_row_at_the_command_line_is_one_line_exit_2(tmp_path):
    from support.jobs import make_job, python_run, run_xtrain

    job = make_job(tmp_path / "job", steps=1)
    data = _jsonl(tmp_path / "bad.jsonl", [*ALPACA[:2], {"instruction": "x", "output": None}])
    args = ("--config", str(job.config), f"data.train={data}", "data.eval=null")
    proc = run_xtrain(python_run(*args, f"run.output_dir={tmp_path / 'out'}"), job.env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if re.search(r"\berror:", ln)]
    assert len(errors) == 1 and "row 2 of" in errors[0] and "field 'output'" in errors[0], proc.stderr


def test_a_field_of_another_type_is_named():
    from xtrain.data.rows.formats import BadRow, alpaca_fields

    with pytest.raises(BadRow, match=r"row 4 of f.jsonl: field 'input' holds int, not text"):
        alpaca_fields({"instruction": "Add.", "input": 5, "output": "x"}, 4, "f.jsonl")
