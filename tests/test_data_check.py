"""The data checked before launch (docs/training.md#the-data-check): `xtrain train --dry-run` reads
the first rows of the data through the task's own readers, refuses a bad file, column, image or row
in one line (exit 2), and shows one example as the model gets it with its trained tokens marked;
the run's build runs the same check on the first rows it loaded."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest
from support.workloads import local_run

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.tasks import get as get_task
from xtrain.tasks.validation import load_config

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def _dry_run(capsys: pytest.CaptureFixture[str], config: Path, *extra: str) -> tuple[int, str, str]:
    from xtrain.cli import main

    code = main(["train", str(config), *extra, "--dry-run", "--platform", "linux"])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_refusal(code: int, err: str, *says: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for text in says:
        assert text in lines[0], lines[0]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _chat_job(tmp_path: Path, rows: list[dict], *more: str) -> Path:
    _jsonl(tmp_path / "train.jsonl", rows)
    config = tmp_path / "job.yaml"
    lines = ["model:", "  name_or_path: builtin:tiny-llama", "  task: causal-lm",
             "data:", "  train: train.jsonl", "  max_length: 64", *more]  # fmt: skip
    config.write_text("\n".join(lines) + "\n")
    return config


def _chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


# ---------------------------------------------------------------------------------------------
# --dry-run through the CLI


def test_dry_run_shows_the_example_with_its_trained_tokens_marked(tmp_path, capsys):
    rows = [_chat(f"the opposite of {a}?", b) for a, b in [("hot", "cold"), ("up", "down")] * 3]
    code, out, err = _dry_run(capsys, _chat_job(tmp_path, rows, "  chat_template: '" + TEMPLATE + "'"))
    assert code == 0, err
    assert f"Data: train {tmp_path / 'train.jsonl'}: 6 rows, messages; tokens per row" in out
    assert "0 longer than data.max_length=64" in out
    assert f"Example, row 0 of {tmp_path / 'train.jsonl'}" in out
    # the template's text as the model reads it; only the answer and its end token carry loss
    assert "<user>the opposite of hot?</user><assistant>[[cold</assistant>]]" in out, out
    assert out.index("Plan:") < out.index("Data:") < out.index("# what xtrain runs")


TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_dry_run_refuses_a_missing_file_in_one_line(tmp_path, capsys, machines_dir):
    config = _chat_job(tmp_path, [_chat("q?", "a")])
    (tmp_path / "train.jsonl").unlink()
    code, _, err = _dry_run(capsys, config)
    _one_line_refusal(code, err, "data file train.jsonl not found (data.train)")
    # another machine's plan (--facts) still checks the data: it is on this machine
    facts = machines_dir / "windows-2x4090.json"
    code, _, err = _dry_run(capsys, config, "--facts", str(facts))
    _one_line_refusal(code, err, "not found (data.train)")


def test_dry_run_refuses_a_missing_column_in_one_line(tmp_path, capsys):
    config = _chat_job(tmp_path, [{"question": "q?", "answer": "a"}] * 3, "  row_format: prompt_response")
    code, _, err = _dry_run(capsys, config)
    says = ("rows need 'prompt' and 'response'", "has question, answer", "set data.prompt_column")
    _one_line_refusal(code, err, *says)


def test_dry_run_refuses_rows_with_nothing_left_to_learn_and_names_the_length_that_keeps_them(
    tmp_path, capsys
):
    """Every row's answer past data.max_length (tool schemas in the system turn): the run would
    stop with "no training examples left", so the dry run says so in one line with the fix (exit
    2); where some rows still have an answer, the Data line counts the others and the run goes on."""
    system = {"role": "system", "content": "tools: " + json.dumps([{"type": "string"}] * 20)}
    long = {"messages": [system, *_chat("q?", "yes")["messages"]]}
    template = "  chat_template: '" + TEMPLATE + "'"
    code, _, err = _dry_run(capsys, _chat_job(tmp_path, [long] * 4, template))
    _one_line_refusal(code, err, f"nothing to learn in data.train {tmp_path / 'train.jsonl'}: all 4 rows are")
    length = int(err.split("rows are ")[1].split(" ")[0])
    assert length > 64 and "data.max_length=64 cuts off all their trained tokens" in err, err
    assert f"set data.max_length={length} to keep every checked row whole" in err, err
    code, out, err = _dry_run(capsys, _chat_job(tmp_path, [long, _chat("q?", "yes")] * 2, template))
    assert code == 0, err
    assert "2 longer than data.max_length=64, 2 with nothing left to learn (the run leaves them out)" in out
    config = _chat_job(tmp_path, [long] * 4, template)
    config.write_text(config.read_text().replace("max_length: 64", f"max_length: {length}"))
    code, _, err = _dry_run(capsys, config)  # the fix it names
    assert code == 0, err


def test_dry_run_warns_when_the_cut_loses_most_of_the_answers(tmp_path, capsys):
    """Answers cut off the end by data.max_length: the run trains on what is left (exit 0), and
    the dry run says how much of the answers is lost and the length that keeps them whole."""
    rows = [_chat("q?", "yes " * 40)] * 3
    code, out, err = _dry_run(capsys, _chat_job(tmp_path, rows, "  chat_template: '" + TEMPLATE + "'"))
    assert code == 0, err
    kept, whole = map(int, out.split("trained tokens kept")[0].split("; ")[-1].split(" of "))
    assert 0 < kept < whole / 2, out
    length = int(out.split("up to ")[1].split(" ")[0])
    assert length > 64 and f"data.max_length={length} keeps them whole" in out, out
    assert f"warning: data.max_length=64 cuts {1 - kept / whole:.0%} of the trained tokens" in out, out


def test_a_model_folder_without_tokenizer_files_is_planned_untokenized_and_refused_by_the_run(
    tmp_path, capsys
):
    """A config.json alone (the memory plan of a model not downloaded yet): transformers 5 builds
    its tokenizer class with an empty vocabulary, every row tokenizing to nothing. The dry run
    checks the rows untokenized and says why (no "nothing to learn" refusal); loading it for a run
    is one line naming the folder."""
    from xtrain.errors import NoTokenizer
    from xtrain.model.load import load_tokenizer

    folder = tmp_path / "qwen"
    folder.mkdir()
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 1000,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    job = tmp_path / "job.yaml"
    job.write_text(f"model:\n  name_or_path: {folder.as_posix()}\n  task: causal-lm\n"
                   "data:\n  train: builtin:tiny-stories\n")  # fmt: skip
    code, out, err = _dry_run(capsys, job)
    assert code == 0, err
    text = " ".join(out.split())
    assert "rows checked without tokenizing them" in text and "has no vocabulary" in text, text
    with pytest.raises(NoTokenizer, match="copy the model's tokenizer files into that folder"):
        load_tokenizer(str(folder), trust_remote_code=False)


def _vqa_rows(tmp_path: Path, n: int) -> list[dict]:
    from xtrain.builtin import vision_language as builtin_vl

    (tmp_path / "img").mkdir(exist_ok=True)
    rng = random.Random(0)
    rows = []
    for i in range(n):
        builtin_vl.draw_shape(builtin_vl.SHAPES[i % 4], "red", rng).save(tmp_path / "img" / f"{i}.png")
        parts = [{"type": "image", "image": f"img/{i}.png"}, {"type": "text", "text": "which shape?"}]
        rows.append({"messages": [{"role": "user", "content": parts},
                                  {"role": "assistant", "content": builtin_vl.SHAPES[i % 4]}]})  # fmt: skip
    return rows


def _vqa_job(tmp_path: Path, rows: list[dict]) -> Path:
    _jsonl(tmp_path / "vqa.jsonl", rows)
    config = tmp_path / "vqa.yaml"
    config.write_text(
        "model:\n  name_or_path: builtin:tiny-qwen2-vl\n  task: vision-language\n"
        "data:\n  train: vqa.jsonl\n  max_length: 64\n"
    )
    return config


def test_dry_run_refuses_a_missing_image_and_shows_the_expanded_example(tmp_path, capsys):
    rows = _vqa_rows(tmp_path, 3)
    code, out, err = _dry_run(capsys, _vqa_job(tmp_path, rows))
    assert code == 0, err
    assert "images per row 1" in out and f"image {tmp_path / 'img' / '0.png'} (" in out
    # the processor's expansion of the image placeholder, and the answer as the trained span
    assert "<|image_pad|>[... " in out and f"[[{rows[0]['messages'][1]['content']}<|im_end|>]]" in out, out
    (tmp_path / "img" / "2.png").unlink()
    code, _, err = _dry_run(capsys, _vqa_job(tmp_path, rows))
    _one_line_refusal(code, err, f"image {tmp_path / 'img' / '2.png'} (row 2 of", "vqa.jsonl) not found")


def test_a_row_with_an_image_no_turn_uses_is_refused_with_the_row(tmp_path, capsys):
    rows = _vqa_rows(tmp_path, 3)
    rows[1]["images"] = ["img/0.png"]  # listed for the row, but its one image part names its own file
    rows[0]["images"] = None
    rows[2]["images"] = None
    code, _, err = _dry_run(capsys, _vqa_job(tmp_path, rows))
    _one_line_refusal(code, err, "row 1 of", "field 'images' lists 1 image(s) but the turns place 0")
    # the run refuses it too, before the model loads
    cfg = load_config(tmp_path / "vqa.yaml", [])
    with pytest.raises(XtrainError, match="row 1 of .* lists 1 image.s. but the turns place 0"):
        get_task(cfg.model.task).build(local_run(cfg), contextlib.nullcontext)


# ---------------------------------------------------------------------------------------------
# The check and the run agree


def test_the_example_is_the_runs_first_training_row(tmp_path):
    """causal-lm chat: the example's text and trained tokens are the run's row 0, token for token."""
    from support.workloads import build_workload

    from xtrain.data.collate import IGNORE_INDEX

    rows = [_chat(f"the opposite of {a}?", b) for a, b in [("hot", "cold"), ("up", "down")]]
    cfg = load_config(_chat_job(tmp_path, rows, "  chat_template: '" + TEMPLATE + "'"), [])
    report = get_task(cfg.model.task).check_data(cfg, 100)
    workload = build_workload(cfg)
    row, tok = workload.train_dataset[0], workload.tokenizer
    example = report.example
    assert example is not None and example.tokens == len(row["input_ids"])
    assert "".join(p.text for p in example.pieces) == tok.decode(row["input_ids"])
    trained = [t for t in row["labels"] if t != IGNORE_INDEX]
    assert example.trained == len(trained)
    assert "".join(p.text for p in example.pieces if p.trained) == tok.decode(trained)
    # the run keeps the same check of its own first rows: the banner's line
    assert workload.data_report is not None
    line = f"train {cfg.data.train} (2 rows checked, messages, 0 cut at data.max_length)"
    assert workload.data_report.summary() == line


def test_the_example_is_the_text_as_it_is_and_only_a_special_tokens_run_is_cut():
    """`}}}}}` in an answer reads as it is (it once read `}*5`, valid JSON shown broken); a
    special token the model gets many times over (an image's patches) is written once with a
    count that the renderer marks as no part of the text."""
    from transformers import AutoTokenizer

    from xtrain.commands.render_data import example_lines
    from xtrain.data.collate import IGNORE_INDEX
    from xtrain.tasks.data_check import pieces
    from xtrain.tasks.data_report import Example

    tok = AutoTokenizer.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-llama"))
    answer = '{"a": {"b": {"c": {"d": {"type": "string"}}}}}'
    prompt = tok("call:", add_special_tokens=False)["input_ids"]
    ids = prompt + [tok.eos_token_id] * 9 + tok(answer, add_special_tokens=False)["input_ids"]
    labels = [IGNORE_INDEX] * (len(ids) - len(ids[len(prompt) + 9 :])) + ids[len(prompt) + 9 :]
    shown = pieces(tok, ids, labels)
    assert [p.more for p in shown] == [0, 8, 0] and shown[1].text == tok.eos_token
    assert shown[2].trained and shown[2].text.strip() == answer
    example = Example("f.jsonl", 0, shown, tokens=len(ids))
    (plain,) = [line.plain for line in example_lines(example, styled=False)[1:]]
    assert plain.endswith(f"{tok.eos_token}[... 8 more ...][[{shown[2].text}]]"), plain
    styled = example_lines(example, styled=True)[-1]
    assert any(span.style == "dim" and styled.plain[span.start : span.end] == "[... 8 more ...]"
               for span in styled.spans)  # fmt: skip


@pytest.mark.parametrize(
    ("job", "expect"),
    [
        ("lora-causal-lm.yaml", "Question:"),
        ("seq-cls.yaml", "label"),
        ("image-to-text-ocr.yaml", "image"),
        ("speech-to-text-words.yaml", "audio"),
        ("image-classification-shapes.yaml", "image"),
    ],
)
def test_every_builtin_job_is_checked_with_an_example(job, expect):
    cfg = load_config(REPO / "examples" / job, [])
    report = get_task(cfg.model.task).check_data(cfg, 16)
    assert [s.role for s in report.sources] == ["train", "eval"] and not report.notes
    assert all(s.checked == 16 for s in report.sources)
    example = report.example
    assert example is not None and example.row == 0
    shown = " ".join([*(p.text for p in example.pieces), *example.inputs, example.label or ""])
    assert expect in shown or (expect == "label" and example.label), shown
    if example.label is None:  # the tokens with loss: a decoder's whole text, a response
        assert 0 < example.trained <= example.tokens and any(p.trained for p in example.pieces)


def test_only_the_first_rows_are_read(tmp_path):
    """A bad row past the checked ones is the run's to find: the check reads the first rows only
    (streamed), and says it does not know the total."""
    rows = [_chat("q?", "a")] * 5 + [{"messages": "not a conversation"}]
    cfg = load_config(_chat_job(tmp_path, rows, "  chat_template: '" + TEMPLATE + "'"), [])
    report = get_task(cfg.model.task).check_data(cfg, 4)
    assert report.sources[0].checked == 4 and report.sources[0].total is None
    assert report.sources[0].rows() == "first 4 of more rows"
    with pytest.raises(XtrainError, match="row 5 of"):
        get_task(cfg.model.task).check_data(cfg, 10)


# ---------------------------------------------------------------------------------------------
# Labels against the model's


def _classifier(folder: Path, id2label: dict[int, str]) -> Path:
    """builtin:tiny-bert saved with a trained head of ``id2label``'s classes."""
    from transformers import AutoModelForSequenceClassification

    base = builtin.ensure_builtin_model("builtin:tiny-bert")
    labels = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    model = AutoModelForSequenceClassification.from_pretrained(base, **labels)
    model.save_pretrained(folder)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("classes", "says"),
    [
        ({0: "pos", 1: "neg"}, "the labels are the classes of"),  # the same names, another order
        ({0: "neg", 1: "neutral", 2: "pos"}, "has a trained head of 3 classes"),
    ],
)
def test_labels_that_do_not_fit_the_models_head_are_refused(tmp_path, capsys, classes, says):
    model = _classifier(tmp_path / "model", classes)
    (tmp_path / "train.csv").write_text("text,label\ngood,pos\nbad,neg\nfine,pos\n")
    config = tmp_path / "job.yaml"
    config.write_text(f"model:\n  name_or_path: {model}\n  task: seq-cls\ndata:\n  train: train.csv\n")
    code, _, err = _dry_run(capsys, config)
    _one_line_refusal(code, err, says)


def test_labels_in_the_heads_order_pass(tmp_path, capsys):
    model = _classifier(tmp_path / "model", {0: "neg", 1: "pos"})
    (tmp_path / "train.csv").write_text("text,label\ngood,pos\nbad,neg\nfine,pos\n")
    config = tmp_path / "job.yaml"
    config.write_text(f"model:\n  name_or_path: {model}\n  task: seq-cls\ndata:\n  train: train.csv\n")
    code, out, err = _dry_run(capsys, config)
    assert code == 0, err
    assert "labels pos 2, neg 1" in out and "label: [[pos (id 1)]]" in out
    assert "the labels are the classes of" in out
