"""The training config's schema: one dataclass a YAML section, with the defaults.

Field names here are the contract between the config loader, the task builders and the loop.
``sections``/``section_fields``/``config_keys`` read the valid ``section.key`` names off the
dataclasses; what values a key takes is in ``values.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    # local folder, hub id, builtin:NAME (built offline), or a trained result to start from (a run's
    # output_dir, its adapter/ or best/, a merged folder: docs/chains.md)
    name_or_path: str = "builtin:tiny-bert"
    task: str = "seq-cls"  # a task of the registry (xtrain.tasks), e.g. causal-lm, custom
    custom: str | None = None  # "module:function" returning a Workload (the custom task)
    num_labels: int | None = None  # classification tasks; None: inferred from the data
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (weights' load dtype)
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    # auto | sdpa | flash_attention_2 | eager: transformers' attn_implementation; auto is decided
    # from the installed packages, the device, the precision and the model (planning.resolve)
    attn_implementation: str = "auto"
    freeze_encoder: bool = False  # speech-to-text full fine-tune: train the decoder only
    freeze_vision: bool = True  # vision-language full fine-tune: keep the vision tower fixed
    # 4bit (NF4, double quantization) | 8bit (LLM.int8) | None: the base weights loaded through
    # bitsandbytes for QLoRA (LoRA only; compute in the run's precision, float32 on CPU)
    quantization: str | None = None
    # auto | on | off: the loss over the trained tokens only, the output head in chunks whose logits
    # are never all kept (xtrain/model/chunked_loss.py); auto: on wherever it reproduces the
    # model's own loss (causal-lm, vision-language, image-to-text, speech-to-text)
    chunked_loss: str = "auto"
    # what autograd saves for the backward pass moved to host memory (xtrain/model/offload.py)
    activation_offload: bool = False


@dataclass
class LoraConfig:
    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: str | list[str] = "auto"  # auto: found for common architectures
    modules_to_save: list[str] | None = None  # None: the task head for seq-cls
    # image-to-text, speech-to-text: which half of the encoder-decoder model gets adapters
    # (auto targets or the names above)
    apply_to: str = "both"  # both | encoder | decoder
    # vision-language: the adapters go on the language model's attention/MLP layers; these add
    projector: bool = False  # train the projector/merger (vision -> text) whole, saved with the adapter
    vision_blocks: bool = False  # also put adapters on the vision tower's blocks
    # peft's variants: DoRA (weight-decomposed), rsLoRA (alpha / sqrt(r) scaling) and how the
    # adapters start (peft's init_lora_weights: default | gaussian | pissa | olora | loftq)
    use_dora: bool = False
    use_rslora: bool = False
    init_weights: str = "default"
    # model.name_or_path a trained result (docs/chains.md): false trains a new adapter on top of its
    # adapters (kept frozen); true trains its last adapter on (its rank and targets are its own)
    continue_adapter: bool = False


@dataclass
class DataConfig:
    # file (json/jsonl/csv/parquet/txt), saved datasets folder, hub id, builtin:NAME; or a list of
    # them, mixed by data.mix (xtrain.data.mixing)
    train: str | list[str] | None = "builtin:sentiment"
    eval: str | None = None
    # several train files: concat (one after the other, then shuffled as one) | interleave_under
    # (drawn by data.mix_probs until one file runs out) | interleave_over (until each has,
    # the others repeated): LLaMA-Factory's mix_strategy, datasets.interleave_datasets seeded by run.seed
    mix: str = "concat"
    mix_probs: list[float] | None = None  # interleave_*: each file's share; None: equal shares
    max_samples: int | None = None  # the first N rows of each data file (train and eval); None: all
    eval_fraction: float = 0.0  # split this share off train when no eval set is given
    format: str = "auto"  # auto (from the extension) | json | csv | parquet | text | arrow
    # causal-lm: what the rows hold: auto (from the columns) | text | prompt_response | messages |
    # alpaca | sharegpt (``format`` above is how the file is stored)
    row_format: str = "auto"
    text_column: str = "text"
    # image tasks: image paths (relative to the data file, or data.image_root) or an Image feature
    image_column: str = "image"
    # speech-to-text: audio paths (relative to the data file, or data.audio_root) or an Audio feature
    audio_column: str = "audio"
    max_audio_seconds: float | None = None  # speech-to-text: None: the model's window (30 s for Whisper)
    long_audio: str = "refuse"  # speech-to-text, clips over max_audio_seconds: refuse | cut
    text_pair_column: str | None = None
    # chat data (causal-lm, vision-language): conversations of {role, content} turns
    messages_column: str = "messages"
    images_column: str = "images"  # vision-language: images for image parts that name no file
    # a shipped template's name (chatml, qwen2.5, qwen3, llama3.1, llama3.2, mistral, smollm2), a Jinja
    # file or template text; None: the tokenizer's/processor's
    chat_template: str | None = None
    # causal-lm chat: extra variables of every rendering (train, eval, predict, the data check,
    # export), e.g. {enable_thinking: false}; what the template does with them is its own
    chat_template_kwargs: dict[str, Any] | None = None
    # causal-lm chat: which tokens train: all_assistant (every assistant turn: answers, tool calls,
    # reasoning) | last_assistant (the last one only) | all (every token, prompts and results too)
    train_on: str = "all_assistant"
    # causal-lm agent rows (docs/agents.md): the column of each row's tool schemas, and a JSON file
    # of the schemas for rows without that column
    tools_column: str = "tools"
    tools: str | None = None
    # chat turns spelt otherwise (LLaMA-Factory's dataset_info tags): the key of the speaker, the
    # key of the text, and each role's speaker name; None: the row format's own (messages:
    # role/content; sharegpt: from/value, human/gpt/system)
    role_tag: str | None = None
    content_tag: str | None = None
    user_tag: str | None = None
    assistant_tag: str | None = None
    system_tag: str | None = None
    # the folder relative image / audio paths are relative to; None: the data file's folder
    image_root: str | None = None
    audio_root: str | None = None
    min_pixels: int | None = None  # vision-language (Qwen2-VL-style processors): image area bounds
    max_pixels: int | None = None  # (fewer pixels: fewer image tokens, less memory); None: the processor's
    # every task that reads images, and predict: an image file whose header declares more pixels is
    # refused before it is decoded (a decompression bomb); Pillow's own limit; None: no limit
    max_image_pixels: int | None = 89_478_485
    prompt_column: str | None = None  # causal-lm prompt/response: loss masked on the prompt
    response_column: str | None = None
    label_column: str = "label"
    max_length: int = 512
    # causal-lm: off | on (whole examples packed into rows of max_length, kept apart: position_ids
    # restart per example, no attention across them) | concatenate (concatenated and cut into
    # max_length blocks: examples attend to the ones before them; pre-training-style text only)
    packing: str = "off"
    # Each optimizer step's samples of similar length (speech: audio seconds; text: tokens), less
    # padding; the order stays independent of the process count (xtrain.data.sampler).
    group_by_length: bool = False
    num_workers: int | None = None  # DataLoader worker processes per training process; None: the plan's
    # processes that encode the rows on a first run (xtrain.data.encoded); None: the machine's cores
    encode_processes: int | None = None

    def train_sources(self) -> list[str]:
        """``data.train`` as a list of sources (one for a single file; none when unset)."""
        if not self.train:
            return []
        return [self.train] if isinstance(self.train, str) else list(self.train)


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw (torch) | adamw_8bit | paged_adamw_8bit (bitsandbytes)
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
    neftune_alpha: float | None = None  # causal-lm: NEFTune noise on the input embeddings in training


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
    eval_at_start: bool = False  # also evaluate before the first step (the "before" figures)
    save_every: int | None = None  # steps; None: at the end only
    keep_checkpoints: int = 2
    seed: int = 42
    resume: str = "auto"  # auto | off | path to a checkpoint folder
    log_every: int = 10  # steps between host syncs for logging
    mixed_precision: str = "auto"  # auto (from the plan) | no | fp16 | bf16
    tensorboard: bool = True  # the shorthand of report_to: [tensorboard] (report_to: auto reads it)
    # experiment trackers (accelerate's): auto (tensorboard unless run.tensorboard is false), none,
    # or a list of tensorboard, mlflow, wandb, trackio (each but tensorboard installed apart)
    report_to: str | list[str] = "auto"
    save_merged: bool = False  # also write the LoRA-merged full model
    best_metric: str | None = None  # e.g. cer or eval_loss: keep the best model so far in output_dir/best
    # stop after this many evaluations in a row without best_metric improving by more than the
    # threshold (None: never); needs best_metric and eval_every
    early_stopping_patience: int | None = None
    early_stopping_threshold: float = 0.0
    # torch.compile the model (after LoRA, through accelerate's TorchDynamoPlugin, inductor);
    # refused where it cannot work (Windows or a CUDA GPU without Triton: planning.rules)
    compile: bool = False
    # seconds a collective may wait for a slow or hung rank before the run fails (torch's own
    # default is 10 min for NCCL); long enough for rank 0 to tokenise a big data set first
    collective_timeout_s: int = 1800
    # compute threads each training process runs (torch.set_num_threads); None: the plan's, from the
    # cores and the load average (a busy CPU gets fewer: planning/threads.py)
    cpu_threads: int | None = None


@dataclass
class GenerationConfig:
    """How generative tasks (image-to-text, speech-to-text) decode at evaluation and in ``xtrain predict``."""

    max_new_tokens: int = 128
    num_beams: int = 1  # 1: greedy
    sample_predictions: int = 4  # reference vs prediction pairs shown and logged at each eval
    language: str | None = None  # speech-to-text, multilingual Whisper: e.g. en, de; None: detected
    speech_task: str = "transcribe"  # speech-to-text, Whisper: transcribe | translate (to English)


@dataclass
class PreferenceConfig:
    """Preference tuning (the preference task): which loss and its numbers (docs/preference.md)."""

    loss: str = "dpo"  # dpo | ipo | orpo | simpo | kto
    beta: float = 0.1  # DPO/IPO/KTO: how far from the reference; SimPO: the reward scale
    orpo_lambda: float = 0.1  # ORPO: weight of the odds-ratio term next to the SFT loss
    gamma: float = 0.5  # SimPO: the target reward margin
    label_smoothing: float = 0.0  # DPO/SimPO: the chance a pair's preference is flipped (cDPO)
    desirable_weight: float = 1.0  # KTO: weight of desirable rows
    undesirable_weight: float = 1.0  # KTO: weight of undesirable rows
    # weight of an SFT term, the chosen answers' NLL per token, added to the loss (TRL's rpo_alpha,
    # LLaMA-Factory's pref_ftx): keeps the chosen answers likely; not for orpo (its loss has one)
    sft_weight: float = 0.0
    # the reference's log-probabilities computed once before training and stored under
    # run.output_dir (one forward per step instead of two); off: computed live every step
    precompute_reference: bool = False


@dataclass
class GrpoConfig:
    """GRPO (the grpo task): sampling, rewards and the loss of reinforcement learning with
    verifiable rewards (docs/grpo.md). The batch sizes count completions (num_generations a prompt)."""

    num_generations: int = 8  # completions sampled per prompt (a group)
    max_completion_length: int = 64  # tokens a completion may run to (then it is cut: truncated)
    temperature: float = 1.0  # sampling temperature in training (evaluation decodes greedily)
    top_p: float = 1.0  # nucleus sampling in training
    # reward functions: exact_match | format | length (built-ins) or path/to/file.py:function or
    # package.module:function, TRL's signature f(prompts, completions, **columns) -> list[float | None]
    rewards: str | list[str] = field(default_factory=list)  # one name, or a list
    reward_weights: float | list[float] | None = None  # one per reward function; None: 1 each
    answer_column: str = "answer"  # exact_match: the row's column holding the right answer
    answer_pattern: str | None = None  # exact_match: a regex whose first group is the answer given
    format_pattern: str | None = None  # format: a regex the whole completion must match
    length_target: int = 200  # length: characters allowed before the penalty starts
    loss: str = "dapo"  # how the token losses are normalised, as TRL's (the grpo task's LOSSES)
    scale_rewards: str = "group"  # group | batch | none: what the advantages are divided by
    epsilon: float = 0.2  # the clip range's lower side (and upper side unless epsilon_high)
    epsilon_high: float | None = None  # the clip range's upper side (DAPO: 0.28); None: epsilon
    beta: float = 0.0  # the KL penalty to the reference (the model the stage started from)
    num_iterations: int = 1  # optimizer steps on one generation (old log-probs for the ratio)
    mask_truncated_completions: bool = False  # completions cut at the limit add no loss
    # agents (docs/grpo.md#agents-episodes-that-call-your-tools): each completion is an episode that
    # may call these functions (path/to/tools.py:function, from the config's folder, or
    # package.module:function; schemas from signatures and docstrings, or the data.tools file)
    tools: str | list[str] = field(default_factory=list)
    max_turns: int = 4  # the model's turns an episode may take (each up to max_completion_length)
    max_episode_length: int = 512  # tokens after the prompt: the model's turns, tool results, template text
    max_tool_calls: int = 8  # tool calls an episode may make; a later one gets an error as its result
    tool_timeout: float = 10.0  # seconds a call may take; then an error is its result


@dataclass
class ParallelConfig:
    """How each step's work is split across the processes beyond data parallelism (docs/long-context.md)."""

    # sequence parallelism: each process holds 1/N of every sequence's tokens (N divides the
    # processes; the processes / N groups train data-parallel); 1: off; all (0): every process
    sequence: int = 1
    # auto (ulysses where the attention and key/value heads divide by N, else ring) | ulysses
    # (all-to-all: sequence shards -> head shards) | ring (keys and values passed around the ring)
    sequence_mode: str = "auto"


