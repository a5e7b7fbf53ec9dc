# longer: the one contract between the tasks and everything that reads them (the table of
# docs/architecture.md#add-a-task), each part's meaning written beside it: one file to read.
"""The task contract: one ``Task`` object holds everything xtrain knows about a task.

A task is one module under ``xtrain/tasks/`` that exports ``TASK`` and one line in the
registry (``xtrain.tasks.REGISTRY``). The config reader, the validation, the model loader,
LoRA, the plan's memory estimate, resume, ``xtrain predict`` and ``xtrain quickstart`` read the
task's parts from here; none of them keeps a table of tasks or a branch on a task's name.

Task modules stay light at import (no torch, transformers, datasets): the config is read and
checked before any of those is imported (``xtrain train`` with a broken torch still prints the
doctor's findings). Heavy imports go inside the hooks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import SimpleNamespace

    import torch
    from accelerate import Accelerator
    from torch.nn import Module
    from torch.utils.data import DataLoader
    from transformers import PretrainedConfig, PreTrainedTokenizerBase, ProcessorMixin
    from transformers.utils import ModelOutput

    from xtrain.config.schema import TrainConfig
    from xtrain.model.activations import Stack
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.planning.run import Run
    from xtrain.tasks.data_report import DataReport

MainProcessFirst = Callable[[], contextlib.AbstractContextManager]
# ``"*"`` in ``Task.keys``: the task reads any key (custom tasks: the user's builder decides)
EVERY_KEY = "*"


@dataclass(frozen=True)
class Quickstart:
    """The task's built-in job for ``xtrain quickstart --task NAME``."""

    job: str  # a YAML file under xtrain/builtin/jobs/
    about: str  # what it trains, for --task's help: "OCR"
    next_command: str  # the command to try next, on the user's own data
    # (metric key, its name, what it means) printed under the before/after table
    headline: tuple[str, str, str] | None = None
    # the closing sample pairs' labels (what the reference is | what the prediction is), and a metric
    # (key, what it counts) printed with them, before -> after
    samples: tuple[str, str] = ("reference", "the model's answer after training")
    samples_metric: tuple[str, str] | None = None
    # ``xtrain predict RUN ...`` arguments on the first eval input of its built-in data
    predict_args: Callable[[], list[str]] | None = None
    # Before/after answers: the eval data file (in the job's format) whose rows the base model
    # and the trained result both answer, scored over every row, the first few shown side by side
    compare: Callable[[], Path] | None = None
    default: bool = False  # the job ``xtrain quickstart`` runs without --task (one task has it)


@dataclass(frozen=True)
class Curve:
    """One panel of a run's curves (``curves.png`` in the run folder, ``xtrain report``): a
    quantity the task's users watch. ``train``: keys of the loop's logging windows (``loss``,
    ``lr``, the task's forward ``.metrics``); ``eval``: keys of its evaluations. A ``*`` matches
    any part of a key, and names the line (``rewards/*/mean``: a line per reward function)."""

    title: str
    train: tuple[str, ...] = ()
    eval: tuple[str, ...] = ()


@dataclass(frozen=True)
class OtherModel:
    """A model a run loads frozen beside the trained one (a distillation teacher), named by a config
    ``key`` as ``model.name_or_path`` names a model; ``quantization`` (and the key that sets it)."""

    key: str
    name: str
    quantization: str | None = None
    quantization_key: str | None = None


