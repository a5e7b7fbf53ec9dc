"""`xtrain predict RUN --data FILE`: every row of a data file read by the run's own row readers,
batched, one JSON line per row with the reference and the task's metric; sampling options;
bad rows and existing results files refused in one line with nothing written.

The results are held against plain references: the same model generating for one prompt at a
time, the file-inputs path of the same task, and the prompt training rendered."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xtrain import predict as lib
from xtrain.cli import main
from xtrain.tasks.contract import PredictRequest

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "examples" / "data" / "chat-template.jinja"
PROMPTS = ["once upon a time there was", "the cat", "a little dog ran to the old red"]

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def _builtin(tmp_path_factory, name: str) -> Path:
    from support.jobs import session_builtin

    return session_builtin(tmp_path_factory, name)


def _record(task: str, chat: bool = False, data: dict | None = None, **more) -> str:
    return json.dumps({"task": task, "chat": chat, "data": data or {}, **more})


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _refused(args: list[str], capsys) -> str:
    capsys.readouterr()  # what earlier in-process calls printed
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    return err


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Path:
    """A run folder holding a LoRA adapter (its B weights not zero, so it changes the outputs) of
    the built-in tiny llama, recorded as a prompt/response run on `question`/`answer` columns."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = _builtin(tmp_path_factory, "builtin:tiny-llama")
    run = tmp_path_factory.mktemp("text") / "run"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(run / "adapter")
    AutoTokenizer.from_pretrained(base).save_pretrained(run / "adapter")
    data = {"prompt_column": "question", "response_column": "answer", "row_format": "auto"}
    record = _record("causal-lm", data=data, row_format="prompt_response")
    (run / "adapter" / "xtrain_run.json").write_text(record, encoding="utf-8")
    return run


@pytest.fixture(scope="module")
def plain(text_run) -> dict[str, str]:
    """Each prompt's greedy continuation, one prompt at a time, without padding: the reference."""
    import torch

    _, loaded = lib.load_predictor(text_run)
    tokenizer, out = loaded.tokenizer, {}
    for prompt in PROMPTS:
        enc = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            ids = loaded.model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=0)
        out[prompt] = tokenizer.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    return out


def test_every_row_is_one_line_with_its_reference_and_exact_match(text_run, plain, tmp_path, capsys):
    rows = [
        {"question": PROMPTS[0], "answer": plain[PROMPTS[0]]},  # the model's own answer: a hit
        {"question": PROMPTS[1], "answer": "not what it says"},
        {"question": PROMPTS[2]},  # a prompt without a reference
    ]
    data = _jsonl(tmp_path / "eval.jsonl", rows)
    args = ["predict", str(text_run / "adapter"), "--data", str(data), "--max-new-tokens", "6"]
    assert main([*args, "--batch-size", "2"]) == 0
    captured = capsys.readouterr()
    out = text_run / "predictions-eval.jsonl"  # the default: in the run's output_dir
    assert f"3 rows -> {out}" in captured.out
    assert "exact match 0.5 over 2 rows with a reference (of 3)" in captured.err
    lines = _lines(out)
    assert [r["row"] for r in lines] == [0, 1, 2]
    assert [r["input"] for r in lines] == PROMPTS
    assert [r["output"] for r in lines] == [plain[p] for p in PROMPTS]  # left-padded batches: the same
    assert [r.get("exact_match") for r in lines] == [1.0, 0.0, None]
    assert lines[1]["reference"] == "not what it says" and "reference" not in lines[2]
    out.unlink()


def test_an_existing_results_file_is_replaced_only_with_force(text_run, tmp_path, capsys):
    data = _jsonl(tmp_path / "mine.jsonl", [{"question": PROMPTS[1]}])
    out = text_run / "predictions-mine.jsonl"
    out.write_text("the user's own results\n", encoding="utf-8")
    args = ["predict", str(text_run), "--data", str(data), "--max-new-tokens", "2"]
    err = _refused(args, capsys)
    assert "already exists" in err and "--force" in err
    assert out.read_text(encoding="utf-8") == "the user's own results\n"
    assert main([*args, "--force"]) == 0
    assert [r["input"] for r in _lines(out)] == [PROMPTS[1]]
    capsys.readouterr()
    assert main([*args, "--output", "-"]) == 0  # stdout: the lines themselves
    assert json.loads(capsys.readouterr().out.splitlines()[0])["input"] == PROMPTS[1]
    out.unlink()


