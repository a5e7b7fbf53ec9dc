"""Names from other trainers (HF Trainer / TRL, LLaMA-Factory, axolotl): the one table of what
xtrain calls the same setting, or how xtrain does it instead, and ``answer``, the pure lookup that
the config loader's unknown-key errors use (YAML keys under any section or at the top level, and
command-line ``key=value`` overrides alike). docs/configuration.md's "Coming from another trainer"
table is checked against ``FOREIGN`` (tests/test_foreign_names.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Foreign:
    """One name from another trainer: the xtrain ``key`` that means the same (with the ``value``
    to set, where the other trainer spells the choice as its own flag), and/or how xtrain does it
    (``how``), and which trainers use the name (``where``)."""

    key: str | None
    where: str
    how: str = ""
    value: str = ""


HF = "HF Trainer/TRL"
LF = "LLaMA-Factory"
AX = "axolotl"
_ACCUMULATION = (
    "accumulation is derived from batch.global_batch / (batch.per_device x processes): set "
    "batch.global_batch (the samples per optimizer step, the same on any number of GPUs)"
)

_EVAL = "evaluation is every run.eval_every optimizer steps (unset: at the end)"
_SAVE = "checkpoints are every run.save_every optimizer steps (unset: at the end)"
_DEEPSPEED = "DeepSpeed is a launch option: xtrain train CONFIG --deepspeed zero2 (or zero3)"
_TRAIN = "data.train: a file, a folder, a hub id or builtin:NAME, or a list of them (mixed by data.mix)"
_CACHED = "tokenized data is cached by datasets (HF_DATASETS_CACHE) and reused by the next run"
_UNUSED = "xtrain freezes what does not train, so DDP needs no search (no key)"
_SFT_TERM = (
    "the same weight; preference.sft_weight takes the chosen answers' NLL per token over the "
    "step's chosen tokens (TRL's rpo_alpha: over each micro-batch's), pref_ftx each answer's "
    "per-token NLL averaged (the same for answers of one length)"
)

# fmt: off
FOREIGN: dict[str, Foreign] = {
    "learning_rate": Foreign("optim.lr", f"{HF}, {LF}, {AX}"),
    "gradient_accumulation_steps": Foreign("batch.global_batch", f"{HF}, {LF}, {AX}", _ACCUMULATION),
    "per_device_train_batch_size": Foreign("batch.per_device", f"{HF}, {LF}"),
    "micro_batch_size": Foreign("batch.per_device", AX),
    "per_device_eval_batch_size": Foreign(
        "batch.per_device", f"{HF}, {LF}", "evaluation batches take batch.per_device too"
    ),
    "eval_batch_size": Foreign("batch.per_device", AX, "evaluation batches take batch.per_device too"),
    "total_batch_size": Foreign("batch.global_batch", "others"),
    "global_batch_size": Foreign("batch.global_batch", "others"),
    "num_train_epochs": Foreign("run.epochs", f"{HF}, {LF}"),
    "num_epochs": Foreign("run.epochs", AX),
    "max_steps": Foreign("run.max_steps", f"{HF}, {LF}, {AX}"),
    "cutoff_len": Foreign("data.max_length", LF),
    "sequence_len": Foreign("data.max_length", AX),
    "max_seq_length": Foreign("data.max_length", "TRL (older), Unsloth"),
    "max_seq_len": Foreign("data.max_length", "others"),
    "model_max_length": Foreign("data.max_length", "transformers tokenizers"),
    "logging_steps": Foreign("run.log_every", f"{HF}, {LF}, {AX}"),
    "save_steps": Foreign("run.save_every", f"{HF}, {LF}, {AX}"),
    "saves_per_epoch": Foreign("run.save_every", AX, _SAVE),
    "eval_steps": Foreign("run.eval_every", f"{HF}, {LF}, {AX}"),
    "evals_per_epoch": Foreign("run.eval_every", AX, _EVAL),
    "eval_strategy": Foreign("run.eval_every", HF, _EVAL),
    "evaluation_strategy": Foreign("run.eval_every", HF, _EVAL),
    "save_strategy": Foreign("run.save_every", HF, _SAVE),
    "save_total_limit": Foreign("run.keep_checkpoints", f"{HF}, {LF}, {AX}"),
    "lora_target": Foreign("lora.target_modules", LF),
    "lora_target_modules": Foreign("lora.target_modules", AX),
    "lora_target_linear": Foreign("lora.target_modules", AX, "", "all-linear"),
    "target_modules": Foreign("lora.target_modules", "peft"),
    "lora_rank": Foreign("lora.r", LF),
    "lora_r": Foreign("lora.r", AX),
    "lora_alpha": Foreign("lora.alpha", f"{LF}, {AX}"),
    "lora_dropout": Foreign("lora.dropout", f"{LF}, {AX}"),
    "additional_target": Foreign("lora.modules_to_save", LF),
    "lora_modules_to_save": Foreign("lora.modules_to_save", AX),
    "use_dora": Foreign("lora.use_dora", f"{LF}, {AX}"),
    "use_rslora": Foreign("lora.use_rslora", f"{LF}, {AX}"),
    "pissa_init": Foreign("lora.init_weights", LF, "", "pissa"),
    "finetuning_type": Foreign("lora.enabled", LF, "lora.enabled: true for lora, false for a full fine-tune"),
    "adapter": Foreign("lora.enabled", AX, "lora: lora.enabled: true; qlora: also model.quantization: 4bit"),
    "warmup_ratio": Foreign("optim.warmup_ratio", f"{HF}, {LF}, {AX}"),
    "warmup_steps": Foreign("optim.warmup_steps", f"{HF}, {LF}, {AX}"),
    "weight_decay": Foreign("optim.weight_decay", f"{HF}, {LF}, {AX}"),
    "max_grad_norm": Foreign("optim.max_grad_norm", f"{HF}, {LF}, {AX}"),
    "gradient_clipping": Foreign("optim.max_grad_norm", "DeepSpeed"),
    "lr_scheduler_type": Foreign("optim.schedule", f"{HF}, {LF}"),
    "lr_scheduler": Foreign("optim.schedule", AX),
    "optim": Foreign("optim.name", f"{HF}, {LF}"),
    "optimizer": Foreign("optim.name", AX),
    "adam_beta1": Foreign("optim.betas", HF, "both betas in one list: optim.betas: [0.9, 0.999]"),
    "adam_beta2": Foreign("optim.betas", HF, "both betas in one list: optim.betas: [0.9, 0.999]"),
    "adam_epsilon": Foreign("optim.eps", HF),
    "neftune_noise_alpha": Foreign("optim.neftune_alpha", f"{HF}, {LF}, {AX}"),
    "bf16": Foreign("run.mixed_precision", f"{HF}, {LF}, {AX}", "", "bf16"),
    "fp16": Foreign("run.mixed_precision", f"{HF}, {LF}, {AX}", "", "fp16"),
    "pure_bf16": Foreign("model.dtype", LF, "bf16 weights: model.dtype: bfloat16", "bfloat16"),
    "torch_dtype": Foreign("model.dtype", "transformers"),
    "gradient_checkpointing": Foreign("model.gradient_checkpointing", f"{HF}, {AX}"),
    "output_dir": Foreign("run.output_dir", f"{HF}, {LF}, {AX}"),
    "seed": Foreign("run.seed", f"{HF}, {LF}, {AX}"),
    "resume_from_checkpoint": Foreign("run.resume", f"{HF}, {LF}, {AX}"),
    "report_to": Foreign("run.report_to", f"{HF}, {LF}"),
    "torch_compile": Foreign("run.compile", f"{HF}, {AX}"),
    "metric_for_best_model": Foreign("run.best_metric", HF),
    "load_best_model_at_end": Foreign("run.best_metric", HF, "naming run.best_metric keeps the best model"),
    "early_stopping_patience": Foreign("run.early_stopping_patience", f"{HF}, {AX}"),
    "model_name_or_path": Foreign("model.name_or_path", f"{HF}, {LF}"),
    "base_model": Foreign("model.name_or_path", AX),
    "trust_remote_code": Foreign("model.trust_remote_code", f"{LF}, {AX}"),
    "flash_attn": Foreign("model.attn_implementation", LF, "", "flash_attention_2"),
    "attn_implementation": Foreign("model.attn_implementation", "transformers"),
    "load_in_4bit": Foreign("model.quantization", AX, "", "4bit"),
    "load_in_8bit": Foreign("model.quantization", AX, "", "8bit"),
    "quantization_bit": Foreign("model.quantization", LF, "model.quantization: 4bit or 8bit"),
    "dataset": Foreign("data.train", LF, _TRAIN),
    "datasets": Foreign("data.train", AX, _TRAIN),
    "dataset_dir": Foreign("data.train", LF, "data.train takes paths (relative to the config file)"),
    "max_samples": Foreign("data.max_samples", LF),
    "max_train_samples": Foreign("data.max_samples", "HF examples"),
    "mix_strategy": Foreign("data.mix", LF),
    "interleave_probs": Foreign("data.mix_probs", LF),
    "shuffle_merged_datasets": Foreign(
        "run.seed", AX, "the mixed rows are shuffled every epoch, seeded by run.seed (no key)"
    ),
    "test_datasets": Foreign("data.eval", AX),
    "dataset_text_field": Foreign("data.text_column", "TRL"),
    "formatting": Foreign("data.row_format", f"{LF} dataset_info"),
    "messages": Foreign("data.messages_column", f"{LF} dataset_info"),
    "neat_packing": Foreign("data.packing", LF, "", "on"),
    "dataset_num_proc": Foreign("data.encode_processes", f"TRL, {AX}"),
    "tokenized_path": Foreign(None, LF, _CACHED),
    "dataset_prepared_path": Foreign(None, AX, _CACHED),
    "dataset_name": Foreign("data.train", HF),
    "train_file": Foreign("data.train", HF),
    "eval_dataset": Foreign("data.eval", LF),
    "validation_file": Foreign("data.eval", HF),
    "val_size": Foreign("data.eval_fraction", LF),
    "val_set_size": Foreign("data.eval_fraction", AX),
    "template": Foreign(
        "data.chat_template", LF,
        "chat rows are rendered with the tokenizer's own chat template; data.chat_template takes "
        "a shipped template's name (chatml, qwen2.5, qwen3, llama3.1, llama3.2, mistral, smollm2), a "
        "Jinja file or text to use another",
    ),
    "mask_history": Foreign("data.train_on", LF, "", "last_assistant"),
    "train_on_inputs": Foreign("data.train_on", f"{LF}, {AX}", "", "all"),
    "assistant_only_loss": Foreign("data.train_on", HF, "", "all_assistant"),
    "chat_template_kwargs": Foreign("data.chat_template_kwargs", HF),
    "enable_thinking": Foreign(
        "data.chat_template_kwargs", LF, "data.chat_template_kwargs: {enable_thinking: false} (or true)"
    ),
    "chat_template": Foreign("data.chat_template", AX),
    "packing": Foreign("data.packing", f"{HF}, {LF}"),
    "sample_packing": Foreign("data.packing", AX),
    "group_by_length": Foreign("data.group_by_length", HF),
    "dataloader_num_workers": Foreign("data.num_workers", HF),
    "preprocessing_num_workers": Foreign("data.encode_processes", LF),
    "max_new_tokens": Foreign("generation.max_new_tokens", "transformers generate"),
    "num_beams": Foreign("generation.num_beams", "transformers generate"),
    "rpo_alpha": Foreign("preference.sft_weight", "TRL"),
    "pref_ftx": Foreign("preference.sft_weight", LF, _SFT_TERM),
    "loss_weights": Foreign(
        "preference.sft_weight", "TRL",
        "TRL's loss_type [sigmoid, sft] with loss_weights [1, w] is preference.loss: dpo with "
        "preference.sft_weight: w",
    ),
    "loss_type": Foreign(
        "preference.loss", "TRL", "TRL's sigmoid is preference.loss: dpo; ipo, orpo, simpo, kto as named"
    ),
    "pref_loss": Foreign(
        "preference.loss", LF, "LLaMA-Factory's sigmoid is preference.loss: dpo; ipo, orpo, simpo as named"
    ),
    "pref_beta": Foreign("preference.beta", LF),
    "center_rewards_coefficient": Foreign("reward.center_rewards_coefficient", "TRL"),
    "deepspeed": Foreign(None, f"{HF}, {LF}, {AX}", _DEEPSPEED),
    "fsdp": Foreign(None, f"{HF}, {AX}", "FSDP is a launch option: xtrain train CONFIG --fsdp"),
    "ddp_find_unused_parameters": Foreign(None, HF, _UNUSED),
    "ddp_timeout": Foreign("run.collective_timeout_s", f"{HF}, {LF}, {AX}"),
    "sequence_parallel_size": Foreign("parallel.sequence", "ms-swift"),
    "sequence_parallel_degree": Foreign("parallel.sequence", AX),
    "context_parallel_size": Foreign("parallel.sequence", AX),
}
# fmt: on


def answer(name: str) -> str | None:
    """The hint for an unknown ``name`` that another trainer uses (its last part: ``learning_rate``,
    ``optim.learning_rate``, ``training.learning_rate`` alike), or None. Pure."""
    leaf = name.strip().rsplit(".", 1)[-1].lower().replace("-", "_")
    found = FOREIGN.get(leaf)
    if found is None:
        return None
    if found.how:  # how xtrain does it, naming the key
        return f"{leaf} ({found.where}): {found.how}"
    setting = f"{found.key}: {found.value}" if found.value else found.key
    return f"{leaf} ({found.where}) is {setting} in xtrain"


def doc_table() -> str:
    """docs/configuration.md's "Coming from another trainer" table (checked against it by
    tests/test_foreign_names.py; print it to update the page)."""
    rows = ["| name | used by | in xtrain |", "|---|---|---|"]
    for name, f in sorted(FOREIGN.items()):
        setting = f"`{f.key}: {f.value}`" if f.key and f.value else f"`{f.key}`" if f.key else ""
        said = f"{setting}: {f.how}" if setting and f.how else setting or f.how
        rows.append(f"| `{name}` | {f.where} | {said} |")
    return "\n".join(rows)