@dataclass
class PredictRequest:
    """What ``xtrain predict`` was given, beyond the result folder."""

    inputs: list[str]  # files or folders (images, audio)
    prompts: list[str]  # --prompt / --question
    system: str | None = None
    max_new_tokens: int = 128
    num_beams: int = 1
    # sampling (tasks whose ``Predicts.samples``): None or 0 temperature and no top_p is greedy
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None  # sampling starts from this seed (reproducible); None: fresh randomness
    batch_size: int = 8  # inputs per ``generate`` / forward call
    tools: list[dict[str, Any]] | None = None  # causal-lm chat: --tools, the schemas a prompt may call
    # --tools naming Python functions (xtrain.tasks.grpo.tools.Tool): each prompt an episode that runs them
    functions: list[Any] | None = None
    answers: list[str] = field(default_factory=list)  # --answer: a reward model scores each after each prompt

    @property
    def sampling(self) -> bool:
        return bool(self.temperature) or self.top_p is not None

    def decoding(self) -> dict[str, Any]:
        """``generate``'s decoding keywords: greedy (or beam search), else sampling at
        ``temperature`` (1.0 when only ``top_p`` is given) within ``top_p``."""
        if not self.sampling:
            return {"do_sample": False, "num_beams": self.num_beams}
        kwargs = {"do_sample": True, "num_beams": self.num_beams, "temperature": self.temperature or 1.0}
        return {**kwargs, "top_p": self.top_p} if self.top_p is not None else kwargs


@dataclass
class Example:
    """One row of a ``xtrain predict --data`` file, read by the run's own row readers."""

    row: int  # its index in the file (0-based, as the readers' one-line errors count rows)
    shown: dict[str, Any]  # the input as its results line shows it: {"input": ..., ("prompt": ...)}
    feed: Any  # what the task's ``FileRows.answer`` takes: a prompt, a conversation, a media cell
    reference: str | None = None  # the row's answer, transcript or label, where it has one
    data: Any = None  # the row as the task read it, for its answer hook's scores (GRPO: its rewards)


@dataclass
class Loaded:
    """A finished result loaded for prediction: the model (adapter applied, on its device, in
    eval mode) and what turns inputs into its batches."""

    model: Module
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin
    source: str  # the folder the result came from
    parts: dict[str, Any] = field(default_factory=dict)  # processors, chat flag, labels, ...


# The record's key under which ``xtrain predict`` passes a task's ``Predicts.load`` the
# ``from_pretrained`` keywords of the base ({}; a quantized run's BitsAndBytesConfig and device_map)
BASE_LOAD = "base_load"


@dataclass(frozen=True)
class FileRows:
    """How ``xtrain predict RUN --data FILE`` runs every row of a data file in the run's format."""

    rows: str  # what its rows hold, for one-line refusals and docs: "image paths (+ their text)"
    # (the run's config with ``data.train`` = the file, the run's record) -> the file's rows,
    # read by the run's own row readers and checked before any model loads (a bad row: RowError)
    read: Callable[[TrainConfig, dict[str, Any]], list[Example]]
    # (the loaded result, a batch of examples, the request) -> one dict per example:
    # {"output": ..., ("probability": ...)}
    answer: Callable[[Loaded, list[Example], PredictRequest], list[dict[str, str]]]
    # (references, outputs) -> metrics; per row with one pair, over the file with every pair
    score: Callable[[list[str], list[str]], dict[str, float]]
    # keys of ``answer``'s per-row numbers that are scores of their own (GRPO's ``reward`` and
    # ``rewards/NAME``: a key equal to one or starting with it), averaged over the file's rows
    averaged: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolUse:
    """How a chat result's answers call tools: the hooks a task hands the decoder-only predict
    (``prompt_predict``'s functions take them as ``tools``, bound in the task's ``Predicts``), so
    that shared module names no task's own: an answer's calls parsed (None: it makes none) and
    shown, a data row's calls as its reference text, the call exact match over ``--data``
    (None: no row's reference is a call), and ``--tools`` naming Python functions: each prompt
    an episode (the texts rendered with the tools, the render, its end-of-turn token)."""

    parse: Callable[[str], list[Any] | None]
    shown: Callable[[list[Any]], str]
    reference: Callable[[list[dict[str, Any]]], str]
    exact_match: Callable[[list[str], list[str]], float | None]
    episodes: Callable[..., list[dict[str, str]]]


