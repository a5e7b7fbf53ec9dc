"""image-to-text: the built-ins, data layouts (paths relative to a CSV, imagefolder + metadata,
an Image feature saved with save_to_disk), image conversion, bad images as one line, LoRA on the
encoder and/or decoder (TrOCR- and ViT-GPT2-shaped models built from configs), generation eval."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import pickle
import random
import re
from pathlib import Path

import pytest
import torch
from support.workloads import build_workload

from xtrain import builtin
from xtrain.builtin import image as builtin_image
from xtrain.data.rows.images import ImageTextCollator, UnreadableImage, to_rgb
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

TEXTS = builtin_image.line_texts(12, seed=3)


pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture
def trocr(private_caches) -> str:
    return str(builtin.ensure_builtin_model("builtin:tiny-trocr"))


def _images(folder: Path, n: int = len(TEXTS), prefix: str = "") -> list[str]:
    """``n`` rendered lines as PNG files in ``folder``; returns their file names."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    names = []
    for i, text in enumerate(TEXTS[:n]):
        name = f"{prefix}{i:03d}.png"
        builtin_image.render_line(text, rng).save(folder / name)
        names.append(name)
    return names


def _jsonl(folder: Path, n: int = len(TEXTS)) -> tuple[Path, list[str]]:
    """``n`` images and a ``train.jsonl`` listing them by relative path; returns (file, image names)."""
    names = _images(folder, n)
    rows = [{"image": name, "text": text} for name, text in zip(names, TEXTS[:n], strict=True)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "train.jsonl", names


def _cfg(model: str, train: Path | str, *extra: str, eval_: Path | str | None = None):
    overrides = [
        f"model.name_or_path={model}",
        "model.task=image-to-text",
        f"data.train={train}",
        "data.max_length=24",
        "batch.per_device=4",
        "generation.max_new_tokens=8",
        *extra,
    ]
    overrides.append(f"data.eval={eval_ if eval_ is not None else 'null'}")
    return load_config(None, overrides)


def _train_batch(workload, n: int = 4) -> dict:
    return workload.collator([workload.train_dataset[i] for i in range(n)])


# ---------------------------------------------------------------------------------------------
# Built-ins


def test_builtin_model_is_deterministic_and_loads_like_a_checkpoint(trocr, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoImageProcessor, AutoTokenizer, VisionEncoderDecoderModel

    again = builtin.ensure_builtin_model("tiny-trocr", tmp_path)
    a, b = load_file(f"{trocr}/model.safetensors"), load_file(f"{again}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model = VisionEncoderDecoderModel.from_pretrained(trocr)
    tokenizer = AutoTokenizer.from_pretrained(trocr)
    processor = AutoImageProcessor.from_pretrained(trocr)
    assert model.config.decoder.model_type == "trocr" and model.config.encoder.model_type == "vit"
    assert model.config.decoder_start_token_id == tokenizer.bos_token_id
    line = "Tom's 42 cats, ok?"
    ids = tokenizer(line)["input_ids"]
    assert len(ids) == len(line) + 1 and ids[-1] == tokenizer.eos_token_id  # one token per character
    assert tokenizer.decode(ids, skip_special_tokens=True) == line
    image = builtin_image.render_line(line, random.Random(1))
    pixels = processor(images=[image.convert("RGB")], return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, builtin_image.IMAGE_HEIGHT, builtin_image.IMAGE_WIDTH)
    out = model(pixel_values=pixels, labels=torch.tensor([ids]))
    assert torch.isfinite(out.loss)


def test_builtin_lines_are_deterministic_and_relative_to_their_file(private_caches):
    folder = builtin.ensure_builtin_data("builtin:ocr-lines")
    rows = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == builtin_image.EVAL_LINES
    assert rows[0]["image"] == "eval/00000.png" and (folder / rows[0]["image"]).is_file()
    assert builtin_image.line_texts(50, 7) == builtin_image.line_texts(50, 7)
    assert all(len(t) <= 16 for t in builtin_image.line_texts(200, 7))
    first = io.BytesIO()
    builtin_image.render_line("red cat 42", random.Random(5)).save(first, format="PNG")
    second = io.BytesIO()
    builtin_image.render_line("red cat 42", random.Random(5)).save(second, format="PNG")
    assert first.getvalue() == second.getvalue()


# ---------------------------------------------------------------------------------------------
# Images


def test_every_image_mode_becomes_rgb():
    import numpy as np
    from PIL import Image

    gray = Image.new("L", (8, 4), 30)
    assert to_rgb(gray).mode == "RGB" and to_rgb(gray).getpixel((0, 0)) == (30, 30, 30)
    clear = Image.new("RGBA", (8, 4), (0, 0, 0, 0))  # transparent page: composited on white
    assert to_rgb(clear).getpixel((0, 0)) == (255, 255, 255)
    assert to_rgb(Image.new("LA", (8, 4), (0, 255))).getpixel((0, 0)) == (0, 0, 0)
    assert to_rgb(Image.new("CMYK", (8, 4), (0, 0, 0, 0))).getpixel((0, 0)) == (255, 255, 255)
    assert to_rgb(Image.new("P", (8, 4))).mode == "RGB"
    deep = Image.fromarray(np.full((4, 8), 65535, dtype=np.uint16))  # 16-bit: scaled, not clipped
    assert to_rgb(deep).getpixel((0, 0)) == (255, 255, 255)
    half = Image.fromarray(np.full((4, 8), 32768, dtype=np.uint16))
    assert to_rgb(half).getpixel((0, 0))[0] in (127, 128)
    assert to_rgb(Image.fromarray(np.full((4, 8), 0.5, dtype=np.float32))).getpixel((0, 0))[0] == 127


# ---------------------------------------------------------------------------------------------
# Data layouts


def test_csv_with_paths_relative_to_the_file(trocr, tmp_path):
    names = _images(tmp_path / "data" / "lines")
    with open(tmp_path / "data" / "train.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "transcript"])
        writer.writerows([f"lines/{n}", t] for n, t in zip(names, TEXTS, strict=True))
    cfg = _cfg(
        trocr,
        tmp_path / "data" / "train.csv",
        "data.image_column=file",
        "data.text_column=transcript",
        "data.eval_fraction=0.25",
    )
    workload = build_workload(cfg)
    assert len(workload.train_dataset) == 9 and len(workload.eval_dataset) == 3
    assert workload.main_metric == "cer" and workload.evaluate is not None
    row = workload.train_dataset[0]
    assert row["image"].mode == "RGB" and row["text"] in TEXTS
    batch = _train_batch(workload)
    assert batch["pixel_values"].shape == (4, 3, builtin_image.IMAGE_HEIGHT, builtin_image.IMAGE_WIDTH)
    labels = batch["labels"]
    assert (labels == -100).any() and (labels[:, 0] != -100).all()  # padded with -100 only
    assert torch.isfinite(workload.model(**batch).loss)
    # spawned DataLoader workers (Windows) get both by pickling
    pickle.loads(pickle.dumps(workload.collator))
    assert pickle.loads(pickle.dumps(workload.train_dataset))[0]["text"] == row["text"]


def test_imagefolder_with_metadata(trocr, tmp_path):
    folder = tmp_path / "lines"
    names = _images(folder / "train")
    with open(folder / "train" / "metadata.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["file_name", "text"])
        writer.writerows(zip(names, TEXTS, strict=True))
    workload = build_workload(_cfg(trocr, folder))
    assert len(workload.train_dataset) == len(TEXTS)
    assert {workload.train_dataset[i]["text"] for i in range(len(TEXTS))} == set(TEXTS)
    assert torch.isfinite(workload.model(**_train_batch(workload)).loss)


def test_image_feature_saved_with_save_to_disk_is_read_lazily(trocr, tmp_path):
    import datasets

    names = _images(tmp_path / "png")
    ds = datasets.Dataset.from_dict(
        {"picture": [str(tmp_path / "png" / n) for n in names], "caption": TEXTS}
    ).cast_column("picture", datasets.Image())
    ds = ds.map(lambda r: {"picture": r["picture"].convert("LA")})  # bytes embedded, gray + alpha
    ds.save_to_disk(str(tmp_path / "saved"))
    cfg = _cfg(trocr, tmp_path / "saved", "data.image_column=picture", "data.text_column=caption")
    workload = build_workload(cfg)
    inner = workload.train_dataset.ds
    assert inner.features["picture"].decode is False  # nothing decoded until a row is read
    assert workload.train_dataset[3]["image"].mode == "RGB"
    assert torch.isfinite(workload.model(**_train_batch(workload)).loss)


def test_missing_image_is_one_line_before_training(trocr, tmp_path):
    names = _images(tmp_path)
    rows = [{"image": n, "text": t} for n, t in zip(names, TEXTS, strict=True)]
    rows[5]["image"] = "nowhere/gone.png"
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(XtrainError) as e:
        build_workload(_cfg(trocr, tmp_path / "train.jsonl"))
    assert "gone.png" in str(e.value) and "row 5" in str(e.value) and "\n" not in str(e.value)


def test_unreadable_image_is_one_line_even_from_a_dataloader_worker(trocr, tmp_path):
    from torch.utils.data import DataLoader

    names = _images(tmp_path)
    (tmp_path / names[2]).write_bytes(b"not a png at all")
    rows = [{"image": n, "text": t} for n, t in zip(names, TEXTS, strict=True)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = build_workload(_cfg(trocr, tmp_path / "train.jsonl"))  # lazy: nothing read yet
    with pytest.raises(UnreadableImage) as e:
        workload.train_dataset[2]
    assert names[2] in str(e.value) and "row 2" in str(e.value)
    loader = DataLoader(workload.train_dataset, batch_size=4, collate_fn=workload.collator, num_workers=1)
    with pytest.raises(XtrainError) as e:
        list(loader)
    message = e.value.one_line()
    assert "\n" not in message and "Traceback" not in message
    assert re.search(rf"cannot read image .*{names[2]} \(row 2 of ", message), message


def test_wrong_columns_and_wrong_model_are_one_line(trocr, tmp_path, private_caches):
    _jsonl(tmp_path, 4)
    with pytest.raises(XtrainError, match="column 'img' not in"):
        build_workload(_cfg(trocr, tmp_path / "train.jsonl", "data.image_column=img"))
    llama = str(builtin.ensure_builtin_model("builtin:tiny-llama"))
    with pytest.raises(XtrainError, match="not a vision encoder-decoder"):
        build_workload(_cfg(llama, tmp_path / "train.jsonl"))
    with pytest.raises(
        XtrainError, match="lora.apply_to is for tasks image-to-text, speech-to-text, not seq-cls"
    ):
        load_config(None, ["lora.apply_to=encoder"])


# ---------------------------------------------------------------------------------------------
# LoRA and special tokens


def _lora_parts(model) -> set[str]:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    return {n.split(".")[2] for n in names}  # base_model.model.<encoder|decoder>.…


@pytest.mark.parametrize(
    ("apply_to", "parts"),
    [("both", {"encoder", "decoder"}), ("encoder", {"encoder"}), ("decoder", {"decoder"})],
)
def test_lora_on_the_encoder_the_decoder_or_both(trocr, tmp_path, apply_to, parts):
    _jsonl(tmp_path, 4)
    workload = build_workload(_cfg(trocr, tmp_path / "train.jsonl", f"lora.apply_to={apply_to}"))
    assert _lora_parts(workload.model) == parts
    workload.model(**_train_batch(workload)).loss.backward()
    full = build_workload(_cfg(trocr, tmp_path / "train.jsonl", "lora.enabled=false"))
    trainable = {n for n, p in full.model.named_parameters() if p.requires_grad}
    assert not any(n.startswith("encoder.pooler") for n in trainable)  # unused: DDP would wait for it
    assert any(n.startswith("encoder.") for n in trainable) and any(
        n.startswith("decoder.") for n in trainable
    )


def test_vit_gpt2_captioner_gets_its_special_tokens_and_targets(tmp_path):
    """A ViT-GPT2 checkpoint (distilvit-style) that leaves decoder_start/pad unset, as many do."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
        ViTModel,
    )

    tokenizer = builtin.build_tokenizer("llama")
    tokenizer.pad_token = None  # GPT-2 tokenizers have no pad token
    encoder = ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, image_size=32, patch_size=16))  # fmt: skip
    decoder = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                   add_cross_attention=True, is_decoder=True, bos_token_id=None, eos_token_id=None)
    )  # fmt: skip
    model = VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    assert getattr(model.config, "decoder_start_token_id", None) is None
    folder = tmp_path / "vit-gpt2"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    _jsonl(tmp_path / "img", 4)
    workload = build_workload(_cfg(str(folder), tmp_path / "img" / "train.jsonl"))
    base = workload.model.get_base_model()
    assert base.config.decoder_start_token_id == tokenizer.bos_token_id
    assert base.config.pad_token_id == tokenizer.eos_token_id  # the tokenizer's pad fallback
    assert base.generation_config.decoder_start_token_id == tokenizer.bos_token_id
    targets = {n.rsplit(".", 1)[-1] for n, m in workload.model.named_modules() if hasattr(m, "lora_A")}
    assert {"c_attn", "q_attn"} <= targets and targets & {"query", "q_proj"}
    batch = _train_batch(workload)
    assert batch["pixel_values"].shape == (4, 3, 32, 32)
    assert torch.isfinite(workload.model(**batch).loss)
    generated = workload.model.generate(pixel_values=batch["pixel_values"], max_new_tokens=3)
    assert generated.shape[0] == 4


# ---------------------------------------------------------------------------------------------
# Evaluation by generation


def test_text_metrics_are_jiwer_corpus_rates():
    from xtrain.tasks.generation import text_metrics

    m = text_metrics(["abcd", "ef"], ["abxd", "ef"])
    assert m["cer"] == pytest.approx(1 / 6) and m["wer"] == pytest.approx(1 / 2)
    assert text_metrics(["", " "], ["a", "b"]) == {}


def test_generation_eval_in_one_process(trocr, tmp_path):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    names = _images(tmp_path)
    rows = [{"image": n, "text": t} for n, t in zip(names, TEXTS, strict=True)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(
        trocr, tmp_path / "train.jsonl", "generation.sample_predictions=3", eval_=tmp_path / "train.jsonl"
    )
    workload = build_workload(cfg)
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(
        DataLoader(workload.eval_dataset, batch_size=5, collate_fn=workload.collator)
    )
    metrics, samples = workload.evaluate(accelerator, workload.model, loader)
    assert set(metrics) == {"eval_loss", "cer", "wer"} and metrics["cer"] > 0.5  # random weights
    assert [s.reference for s in samples] == TEXTS[:3]
    beams, _ = dataclasses.replace(workload.evaluate, num_beams=2)(accelerator, workload.model, loader)
    assert set(beams) == set(metrics) and beams["eval_loss"] == pytest.approx(metrics["eval_loss"])
    assert isinstance(ImageTextCollator, type)
    with contextlib.suppress(Exception):
        accelerator.end_training()


# ---------------------------------------------------------------------------------------------
# Real processes: 1 vs 2 processes, kill -9 + resume (gloo on CPU)

JOB = """\
model:
  name_or_path: {model}
  task: image-to-text
lora:
  r: 4
  alpha: 8
  dropout: 0.1
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 20
generation:
  max_new_tokens: 6
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
  best_metric: cer
  tensorboard: true
  seed: 7
"""


@pytest.fixture(scope="module")
def ocr_job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    root = tmp_path_factory.mktemp("ocr-job")
    rng = random.Random(11)
    (root / "img").mkdir()
    rows = []
    for i, text in enumerate(builtin_image.line_texts(42, seed=11)):
        builtin_image.render_line(text, rng).save(root / "img" / f"{i}.png")
        rows.append({"image": f"img/{i}.png", "text": text})
    # eval: 10 rows, the last batch is partial on 2 ranks
    return task_job(root, JOB, session_builtin(tmp_path_factory, "builtin:tiny-trocr"), rows)


@pytest.fixture(scope="module")
def ocr_straight(ocr_job):
    from support.jobs import train_once

    out, proc = train_once(ocr_job)
    assert "reference" in proc.stderr and "prediction" in proc.stderr  # sample predictions shown
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for folder in {p.parent for p in (out / "logs").rglob("events.out.tfevents.*")}:
        logged = EventAccumulator(str(folder)).Reload().Tags()
        tags |= set(logged["tensors"]) | set(logged["scalars"])
    assert {"eval/predictions/text_summary", "cer"} <= tags  # sample predictions as text, CER as a scalar
    return out


@pytest.mark.slow
def test_the_result_keeps_its_best_evaluation_and_loads_in_plain_peft(ocr_straight):
    one = json.loads((ocr_straight / "train_result.json").read_text())
    assert len(one["predictions"]) == 4
    base = _base_model(one)
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(base, one["outputs"]["adapter"])  # plain peft loads it
    best = json.loads((ocr_straight / "best" / "best.json").read_text())  # run.best_metric: cer
    assert best["metric"] == "cer" and best["value"] == min(h["cer"] for h in one["eval_history"])
    assert one["outputs"]["best"] == str(ocr_straight / "best")
    assert (
        adapted.generate(
            pixel_values=torch.zeros(1, 3, builtin_image.IMAGE_HEIGHT, builtin_image.IMAGE_WIDTH),
            max_new_tokens=2,
        ).shape[0]
        == 1
    )


# soak: the default run's 2-process generation evaluations are speech-to-text's and
# vision-language's (the same tasks/generation.py); the Windows plan with spawned loader workers
# is test_launch_modes' and test_loader_workers'
@pytest.mark.soak
def test_one_and_two_processes_give_the_same_cer(ocr_job, ocr_straight):
    """Two spawned ranks as on Windows (the Windows plan, the CPU-staged all-reduce), each with a
    loader worker of its own (spawned by a spawned rank), against one process without one."""
    from support.jobs import assert_same_training, python_run, run_xtrain

    out = ocr_job.root / "two"
    env = {**ocr_job.env, "XTRAIN_PLATFORM": "windows", "XTRAIN_FORCE_CPU_STAGED": "1"}
    args = ("--processes", "2", "--config", str(ocr_job.config), f"run.output_dir={out}")
    args = (*args, "data.num_workers=1")
    proc = run_xtrain(python_run(*args), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((ocr_straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert two["run_info"]["cpu_staged_allreduce"] is True and two["run_info"]["plan_os"] == "windows"
    assert (two["world_size"], two["accumulation"], one["accumulation"]) == (2, 1, 2)
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):  # step 0 and the end
        assert (a["step"], a["cer"], a["wer"]) == (b["step"], b["cer"], b["wer"])
    assert one["predictions"] == two["predictions"] and len(one["predictions"]) == 4
    assert_same_training(ocr_straight, out)


@pytest.mark.slow
def test_predict_reads_images_with_the_trained_adapter(ocr_job, ocr_straight, capsys):
    from xtrain.cli import main

    out = ocr_job.root / "predictions.jsonl"
    image = str(ocr_job.root / "img" / "0.png")
    assert main(["predict", str(ocr_straight), image, "--max-new-tokens", "4", "-o", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["input"].endswith("0.png") and isinstance(rows[0]["output"], str)
    assert "0.png\t" in capsys.readouterr().out
    assert main(["predict", str(ocr_straight), "--prompt", "hi"]) == 2  # an image model takes images


def test_predict_continues_prompts_with_a_causal_lm(private_caches, capsys):
    from xtrain.cli import main

    llama = str(builtin.ensure_builtin_model("builtin:tiny-llama"))
    assert main(["predict", llama, "--prompt", "once upon a time", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("once upon a time\t")


LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "xtrain.run"],
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "-m", "xtrain.run"],
    "windows": ["-m", "xtrain.run", "--processes", "2"],  # spawn + CPU-staged all-reduce, as on Windows
}  # fmt: skip


# The Windows path (spawned ranks that spawn their own loader workers) runs by default in
# test_one_and_two_processes_give_the_same_cer; every launcher with loader workers with `pytest -m soak`
@pytest.mark.soak
@pytest.mark.parametrize("mode", list(LAUNCHERS))
def test_launchers_with_loader_workers_give_the_same_cer(ocr_job, ocr_straight, mode):
    import sys

    from support.jobs import assert_same_training, run_xtrain

    out = ocr_job.root / mode
    env = dict(ocr_job.env)
    if mode == "windows":
        env.update(XTRAIN_PLATFORM="windows", XTRAIN_FORCE_CPU_STAGED="1")
    args = ["--config", str(ocr_job.config), f"run.output_dir={out}", "data.num_workers=1"]
    proc = run_xtrain([sys.executable, *LAUNCHERS[mode], *args], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((ocr_straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert two["world_size"] == 2 and two["run_info"]["cpu_staged_allreduce"] is (mode == "windows")
    assert [h["cer"] for h in one["eval_history"]] == [h["cer"] for h in two["eval_history"]]
    assert_same_training(ocr_straight, out)


def _base_model(result: dict):
    from transformers import VisionEncoderDecoderModel

    adapter = Path(result["outputs"]["adapter"])
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    return VisionEncoderDecoderModel.from_pretrained(base)


@pytest.mark.slow
def test_kill_and_resume_is_exact(ocr_job, ocr_straight):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    out = ocr_job.root / "killed"
    args = ["--config", str(ocr_job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), ocr_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), ocr_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(ocr_straight, out, exact=True)


def test_quickstart_task_is_checked_before_anything_runs(tmp_path, capsys):
    from xtrain.cli import main

    assert main(["quickstart", "--task", "ocr-please", "--output-dir", str(tmp_path)]) == 2
    assert "--task image-to-text" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
