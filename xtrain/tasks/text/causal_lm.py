"""``causal-lm``: a text column, or prompt/response columns with the loss on the response only,
or chat conversations (``data.messages_column``, rendered by the chat template, loss on the
assistant turns only: ``chat_data``), or alpaca / sharegpt rows mapped onto those two
(``row_formats``; ``data.row_format`` or detected from the columns); optional packing (``data.packing``:
on packs whole examples into rows kept apart by restarting ``position_ids``, concatenate is the
old concatenation into blocks) and NEFTune (``optim.neftune_alpha``); metric: next-token accuracy
(and perplexity).
``xtrain predict`` continues text prompts (a chat run's prompts as user turns) and the prompts of
a data file's rows (``prompt_predict``). The rows from the data as read to what the loop reads:
``rows.py`` (encoded once, cached)."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.builtin import chat as builtin_chat
from xtrain.data.rows import formats as row_formats
from xtrain.data.rows.columns import require, row_format
from xtrain.data.rows.formats import text_columns
from xtrain.errors import XtrainError
from xtrain.model import load as models
from xtrain.model import neftune
from xtrain.tasks import contract, prompt_predict
from xtrain.tasks.contract import FileRows, MainProcessFirst, Predicts, Quickstart, Task
from xtrain.tasks.data_report import DataReport
from xtrain.tasks.text import tool_calls
from xtrain.tasks.text.rows import chat_render, encoded_sets, is_chat

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Render
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.data_check import Sample
    from xtrain.tasks.data_report import Example, SourceCheck

NAME = "causal-lm"


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.tasks import data_check
    from xtrain.tasks.common import load_seeded, prepare_tokenizer, raw_datasets, text_workload

    cfg = run.cfg
    d = cfg.data
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    with main_process_first():  # the first process encodes (datasets' cache), the others read it
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        first = data_check.loaded_samples(cfg, [(train, train_name, "train"), (eval_ds, eval_name, "eval")])
        report = inspect(cfg, tokenizer, source, first, [])  # the data check: its first rows first
        fmt, chat, train, eval_ds = encoded_sets(
            cfg, tokenizer, source, train, eval_ds, train_name, eval_name
        )

    model = load_seeded(run, TASK, source)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    from xtrain.data import collate

    evaluation = (collate.causal_lm_eval_batch, collate.causal_lm_reduce, "token_accuracy")
    if d.packing == "on":
        check_packs_apart(model)  # before LoRA wraps it: the model's own class and config
    workload = text_workload(model, run, TASK, tokenizer, (train, eval_ds), evaluation)
    workload.chat, workload.data_report = chat, report
    workload.record = {"row_format": fmt}  # what predict --data reads a file as (xtrain_run.json)
    pad = workload.collator  # encoded chat rows carry no attention mask (all ones): the collator's
    workload.collator = collate.PadCollator(pad.pad_token_id, pad.pad_to_multiple_of, masks=True)
    if d.packing == "on":  # one padding-free row per micro-batch; eval rows padded as before
        workload.collator = collate.PackedCollator(pad.pad_token_id, pad.pad_to_multiple_of)
    if cfg.optim.neftune_alpha is not None:  # on the unwrapped model; active in training mode only
        neftune.attach(workload.model, cfg.optim.neftune_alpha)
    return workload


# ---------------------------------------------------------------------------------------------
# The data check (``Task.check_data``): the first rows through the functions ``build`` uses


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    from xtrain.tasks import data_check
    from xtrain.tasks.encoding_check import encoding_note

    found, samples, notes = data_check.text_check(cfg, limit)
    source, tokenizer = found if found is not None else (cfg.model.name_or_path, None)
    report = inspect(cfg, tokenizer, source, samples, notes)
    if tokenizer is not None:
        note = encoding_note(cfg, samples, lambda *sets: encoded_sets(cfg, tokenizer, source, *sets))
        report.encoding = note
    return report


def inspect(
    cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, source: str, samples: list[Sample], notes: list[str]
) -> DataReport:
    """Each sample's rows in the format the run reads (``row_format``), tokenised as the run
    tokenises them (chat: ``chat_data``; text: ``tokenize_causal_lm``); without a tokenizer
    (a hub model not on this machine) the rows' fields only."""
    d = cfg.data
    report = DataReport(NAME, d.max_length, notes=notes)
    train = next((s for s in samples if s.role == "train"), None)
    if train is None:
        return report
    fmt = row_format(cfg, train.ds, train.name)
    chat = fmt in row_formats.CHAT if tokenizer is None else is_chat(cfg, tokenizer, fmt)
    render = chat_render(cfg, tokenizer, source, fmt) if chat and tokenizer is not None else None
    for s in samples:
        require(cfg, fmt, s.ds, s.name)  # the eval data too: the format the training data holds
        if chat:
            check = _check_chat(cfg, s, fmt, render, tokenizer, report.notes)
        else:
            check = _check_text(cfg, s, fmt, tokenizer)
        report.sources.append(check[0])
        report.example = report.example or check[1]
    if report.example is not None and d.packing == "on":
        report.example.note = (
            f"data.packing=on: whole examples like this one are packed into training rows of up to "
            f"{d.max_length} tokens (the first token of each carries no loss)"
        )
    return report