def test_sampling_with_a_seed_is_reproducible_and_differs_from_greedy(text_run, plain, tmp_path):
    data = _jsonl(tmp_path / "p.jsonl", [{"question": p} for p in PROMPTS])

    def outputs(**sampling) -> list[str]:
        request = PredictRequest([], [], max_new_tokens=6, **sampling)
        return [r["output"] for r in lib.predict_file(text_run, data, request).rows]

    sampled = outputs(temperature=1.5, top_p=0.95, seed=3)
    assert sampled == outputs(temperature=1.5, top_p=0.95, seed=3)
    assert sampled == outputs(temperature=1.5, top_p=0.95, seed=3, batch_size=1)  # a row's own draws
    assert sampled != outputs(temperature=1.5, top_p=0.95, seed=4)
    assert sampled != [plain[p] for p in PROMPTS] == outputs()  # greedy stays the default
    assert outputs(temperature=0.0) == outputs()  # temperature 0 is greedy


def test_options_that_cannot_apply_are_one_line_before_any_model_loads(text_run, tmp_path, capsys):
    data = _jsonl(tmp_path / "p.jsonl", [{"question": "hi"}])
    run = str(text_run)
    assert "--data predicts every row" in _refused(["predict", run, "--data", str(data), "-p", "hi"], capsys)
    assert "not found" in _refused(["predict", run, "--data", str(tmp_path / "none.jsonl")], capsys)
    assert "--top-p must be" in _refused(["predict", run, "-p", "hi", "--top-p", "1.5"], capsys)
    assert "needs a number" in _refused(["predict", run, "-p", "x", "--temperature", "hot"], capsys)
    assert "--batch-size must be" in _refused(["predict", run, "-p", "x", "--batch-size", "0"], capsys)
    missing = _jsonl(tmp_path / "other.jsonl", [{"prompt": "hi"}])  # not the run's columns
    err = _refused(["predict", run, "--data", str(missing)], capsys)
    assert "trained on prompt_response rows" in err and "need 'question'" in err and "other.jsonl" in err
    assert "data." not in err  # predict takes no data.* keys
    assert not (text_run / "predictions-other.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# Chat runs and the formats causal-lm reads


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """The tiny llama as a full-model result of a chat run: the example chat template saved."""
    base = _builtin(tmp_path_factory, "builtin:tiny-llama")
    model = shutil.copytree(base, tmp_path_factory.mktemp("chat") / "model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE.read_text()
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    record = _record("causal-lm", chat=True, row_format="messages")
    (model / "xtrain_run.json").write_text(record, encoding="utf-8")
    return model


CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "what is red?"},
    {"role": "assistant", "content": "a colour"},
    {"role": "user", "content": "and blue?"},
    {"role": "assistant", "content": "also"},
]


def test_a_chat_runs_rows_are_prompted_as_training_rendered_them(chat_model, tmp_path):
    from xtrain.data.rows import chat as chat_data
    from xtrain.model import load as models

    data = _jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}, {"messages": CONVERSATION[:4]}])
    task, examples = lib.read_examples(chat_model, data)
    tokenizer = models.load_tokenizer(str(chat_model), False)
    render = chat_data.renderer(tokenizer, tokenizer.chat_template)
    conv = chat_data.parse_conversation(CONVERSATION, 0, "t", allow_images=False)
    trained = chat_data.encode(render, tokenizer, conv, "t")  # what training saw before the last answer
    assert [render(e.feed, True) for e in examples] == [trained.prompt] * 2
    assert [e.reference for e in examples] == ["also", None]  # a row ending in a user turn: no reference
    assert [e.shown["input"] for e in examples] == ["and blue?"] * 2
    speaker = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = [{"from": speaker[t["role"]], "value": t["content"]} for t in CONVERSATION]
    data = _jsonl(tmp_path / "sharegpt.jsonl", [{"conversations": sharegpt}])
    other = shutil.copytree(chat_model, tmp_path / "sharegpt-run")
    (other / "xtrain_run.json").write_text(_record("causal-lm", chat=True, row_format="sharegpt"))
    (example,) = lib.read_examples(other, data)[1]
    assert render(example.feed, True) == trained.prompt and example.reference == "also"


