"""TRL's RewardTrainer on the job `benchmarks/reward_vs_trl.py` gives xtrain: the same model folder
(loaded as a one-output sequence classifier in float32), the same pairs (jsonl, {prompt, chosen,
rejected} strings), LoRA r=8 / alpha 16 on q/k/v/o with the head trained whole (peft's
``modules_to_save=["score"]``, as TRL's docs advise for a causal LM), no dropout, the same batch,
steps, learning rate and centring coefficient; fp32 (``bf16=False``: TRL defaults to bf16, emulated
on most CPUs) and no gradient checkpointing (TRL's default is on).

Before training it computes ``compute_loss`` on its first batch (``--probe``: the batch, the
trainable weights and the loss are saved there), and again with the trained weights, so the
caller computes xtrain's loss on the very same batch and weights. Prints one ``RESULT`` JSON line:
(wall, CPU) seconds at each optimizer step (torch's global optimizer-step pre-hook, the same stamp
as xtrain's side), the final eval accuracy, the probes' losses. Runs in TRL's own environment
(never a dependency of xtrain):

    .venv-trl/bin/python benchmarks/reward_trl_job.py --model DIR --train FILE --eval FILE \
        --out DIR --probe DIR
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path


def _probe(trainer, batch: dict, folder: Path, name: str) -> float:
    """TRL's own loss of ``batch`` (its collator's output) with the model as it is now, saved with
    the batch and the trainable weights under ``folder/name``."""
    import torch
    from safetensors.torch import save_file

    model = trainer.model
    was = model.training
    model.train()  # (no dropout: the same in either mode)
    with torch.no_grad():
        loss = trainer.compute_loss(model, {k: v.clone() for k, v in batch.items()})
    model.train(was)
    trainable = {n: p.detach().contiguous().clone() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(folder / f"{name}-weights.safetensors"))
    torch.save({k: v for k, v in batch.items()}, folder / f"{name}-batch.pt")
    return float(loss)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--probe", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--center", type=float, default=0.01)
    p.add_argument("--max-length", type=int, default=64)
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    trl = importlib.import_module("trl")  # TRL's environment only (not xtrain's)
    torch.manual_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForSequenceClassification.from_pretrained(a.model, num_labels=1, dtype=torch.float32)
    data = load_dataset("json", data_files={"train": a.train, "eval": a.eval})
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    stamps: list[tuple[float, float]] = []  # (wall, this process's CPU) at each optimizer step
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    config = trl.RewardConfig(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.per_device,
        per_device_eval_batch_size=a.per_device, gradient_accumulation_steps=a.accumulation,
        learning_rate=a.lr, lr_scheduler_type="cosine", warmup_steps=5, max_length=a.max_length,
        center_rewards_coefficient=a.center, logging_steps=10, save_strategy="no", eval_strategy="no",
        report_to=[], use_cpu=True, seed=42, dataloader_num_workers=0, bf16=False,
        gradient_checkpointing=False,
    )  # fmt: skip
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets, task_type="SEQ_CLS",
                      modules_to_save=["score"])  # fmt: skip
    trainer = trl.RewardTrainer(
        model=model, args=config, train_dataset=data["train"], eval_dataset=data["eval"],
        processing_class=tokenizer, peft_config=lora,
    )  # fmt: skip
    folder = Path(a.probe)
    folder.mkdir(parents=True, exist_ok=True)
    first = trainer.data_collator([trainer.train_dataset[i] for i in range(a.per_device)])
    at_start = _probe(trainer, first, folder, "start")
    stamps.clear()
    trainer.train()
    trained = _probe(trainer, first, folder, "trained")
    metrics = trainer.evaluate()
    pairs = (first["input_ids"], first["attention_mask"])
    print("RESULT " + json.dumps({
        "stamps": stamps, "accuracy": metrics.get("eval_accuracy"), "loss_start": at_start,
        "loss_trained": trained, "kept": len(trainer.train_dataset),
        "ids": [x[m.bool()].tolist() for x, m in zip(*pairs, strict=True)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