@dataclass(frozen=True)
class Predicts:
    """How a task's finished result is run by ``xtrain predict``."""

    takes: str  # what it reads, for one-line refusals: "images", "audio files", "--prompt TEXT"
    # (result folder, its base model, the run's record) -> (the bare base model, tokenizer, parts
    # for ``run``; the record's items are added to them)
    load: Callable[[Path, str, dict[str, Any]], tuple[Module, PreTrainedTokenizerBase | None, dict[str, Any]]]
    # (the loaded result, the request) -> rows: {"input": ..., ("prompt": ...,) "output": ...}
    run: Callable[[Loaded, PredictRequest], list[dict[str, str]]]
    file: FileRows | None = None  # None: ``--data`` is refused for its results
    samples: bool = False  # it generates text that ``--temperature`` / ``--top-p`` can sample
    tools: bool = False  # a chat run's prompts take ``--tools`` (the schemas a prompt may call)
    answers: bool = False  # its prompts take ``--answer`` texts to score (a reward model)
    # how its chat answers call tools (``ToolUse``: the hooks its ``prompt_predict`` functions are
    # bound to; ``xtrain export`` answers with them too); None: its answers call none
    tool_use: ToolUse | None = None
    # ``xtrain chat``: (the loaded result, the conversation so far ending in a user turn, the
    # request) -> the next assistant turn. None: ``xtrain chat`` refuses its results
    chat: Callable[[Loaded, list[dict[str, str]], PredictRequest], str] | None = None


def _no_check(cfg: TrainConfig) -> None:
    return None


def recognizes_none(config: dict[str, Any]) -> bool:
    """``Task.recognizes`` of a task whose result, saved without xtrain's record, is another
    task's to read: preference tuning and GRPO train a causal LM (causal-lm reads it), vision
    preference a vision-language model."""
    return False