def _check_chat(
    cfg: TrainConfig,
    s: Sample,
    fmt: str,
    render: Render | None,
    tokenizer: PreTrainedTokenizerBase,
    notes: list[str],
) -> tuple[SourceCheck, Example | None]:
    from xtrain.data.collate import IGNORE_INDEX
    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows import tools as agent_rows
    from xtrain.tasks import data_check

    d = cfg.data
    cells = row_formats.conversations(s.ds, d, fmt, s.name)
    tools = agent_rows.row_tools(s.ds, d, s.name)
    check, example, calling, undeclared = s.check(row_format=fmt), None, False, {}
    for row, cell in enumerate(cells):
        conv = agent_rows.parse_text(cell, row, s.name, tools[row])
        for name in agent_rows.undeclared(conv):
            undeclared.setdefault(name, []).append(row)
        if render is None:
            continue
        where = f"row {row} of {s.name}"
        enc = chat_data.encode(render, tokenizer, conv, where, train_on=d.train_on)
        ids, labels = enc.input_ids[: d.max_length], enc.labels[: d.max_length]
        check.lengths.append(len(enc.input_ids))
        check.truncated += len(enc.input_ids) > d.max_length
        check.trained += data_check.trained_tokens(enc.labels)
        check.trained_kept += data_check.trained_tokens(labels)
        if all(t == IGNORE_INDEX for t in labels[1:]):  # text_chat_rows leaves it out
            check.dropped += 1
        elif s.role == "train" and (example is None or (not calling and agent_rows.has_calls(conv))):
            # a row that calls a tool, where there is one: the call trains, the result does not
            example, calling = (
                data_check.example_of(s, row, tokenizer, ids, labels),
                agent_rows.has_calls(conv),
            )
    for name, rows in undeclared.items():
        notes.append(
            f"warning: {len(rows)} call(s) to '{name}', which the row's tools do not declare "
            f"(row {rows[0]} of {s.name} first)"
        )
    return check, example


