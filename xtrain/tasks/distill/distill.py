"""``distill``: a causal LM (the student) learns from another (the teacher, ``distill.teacher``)
through their next-token distributions, ``distill.*`` (docs/distillation.md).

Data: prompts, with an answer where GKD trains on the data's (``rows``: text, turns, alpaca,
prompt-completion, messages). Each step the prompts are completed (``step``): on-policy by the
student's own samples, whose tokens the teacher scores (the per-token reverse KL of the sampled
tokens is the loss); GKD by the student's samples on a share ``lmbda`` of the steps and the data's
answers (or with ``seq_kd`` the teacher's samples) on the rest, the generalized JSD over the whole
distributions the loss (``losses``). The teacher is loaded frozen on the student's device
(``teacher``: a hub id, a folder, a built-in, a trained result; 4-bit allowed) and must share the
student's tokenizer. The evaluation answers the eval prompts greedily with both and reports the
student's agreement with the teacher's answers and the KL on them (``evaluation``). The result is a
causal LM adapter: ``xtrain predict`` continues prompts as causal-lm does, a next stage (DPO,
GRPO) starts from it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from xtrain.builtin import preference as builtin_preference
from xtrain.errors import XtrainError
from xtrain.tasks.contract import (
    Curve,
    Example,
    FileRows,
    MainProcessFirst,
    OtherModel,
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
    from xtrain.tasks.distill.rows import RowEncoder

NAME = "distill"
METRIC = "agreement"
CURVES = (
    Curve("KL to the teacher (a token)", train=("kl",), eval=("kl",)),
    Curve("agreement with the teacher's greedy answers", eval=(METRIC,)),
    Curve(
        "top-1 agreement with the teacher (a token)", train=("token_agreement",), eval=("token_agreement",)
    ),
    Curve("completion length (tokens)", train=("completions/mean_length",), eval=("completion_length",)),
    Curve("share of steps on the student's own samples", train=("on_student_samples",)),
)
KEYS = ("teacher", "teacher_quantization", "mode", "beta", "lmbda", "seq_kd", "temperature",
        "max_completion_length")  # fmt: skip


def answers_needed(cfg: TrainConfig) -> bool:
    """GKD trains on the data's answers in the steps not on the student's samples (no ``seq_kd``)."""
    d = cfg.distill
    return d.mode == "gkd" and d.lmbda < 1 and not d.seq_kd


def encoder_of(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> RowEncoder:
    """Prompts rendered as GRPO renders them (the chat template where rows are turns), answers as
    the template (or the text and the end token) writes them."""
    from xtrain.tasks.distill.rows import RowEncoder
    from xtrain.tasks.grpo.grpo import encoder_of as prompt_encoder

    return RowEncoder(prompt_encoder(cfg, tokenizer), cfg.distill.max_completion_length, answers_needed(cfg))


def encoded_sets(
    cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, train: Dataset, eval_ds: Dataset | None,
    train_name: str, eval_name: str,
) -> tuple[Dataset, Dataset | None]:  # fmt: skip
    """The train and eval rows encoded once (``rows.encoding``); eval rows are prompts (answers
    not needed: the teacher answers them)."""
    from dataclasses import replace

    from xtrain.data.encoded import encode
    from xtrain.data.tokenize import tokenizer_fingerprint
    from xtrain.tasks.distill import rows as rows_

    encoder, key, d = encoder_of(cfg, tokenizer), tokenizer_fingerprint(tokenizer), cfg.data
    column, processes = d.messages_column, d.encode_processes
    train_ids = encode(train, rows_.encoding(train_name, encoder, key, column, processes), "encoding train")
    if eval_ds is None:
        return train_ids, None
    prompts = replace(encoder, answers_needed=False)
    return train_ids, encode(
        eval_ds, rows_.encoding(eval_name, prompts, key, column, processes), "encoding eval"
    )


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.tasks import data_check
    from xtrain.tasks.common import finish_model, load_seeded, prepare_tokenizer, raw_datasets
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.distill import teacher as teacher_
    from xtrain.tasks.distill.evaluation import DistillEval
    from xtrain.tasks.distill.rows import DistillCollator, DistillRows
    from xtrain.tasks.distill.step import DistillStep
    from xtrain.tasks.grpo.step import eos_ids
    from xtrain.tasks.preference.reference import no_dropout

    cfg = run.cfg
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    with main_process_first():  # the first process writes a built-in teacher and encodes the rows
        teacher_.source_of(cfg)
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        first = data_check.loaded_samples(cfg, [(train, train_name, "train"), (eval_ds, eval_name, "eval")])
        report = inspect(cfg, (source, tokenizer), first, [])
        train_ids, eval_ids = encoded_sets(cfg, tokenizer, train, eval_ds, train_name, eval_name)
    model = load_seeded(run, TASK, source)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model = finish_model(model, cfg, TASK)
    no_dropout(model)  # TRL's GKDTrainer's default (disable_dropout): the samples' model is the trained one
    head = model.get_output_embeddings()
    teacher = teacher_.load(run, tokenizer, int(getattr(head, "out_features", 0) or head.weight.shape[0]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    step = DistillStep(cfg.distill, teacher, cfg.run.seed, pad, eos_ids(tokenizer, model), decoding_of(run))
    rows = DistillRows(eval_ds, eval_name, cfg.data.messages_column) if eval_ds is not None else None
    template = encoder_of(cfg, tokenizer).prompts.template
    return Workload(
        model=model,
        train_dataset=train_ids,
        collator=DistillCollator(pad),
        eval_dataset=eval_ids,
        tokenizer=tokenizer,
        chat=template is not None
        and DistillRows(train, train_name, cfg.data.messages_column)[0].conversational,
        main_metric=METRIC,
        forward=step,
        notes=step.notes,
        evaluate=DistillEval(step, rows, tokenizer) if rows is not None else None,
        data_report=report,
        step_start=step.step_start,
        at_step=step.at_step,
        use_chunked_loss=step.use_chunked_loss,
        cuts_sequences=True,  # parallel.sequence: its step completes the prompts, then cuts (grpo/sharded.py)
        record=teacher_.record(cfg, teacher.start),
    )


def decoding_of(run: Run) -> DecodeSettings:
    """How this process's decode steps run (``decoding.decode_settings``): on CUDA a static cache as
    long as the longest prompt and completion, compiled where torch.compile can run."""
    from xtrain.model.decoding import decode_settings

    cfg = run.cfg
    sharded = run.context.sharding is not None and run.world_size > 1
    return decode_settings(run.device_type, sharded, cfg.model.quantization is not None,
                           run.plan.compile_blocker, kv_cache_tokens(cfg))  # fmt: skip


def kv_cache_tokens(cfg: TrainConfig) -> int:
    """``Task.kv_cache_tokens``: a prompt and its completion, at their longest."""
    return cfg.data.max_length + cfg.distill.max_completion_length


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The memory estimate's stacks: a sample is a prompt (up to ``data.max_length``) and its
    completion (``distill.max_completion_length``) through the text layers."""
    from dataclasses import replace

    from xtrain.tasks.stacks import text_stacks

    extra = cfg.distill.max_completion_length
    return [replace(s, positions=s.positions + extra, extra=extra) for s in text_stacks(model, cfg)]


