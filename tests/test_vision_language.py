"""vision-language: the built-ins (tiny Qwen2-VL, shapes VQA), assistant-only labels on the processor's
expanded ids, bad rows as one line, pixel bounds, LoRA placement, generation eval with left-padded
prompts, `xtrain predict` (image + question), and real processes: 1 vs 2 processes (gloo), kill +
exact resume, plain peft loading."""

from __future__ import annotations

import io
import json
import pickle
import random
from pathlib import Path

import pytest
import torch
from support.workloads import build_workload

from xtrain import builtin
from xtrain.builtin import vision_language as builtin_vl
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture
def qwen(private_caches) -> str:
    return str(builtin.ensure_builtin_model("builtin:tiny-qwen2-vl"))


def _images(folder: Path, n: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    names = []
    for i in range(n):
        name = f"{i}.png"
        builtin_vl.draw_shape(builtin_vl.SHAPES[i % 4], list(builtin_vl.COLOURS)[i % 6], rng).save(
            folder / name
        )
        names.append(name)
    return names


def _turns(image: str | None, question: str, answer: str) -> list[dict]:
    parts = [
        {"type": "image", "image": image} if image else {"type": "image"},
        {"type": "text", "text": question},
    ]
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": answer}]


def _jsonl(path: Path, rows: list[list[dict]]) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows), encoding="utf-8")
    return path


def _cfg(model: str, train: Path | str, *extra: str, eval_: Path | str | None = None):
    overrides = [
        f"model.name_or_path={model}",
        "model.task=vision-language",
        f"data.train={train}",
        f"data.eval={eval_ if eval_ is not None else 'null'}",
        "data.max_length=64",
        "batch.per_device=4",
        "generation.max_new_tokens=4",
        *extra,
    ]
    return load_config(None, overrides)


def _unmasked(tokenizer, labels) -> str:
    return tokenizer.decode([int(t) for t in labels if t != -100])


# ---------------------------------------------------------------------------------------------
# Built-ins


def test_builtin_model_loads_like_a_checkpoint(qwen):
    from transformers import AutoModelForImageTextToText

    from xtrain.tasks.vision.vision_language import load_processor

    model = AutoModelForImageTextToText.from_pretrained(qwen)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    processor = load_processor(qwen, False)  # AutoProcessor, or the image-only build without torchvision
    assert type(processor).__name__ == "Qwen2VLProcessor" and processor.chat_template
    tokens = processor.tokenizer.convert_ids_to_tokens(
        processor.tokenizer("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>")["input_ids"]
    )
    assert tokens[:1] == ["<|im_start|>"] and "<|image_pad|>" in tokens  # one token each
    image = builtin_vl.draw_shape("square", "red", random.Random(0))
    out = processor(
        text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=[image], return_tensors="pt"
    )
    assert (out["input_ids"] == processor.image_token_id).sum() == builtin_vl.tokens_per_image() == 4
    assert torch.isfinite(model(**out, labels=out["input_ids"]).loss)
    again = pickle.loads(pickle.dumps(processor))  # spawned DataLoader workers get it by pickling
    assert (
        again(text=["hi"], return_tensors="pt")["input_ids"].tolist() == processor(text=["hi"])["input_ids"]
    )


def test_builtin_shapes_are_deterministic_with_paths_relative_to_their_file(private_caches):
    folder = builtin.ensure_builtin_data("builtin:shapes-vqa")
    rows = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == builtin_vl.EVAL_ROWS
    user, answer = rows[0]["messages"]
    assert (folder / user["content"][0]["image"]).is_file() and answer["role"] == "assistant"
    assert answer["content"] in (*builtin_vl.SHAPES, *builtin_vl.COLOURS)
    first, second = io.BytesIO(), io.BytesIO()
    builtin_vl.draw_shape("circle", "blue", random.Random(5)).save(first, format="PNG")
    builtin_vl.draw_shape("circle", "blue", random.Random(5)).save(second, format="PNG")
    assert first.getvalue() == second.getvalue()


# ---------------------------------------------------------------------------------------------
# Rendering and masking