@dataclass
class DistillConfig:
    """Distillation from a teacher (the distill task, docs/distillation.md): the student learns the
    teacher's next-token distributions on the student's own samples or on answers."""

    # what model.name_or_path takes: a hub id, a folder, builtin:NAME, a trained run or chain; loaded
    # frozen on the student's device, in eval mode; it must share the student's tokenizer
    teacher: str | None = None
    teacher_quantization: str | None = None  # 4bit | 8bit | None: the teacher's weights through bitsandbytes
    # on_policy: the student samples, the per-token reverse KL of the sampled tokens is the loss
    # (Thinking Machines' on-policy distillation); gkd: generalized JSD over the whole distributions
    # (TRL's GKDTrainer) on the student's samples (a share lmbda of the steps) or on answers
    mode: str = "on_policy"
    beta: float = 0.5  # gkd: 0 forward KL(teacher || student), 1 reverse KL(student || teacher), between: JSD
    lmbda: float = 0.5  # gkd: the share of steps trained on the student's own samples
    seq_kd: bool = False  # gkd: the other steps on the teacher's sampled answers instead of the data's
    temperature: float = 1.0  # sampling temperature of the student's (and seq_kd's teacher's) samples
    max_completion_length: int = 128  # tokens a completion (sampled, or the data's answer) may run to