def other_models(cfg: TrainConfig) -> tuple[OtherModel, ...]:
    """``Task.other_models``: the teacher."""
    d = cfg.distill
    if not d.teacher:
        return ()
    return (OtherModel("distill.teacher", d.teacher, d.teacher_quantization, "distill.teacher_quantization"),)


def settings_line(cfg: TrainConfig) -> str:
    d = cfg.distill
    quantized = f" in {d.teacher_quantization}" if d.teacher_quantization else ""
    if d.mode == "on_policy":
        how = "on-policy: the student's samples, the sampled tokens' reverse KL"
    else:
        rest = "the teacher's samples (seq_kd)" if d.seq_kd else "the data's answers"
        how = f"gkd: generalized JSD at beta {d.beta:g}, the student's samples on {d.lmbda:.0%} of the steps, {rest} on the rest"  # noqa: E501
    return (
        f"teacher {d.teacher}{quantized}; {how}; completions up to {d.max_completion_length} tokens at "
        f"temperature {d.temperature:g}"
    )


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    """The data check (``xtrain train --dry-run``): the first rows read and encoded (a bad row, or
    a row without the answer GKD trains on, raises its line), the first row as the model reads it,
    and the teacher's tokenizer against the student's (another tokenizer is the run's one line)."""
    from xtrain.tasks import data_check
    from xtrain.tasks.encoding_check import encoding_note

    found, samples, notes = data_check.text_check(cfg, limit)
    report = inspect(cfg, found, samples, notes)
    if found is not None:
        report.notes.append(teacher_note(cfg, found[1]))
        report.encoding = encoding_note(cfg, samples, lambda *sets: encoded_sets(cfg, found[1], *sets))
    return report


