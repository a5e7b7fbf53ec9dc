"""TRL's DPOTrainer on the job `benchmarks/preference_vs_trl.py` gives xtrain: the same model
folder, the same pairs (jsonl, {prompt, chosen, rejected} strings), LoRA r=8 / alpha 16 on
q/k/v/o through peft (the reference: the adapters off), the same batch, steps, learning rate and
beta. Prints one ``RESULT`` JSON line: (wall, CPU) seconds at each optimizer step (torch's global
optimizer-step pre-hook, the same stamp as xtrain's side) and the final eval reward accuracy.
Runs in TRL's own environment (never a dependency of xtrain):

    .venv-trl/bin/python benchmarks/preference_trl_job.py --model DIR --train FILE --eval FILE --out DIR
"""

from __future__ import annotations

import argparse
import importlib
import json
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--eval", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--max-length", type=int, default=64)
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trl = importlib.import_module("trl")  # TRL's environment only (not xtrain's)
    torch.manual_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    data = load_dataset("json", data_files={"train": a.train, "eval": a.eval})
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    stamps: list[tuple[float, float]] = []  # (wall, this process's CPU) at each optimizer step
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))

    config = trl.DPOConfig(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.per_device,
        per_device_eval_batch_size=a.per_device, gradient_accumulation_steps=a.accumulation,
        learning_rate=a.lr, lr_scheduler_type="cosine", warmup_steps=5, beta=a.beta,
        max_length=a.max_length, logging_steps=10, save_strategy="no", eval_strategy="no", report_to=[],
        use_cpu=True, seed=42, dataloader_num_workers=0,
    )  # fmt: skip
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM")
    trainer = trl.DPOTrainer(
        model=model, args=config, train_dataset=data["train"], eval_dataset=data["eval"],
        processing_class=tokenizer, peft_config=lora,
    )  # fmt: skip
    trainer.train()
    metrics = trainer.evaluate()
    accuracy = metrics.get("eval_rewards/accuracies")
    print("RESULT " + json.dumps({"stamps": stamps, "reward_accuracy": accuracy}))


if __name__ == "__main__":
    main()
