"""vision-preference: DPO on the built-in tiny Qwen2-VL with pairs whose prompts hold images, in
TRL's and LLaMA-Factory's shapes; chosen and rejected in one processor call and one forward; the
policy equals its reference at step 0 (log 2) and the reward accuracy rises."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.workloads import build_workload

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def _pairs(n: int, llama_factory: bool = False) -> list[dict]:
    """Built-in shape questions with the true answer chosen and a curt non-answer rejected."""
    folder = builtin.ensure_builtin_data("builtin:shapes-vqa")
    out = []
    for line in (folder / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]:
        user, answer = json.loads(line)["messages"]
        image = str(folder / user["content"][0]["image"])
        question = user["content"][1]["text"]
        if llama_factory:
            out.append({"conversations": [{"from": "human", "value": f"<image>{question}"}],
                        "chosen": {"from": "gpt", "value": answer["content"]},
                        "rejected": {"from": "gpt", "value": "no idea"}, "images": [image]})  # fmt: skip
        else:
            turn = {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": question}],
            }
            out.append({"prompt": [turn], "chosen": answer["content"], "rejected": "no idea"})
    return out


def _cfg(root: Path, rows: list[dict], *extra: str):
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    overrides = [
        "model.name_or_path=builtin:tiny-qwen2-vl", "model.task=vision-preference",
        f"data.train={root / 'train.jsonl'}", "data.eval=null", "data.max_length=128",
        f"run.output_dir={root / 'out'}", "run.report_to=none", "batch.per_device=2", "batch.global_batch=2",
        *extra,
    ]  # fmt: skip
    return load_config(None, overrides)


@pytest.mark.parametrize("llama_factory", [False, True], ids=["trl", "llama-factory"])
def test_a_pair_with_images_is_one_forward_at_log_2(tmp_path, llama_factory):
    workload = build_workload(_cfg(tmp_path, _pairs(4, llama_factory)))
    batch = workload.collator([workload.train_dataset[i] for i in range(2)])
    assert batch["input_ids"].shape[0] == 4 and "pixel_values" in batch
    tok = workload.tokenizer.tokenizer
    trained = [t for t in batch["labels"][2].tolist() if t != -100]
    assert tok.decode(trained).startswith("no idea"), "the rejected answer's tokens only"
    out = workload.forward(workload.model, batch)
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6)


def test_precomputed_and_live_reference_give_the_same_loss_and_the_images_are_in_the_fingerprint(tmp_path):
    """The stored reference (computed once, named by the rows' ids, labels and image pixels, read
    again by a second build) against the adapters switched off, with the policy moved; one image
    changed on disk (same path, same text) names another file."""
    import shutil

    import torch

    pairs = _pairs(4)
    stored_cfg = ("batch.per_device=2", "preference.precompute_reference=true")
    live, stored = build_workload(_cfg(tmp_path, pairs)), build_workload(_cfg(tmp_path, pairs, *stored_cfg))
    files = sorted((tmp_path / "out" / "preference-reference").glob("*.pt"))
    assert len(files) == 1 and len(torch.load(files[0], weights_only=True)["train"]) == 4
    stamp = files[0].stat().st_mtime_ns
    again = build_workload(_cfg(tmp_path, pairs, *stored_cfg))
    assert files[0].stat().st_mtime_ns == stamp, "read back, not computed again"
    assert again.train_dataset[1]["ref_second"] == stored.train_dataset[1]["ref_second"]
    for workload in (live, stored):
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    batch = live.collator([live.train_dataset[i] for i in range(2)])
    with_ref = stored.collator([stored.train_dataset[i] for i in range(2)])
    assert with_ref["ref_first"].shape == (2,) and "ref_first" not in batch
    a, b = live.forward(live.model, batch), stored.forward(stored.model, with_ref)
    assert a.loss.item() != pytest.approx(math.log(2), abs=1e-3), "the policy moved"
    assert b.loss.item() == pytest.approx(a.loss.item(), rel=1e-5)

    image = pairs[0]["prompt"][0]["content"][0]["image"]
    copy = tmp_path / "img0.png"
    shutil.copy(pairs[1]["prompt"][0]["content"][0]["image"], copy)  # another picture, the same rows' text
    pairs[0]["prompt"][0]["content"][0]["image"] = str(copy)
    build_workload(_cfg(tmp_path, pairs, *stored_cfg))
    assert image != str(copy) and len(list((tmp_path / "out" / "preference-reference").glob("*.pt"))) == 2


def test_kto_and_a_missing_image_are_refused(tmp_path):
    with pytest.raises(XtrainError, match="preference.loss=kto is not available for vision-preference"):
        _cfg(tmp_path, _pairs(2), "preference.loss=kto")
    rows = _pairs(2, llama_factory=True)
    rows[1]["images"] = [str(tmp_path / "nope.png")]
    with pytest.raises(XtrainError, match=r"nope.png \(row 1 of"):
        build_workload(_cfg(tmp_path, rows))


@pytest.mark.slow
def test_dpo_with_images_raises_the_reward_accuracy(tmp_path):
    from support.workloads import this_machine

    from xtrain.train.loop import train

    extra = ["batch.per_device=4", "batch.global_batch=4", "optim.lr=1e-2", "optim.warmup_steps=0",
             "run.max_steps=6", "run.log_every=3", "data.eval_fraction=0.25"]  # fmt: skip
    cfg = _cfg(tmp_path, _pairs(16), *extra)
    cfg.run.eval_at_start = True
    result = train(cfg, this_machine())
    before, after = result.eval_history[0], result.eval_metrics
    assert before["rewards/accuracy"] == 0.5 and before["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert after["rewards/accuracy"] > 0.5 and after["rewards/margin"] > 0


# -- the guarantees of every task: 1 vs 2 processes equal, kill + resume exact ----------------------
JOB = """\
model:
  name_or_path: {model}
  task: vision-preference