def test_only_assistant_tokens_carry_loss_after_image_expansion(qwen, tmp_path):
    _images(tmp_path / "img", 2)
    chat = [
        {"role": "system", "content": "Answer briefly."},
        {
            "role": "user",
            "content": [{"type": "image", "image": "img/0.png"}, {"type": "text", "text": "colour?"}],
        },
        {"role": "assistant", "content": "red"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "and this?"}, {"type": "image", "image": "img/1.png"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "a blue square"}]},
    ]
    data = _jsonl(tmp_path / "train.jsonl", [chat, _turns("img/1.png", "shape?", "square")])
    workload = build_workload(_cfg(qwen, data, eval_=data))
    tokenizer = workload.collator.tokenizer
    batch = workload.collator([workload.eval_dataset[i] for i in range(2)])
    assert _unmasked(tokenizer, batch["labels"][0]) == "red<|im_end|>a blue square<|im_end|>"
    assert _unmasked(tokenizer, batch["labels"][1]) == "square<|im_end|>"
    assert (batch["input_ids"] == workload.collator.processor.image_token_id).sum() == 3 * 4  # expanded
    assert batch["pixel_values"].shape[0] == 3 * 16 and batch["image_grid_thw"].shape == (3, 3)
    # generation inputs: the prompt before the last answer, left-padded; the answer as reference
    assert _unmasked(tokenizer, batch["answer_labels"][0]) == "a blue square<|im_end|>"
    prompt = tokenizer.decode(batch["gen_input_ids"][1], skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n") and prompt.startswith("<|endoftext|>")  # left pad
    assert batch["gen_attention_mask"][1, 0] == 0 and batch["gen_attention_mask"][0, -1] == 1
    train_batch = workload.collator([workload.train_dataset[i] for i in range(2)])
    assert not any(k.startswith("gen_") for k in train_batch)  # training batches: the model's keys only
    assert torch.isfinite(workload.model(**train_batch).loss)
    pickle.loads(pickle.dumps(workload.collator))
    assert pickle.loads(pickle.dumps(workload.train_dataset))[0]["images"][0].mode == "RGB"


def test_images_column_and_image_feature_saved_with_save_to_disk(qwen, tmp_path):
    import datasets

    names = _images(tmp_path / "png", 4)
    turns = _turns(None, "colour?", "red")  # the image part names no file: the images column has it
    turns[1]["content"] = [{"type": "text", "text": "red"}]  # (Arrow: one content type per column)
    rows = [{"messages": turns, "images": [str(tmp_path / "png" / n)]} for n in names]
    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image()))
    ds.save_to_disk(str(tmp_path / "saved"))
    workload = build_workload(_cfg(qwen, tmp_path / "saved"))
    row = workload.train_dataset[2]
    assert len(row["images"]) == 1 and row["images"][0].size == (56, 56)
    assert torch.isfinite(workload.model(**workload.collator([row, workload.train_dataset[0]])).loss)


@pytest.mark.parametrize(
    ("chat", "says"),
    [
        (_turns("img/none.png", "q?", "a"), "none.png (row 1 of"),
        ([_turns("img/0.png", "q?", "a")[0]], "has no assistant turn"),
        ([{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "a"}], "role 'robot'"),
        (
            [*_turns("img/0.png", "q?", "a")[:1], {"role": "assistant", "content": " "}],
            "empty assistant answer",
        ),
    ],
)
def test_bad_rows_are_one_line_naming_row_and_file(qwen, tmp_path, chat, says):
    _images(tmp_path / "img", 1)
    data = _jsonl(tmp_path / "vqa.jsonl", [_turns("img/0.png", "q?", "a"), chat])
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(qwen, data))
    message = e.value.one_line()
    assert says in message and "row 1 of" in message and "vqa.jsonl" in message and "\n" not in message


