"""TRL's GKDTrainer on the job `benchmarks/distill_vs_trl.py` gives xtrain: the same student and
teacher folders, the same conversations (jsonl, {"messages": [user, assistant]}), LoRA r=8 / alpha 16
on q/k/v/o through peft, float32 (TRL's bf16 off), no gradient checkpointing (TRL's default on),
the same batch, steps, learning rate, beta, lmbda, temperature and completion length. Prints one
``RESULT`` JSON line: (wall, CPU) seconds at each optimizer step (torch's global optimizer-step
pre-hook, the same stamp as xtrain's side), each optimizer step's loss as TRL back-propagates it
(the sum of what ``accelerator.backward`` got over the step's micro-batches) and the token ids of
the first step's micro-batches. Runs in TRL's own environment (never a dependency of xtrain):

    .venv-trl/bin/python benchmarks/distill_trl_job.py --student DIR --teacher DIR --train FILE --out DIR
"""

from __future__ import annotations

import argparse
import importlib
import json
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--student", required=True)
    p.add_argument("--teacher", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--lmbda", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-length", type=int, default=128)
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gkd = importlib.import_module("trl.experimental.gkd")  # TRL's environment only (not xtrain's)
    torch.manual_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(a.student)
    model = AutoModelForCausalLM.from_pretrained(a.student, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(a.teacher, dtype=torch.float32)
    data = load_dataset("json", data_files={"train": a.train})
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    stamps: list[tuple[float, float]] = []  # (wall, this process's CPU) at each optimizer step
    losses: list[float] = []  # each optimizer step's loss, as back-propagated
    pending: list[float] = []
    first: list[list[list[int]]] = []  # the first step's micro-batches' input ids

    def step_hook(*_: object) -> None:
        stamps.append((time.perf_counter(), time.process_time()))
        losses.append(sum(pending))
        pending.clear()

    register_optimizer_step_pre_hook(step_hook)
    config = gkd.GKDConfig(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.per_device,
        gradient_accumulation_steps=a.accumulation, learning_rate=a.lr, lr_scheduler_type="linear",
        warmup_steps=0, beta=a.beta, lmbda=a.lmbda, temperature=a.temperature,
        max_new_tokens=a.max_new_tokens, max_length=a.max_length, seq_kd=False, logging_steps=1,
        save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True, seed=42, dataloader_num_workers=0,
        bf16=False, fp16=False,
        gradient_checkpointing=False,
    )  # fmt: skip
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
    trainer = gkd.GKDTrainer(
        model=model, teacher_model=teacher, args=config, train_dataset=data["train"],
        processing_class=tokenizer, peft_config=lora,
    )  # fmt: skip
    backward = trainer.accelerator.backward

    def recorded(loss: torch.Tensor, **kwargs: object) -> None:
        pending.append(float(loss.detach()))
        return backward(loss, **kwargs)

    trainer.accelerator.backward = recorded
    step = trainer.training_step

    def training_step(model: object, inputs: dict, num_items_in_batch: object = None) -> torch.Tensor:
        if not losses and len(first) < a.accumulation:
            first.append(inputs["input_ids"].tolist())
        return step(model, inputs, num_items_in_batch)

    trainer.training_step = training_step
    trainer.train()
    print("RESULT " + json.dumps({"stamps": stamps, "losses": losses, "first_batches": first}))


if __name__ == "__main__":
    main()
