"""The training config: one YAML file plus `key=value` overrides, strictly validated.

Field names here are the contract between the config loader, the task builders and the loop.
(Loading, override parsing and validation are filled in by the config owner.)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    name_or_path: str = "builtin:tiny-llama"  # local folder, hub id, or builtin:NAME (built offline)
    task: str = "causal-lm"  # causal-lm | seq-cls | custom
    custom: str | None = None  # "module:function" returning a Workload (task: custom)
    num_labels: int | None = None  # seq-cls; None: inferred from the data
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (weights' load dtype)
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False


@dataclass
class LoraConfig:
    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: str | list[str] = "auto"  # auto: found for common architectures
    modules_to_save: list[str] | None = None  # None: the task head for seq-cls


@dataclass
class DataConfig:
    train: str | None = None  # file (json/jsonl/csv/parquet/txt), saved datasets folder, hub id, builtin:NAME
    eval: str | None = None
    eval_fraction: float = 0.0  # split this share off train when no eval set is given
    format: str = "auto"  # auto (from the extension) | json | csv | parquet | text | arrow
    text_column: str = "text"
    text_pair_column: str | None = None
    prompt_column: str | None = None  # causal-lm prompt/response: loss masked on the prompt
    response_column: str | None = None
    label_column: str = "label"
    max_length: int = 512
    packing: bool = False  # causal-lm: concatenate and cut into max_length blocks


@dataclass
class OptimConfig:
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: str = "cosine"  # cosine | linear | constant
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    lr_scaling: str = "none"  # none | linear | sqrt (relative to base_global_batch)
    base_global_batch: int | None = None


@dataclass
class BatchConfig:
    per_device: int = 8
    # None: per_device x processes (accumulation 1). Otherwise accumulation is derived as
    # global / (per_device x processes), so the effective batch stays fixed when the GPU count changes.
    global_batch: int | None = None


@dataclass
class RunConfig:
    output_dir: str = "xtrain-output"
    max_steps: int | None = None  # optimizer steps; wins over epochs
    epochs: float = 1.0
    eval_every: int | None = None  # steps; None: at the end only
    save_every: int | None = None  # steps; None: at the end only
    keep_checkpoints: int = 2
    seed: int = 42
    resume: str = "auto"  # auto | off | path to a checkpoint folder
    log_every: int = 10  # steps between host syncs for logging
    mixed_precision: str = "auto"  # auto (from the plan) | no | fp16 | bf16
    tensorboard: bool = True
    save_merged: bool = False  # also write the LoRA-merged full model


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    run: RunConfig = field(default_factory=RunConfig)
