"""Text-only chat under causal-lm: the `messages` format rendered by a chat template, loss on the
assistant turns only, a missing template or a bad row as one line (examples/chat-sft.yaml)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.workloads import build_workload

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "chat-sft.yaml"


pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows), encoding="utf-8")
    return path


def _cfg(data: Path, *extra: str):
    base = ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", f"data.train={data}"]
    return load_config(None, [*base, "data.eval=null", *extra])


def _answers(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


def test_only_the_assistant_answers_carry_loss():
    workload = build_workload(load_config(EXAMPLE, ["data.eval=null"]))
    tokenizer = workload.tokenizer
    rows = [
        json.loads(x)["messages"] for x in (REPO / "examples/data/chat-train.jsonl").read_text().splitlines()
    ]
    assert len(workload.train_dataset) == len(rows)
    for i in (0, 1, 2):  # a system turn; two turns; one plain turn
        example = workload.train_dataset[i]
        learned = tokenizer.decode([t for t in example["labels"] if t != -100])
        assert learned == "".join(f"{a}{tokenizer.eos_token}" for a in _answers(rows[i]))
        assert len(example["labels"]) == len(example["input_ids"])
    assert len(_answers(rows[1])) == 2
    batch = workload.collator([workload.train_dataset[i] for i in range(4)])
    lengths = [len(workload.train_dataset[i]["input_ids"]) for i in range(4)]
    assert batch["attention_mask"].sum(1).tolist() == lengths  # each row's own tokens (the collator's mask)
    assert workload.model(**batch).loss.isfinite()
    assert workload.tokenizer.chat_template  # the named template is saved with the adapter


def test_a_tokenizer_without_template_is_one_line_naming_the_key(tmp_path):
    data = _write(
        tmp_path / "c.jsonl", [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]
    )
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(data))
    assert "no chat template" in str(e.value) and "data.chat_template" in str(e.value)
    inline = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    workload = build_workload(_cfg(data, f"data.chat_template={inline}"))
    labels = workload.train_dataset[0]["labels"]
    assert workload.tokenizer.decode([t for t in labels if t != -100]) == "yo</s>"
    with pytest.raises(XtrainError, match="data.packing=concatenate would cut conversations"):
        build_workload(_cfg(data, f"data.chat_template={inline}", "data.packing=concatenate"))


ANSWER = {"role": "assistant", "content": "x"}


@pytest.mark.parametrize(
    ("turns", "says"),
    [
        ([{"role": "user", "content": "hi"}], "has no assistant turn"),
        ([{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}], "role 'bot'"),
        ([{"role": "assistant", "content": "yo"}], "before any user turn"),
        ([{"role": "user", "content": [{"type": "image", "image": "a.png"}]}, ANSWER], "chat is text only"),
        ([{"role": "user", "content": [{"type": "audio"}]}, ANSWER], "type 'audio'"),
    ],
)  # fmt: skip
def test_bad_rows_are_one_line_naming_row_and_file(tmp_path, turns, says):
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    data = _write(tmp_path / "chat.jsonl", [good, good, turns])
    template = REPO / "examples/data/chat-template.jinja"
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(data, f"data.chat_template={template}"))
    message = e.value.one_line()
    assert says in message and "row 2 of" in message and "chat.jsonl" in message and "\n" not in message


def test_builtin_tiny_llama_stays_without_template(private_caches):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-llama"))
    assert not tokenizer.chat_template  # the example names one: the error path stays reachable


# ---------------------------------------------------------------------------------------------
# xtrain predict on a chat run


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory) -> Path:
    """Two steps of examples/chat-sft.yaml: an adapter saved with its chat template."""
    from support.jobs import offline_env, python_run, run_xtrain

    root = tmp_path_factory.mktemp("chat")
    env = offline_env(root, tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain")
    out = root / "run"
    args = ("--config", str(EXAMPLE), "run.max_steps=2", "data.eval=null", f"run.output_dir={out}")
    proc = run_xtrain(python_run(*args), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_predict_renders_a_chat_prompt_as_training_rendered_it(chat_run, capsys):
    from xtrain import predict
    from xtrain.cli import main
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks import prompt_predict
    from xtrain.tasks.text import causal_lm

    task, loaded = predict.load_predictor(chat_run)
    assert task is causal_lm.TASK and loaded.parts["chat"]
    text, stop = prompt_predict.chat_prompt(loaded, "what is red?", system="one word")
    tokenizer = build_workload(load_config(EXAMPLE, ["data.eval=null"])).tokenizer
    turns = [
        {"role": "system", "content": "one word"},
        {"role": "user", "content": "what is red?"},
        {"role": "assistant", "content": "a colour"},
    ]
    conv = chat_data.parse_conversation(turns, 0, "t", allow_images=False)
    render = chat_data.renderer(tokenizer, tokenizer.chat_template)
    assert text == chat_data.encode(render, tokenizer, conv, "t").prompt  # the prompt before the answer
    assert stop == tokenizer.eos_token_id  # the example template ends a turn with the eos token
    args = ["predict", str(chat_run), "-p", "what is red?", "--system", "one word", "--max-new-tokens", "3"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("what is red?\t")


def test_a_plain_text_run_on_a_chat_model_continues_the_raw_prompt(tmp_path, capsys):
    from xtrain import predict
    from xtrain.cli import main
    from xtrain.tasks import prompt_predict

    model = shutil.copytree(builtin.ensure_builtin_model("builtin:tiny-llama"), tmp_path / "model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = (REPO / "examples/data/chat-template.jinja").read_text()  # a chat model
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "xtrain_run.json").write_text(json.dumps({"task": "causal-lm", "chat": False}))
    _, loaded = predict.load_predictor(model)
    assert loaded.tokenizer.chat_template and not loaded.parts["chat"]
    assert prompt_predict.chat_prompt(loaded, "once upon") == ("once upon", None)
    assert main(["predict", str(model), "-p", "hi", "--system", "be brief"]) == 2
    assert "--system" in capsys.readouterr().err


def test_an_unsafe_template_is_named_not_a_row(tmp_path):
    """jinja2's sandbox refuses a template that reaches for Python internals: the line names the
    template as unsafe (the data is fine), not "row 0 ... fix or remove that row"."""
    data = _write(
        tmp_path / "chat.jsonl", [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]
    )
    unsafe = "{% for m in messages %}{{ m['content'].__class__.__mro__[1].__subclasses__() }}{% endfor %}"
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(data, f"data.chat_template={unsafe}"))
    message = e.value.one_line()
    assert message.startswith("data.chat_template is unsafe: the sandbox refused it")
    assert "row" not in message and "\n" not in message
    # the same template as the tokenizer's own: named as the tokenizer's
    from xtrain.data.rows import chat as chat_data

    class Owner:
        chat_template = unsafe

        def apply_chat_template(self, messages, chat_template, **kwargs):
            from jinja2.exceptions import SecurityError

            raise SecurityError("access to attribute '__class__' of 'str' object is unsafe.")

    render = chat_data.renderer(Owner(), unsafe)
    with pytest.raises(XtrainError, match="^the tokenizer's chat template is unsafe"):
        chat_data.assistant_spans(render, [{"role": "user", "content": "hi"}, ANSWER], "row 0 of chat.jsonl")