@dataclass
class RewardConfig:
    """Reward models (the reward task): the Bradley-Terry loss over preference pairs, as TRL's
    RewardTrainer computes it (docs/reward-models.md)."""

    # the column of a pair's margin (a number, e.g. how much better the chosen answer was rated):
    # the loss asks r_chosen - r_rejected to exceed it (Llama 2's); read when the rows have it;
    # null: no margin
    margin_column: str | None = "margin"
    # TRL's center_rewards_coefficient: + coef x (r_chosen + r_rejected)^2 per pair, which keeps
    # the rewards centred on 0 (0.01 in the paper that proposed it); 0: off
    center_rewards_coefficient: float = 0.0


@dataclass
class EvalConfig:
    """Benchmarks through lm-evaluation-harness (the eval extra; docs/evaluation.md), scored on
    the run's saved result at its end by the run's own processes: causal-lm, preference and GRPO
    runs. The scores go into train_result.json, curves.png and the report."""

    benchmarks: list[str] = field(default_factory=list)  # lm-eval task names, or task YAML files/folders
    limit: float | None = None  # rows per task (below 1: that share of each); None: every row
    num_fewshot: int | None = None  # few-shot examples; None: each task's own
    batch_size: int = 8  # rows per forward pass (per process)
    at_start: bool = False  # also the model the run started from (its "before"), scored at the end


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    run: RunConfig = field(default_factory=RunConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def sections() -> dict[str, type]:
    """``{section name: its dataclass}``, in declaration order (a copy: the caller's to change)."""
    return dict(_sections())


def section_fields(section_cls: type) -> dict[str, Any]:
    """``{key: its type}`` of one section's dataclass (a copy)."""
    return dict(_section_fields(section_cls))


# The schema is fixed once imported, and resolving the annotations (``get_type_hints`` compiles each
# string annotation) cost ~2 ms a call: a config load asks ~30 times, read once here instead.
@functools.cache
def _sections() -> dict[str, type]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


@functools.cache
def _section_fields(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def config_keys() -> list[str]:
    """Every valid ``section.key``, in declaration order."""
    return [f"{s}.{k}" for s, cls in sections().items() for k in section_fields(cls)]


# The ``section.key`` names a config was given (its YAML file and overrides), kept on the loaded
# object by ``loading.load_config``: a default the user never wrote can then be fitted to the model
# (``model_checks.fit_defaults``) instead of being refused as if the user had chosen it. Not a
# dataclass field, so it is not a section, not saved with checkpoints and not compared.
_GIVEN = "_xtrain_given_keys"


def mark_given(cfg: TrainConfig, keys: typing.Iterable[str]) -> None:
    setattr(cfg, _GIVEN, frozenset(keys))


def given_keys(cfg: TrainConfig) -> frozenset[str] | None:
    """The keys ``cfg`` was given; None for a config built in code (every value counts as chosen)."""
    return getattr(cfg, _GIVEN, None)