def teacher_note(cfg: TrainConfig, student: PreTrainedTokenizerBase) -> str:
    """The dry run's line on the teacher: its tokenizer checked against the student's, or why it
    is not here yet (a hub model not downloaded: the run checks it when it loads it)."""
    from xtrain.tasks.distill import teacher as teacher_

    start = teacher_.teacher_start(cfg)
    try:
        theirs = teacher_.load_tokenizer(cfg, teacher_.source_of(cfg))
    except XtrainError as e:
        if not start.result and not _local(start.base):
            where = f"its tokenizer is not on this machine ({e.message})"
            return f"teacher {cfg.distill.teacher}: {where}; the run checks it when it loads it"
        raise
    teacher_.check_vocabulary(student, theirs, str(cfg.distill.teacher))
    return f"teacher {start.shown()}: its tokenizer is the student's ({len(student):,} tokens)"


def _local(name: str) -> bool:
    from pathlib import Path

    from xtrain import builtin

    return builtin.is_builtin(name) or Path(name).expanduser().exists()


def inspect(cfg: TrainConfig, found: Tokenizer, samples: list[Sample], notes: list[str]) -> DataReport:
    """``check_data``'s report of ``samples`` with ``found`` = (source, tokenizer), or None."""
    from xtrain.tasks import data_check
    from xtrain.tasks.data_report import DataReport
    from xtrain.tasks.distill import rows as rows_

    report = DataReport(NAME, cfg.data.max_length, notes=[*notes, settings_line(cfg)])
    column = cfg.data.messages_column
    for s in samples:
        read = [rows_.read_row(dict(r), i, s.name, column) for i, r in enumerate(s.ds)]
        shape = "conversational prompts" if read and read[0].conversational else "text prompts"
        answered = sum(r.answer is not None for r in read)
        check = s.check(row_format=f"{shape}, {answered} with answers")
        report.sources.append(check)
        if found is None:
            continue
        encoder = encoder_of(cfg, found[1])
        if s.role != "train":
            from dataclasses import replace

            encoder = replace(encoder, answers_needed=False)
        encoded = [encoder.encode(r, f"row {i} of {s.name}") for i, r in enumerate(read)]
        check.lengths.extend(len(x["input_ids"]) + len(x["answer_ids"]) for x in encoded)
        check.trained = sum(len(x["answer_ids"]) for x in encoded)
        check.trained_kept = check.trained
        cut = sum(x["answer_cut"][0] for x in encoded)
        if cut:
            report.notes.append(
                f"{s.name}: {cut} of {len(encoded)} checked answers longer than "
                f"distill.max_completion_length={cfg.distill.max_completion_length}, cut there"
            )
        if report.example is None and s.role == "train" and encoded:
            ids = encoded[0]["input_ids"] + encoded[0]["answer_ids"]
            labels = [-100] * len(encoded[0]["input_ids"]) + encoded[0]["answer_ids"]
            report.example = data_check.example_of(s, 0, found[1], ids, labels)
            longest = cfg.distill.max_completion_length
            report.example.note = (
                f"the prompt, then its answer (trained on GKD's data steps); the student's samples of up to "
                f"{longest} tokens take its place on the others"
                if encoded[0]["answer_ids"]
                else f"the prompt; the student's samples (up to {longest} tokens) follow"
            )
    return report