@dataclass(frozen=True)
class SequenceEntry:
    """Where a task's sequences are cut for ``parallel.sequence`` when its model must see whole
    rows first (a vision-language model: images merged into the embeddings, positions computed on
    the row): at the entry of its text decoder (xtrain/model/sequence_entry.py), not before the
    model."""

    # (the model, not wrapped by peft) -> the qualified name of its text decoder
    decoder: Callable[[Module], str]
    # the model types (``config.model_type``) whose decoder is cut so, checked at the dry run
    families: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """Everything xtrain knows about one task."""

    name: str
    about: str  # one line: what it trains, its data and its metric
    # (this process's Run: config, plan, settings, device, precision; the main-process-first
    # context) -> the Workload; the model placed on ``run.device`` in ``run.precision``
    build: Callable[[Run, MainProcessFirst], Workload]
    aliases: tuple[str, ...] = ()
    # The task-specific ``section.key`` names it reads (see ``config.validate.COMMON_KEYS`` for
    # the rest); a key another task owns, set away from its default, is refused for this one.
    keys: frozenset[str] = frozenset()
    validate: Callable[[TrainConfig], None] = _no_check  # its own checks across keys
    model_class: str | None = None  # the transformers class its model loads with; None: its own
    # Model classes of trained results a stage of this task may start from besides its own: their
    # adapters go under its model (a reward model's head on an SFT result's causal LM)
    starts_from: tuple[str, ...] = ()
    peft_task_type: str | None = None  # peft's TaskType name for its adapters (None: no head rule)
    # Plan-time sizes: (the model built on the meta device, cfg) -> (qualified names of the Linear
    # layers that get adapters, module names trained whole); the same chooser the build uses.
    lora_plan: Callable[[Module, TrainConfig], tuple[list[str], list[str]]] | None = None
    # A full fine-tune's freezing (cfg.lora.enabled false), shared by the build and the plan
    full_fine_tune: Callable[[Module, TrainConfig], None] | None = None
    # Module names (at any depth) that ``model.quantization`` leaves in their dtype, e.g. a vision
    # tower (the output and classifier heads always stay: ``quantization.HEADS``)
    unquantized: tuple[str, ...] = ()
    image_tokens: bool = False  # its sequences hold image tokens (the memory estimate)
    # The stacks of layers a training step runs, in order (the memory estimate's activations):
    # (the model, on the meta device or loaded, not wrapped by peft; cfg) -> stacks with a
    # sample's positions each (an encoder's audio frames or image patches, a decoder's tokens).
    # None: the model's layers at data.max_length positions (``tasks.stacks.text_stacks``)
    stacks: Callable[[PretrainedConfig, TrainConfig], list[Stack]] | None = None
    # Where its token sequences (``data.max_length``) meet a position limit: (the model's config)
    # -> (that part's name for messages, e.g. "decoder"; its positions, None: unknown). None: the
    # text model's ``max_position_embeddings`` (``xtrain.tasks.model_checks``)
    positions: Callable[[PretrainedConfig | SimpleNamespace], tuple[str, int | None]] | None = None
    # Tokens ahead of the first generated one at its evaluation by generation (start tokens, the
    # prompt), on top of which ``generation.max_new_tokens`` must fit the positions; None: it
    # does not generate
    generation_prompt: Callable[[TrainConfig], int] | None = None
    # Tokens a training sequence holds in a KV cache while the task generates during training
    # (GRPO's rollout: its prompt and completion): the memory estimate counts that cache; None:
    # it does not generate in training
    kv_cache_tokens: Callable[[TrainConfig], int] | None = None
    # its rows decode images or audio when read: the plan's media DataLoader workers serve it
    decodes_media: bool = False
    # Its training loss is the model's cross-entropy over the vocabulary at its output head
    # (``model.get_output_embeddings()``): ``next-token`` (a causal LM, labels shifted by one) or
    # ``decoder`` (an encoder-decoder, labels at the decoder's positions, its inputs made from them).
    # The chunked loss can run it (``model.chunked_loss``, xtrain/model/chunked_loss.py). ``sequence``:
    # the task's own forward reads per-sequence log-probs of the next tokens off the head (preference
    # tuning) and runs them chunk-wise itself when told (``Workload.use_chunked_loss``); ``logps``:
    # the same with per-token log-probs (GRPO's completions); ``divergence``: the same with each
    # token's whole distribution against another model's (distillation). None: not such a loss
    # (classifiers, custom tasks).
    # It also says what the step's loss is (xtrain/train/step_loss.py, the one place): for
    # ``next-token`` and ``decoder`` the model's ``.loss`` is the mean over a micro-batch's trained
    # tokens (its labels not -100, after the shift), and the step's loss the sum of every token's
    # loss over the trained tokens of the whole step; otherwise ``.loss`` is a mean over the
    # micro-batch's sequences (or already the step's: GRPO), averaged over the step's micro-batches
    # (a forward's ``token_sum`` adds a token term: ``Workload.trained_tokens``)
    token_loss: str | None = None
    # Its training batches can be split across the processes of a group (``parallel.sequence``,
    # docs/long-context.md): decoder-only text rows ([rows, positions] ids and labels) whose loss
    # sums the shards' token terms (the model's own next-token loss) or adds up each sequence's
    # shards first (``model.sequence_parallel.shard_total``: the preference task's log-probs).
    sequence_parallel: bool = False
    # Its sequences are cut inside the model, at its text decoder's entry (None: the collated batch)
    sequence_entry: SequenceEntry | None = None
    resume_keys: tuple[str, ...] = ()  # its keys a resumed run must keep (they shape the weights)
    # the head of a result saved without xtrain's record: architectures' suffix / peft task type
    recognizes: Callable[[dict[str, Any]], bool] | None = None
    predicts: Predicts | None = None  # None: ``xtrain predict`` refuses its results
    quickstart: Quickstart | None = None
    # More built-in jobs of this task, each (its ``xtrain quickstart --task`` name, the job)
    more_quickstarts: tuple[tuple[str, Quickstart], ...] = ()
    # The data check (``xtrain train --dry-run``): (cfg, rows) -> what the first ``rows`` rows of
    # each data source hold, read by the task's own readers with its tokenizer or processor (never
    # the model weights); a row the run would refuse raises its line. Its ``build`` runs the same
    # check on the data it loaded (``Workload.data_report``). None: not checked (custom).
    check_data: Callable[[TrainConfig, int], DataReport] | None = None
    # What its users watch, a panel each, drawn after the loss and the learning rate (every other
    # eval metric gets a panel of its own after them): ``train.curves``
    curves: tuple[Curve, ...] = ()
    # (cfg) -> the models it loads frozen beside the trained one (a teacher): built where the run
    # starts if trained built-ins, found by the preflight, counted by the memory estimate
    other_models: Callable[[TrainConfig], tuple[OtherModel, ...]] | None = None