def _check_text(
    cfg: TrainConfig, s: Sample, fmt: str, tokenizer: PreTrainedTokenizerBase
) -> tuple[SourceCheck, Example | None]:
    from xtrain.data.tokenize import require_columns, tokenize_causal_lm
    from xtrain.tasks import data_check

    d = cfg.data
    prompt, response, columns = text_columns(cfg, fmt)
    ds = row_formats.alpaca_as_prompt_response(s.ds, s.name) if fmt == "alpaca" else s.ds
    require_columns(ds, columns, s.name)
    check = s.check(row_format=fmt)
    if tokenizer is None:
        return check, None
    settings = {"text_column": d.text_column, "prompt_column": prompt, "response_column": response}

    def tokenize(
        batch: dict[str, list[Any]], max_length: int, packing: str = "off"
    ) -> dict[str, list[list[int]]]:
        return tokenize_causal_lm(batch, tokenizer, **settings, max_length=max_length, packing=packing)

    whole, cut = tokenize(ds[:], data_check.NO_CUT), tokenize(ds[:], d.max_length)
    check.lengths = [len(ids) for ids in whole["input_ids"]]
    check.truncated = sum(n > d.max_length for n in check.lengths)
    check.dropped = len(ds) - len(cut["input_ids"])
    check.trained = sum(map(data_check.trained_tokens, whole["labels"]))
    check.trained_kept = sum(map(data_check.trained_tokens, cut["labels"]))
    example = None
    if s.role == "train" and d.packing == "concatenate":  # the first block the run trains on
        run = tokenize(ds[:], d.max_length, d.packing)
        if run["input_ids"]:
            example = data_check.example_of(s, 0, tokenizer, run["input_ids"][0], run["labels"][0])
            example.note = "data.packing=concatenate: the rows joined and cut into blocks; the first block"
    elif s.role == "train":
        for row in range(len(ds)):  # the first row with something to learn
            one = tokenize(ds[row : row + 1], d.max_length)
            if one["input_ids"]:
                example = data_check.example_of(s, row, tokenizer, one["input_ids"][0], one["labels"][0])
                break
    return check, example


def validate(cfg: TrainConfig) -> None:
    d = cfg.data
    if (d.prompt_column is None) != (d.response_column is None):
        raise XtrainError(
            "data.prompt_column and data.response_column go together",
            "set both (loss on the response only) or neither (loss on data.text_column)",
        )
    if d.prompt_column is not None and d.row_format not in ("auto", "prompt_response"):
        raise XtrainError(
            f"data.prompt_column is for prompt/response rows, and data.row_format={d.row_format}",
            "leave data.prompt_column and data.response_column unset, or set data.row_format=prompt_response",
        )
    if d.packing == "concatenate" and d.row_format in ("messages", "sharegpt"):
        raise XtrainError(
            f"data.packing=concatenate would cut conversations mid-turn (data.row_format={d.row_format})",
            "set data.packing=on (whole conversations packed, kept apart) or off",
        )
    if d.group_by_length and d.packing != "off":
        raise XtrainError(
            "data.group_by_length has nothing to group: packed rows are all filled up to max_length tokens",
            "set data.group_by_length=false",
        )


# Masks transformers builds from position_ids (masking_utils): a model whose modelling code uses
# one of these gets packed examples kept apart (checked in tests/test_packing.py for llama).
PACKED_MASKS = ("create_causal_mask", "create_sliding_window_causal_mask")
ATTENTION_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}


def check_packs_apart(model: Module) -> None:
    """``data.packing=on`` keeps examples apart only where the model builds its attention mask
    from ``position_ids`` (transformers' ``masking_utils``) and every layer is attention: a
    recurrent layer (Mamba, RWKV, linear attention) carries state from one example into the
    next. Refused in one line otherwise."""
    import sys

    module = sys.modules.get(type(model).__module__)
    name = type(model).__name__
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    recurrent = set(getattr(text, "layer_types", None) or ()) - ATTENTION_LAYERS
    if module is None or not any(hasattr(module, f) for f in PACKED_MASKS):
        why = f"{name} does not build its attention mask from position_ids"
    elif recurrent:
        why = f"{name} has {', '.join(sorted(recurrent))} layers, which carry state across examples"
    else:
        return
    raise XtrainError(
        f"data.packing=on cannot keep packed examples apart: {why}",
        "set data.packing=off, or data.packing=concatenate (examples then attend to each other)",
    )