def validate(cfg: TrainConfig) -> None:
    d = cfg.distill
    if not d.teacher:
        raise XtrainError(
            "model.task=distill needs distill.teacher (the model the student learns from)",
            "set distill.teacher to a hub id, a model folder, builtin:NAME or a trained run",
        )
    for key, value in (("distill.beta", d.beta), ("distill.lmbda", d.lmbda)):
        if not 0 <= value <= 1:
            raise XtrainError(f"{key} must be a number in [0, 1], got {value}")
    if d.mode == "on_policy":
        given = [
            f"distill.{k}"
            for k, v in (("beta", 0.5), ("lmbda", 0.5), ("seq_kd", False))
            if getattr(d, k) != v
        ]
        if given:
            raise XtrainError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for distill.mode=gkd; "
                "distill.mode=on_policy trains on the student's samples alone",
                f"set distill.mode=gkd, or leave out {', '.join(given)}",
            )


def _read_prompt_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """``xtrain predict --data``: the file's rows as prompts (a chat run's turns, a plain run's
    text), each row's answer the reference."""
    from xtrain.data.rows.chat import Conversation
    from xtrain.tasks.distill.rows import DistillRows
    from xtrain.tasks.grpo.rows import untemplated
    from xtrain.tasks.predicting import load_file

    ds, source, _ = load_file(cfg)
    rows = DistillRows(ds, source, cfg.data.messages_column)
    out = []
    for i in range(len(rows)):
        row = rows[i]
        if not row.conversational:
            feed: Any = row.prompt
        elif record.get("chat"):
            feed = Conversation(list(row.prompt))
        else:
            feed = untemplated(list(row.prompt))
        out.append(Example(i, {"input": row.shown}, feed, row.answer))
    return out


TASK = Task(
    name=NAME,
    about="a causal LM (the student) learns a teacher's next-token distributions: on-policy distillation, "
    "GKD; metric: agreement with the teacher's greedy answers",
    build=build,
    aliases=("distillation", "kd"),
    keys=frozenset(
        {"model.quantization", "data.chat_template", "data.messages_column", *(f"distill.{k}" for k in KEYS)}
    ),
    validate=validate,
    model_class="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    stacks=stacks,
    token_loss="divergence",  # its forward reads both models' distributions, chunked (losses.chunked)
    sequence_parallel=True,  # parallel.sequence: completed whole, student and teacher on shards
    curves=CURVES,
    kv_cache_tokens=kv_cache_tokens,
    other_models=other_models,
    resume_keys=("distill.teacher", "distill.mode"),
    recognizes=recognizes_none,
    predicts=Predicts(
        takes="--prompt TEXT",
        load=load_for_predict,
        run=predict_file.prompt_answers,
        file=FileRows(
            rows="prompts: text, conversational, alpaca or messages rows (an answer scored), as it trained",
            read=_read_prompt_file,
            answer=predict_file.answer_prompts,
            score=exact_match,
        ),
        samples=True,
        tools=True,
        tool_use=TOOL_USE,
    ),
    quickstart=Quickstart(
        job="quickstart-distill.yaml",
        about="distillation: the plain tiny llama learns builtin:tiny-llama-sft's answers on prompts alone",
        next_command="xtrain train examples/distill.yaml",
        headline=(
            METRIC,
            "agreement with the teacher",
            "eval prompts answered greedily by the student and the teacher: the share alike; 1 is best",
        ),
        samples=("the teacher's greedy answer", "the student's greedy answer after training"),
        predict_args=builtin_preference.quickstart_predict_args,
    ),
    check_data=check_data,
)
