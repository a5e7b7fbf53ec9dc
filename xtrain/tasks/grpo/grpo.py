"""``grpo``: reinforcement learning with verifiable rewards (GRPO, Dr. GRPO, DAPO) on a causal LM,
``grpo.*`` (docs/grpo.md).

Data: prompt-only rows (``rows``: text, turns or alpaca) with any other columns handed to the
reward functions (``rewards``). Each step, every prompt gets ``grpo.num_generations`` sampled
completions (``rollout``: the model's ``generate``, seeded per completion), scored, and the
group-relative advantages weight the clipped surrogate (``loss``); ``step`` runs it on the loop's
hooks (``at_step``, ``step_start``, ``forward``). The batch sizes count completions: a data set
item is one prompt of ``num_generations`` samples (``Workload.samples_per_item``), so
``batch.per_device`` and ``batch.global_batch`` are multiples of it. The evaluation answers the
eval prompts greedily and reports their mean reward (``evaluation``). The result is a causal LM
adapter: ``xtrain predict`` continues prompts as causal-lm does, ``xtrain export`` merges it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from xtrain.builtin import preference as builtin_preference
from xtrain.errors import XtrainError
from xtrain.tasks.contract import (
    Curve,
    FileRows,
    MainProcessFirst,
    Predicts,
    Quickstart,
    Task,
    recognizes_none,
)
from xtrain.tasks.grpo import predict_file
from xtrain.tasks.predicting import exact_match
from xtrain.tasks.text.causal_lm import TOOL_USE, load_for_predict

if TYPE_CHECKING:
    from datasets import Dataset
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.model.activations import Stack
    from xtrain.model.decoding import DecodeSettings
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.data_check import Sample, Tokenizer
    from xtrain.tasks.data_report import DataReport
    from xtrain.tasks.grpo.rows import PromptEncoder

NAME = "grpo"
METRIC = "reward"
# what a GRPO run's users watch (train: the step's rollouts, step.py; eval: evaluation.py); a tools
# run adds its episodes' calls, a beta > 0 run its KL (a panel without points is left out)
CURVES = (
    Curve("reward (weighted sum)", train=("reward",), eval=("reward",)),
    Curve("reward per function", train=("rewards/*/mean",), eval=("rewards/*",)),
    Curve("completion length (tokens)", train=("completions/mean_length",), eval=("completion_length",)),
    Curve("KL to the reference", train=("kl",)),
    Curve("groups without reward spread (no signal)", train=("frac_reward_zero_std",)),
    Curve("tool calls per episode", train=("tools/call_frequency",)),
    Curve("tool calls failed (share)", train=("tools/failure_frequency",)),
)
LOSSES = ("grpo", "dr_grpo", "dapo")  # grpo.loss: TRL's normalisations (xtrain.tasks.grpo.loss)


def encoder_of(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> PromptEncoder:
    """Prompts rendered by the chat template (``data.chat_template`` or the tokenizer's) where
    there is one (conversational and alpaca rows), else as text; with ``grpo.tools``' schemas."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.tasks.grpo import tools as tools_
    from xtrain.tasks.grpo.rows import PromptEncoder

    template = chat_data.load_template(cfg.data.chat_template) or getattr(tokenizer, "chat_template", None)
    schemas = [t.schema for t in tools_.from_config(cfg)] or None
    return PromptEncoder(tokenizer, cfg.data.max_length, template, schemas)


def encoded_sets(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    train: Dataset,
    eval_ds: Dataset | None,
    train_name: str,
    eval_name: str,
) -> tuple[Dataset, Dataset | None]:
    """The train and eval prompts encoded once (``rows.encoding``), for the run and the dry run's
    ``encoding_note``."""
    from xtrain.data.encoded import encode
    from xtrain.data.tokenize import tokenizer_fingerprint
    from xtrain.tasks.grpo import rows as rows_

    encoder, key, processes = (
        encoder_of(cfg, tokenizer),
        tokenizer_fingerprint(tokenizer),
        cfg.data.encode_processes,
    )
    train_ids = encode(train, rows_.encoding(train_name, encoder, key, processes), "encoding train")
    if eval_ds is None:
        return train_ids, None
    return train_ids, encode(eval_ds, rows_.encoding(eval_name, encoder, key, processes), "encoding eval")


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.tasks import data_check
    from xtrain.tasks.common import finish_model, load_seeded, prepare_tokenizer, raw_datasets
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.grpo import rewards as rw
    from xtrain.tasks.grpo import rows as rows_
    from xtrain.tasks.grpo import tools as tools_
    from xtrain.tasks.grpo.episodes import agent_of
    from xtrain.tasks.grpo.evaluation import GrpoEval
    from xtrain.tasks.grpo.step import GrpoStep, eos_ids
    from xtrain.tasks.preference.reference import no_dropout

    cfg = run.cfg
    # (checked when the config was; imported once per process)
    rewards = rw.resolve(cfg.grpo, [t.schema for t in tools_.from_config(cfg)])
    rw.place(rewards, run.device)  # a reward model (model:PATH) scores on this process's device
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    encoder = encoder_of(cfg, tokenizer)
    with main_process_first():  # the first process encodes (datasets' cache), the others read it
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        first = data_check.loaded_samples(cfg, [(train, train_name, "train"), (eval_ds, eval_name, "eval")])
        report = inspect(cfg, (source, tokenizer), first, [])
        train_ids, eval_ids = encoded_sets(cfg, tokenizer, train, eval_ds, train_name, eval_name)
    train_rows = rows_.read_rows(train, train_name)  # read on access, for the rewards
    eval_rows = rows_.read_rows(eval_ds, eval_name) if eval_ds is not None else None

    model = load_seeded(run, TASK, source)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model = finish_model(model, cfg, TASK)
    no_dropout(model)  # TRL's default: the old policy and the reference are the same function
    agent = agent_of(cfg, encoder, train_rows, eos_ids(tokenizer, model))  # grpo.tools' episodes
    step = GrpoStep(cfg.grpo, rewards, train_rows, encoder, cfg.run.seed, decoding_of(run), agent)
    pad = step.pad_id
    return Workload(
        model=model,
        train_dataset=train_ids,
        collator=rows_.PromptCollator(pad),
        eval_dataset=eval_ids,
        tokenizer=tokenizer,
        chat=encoder.template is not None and train_rows[0].conversational,
        main_metric=METRIC,
        forward=step,
        notes=step.notes,
        evaluate=GrpoEval(step, eval_rows) if eval_rows else None,
        data_report=report,
        step_start=step.step_start,
        at_step=step.at_step,
        samples_per_item=cfg.grpo.num_generations,
        use_chunked_loss=step.use_chunked_loss,
        cuts_sequences=True,  # parallel.sequence: its step completes the prompts, then cuts (grpo/sharded.py)
        record=predict_file.record_of(cfg),  # what predict --data and export read: answers, tools
    )


def decoding_of(run: Run) -> DecodeSettings:
    """How this process's decode steps run (``decoding.decode_settings``): a static cache as long as
    the longest prompt and completion (or episode) on CUDA, compiled where torch.compile can run."""
    from xtrain.model.decoding import decode_settings

    cfg = run.cfg
    sharded = run.context.sharding is not None and run.world_size > 1
    return decode_settings(
        run.device_type, sharded, cfg.model.quantization is not None, run.plan.compile_blocker,
        cfg.data.max_length + sequence_tokens(cfg),
    )  # fmt: skip


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    """The data check (``xtrain train --dry-run``): the first rows read and their prompts encoded
    (a bad row raises its line), the first prompt as the model reads it, the generation settings
    and the reward functions found (their import already checked with the config)."""
    from xtrain.tasks import data_check
    from xtrain.tasks.encoding_check import encoding_note

    found, samples, notes = data_check.text_check(cfg, limit)
    report = inspect(cfg, found, samples, notes)
    if found is not None:
        note = encoding_note(cfg, samples, lambda *sets: encoded_sets(cfg, found[1], *sets))
        report.encoding = note
    return report


def settings_line(cfg: TrainConfig) -> str:
    g = cfg.grpo
    from xtrain.tasks.grpo import tools as tools_
    from xtrain.tasks.grpo.rewards import named_weights

    named = ", ".join(f"{n} x{w:g}" for n, w in named_weights(g))
    episodes = tools_.settings(cfg)
    return (
        f"generation: {g.num_generations} completions a prompt, up to {g.max_completion_length} tokens, "
        f"temperature {g.temperature:g}, top_p {g.top_p:g}; loss {g.loss}, scale_rewards {g.scale_rewards}, "
        f"beta {g.beta:g}; rewards: {named}{episodes}"
    )


def sequence_tokens(cfg: TrainConfig) -> int:
    """A completion's tokens after its prompt: the episode's with tools, else one completion's."""
    from xtrain.tasks.grpo import tools as tools_

    g = cfg.grpo
    return g.max_episode_length if tools_.specs(g.tools) else g.max_completion_length


def kv_cache_tokens(cfg: TrainConfig) -> int:
    """``Task.kv_cache_tokens``: a completion's prompt and the completion (with tools: the
    episode), at their longest."""
    return cfg.data.max_length + sequence_tokens(cfg)


def kv_cache_line(cfg: TrainConfig, source: str) -> str:
    """The dry run's line on generation's KV cache of one micro-batch, from the model's config."""
    from xtrain.model import load as models
    from xtrain.model import memory
    from xtrain.model.estimate import kv_cache_bytes, kv_values
    from xtrain.tasks.grpo import tools as tools_

    b, tokens = cfg.batch, kv_cache_tokens(cfg)
    try:
        config = models.load_config(source, cfg.model.trust_remote_code)
    except Exception:  # noqa: BLE001 - the config is not on this machine: no figure, the rule only
        config = None
    size = kv_cache_bytes(b.per_device, tokens, kv_values(config), 2) if config is not None else 0
    figure = f"{memory.size(size / 2**30, 2)} in 16-bit" if size else "its size needs the model's config"
    return (
        f"generation's KV cache: {b.per_device} completions x up to {tokens} tokens (data.max_length + "
        f"grpo.{'max_episode_length' if tools_.specs(cfg.grpo.tools) else 'max_completion_length'}) a "
        f"micro-batch: {figure} (x2 in float32); the memory estimate counts it"
    )


def inspect(cfg: TrainConfig, found: Tokenizer, samples: list[Sample], notes: list[str]) -> DataReport:
    """``check_data``'s report of ``samples`` with ``found`` = (source, tokenizer), or None."""
    from xtrain.tasks import data_check
    from xtrain.tasks.data_report import DataReport
    from xtrain.tasks.grpo import rows as rows_
    from xtrain.tasks.grpo.episodes import check_prompts

    report = DataReport(NAME, cfg.data.max_length, notes=[*notes, settings_line(cfg)])
    for s in samples:
        rows = rows_.read_rows(s.ds, s.name)
        shape = "conversational prompts" if rows[0].conversational else "text prompts"
        check = s.check(row_format=shape)
        report.sources.append(check)
        if found is None:
            continue
        if report.example is None and s.role == "train":
            report.notes.append(kv_cache_line(cfg, found[0]))
        encoder = encoder_of(cfg, found[1])
        if encoder.tools:  # episodes: prompts a template renders with the tools
            check_prompts(encoder, rows)
        ids = rows_.encoded(rows, encoder, s.name)
        check.lengths.extend(len(x["input_ids"]) for x in ids)
        if report.example is None and s.role == "train":
            report.example = data_check.example_of(s, 0, found[1], ids[0]["input_ids"], None)
            follow = (
                f"episodes of up to {cfg.grpo.max_episode_length} tokens"
                if encoder.tools
                else f"completions of up to {cfg.grpo.max_completion_length} tokens"
            )
            report.example.note = (
                f"the prompt; {cfg.grpo.num_generations} {follow} follow it; other columns to the "
                f"rewards: {', '.join(sorted(rows[0].columns)) or 'none'}"
            )
    return report


def validate(cfg: TrainConfig) -> None:
    from xtrain.config.values import choose
    from xtrain.tasks.grpo import rewards as rw
    from xtrain.tasks.grpo import tools as tools_

    g, b = cfg.grpo, cfg.batch
    g.loss = choose("grpo.loss", g.loss, LOSSES, {})  # here: its choices are this task's
    for key, value in (("batch.per_device", b.per_device), ("batch.global_batch", b.global_batch)):
        if value is not None and value % g.num_generations:
            raise XtrainError(
                f"{key}={value} is not a multiple of grpo.num_generations={g.num_generations}: "
                "GRPO's batch sizes count completions, a prompt's group whole",
                f"use {key}={max(1, value // g.num_generations) * g.num_generations}",
            )
    if not 0 < g.top_p <= 1:
        raise XtrainError(
            f"grpo.top_p must be a number in (0, 1], got {g.top_p}", "1 samples from every token"
        )
    if g.epsilon >= 1:
        raise XtrainError(f"grpo.epsilon={g.epsilon}: the ratio's clip range 1 - epsilon must stay above 0")
    if g.num_iterations > 1 and cfg.run.save_every and cfg.run.save_every % g.num_iterations:
        raise XtrainError(
            f"run.save_every={cfg.run.save_every} is not a multiple of "
            f"grpo.num_iterations={g.num_iterations}",
            "checkpoints at generation boundaries keep a resume exact: use a multiple",
        )
    if cfg.data.tools and not tools_.specs(g.tools):
        raise XtrainError(
            "data.tools gives tool schemas, and grpo.tools names no functions to run",
            "name the functions in grpo.tools (path/to/tools.py:function)",
        )
    # the tools and the reward functions imported and checked: before any model loads
    rw.resolve(g, [t.schema for t in tools_.from_config(cfg)])


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The memory estimate's stacks: a sample is a prompt (up to ``data.max_length``) and its
    completion (``grpo.max_completion_length``; with tools its episode, ``grpo.max_episode_length``)
    through the text layers."""
    from dataclasses import replace

    from xtrain.tasks.stacks import text_stacks

    extra = sequence_tokens(cfg)
    return [replace(s, positions=s.positions + extra, extra=extra) for s in text_stacks(model, cfg)]


def _tools_prompt() -> list[str]:
    from xtrain.builtin.agent_grpo import QUICKSTART_PROMPT, TOOLS

    names = ",".join([TOOLS[0], *(t.rpartition(":")[2] for t in TOOLS[1:])])  # module:square,cube
    return ["--prompt", QUICKSTART_PROMPT, "--tools", names]


TASK = Task(
    name=NAME,
    about="prompts and reward functions on a causal LM: GRPO, Dr. GRPO, DAPO (RL with verifiable "
    "rewards); metric: mean reward",
    build=build,
    keys=frozenset(
        {
            "model.quantization",
            "data.chat_template",
            "data.tools",
            *(
                f"grpo.{k}"
                for k in (
                    "num_generations",
                    "max_completion_length",
                    "temperature",
                    "top_p",
                    "rewards",
                    "reward_weights",
                    "answer_column",
                    "answer_pattern",
                    "format_pattern",
                    "length_target",
                    "loss",
                    "scale_rewards",
                    "epsilon",
                    "epsilon_high",
                    "beta",
                    "num_iterations",
                    "mask_truncated_completions",
                    "tools",
                    "max_turns",
                    "max_episode_length",
                    "max_tool_calls",
                    "tool_timeout",
                )
            ),  # fmt: skip
        }
    ),
    validate=validate,
    model_class="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    stacks=stacks,
    token_loss="logps",  # its forward reads the completions' log-probs, chunked (rollout.token_logps)
    sequence_parallel=True,  # parallel.sequence: generated whole, trained on shards (sharded.py)
    curves=CURVES,
    kv_cache_tokens=kv_cache_tokens,
    resume_keys=("grpo.num_generations",),
    recognizes=recognizes_none,
    predicts=Predicts(
        takes="--prompt TEXT",
        load=load_for_predict,
        run=predict_file.prompt_answers,
        file=FileRows(
            rows="prompts: text, conversational or alpaca rows (scored by the run's reward functions and "
            "against the answer column), or chat and prompt rows as causal-lm reads them",
            read=predict_file.read_prompt_file,
            answer=predict_file.answer_prompts,
            score=exact_match,
            averaged=("reward",),
        ),
        samples=True,
        tools=True,
        tool_use=TOOL_USE,
    ),
    quickstart=Quickstart(
        job="quickstart-grpo.yaml",
        about="GRPO: whole-sentence answers rewarded by a regex, learnt from the model's own samples",
        next_command="xtrain train examples/grpo.yaml",
        headline=(
            METRIC,
            "mean reward",
            "eval prompts answered greedily, scored by the reward functions; 1 is best",
        ),
        samples=("prompt", "the trained model's completion [its reward]"),
        predict_args=builtin_preference.quickstart_predict_args,
    ),
    more_quickstarts=(
        (
            "grpo-tools",
            Quickstart(
                job="quickstart-grpo-tools.yaml",
                about="GRPO agents: episodes that call a calculator tool, the exact answer rewarded",
                next_command="xtrain train examples/grpo-tools.yaml",
                headline=(
                    "rewards/exact_match",
                    "exact answer",
                    "eval questions answered greedily by episodes that may call square and cube; 1 is best",
                ),
                samples=("the prompt", "the episode after training: its calls -> their results | its answer"),
                predict_args=_tools_prompt,
            ),
        ),
    ),
    check_data=check_data,
)