# ---------------------------------------------------------------------------------------------
# Predict: prompts -> continuations


def load_for_predict(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    try:
        base_load = record.get(contract.BASE_LOAD, {})  # a quantized run's base: in 4/8 bits
        model = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=False, **base_load)
    except ValueError:
        raise XtrainError(
            f"{base} is a model without a text generation head",
            "xtrain predict runs the results of tasks that generate text or classify images",
        ) from None
    return model, models.load_tokenizer(str(folder), False), {}


def _is_causal_lm(config: dict[str, Any]) -> bool:
    return any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])


def _quickstart_eval_file() -> Path:
    """The eval split of ``builtin:chat`` that the quickstart's base model and trained adapter
    both answer (built on first use)."""
    from xtrain.builtin import builtin_data_file

    return builtin_data_file(builtin_chat.PREFIX + "chat", "eval")


def _episodes(*args: Any, **kwargs: Any) -> list[dict[str, str]]:
    """``xtrain predict --tools`` naming functions: each prompt an episode as GRPO runs them."""
    from xtrain.tasks.grpo.episodes import predict_episodes

    return predict_episodes(*args, **kwargs)


# how a chat run's answers call tools (prompt_predict's hooks: tasks.contract.ToolUse)
TOOL_USE = contract.ToolUse(
    tool_calls.parse, tool_calls.shown, tool_calls.reference, tool_calls.call_exact_match, _episodes
)

TASK = Task(
    name=NAME,
    about="text, prompt/response, chat conversations, alpaca or sharegpt; metric: next-token accuracy",
    build=build,
    aliases=("clm",),
    keys=frozenset(
        {
            "model.chunked_loss",
            "model.quantization",
            "data.row_format",
            "data.text_column",
            "data.prompt_column",
            "data.response_column",
            "data.messages_column",
            "data.role_tag",
            "data.content_tag",
            "data.user_tag",
            "data.assistant_tag",
            "data.system_tag",
            "data.chat_template",
            "data.chat_template_kwargs",
            "data.train_on",
            "data.tools_column",
            "data.tools",
            "data.packing",
            "data.group_by_length",
            "optim.neftune_alpha",
        }
    ),
    validate=validate,
    token_loss="next-token",
    sequence_parallel=True,  # parallel.sequence: its sequences split across processes
    model_class="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    recognizes=_is_causal_lm,
    predicts=Predicts(
        takes="--prompt TEXT",
        load=load_for_predict,
        run=functools.partial(prompt_predict.text_predict, tools=TOOL_USE),
        file=FileRows(
            rows="prompts: text, prompt/response, messages, alpaca or sharegpt rows, as the run trained",
            read=functools.partial(prompt_predict.read_text_file, tools=TOOL_USE),
            answer=functools.partial(prompt_predict.text_answer, tools=TOOL_USE),
            score=functools.partial(prompt_predict.text_score, tools=TOOL_USE),
        ),
        samples=True,
        tools=True,
        tool_use=TOOL_USE,
        chat=functools.partial(prompt_predict.chat_reply, tools=TOOL_USE),
    ),
    quickstart=Quickstart(
        job="quickstart-chat.yaml",
        about="chat LoRA: a tiny llama learns to answer short questions",
        next_command="xtrain train examples/chat-sft.yaml",
        predict_args=builtin_chat.quickstart_predict_args,
        compare=_quickstart_eval_file,
        default=True,
    ),  # fmt: skip
    more_quickstarts=(
        (
            "long",
            Quickstart(
                job="quickstart-long.yaml",
                about="long chats, each sequence split across the processes (parallel.sequence)",
                next_command="xtrain train examples/long-context.yaml",
                headline=(
                    "token_accuracy",
                    "answer token accuracy",
                    "the eval conversations' answer tokens predicted right; 1 is best",
                ),
            ),
        ),
    ),
    check_data=check_data,
)
