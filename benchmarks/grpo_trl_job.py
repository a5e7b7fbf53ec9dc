"""TRL's GRPOTrainer (no vLLM: plain ``generate``) on the job `benchmarks/grpo_vs_trl.py` gives
xtrain: the same model folder, the same prompts (jsonl ``{prompt}`` strings), the same regex
reward, LoRA r=8 / alpha 16 on q/k/v/o, 8 completions a prompt, the same batch, completion
length, steps, learning rate and loss, in float32 (``bf16=False``: GRPOConfig's default bf16 on
a CPU is emulated) without gradient checkpointing (its default on). Prints one ``RESULT`` JSON
line: (wall, CPU) seconds at each optimizer step (torch's global optimizer-step pre-hook, the same
stamp as xtrain's side) and (wall, CPU seconds, completion tokens) of each generation and scoring
(TRL's ``_generate_and_score_completions``). Runs in an environment with TRL (never a dependency
of xtrain):

    .venv-trl/bin/python benchmarks/grpo_trl_job.py --model DIR --train FILE --out DIR --pattern REGEX
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--pattern", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--per-device", type=int, default=16)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--completion-length", type=int, default=24)
    p.add_argument("--lr", type=float, default=5e-3)
    a = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trl = importlib.import_module("trl")  # TRL's environment only (not xtrain's)
    torch.manual_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    data = load_dataset("json", data_files={"train": a.train})["train"].select_columns(["prompt"])
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    stamps: list[tuple[float, float]] = []  # (wall, this process's CPU) at each optimizer step
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    pattern = re.compile(a.pattern, re.DOTALL)

    def regex(prompts, completions, **kwargs):
        return [1.0 if pattern.fullmatch(c.strip()) else 0.0 for c in completions]

    config = trl.GRPOConfig(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.per_device,
        gradient_accumulation_steps=a.accumulation, num_generations=a.generations,
        max_completion_length=a.completion_length, learning_rate=a.lr, lr_scheduler_type="linear",
        warmup_steps=2, loss_type="dapo", beta=0.0, temperature=1.0, disable_dropout=True,
        bf16=False,  # float32 as xtrain on the CPU (GRPOConfig's default bf16: emulated there)
        gradient_checkpointing=False,  # (TRL's default turns it on; xtrain's job runs without)
        logging_steps=4, save_strategy="no", report_to=[], use_cpu=True, seed=42, dataloader_num_workers=0,
    )  # fmt: skip
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=[regex], args=config, train_dataset=data, processing_class=tokenizer,
        peft_config=lora,
    )  # fmt: skip
    generating: list[tuple[float, float, int]] = []  # (wall, CPU seconds, completion tokens) each
    inner = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        out = inner(*args, **kwargs)
        tokens = int(out["completion_mask"].sum())
        generating.append((time.perf_counter() - wall, time.process_time() - cpu, tokens))
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    print("RESULT " + json.dumps({"stamps": stamps, "generating": generating}))


if __name__ == "__main__":
    main()