Batch = Mapping[str, "torch.Tensor"]


# eval_batch(model_outputs, batch) -> per-example tensors, each of shape [batch_size].
# It must include "loss_sum" and "count" (eval loss = sum(loss_sum) / sum(count)); any other
# keys are task statistics that ``reduce_metrics`` turns into numbers. The loop gathers these
# with ``accelerator.gather_for_metrics`` (which drops the duplicated samples of the last batch).
EvalBatchFn = Callable[["ModelOutput", Batch], dict[str, "torch.Tensor"]]


# reduce_metrics(gathered per-example tensors over the whole eval set) -> {"accuracy": 0.93, ...}
ReduceFn = Callable[[dict[str, "torch.Tensor"]], dict[str, float]]


@dataclass
class Prediction:
    """One sample of a generative eval: what the model should write and what it wrote, or, where
    there is nothing it should write (GRPO), what it was given; ``labels`` name the two."""

    reference: str
    prediction: str
    labels: tuple[str, str] = ("reference", "prediction")
    # what else a person reads of it, for the run's samples file (``eval_samples.json``): GRPO's
    # reward per function and an episode's tool calls with their results
    details: dict[str, Any] = field(default_factory=dict)


# evaluate(accelerator, model, eval_loader) -> (metrics, sample predictions): "eval_loss" among the
# metrics where the task has a loss to evaluate (GRPO's reward is its metric, there is no eval loss).
# Replaces the loop's forward-only evaluation (eval_batch/reduce_metrics) when a task evaluates by
# generating (image-to-text: CER/WER); it runs on every rank and must gather in data order.
EvaluateFn = Callable[["Accelerator", "Module", "DataLoader"], tuple[dict[str, float], list[Prediction]]]


# forward(model, batch) -> what has ``.loss`` (the micro-batch's loss: a mean over its sequences,
# see ``Task.token_loss``) and may carry ``.token_sum``: the sum of its token losses over the
# micro-batch's ``Workload.trained_tokens``, which the loop divides by the trained tokens of the
# whole step (preference's SFT term; xtrain/train/step_loss.py), and ``.metrics``: {name: scalar
# tensor}, the micro-batch's statistics, summed by the loop's logging window over its micro-batches
# and processes without a host sync (one gather a window) and turned into what every log line, the
# trackers and the run's log history show by ``Workload.window_metrics``. A task whose loss is not
# the model's own (preference tuning: log-probabilities of two answers, a reference model) computes
# it here; the loop and the evaluation call it in place of ``model(**batch)``. ``model`` is as the
# loop holds it (wrapped by DDP/FSDP), so its forward is the one the gradients are synchronised for.
ForwardFn = Callable[["Module", Batch], Any]  # returns what has .loss (and maybe .token_sum, .metrics)


# window_metrics(the statistics of the forwards' ``.metrics`` summed over a logging window's
# micro-batches and processes (CPU tensors), how many micro-batches that is) -> the window's
# metrics, as its log line shows them: a task whose statistics are sums and counts divides them
# (preference tuning: the same reduce as its evaluation's). None: each statistic's mean over the
# micro-batches (a task that hands the micro-batch's means, or its step's: GRPO, as TRL logs).
WindowMetricsFn = Callable[[dict[str, "torch.Tensor"], int], dict[str, float]]


# trained_tokens(a collated micro-batch, on the host) -> how many trained tokens its forward's
# ``token_sum`` is over (preference's SFT term: the chosen answers' labelled tokens), counted from
# the host tensors (no device sync); the loop sums them over the step's micro-batches and processes.
TrainedTokensFn = Callable[[Batch], int]


# step_start(model, this process's micro-batches of the step (on the device), gather) -> None:
# called by the loop before the step's first forward, for what a task estimates over the step's
# whole global batch (KTO's KL term): ``gather`` is the Accelerator's (every process's tensors,
# concatenated along dim 0), a collective every process joins once a step.
StepStartFn = Callable[
    ["Module", list[dict[str, "torch.Tensor"]], Callable[["torch.Tensor"], "torch.Tensor"]], None
]