def test_alpaca_prompts_without_outputs_are_read_as_training_writes_them(text_run, tmp_path):
    from xtrain.data.rows import formats as row_formats

    run = shutil.copytree(text_run, tmp_path / "alpaca-run")
    (run / "adapter" / "xtrain_run.json").write_text(_record("causal-lm", row_format="alpaca"))
    rows = [{"instruction": "Name a colour.", "input": "warm"}, {"instruction": "Say hi."}]
    _, examples = lib.read_examples(run, _jsonl(tmp_path / "a.jsonl", rows))
    batch = {"instruction": [r["instruction"] for r in rows], "input": ["warm", None], "output": ["-", "-"]}
    trained = row_formats.alpaca_prompt_response(batch, [0, 1], "a")["prompt"]
    assert [e.feed for e in examples] == trained and [e.reference for e in examples] == [None, None]


def test_a_bad_row_is_one_line_with_file_and_row_and_nothing_is_written(chat_model, tmp_path, capsys):
    bad = [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]
    data = _jsonl(tmp_path / "bad.jsonl", [{"messages": CONVERSATION}, {"messages": bad}])
    out = tmp_path / "results.jsonl"
    err = _refused(["predict", str(chat_model), "--data", str(data), "--output", str(out)], capsys)
    assert "row 1 of" in err and "bad.jsonl" in err and "role 'robot'" in err
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.sampled_from(["user", "assistant"]), st.text(st.characters(codec="utf-8"), max_size=8)),
        min_size=1,
        max_size=6,
    )
)
def test_a_conversation_splits_into_its_prompt_and_its_last_answer(turns):
    from xtrain.tasks.predicting import split_conversation

    cell = [{"role": "user", "content": "q"}] + [{"role": r, "content": "a" + c} for r, c in turns]
    prompt, reference = split_conversation(cell, 0, "f")
    if cell[-1]["role"] == "assistant":
        assert reference == cell[-1]["content"].strip() and prompt.messages == cell[:-1]
    else:
        assert reference is None and prompt.messages == cell


# ---------------------------------------------------------------------------------------------
# Media tasks


def _media_model(tmp_path_factory, name: str, record: str) -> Path:
    model = shutil.copytree(_builtin(tmp_path_factory, name), tmp_path_factory.mktemp("m") / "model")
    (model / "xtrain_run.json").write_text(record, encoding="utf-8")
    return model