lora:
  r: 8
  alpha: 16
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 64
optim:
  lr: 1.0e-2
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  eval_every: 2
  log_every: 1
  save_every: 2
  tensorboard: false
  seed: 7
"""


@pytest.mark.slow
def test_one_and_two_processes_train_the_same_and_kill_and_resume_is_exact(tmp_path_factory):
    """The built-in pairs' kind (builtin.vision_language.preference_pair): 24 training pairs, 6
    eval pairs (the last eval batch partial on 2 ranks); one process (accumulation 2, the
    reference live) against two (gloo, accumulation 1, the reference precomputed: each process
    its half of the rows, gathered), then a run killed after its step-2 checkpoint and resumed
    against the uninterrupted one, bitwise."""
    import random

    import torch
    from support.jobs import (
        assert_same_training,
        python_run,
        run_until,
        run_xtrain,
        session_builtin,
        task_job,
        train_once,
    )

    from xtrain.builtin import vision_language as builtin_vl

    root = tmp_path_factory.mktemp("vision-preference-job")
    (root / "img").mkdir()
    rng = random.Random(11)
    rows = []
    for i in range(30):
        shape, colour = rng.choice(builtin_vl.SHAPES), rng.choice(list(builtin_vl.COLOURS))
        builtin_vl.draw_shape(shape, colour, rng).save(root / "img" / f"{i}.png")
        rows.append(builtin_vl.preference_pair(f"img/{i}.png", shape, colour, rng))
    job = task_job(root, JOB, session_builtin(tmp_path_factory, "builtin:tiny-qwen2-vl"), rows, n_train=24)
    straight, _ = train_once(job)

    out = root / "two"
    args = ["--processes", "2", "--config", str(job.config), f"run.output_dir={out}"]
    proc = run_xtrain(python_run(*args, "preference.precompute_reference=true"), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (json.loads((o / "train_result.json").read_text()) for o in (straight, out))
    assert (two["world_size"], two["accumulation"], one["accumulation"]) == (2, 1, 2)
    (stored,) = (out / "preference-reference").glob("*.pt")
    assert [len(v) for _, v in sorted(torch.load(stored, weights_only=True).items())] == [6, 24]
    assert [h["step"] for h in one["eval_history"]] == [2, 4]
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert b["rewards/accuracy"] == a["rewards/accuracy"]
        assert b["rewards/margin"] == pytest.approx(a["rewards/margin"], rel=1e-4, abs=1e-6)
    assert one["eval_metrics"]["rewards/accuracy"] > 0.5  # it learns
    assert_same_training(straight, out)

    killed = root / "killed"
    args = ["--config", str(job.config), f"run.output_dir={killed}", "run.resume=auto"]
    marker = killed / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((killed / "train_result.json").read_text())["resumed_from"]
    assert_same_training(straight, killed, exact=True)