def test_pixel_bounds_set_the_image_tokens(qwen, tmp_path):
    _images(tmp_path / "img", 2)
    data = _jsonl(tmp_path / "t.jsonl", [_turns("img/0.png", "q?", "red"), _turns("img/1.png", "q?", "blue")])
    small = build_workload(_cfg(qwen, data, "data.min_pixels=784", "data.max_pixels=784"))  # 28x28
    batch = small.collator([small.train_dataset[0]])
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2]]  # one image token
    big = build_workload(_cfg(qwen, data, "data.min_pixels=12544"))  # 112x112: 16 tokens
    assert big.collator([big.train_dataset[0]])["image_grid_thw"].tolist() == [[1, 8, 8]]
    with pytest.raises(XtrainError, match="data.min_pixels=900 is above data.max_pixels=800"):
        _cfg(qwen, data, "data.min_pixels=900", "data.max_pixels=800")
    with pytest.raises(XtrainError, match="data.max_pixels is for tasks? vision-language"):
        load_config(None, ["data.max_pixels=1000"])
    # the data check of the build's first rows runs the collator on row 0: refused before the model loads
    with pytest.raises(XtrainError, match=r"row 0 of .*cutting it would cut an image"):
        build_workload(_cfg(qwen, data, "data.max_length=28", "data.min_pixels=12544"))


# ---------------------------------------------------------------------------------------------
# LoRA


def _trainable(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_lora_on_the_language_model_with_projector_and_vision_options(qwen, tmp_path):
    _images(tmp_path / "img", 1)
    data = _jsonl(tmp_path / "t.jsonl", [_turns("img/0.png", "q?", "red")])
    plain = _trainable(build_workload(_cfg(qwen, data)).model)
    assert plain and all("lora_" in n and ".language_model." in n for n in plain)
    leaves = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in plain}
    assert leaves == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    both = _trainable(
        build_workload(_cfg(qwen, data, "lora.projector=true", "lora.vision_blocks=true")).model
    )
    assert any(".visual.merger." in n and "lora_" not in n for n in both)  # the merger, trained whole
    assert any(".visual.blocks." in n and "lora_" in n for n in both)
    assert not any(".visual.blocks." in n and "lora_" not in n for n in both)  # the tower stays frozen
    full = _trainable(build_workload(_cfg(qwen, data, "lora.enabled=false")).model)
    assert any(n.startswith("model.visual.merger.") for n in full)
    assert not any(n.startswith("model.visual.blocks.") for n in full)
    with pytest.raises(XtrainError, match="lora.projector is for tasks? vision-language"):
        load_config(None, ["lora.projector=true"])


# ---------------------------------------------------------------------------------------------
# Evaluation by generation


