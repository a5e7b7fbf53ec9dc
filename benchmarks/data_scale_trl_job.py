"""TRL's SFTTrainer on the job `benchmarks/data_scale.py` gives xtrain: the same model folder (the
built-in tiny llama with its chat template), the same JSONL of conversations, LoRA r=8 / alpha 16
on q_proj/v_proj through peft, the same batch and max_length, float32 (TRL's bf16 and gradient
checkpointing defaults off: FIELD_NOTES), one optimizer step. TRL maps the rows with datasets
(its own cache, ``dataset_num_proc`` left at its default) and trains on every token of a
conversation (its assistant mask needs ``{% generation %}`` markers in the template). Prints one
``RESULT`` JSON line at the first optimizer step (torch's global optimizer-step pre-hook, as on
xtrain's side) and exits there. Runs in TRL's own environment (never a dependency of xtrain):

    .venv-trl/bin/python benchmarks/data_scale_trl_job.py --model DIR --train FILE --out DIR --t0 T
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--t0", type=float, required=True)  # wall clock when the parent started this process
    p.add_argument("--per-device", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    a = p.parse_args()

    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trl = importlib.import_module("trl")  # TRL's environment only (not xtrain's)

    def first_step(*_: object) -> None:
        t = os.times()
        result = {
            "wall_s": time.time() - a.t0,
            "cpu_s": t.user + t.system + t.children_user + t.children_system,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "children_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        }
        print("RESULT " + json.dumps(result), flush=True)
        sys.stdout.flush()
        os._exit(0)

    register_optimizer_step_pre_hook(first_step)
    torch.manual_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    data = load_dataset("json", data_files={"train": a.train})["train"]
    config = trl.SFTConfig(
        output_dir=a.out, max_steps=1, per_device_train_batch_size=a.per_device, learning_rate=1e-4,
        max_length=a.max_length, bf16=False, gradient_checkpointing=False, use_cpu=True, save_strategy="no",
        eval_strategy="no", report_to=[], logging_steps=1, seed=42, packing=False,
    )  # fmt: skip
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    trainer = trl.SFTTrainer(
        model=model, args=config, train_dataset=data, processing_class=tokenizer, peft_config=lora
    )
    trainer.train()
    raise SystemExit("no optimizer step was taken")


if __name__ == "__main__":
    main()