# at_step(step) -> None: the number of the optimizer step about to run (0-based, counted over the
# run and the same after a resume), told before its micro-batches are drawn; for what a task seeds
# or schedules by step (GRPO's sampling seeds).
AtStepFn = Callable[[int], None]


# shared_pass(accelerator) -> None: work every process shares once the workload is built (the
# build runs on the main process first, so no collective can run inside it), before ``prepare``:
# a preference run's precomputed reference, each process its share, gathered. ``accelerator``
# is the run's; None: one process outside the loop (tests).
SharedPassFn = Callable[["Accelerator | None"], None]


# notes(eval history so far) -> warning lines for the run's own channel (the banner's notes), e.g.
# "reward accuracy stays at chance"; called after each evaluation (a run without eval data: at
# each run.eval_every and at its end, with the history empty).
NotesFn = Callable[[list[dict[str, float]]], list[str]]


@dataclass
class Workload:
    """Everything the loop needs from a task."""

    model: torch.nn.Module  # already wrapped by peft when LoRA is on; its forward returns .loss
    train_dataset: Any  # map-style: len() and [i] -> dict of lists/ints (a datasets.Dataset works)
    collator: Callable[[list[dict[str, Any]]], Batch]  # picklable, top-level (spawned workers)
    eval_dataset: Any | None = None
    eval_batch: EvalBatchFn | None = None
    reduce_metrics: ReduceFn | None = None
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin | None = (
        None  # saved next to the adapter when present
    )
    chat: bool = False  # trained on chat conversations (causal-lm ``messages``): predict renders them
    # more of what the task's predict needs, saved in the run's record (e.g. a classifier's labels)
    record: dict[str, Any] = field(default_factory=dict)
    main_metric: str | None = None  # e.g. "accuracy": shown in banners and closing tables
    # batch key whose sum counts tokens (tokens/s); a padding-free packed batch (no such key,
    # position_ids restarting per example) counts every input id (collate.batch_tokens)
    tokens_key: str | None = "attention_mask"
    evaluate: EvaluateFn | None = None  # evaluation by generation (xtrain.tasks.generation)
    # One length per training sample, for data.group_by_length (speech-to-text: audio seconds from
    # the file headers). None: the token count of an ``input_ids`` column (xtrain.data.sampler).
    train_lengths: Callable[[], Sequence[float]] | None = None
    # the task's data check on the first rows it loaded (``tasks.data_check.DataReport``): its
    # summary is a line of the run's banner
    data_report: DataReport | None = None
    forward: ForwardFn | None = None  # None: ``model(**batch)``, whose ``.loss`` is the loss
    window_metrics: WindowMetricsFn | None = None  # a logging window's sums -> its metrics (None: means)
    # what a forward's ``token_sum`` is over (None: it has none; the tokens of a ``next-token`` or
    # ``decoder`` ``Task.token_loss`` are counted from the labels by the loop)
    trained_tokens: TrainedTokensFn | None = None
    notes: NotesFn | None = None  # warnings the task reads off its eval metrics
    step_start: StepStartFn | None = None  # the whole step's micro-batches first (KTO's KL)
    shared_pass: SharedPassFn | None = None  # on every process after the build
    at_step: AtStepFn | None = None  # the step's number, before its micro-batches (GRPO's seeds)
    # Samples one data set item trains (GRPO: a prompt's num_generations completions): the batch
    # sizes count samples, the data order draws global_batch / samples_per_item items a step
    samples_per_item: int = 1
    # token_loss ``sequence``/``logps``: (the head's logit map, positions a chunk) when the chunked
    # loss runs
    use_chunked_loss: Callable[[LogitMap, int], None] | None = None
    # parallel.sequence: its step makes the sequences it trains (GRPO's rollout, distillation's
    # completions) and cuts them itself, so the loader's rows (prompts) stay whole
    cuts_sequences: bool = False