def _builtin_rows(name: str, n: int) -> tuple[Path, list[dict]]:
    from xtrain import builtin

    folder = builtin.ensure_builtin_data(name)
    lines = (folder / "eval.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return folder, [json.loads(line) for line in lines]


def test_a_csv_of_image_paths_is_read_with_the_runs_columns(tmp_path_factory, tmp_path, capsys):
    record = _record("image-to-text", data={"image_column": "picture", "text_column": "words"})
    model = _media_model(tmp_path_factory, "builtin:tiny-trocr", record)
    folder, rows = _builtin_rows("builtin:ocr-lines", 3)
    for r in rows:
        shutil.copy(folder / r["image"], tmp_path / Path(r["image"]).name)
    names = [Path(r["image"]).name for r in rows]
    (tmp_path / "lines.csv").write_text(
        "picture,words\n" + "".join(f"{n},{r['text']}\n" for n, r in zip(names, rows, strict=True))
    )
    request = PredictRequest([], [], max_new_tokens=4, batch_size=2)
    results = lib.predict_file(model, tmp_path / "lines.csv", request)
    by_file = lib.predict(model, PredictRequest([str(tmp_path / n) for n in names], [], max_new_tokens=4))
    assert [r["input"] for r in results.rows] == [str(tmp_path / n) for n in names]  # relative to the file
    assert [r["output"] for r in results.rows] == [r["output"] for r in by_file]
    assert [r["reference"] for r in results.rows] == [r["text"] for r in rows]
    assert all({"cer", "wer"} <= set(r) for r in results.rows) and set(results.metrics) == {"cer", "wer"}
    (tmp_path / "paths.csv").write_text("picture\n" + "".join(f"{n}\n" for n in names))  # no reference
    assert all("reference" not in r for r in lib.predict_file(model, tmp_path / "paths.csv", request).rows)
    (tmp_path / "gone.csv").write_text(f"picture\n{names[0]}\nmissing.png\n")
    err = _refused(["predict", str(model), "--data", str(tmp_path / "gone.csv"), "-o", "-"], capsys)
    assert "missing.png" in err and "row 1 of" in err and "not found" in err
    (tmp_path / "notes.png").write_text("not an image")  # there, but found bad only when its batch runs
    (tmp_path / "bad.csv").write_text(f"picture\n{names[0]}\nnotes.png\n")
    out = tmp_path / "o.jsonl"
    err = _refused(["predict", str(model), "--data", str(tmp_path / "bad.csv"), "-o", str(out)], capsys)
    assert "cannot read image" in err and "notes.png" in err and "row 1 of" in err and "bad.csv" in err
    assert not out.exists()


def test_image_labels_are_named_as_training_named_them(tmp_path_factory, tmp_path):
    labels = ["circle", "cross", "square", "triangle"]
    model = _media_model(tmp_path_factory, "builtin:tiny-vit", _record("image-classification", labels=labels))
    folder, rows = _builtin_rows("builtin:color-shapes", 3)
    data = [{"image": str(folder / r["image"]), "label": labels.index(r["label"])} for r in rows]
    results = lib.predict_file(model, _jsonl(tmp_path / "shapes.jsonl", data), PredictRequest([], []))
    assert [r["reference"] for r in results.rows] == [r["label"] for r in rows]  # integer labels named
    assert all(r["output"] in labels and float(r["probability"]) > 0 for r in results.rows)
    hits = [r["accuracy"] for r in results.rows]
    assert results.metrics == {"accuracy": sum(hits) / 3}


def test_images_are_read_within_the_runs_max_image_pixels(tmp_path_factory, tmp_path, capsys):
    """The run's data.max_image_pixels (its record) holds for predict as for its training: a data
    file's rows and input files alike, for the tasks reading images through ``open_images`` and
    for vision-language's prompts; a run that does not say gets the default (docsbad's limit)."""
    from xtrain.data.rows.images import MAX_PIXELS

    assert lib.image_limit({}) == MAX_PIXELS and lib.image_limit({"max_image_pixels": None}) is None
    assert lib.image_limit({"max_image_pixels": "many"}) == MAX_PIXELS
    tight = {"max_image_pixels": 16}  # every built-in image is larger
    record = _record("image-classification", data=tight, labels=["circle", "cross", "square", "triangle"])
    vit = _media_model(tmp_path_factory, "builtin:tiny-vit", record)
    folder, rows = _builtin_rows("builtin:color-shapes", 1)
    image = str(folder / rows[0]["image"])
    data = _jsonl(tmp_path / "shapes.jsonl", [{"image": image}])
    for args in (["--data", str(data)], [image]):
        err = _refused(["predict", str(vit), *args, "-o", "-"], capsys)
        assert "above data.max_image_pixels=16" in err, err
    vlm = _media_model(tmp_path_factory, "builtin:tiny-qwen2-vl", _record("vision-language", data=tight))
    folder, rows = _builtin_rows("builtin:shapes-vqa", 1)
    data = _jsonl(folder / "one.jsonl", rows)
    image = str(folder / rows[0]["messages"][0]["content"][0]["image"])
    for args in (["--data", str(data)], [image, "--question", "what shape?"]):
        err = _refused(["predict", str(vlm), *args, "-o", "-"], capsys)
        assert "above data.max_image_pixels=16" in err, err


def test_a_speech_file_transcribes_as_the_file_inputs_do(tmp_path_factory, tmp_path):
    model = _media_model(tmp_path_factory, "builtin:tiny-whisper", _record("speech-to-text"))
    folder, rows = _builtin_rows("builtin:spoken-words", 2)
    data = _jsonl(folder / "two.jsonl", rows)  # paths relative to the file's folder
    request = PredictRequest([], [], max_new_tokens=3)
    results = lib.predict_file(model, data, request)
    clips = [str(folder / r["audio"]) for r in rows]
    by_file = lib.predict(model, PredictRequest(clips, [], max_new_tokens=3))
    assert [r["output"] for r in results.rows] == [r["output"] for r in by_file]
    assert [r["reference"] for r in results.rows] == [r["text"] for r in rows]
    assert {"cer", "wer"} <= set(results.rows[0])


def test_vision_language_rows_batched_answer_as_one_at_a_time(tmp_path_factory, tmp_path):
    model = _media_model(tmp_path_factory, "builtin:tiny-qwen2-vl", _record("vision-language"))
    folder, rows = _builtin_rows("builtin:shapes-vqa", 3)
    rows.append({"messages": rows[0]["messages"][:1]})  # a question without its answer
    data = _jsonl(folder / "four.jsonl", rows)

    def run(size: int, **sampling) -> list[dict]:
        request = PredictRequest([], [], max_new_tokens=4, batch_size=size, **sampling)
        return lib.predict_file(model, data, request).rows

    batched = run(4)
    assert [r["output"] for r in batched] == [r["output"] for r in run(1)]
    assert [r.get("reference") for r in batched] == [r["messages"][1]["content"] for r in rows[:3]] + [None]
    image, question = (p for p in rows[0]["messages"][0]["content"])
    assert batched[0]["input"] == str(folder / image["image"]) and batched[0]["prompt"] == question["text"]
    assert "exact_match" in batched[0] and "exact_match" not in batched[3]
    assert run(4, temperature=2.0, seed=5) == run(4, temperature=2.0, seed=5)


def test_every_vision_format_is_prompted_as_its_native_messages_row(tmp_path_factory):
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks.vision.processor import load_processor

    model = _media_model(tmp_path_factory, "builtin:tiny-qwen2-vl", _record("vision-language"))
    folder, rows = _builtin_rows("builtin:shapes-vqa", 2)
    flat = []
    for r in rows:
        image, question = r["messages"][0]["content"]
        answer = r["messages"][1]["content"]
        flat.append({"image": image["image"], "question": question["text"], "answer": answer})
    placeholders = []  # LLaMA-Factory's rows
    for f in flat:
        question = {"role": "user", "content": "<image>" + f["question"]}
        turns = [question, {"role": "assistant", "content": f["answer"]}]
        placeholders.append({"messages": turns, "images": [f["image"]]})
    questions = [{"image": f["image"], "question": f["question"]} for f in flat]  # no answers: no references
    processor = load_processor(str(model), False)
    render = chat_data.renderer(processor, chat_data.require_template(processor, None, str(model)))

    def read(name: str, data: list[dict]) -> list:
        return lib.read_examples(model, _jsonl(folder / name, data))[1]

    native = read("native.jsonl", rows)
    variants = (("flat.jsonl", flat), ("placeholders.jsonl", placeholders), ("questions.jsonl", questions))
    for name, data in variants:
        examples = read(name, data)
        assert [render(e.feed[0], True) for e in examples] == [render(e.feed[0], True) for e in native], name
        assert [e.shown for e in examples] == [e.shown for e in native], name
        expected = [None, None] if name == "questions.jsonl" else [e.reference for e in native]
        assert [e.reference for e in examples] == expected, name