def test_generation_eval_left_pads_prompts_and_strips_them(qwen, tmp_path):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    _images(tmp_path / "img", 3)
    rows = [_turns("img/0.png", "what colour is it?", "red"), _turns("img/1.png", "shape?", "square"),
            [{"role": "system", "content": "A much longer system prompt, to pad the others."},
             *_turns("img/2.png", "colour?", "blue")]]  # fmt: skip
    data = _jsonl(tmp_path / "e.jsonl", rows)
    workload = build_workload(_cfg(qwen, data, eval_=data))
    accelerator = Accelerator(cpu=True)
    together = accelerator.prepare(
        DataLoader(workload.eval_dataset, batch_size=3, collate_fn=workload.collator)
    )
    alone = accelerator.prepare(DataLoader(workload.eval_dataset, batch_size=1, collate_fn=workload.collator))
    metrics, samples = workload.evaluate(accelerator, workload.model, together)
    single, single_samples = workload.evaluate(accelerator, workload.model, alone)
    assert set(metrics) == {"eval_loss", "exact_match"} and metrics["exact_match"] == 0.0  # random weights
    assert [s.reference for s in samples] == ["red", "square", "blue"]
    assert [s.prediction for s in samples] == [
        s.prediction for s in single_samples
    ]  # padding changes nothing
    assert single["eval_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-5)


# ---------------------------------------------------------------------------------------------
# xtrain predict


def test_predict_answers_like_the_eval_and_refuses_bad_input_in_one_line(qwen, tmp_path, capsys):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from xtrain.cli import main
    from xtrain.data.rows import chat as chat_data
    from xtrain.train import checkpoint

    _images(tmp_path / "img", 2)
    system = "Answer in one word."
    rows = [[{"role": "system", "content": system}, *_turns("img/0.png", "what colour is it?", "red")],
            _turns("img/1.png", "shape?", "square")]  # fmt: skip
    data = _jsonl(tmp_path / "e.jsonl", rows)
    workload = build_workload(_cfg(qwen, data, "lora.projector=true", eval_=data))
    processor = workload.tokenizer
    render = chat_data.renderer(processor, chat_data.require_template(processor, None, qwen))
    for row, (question, sys_) in enumerate((("what colour is it?", system), ("shape?", None))):
        # predict's user turn renders exactly as training rendered the prompt before the answer
        prompt = render(chat_data.user_turn(question, images=1, system=sys_), True)
        assert prompt == workload.eval_dataset.encoded[row]["prompt"]
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(
        DataLoader(workload.eval_dataset, batch_size=1, collate_fn=workload.collator)
    )
    _, samples = workload.evaluate(accelerator, workload.model, loader)
    checkpoint.save_final(workload.model, processor, tmp_path / "run", False)  # adapter/ + processor

    img, out = str(tmp_path / "img" / "0.png"), tmp_path / "answers.jsonl"
    args = ["predict", str(tmp_path / "run"), img, "--max-new-tokens", "4"]
    assert main([*args, "--question", "what colour is it?", "--system", system, "-o", str(out)]) == 0
    answers = [json.loads(x) for x in out.read_text().splitlines()]
    assert answers == [{"input": img, "prompt": "what colour is it?", "output": samples[0].prediction}]
    assert capsys.readouterr().out == f"{img}\twhat colour is it?\t{samples[0].prediction}\n"
    # bad input: one line on stderr, exit 2, no traceback
    notes = tmp_path / "notes.png"
    notes.write_text("not an image", encoding="utf-8")
    cases = [
        ([*args[:2], str(tmp_path / "img" / "none.png"), "-p", "q?"], "none.png not found"),
        (args, "answers a question about each image (add --question TEXT)"),
        ([*args[:2], str(notes), "-p", "q?"], f"input {notes} is not a readable image"),
        ([*args[:2], "-p", "q?"], "vision-language model: it answers a question about an image"),
    ]
    for argv, says in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in " ".join(err.split()) and "Traceback" not in err and "row" not in err


def test_exact_match_is_normalised():
    from xtrain.tasks.generation import exact_match

    assert exact_match(["Red", "a square"], ["red.", "A  Square!"]) == 1.0
    assert exact_match(["red", "blue"], ["red", "green"]) == 0.5


# ---------------------------------------------------------------------------------------------
# Real processes: 1 vs 2 processes, kill -9 + resume (gloo on CPU)

JOB = """\
model:
  name_or_path: {model}
  task: vision-language
lora:
  r: 8
  alpha: 16
  dropout: 0.1
  projector: true
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 48
generation:
  max_new_tokens: 3
optim:
  lr: 0.01
  warmup_steps: 1
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 6
  log_every: 1
  save_every: 2
  eval_at_start: true
  tensorboard: false
  seed: 7
"""


@pytest.fixture(scope="module")
def vqa_job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    root = tmp_path_factory.mktemp("vqa-job")
    (root / "img").mkdir()
    rng = random.Random(11)
    rows = []
    for i in range(42):
        shape, colour = rng.choice(builtin_vl.SHAPES), rng.choice(list(builtin_vl.COLOURS))
        builtin_vl.draw_shape(shape, colour, rng).save(root / "img" / f"{i}.png")
        rows.append(builtin_vl.conversation(f"img/{i}.png", shape, colour, rng))
    # eval: 10 rows, the last batch is partial on 2 ranks
    return task_job(root, JOB, session_builtin(tmp_path_factory, "builtin:tiny-qwen2-vl"), rows)


@pytest.fixture(scope="module")
def vqa_straight(vqa_job):
    from support.jobs import train_once

    return train_once(vqa_job)[0]


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_exact_match(vqa_job, vqa_straight):
    from peft import PeftModel
    from support.jobs import assert_same_training, python_run, run_xtrain
    from transformers import AutoModelForImageTextToText

    out = vqa_job.root / "two"
    args = ("--processes", "2", "--config", str(vqa_job.config), f"run.output_dir={out}")
    proc = run_xtrain(python_run(*args), vqa_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((vqa_straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert (two["world_size"], two["accumulation"], one["accumulation"]) == (2, 1, 2)
    losses = [loss for _, loss in one["losses"]]
    assert losses[-1] < losses[0]  # it learns
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):  # step 0 and the end
        assert (a["step"], a["exact_match"]) == (b["step"], b["exact_match"])
    assert one["predictions"] == two["predictions"] and len(one["predictions"]) == 4
    assert_same_training(vqa_straight, out)
    adapter = one["outputs"]["adapter"]
    base = json.loads((Path(adapter) / "adapter_config.json").read_text())["base_model_name_or_path"]
    model = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(base), adapter
    )  # plain peft
    assert any("merger" in n for n, _ in model.named_parameters() if "modules_to_save" in n)


@pytest.mark.slow
def test_kill_and_resume_is_exact(vqa_job, vqa_straight):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    out = vqa_job.root / "killed"
    args = ["--config", str(vqa_job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), vqa_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), vqa_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(vqa_straight, out, exact=True)


@pytest.mark.slow
def test_predict_with_the_trained_run_gives_its_eval_answers(vqa_job, vqa_straight, capsys):
    from xtrain.cli import main

    result = json.loads((vqa_straight / "train_result.json").read_text())
    rows = [json.loads(x)["messages"] for x in (vqa_job.root / "eval.jsonl").read_text().splitlines()]
    for row, sample in zip(rows, result["predictions"], strict=False):  # the first 4 eval rows
        user = row[0]["content"]
        image, question = str(vqa_job.root / user[0]["image"]), user[1]["text"]
        assert main(["predict", str(vqa_straight), image, "-p", question, "--max-new-tokens", "3"]) == 0
        assert capsys.readouterr().out == f"{image}\t{question}\t{sample['prediction']}\n"


def test_memory_estimate_tells_what_fits_two_24gb_cards():
    from xtrain.model.memory import estimate_gib, memory_warning

    qwen7b = {"params": 8_300_000_000, "hidden": 3584, "layers": 28}  # Qwen2-VL-7B
    lora = 40_000_000  # r=16 on every projection of the language model
    fp32 = estimate_gib(qwen7b["params"], lora, 4, 1024, qwen7b["hidden"], qwen7b["layers"], False)
    bf16 = estimate_gib(qwen7b["params"], lora, 2, 1024, qwen7b["hidden"], qwen7b["layers"], True)
    assert fp32 > 24 and 15 < bf16 < 24  # float32 weights alone are 31 GiB; bf16 + checkpointing fits
    no_ckpt = estimate_gib(qwen7b["params"], lora, 2, 4096, qwen7b["hidden"], qwen7b["layers"], False)
    assert no_ckpt > 24  # 4 long conversations a GPU without checkpointing do not
    warning = memory_warning(fp32, 24, "RTX 4090")
    assert (
        warning
        and "RTX 4090" in warning
        and "model.gradient_checkpointing" in warning
        and "\n" not in warning
    )
    assert memory_warning(bf16, 24) is None


@pytest.mark.slow
def test_the_quickstart_next_line_is_a_working_predict(vqa_straight, capsys):
    import shlex

    from xtrain.cli import main
    from xtrain.commands.quickstart import next_line
    from xtrain.tasks import quickstarts

    line = next_line(quickstarts()["vision-language"], vqa_straight, "bash")
    words = shlex.split(line.split("`")[1])
    assert words[:3] == ["xtrain", "predict", str(vqa_straight)] and "--question" in words
    assert main([*words[1:], "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith(f"{words[3]}\t{words[5]}\t")
