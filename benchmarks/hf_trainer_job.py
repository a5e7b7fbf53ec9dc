"""The Hugging Face Trainer doing the job `benchmarks/startup.py` gives xtrain: the same model
folder, the same jsonl data tokenized and packed with ``datasets.map`` (``run_clm``'s
group_texts), LoRA r=16 on q/k/v/o through peft, the same batch. Reports ``time.time()`` at the
end of the first optimizer step (a callback), then stops.

    python benchmarks/hf_trainer_job.py --model DIR --data FILE --out DIR [--max-length 128] [--per-device 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--per-device", type=int, default=8)
    a = p.parse_args()

    import torch
    from common import emit
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    raw = load_dataset("json", data_files=a.data)["train"]

    def group_texts(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        ids = [t + [tokenizer.eos_token_id] for t in tokenizer(batch["text"])["input_ids"]]
        flat = [t for row in ids for t in row]
        blocks = [flat[i : i + a.max_length] for i in range(0, len(flat), a.max_length)]
        return {"input_ids": blocks, "attention_mask": [[1] * len(b) for b in blocks]}

    data = raw.map(group_texts, batched=True, remove_columns=raw.column_names)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    )

    class FirstStep(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 1:
                emit({"first_step_time": time.time()})
                control.should_training_stop = True

    args = TrainingArguments(
        output_dir=a.out,
        per_device_train_batch_size=a.per_device,
        max_steps=2,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        seed=0,
    )
    Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[FirstStep()],
    ).train()


if __name__ == "__main__":
    main()
