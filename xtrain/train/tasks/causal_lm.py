"""``causal-lm``: a text column, or prompt/response columns with the loss on the response only,
or chat conversations (``data.messages_column``, rendered by the chat template, loss on the
assistant turns only: ``chat_data``); optional packing; metric: next-token accuracy (and perplexity).
``xtrain predict`` continues text prompts (a chat run's prompts as user turns)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.train.tasks.contract import Loaded, MainProcessFirst, PredictRequest, Predicts, Task

if TYPE_CHECKING:
    from xtrain.train.config.schema import TrainConfig
    from xtrain.train.workload import Workload

NAME = "causal-lm"


def is_chat(cfg: TrainConfig, train: Any) -> bool:
    """Chat data: the messages column is there, and neither a text column nor prompt/response."""
    d = cfg.data
    names = train.column_names
    return d.prompt_column is None and d.messages_column in names and d.text_column not in names


def chat_rows(
    cfg: TrainConfig, tokenizer: Any, source: str, train: tuple[Any, str], eval_: tuple[Any, str]
) -> tuple[list[dict[str, list[int]]], list[dict[str, list[int]]] | None]:
    """Conversations -> input_ids/attention_mask/labels (assistant turns only), checked row by row."""
    from xtrain.train.tasks import chat_data
    from xtrain.train.tasks.common import require_nonempty

    d = cfg.data
    if d.packing:
        raise XtrainError("data.packing is for plain text, not chat conversations", "set data.packing=false")
    template = chat_data.require_template(tokenizer, chat_data.load_template(d.chat_template), source)
    if d.chat_template is not None:
        tokenizer.chat_template = template  # saved with the adapter: predict renders the same way
    render = chat_data.renderer(tokenizer, template)
    out: list[list[dict[str, list[int]]] | None] = []
    for ds, name in (train, eval_):
        if ds is None:
            out.append(None)
            continue
        rows = chat_data.text_chat_rows(ds, d.messages_column, render, tokenizer, d.max_length, name)
        require_nonempty(rows, name, "training" if ds is train[0] else "eval")
        out.append(rows)
    assert out[0] is not None
    return out[0], out[1]


def build(cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.train import data
    from xtrain.train.tasks.common import (
        load_seeded,
        prepare_tokenizer,
        raw_datasets,
        require_nonempty,
        text_workload,
        tokenizing,
    )

    d = cfg.data
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    if d.prompt_column is not None:
        columns = {"data.prompt_column": d.prompt_column, "data.response_column": d.response_column}
    else:
        columns = {"data.text_column": d.text_column}
    kwargs = {
        "tokenizer": tokenizer,
        "text_column": d.text_column,
        "prompt_column": d.prompt_column,
        "response_column": d.response_column,
        "max_length": d.max_length,
        "packing": d.packing,
    }
    tokenize = tokenizing(NAME, data.tokenize_causal_lm, kwargs)
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        chat = is_chat(cfg, train)
        if not chat:
            data.require_columns(train, columns, train_name)
            train = tokenize(train, "train")
            require_nonempty(train, train_name, "training")
            if eval_ds is not None:
                data.require_columns(eval_ds, columns, eval_name)
                eval_ds = tokenize(eval_ds, "eval")
                require_nonempty(eval_ds, eval_name, "eval")
    if chat:  # rendered in every process: no datasets cache to share (fast: no model involved)
        train, eval_ds = chat_rows(cfg, tokenizer, source, (train, train_name), (eval_ds, eval_name))

    model = load_seeded(cfg, TASK, source)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    from xtrain.train import collate

    evaluation = (collate.causal_lm_eval_batch, collate.causal_lm_reduce, "token_accuracy")
    workload = text_workload(model, cfg, TASK, tokenizer, (train, eval_ds), evaluation)
    workload.chat = chat
    return workload


def validate(cfg: TrainConfig) -> None:
    d = cfg.data
    if (d.prompt_column is None) != (d.response_column is None):
        raise XtrainError(
            "data.prompt_column and data.response_column go together",
            "set both (loss on the response only) or neither (loss on data.text_column)",
        )
    if d.group_by_length and d.packing:
        raise XtrainError(
            "data.group_by_length has nothing to group here: packed blocks all have max_length tokens",
            "set data.group_by_length=false",
        )


# ---------------------------------------------------------------------------------------------
# Predict: prompts -> continuations


def load_for_predict(folder: Path, base: str, record: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    from xtrain.train import models

    try:
        model = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=False)
    except ValueError:
        raise XtrainError(
            f"{base} is a model without a text generation head",
            "xtrain predict runs the results of tasks that generate text or classify images",
        ) from None
    return model, models.load_tokenizer(str(folder), False), {}


def chat_prompt(loaded: Loaded, prompt: str, system: str | None = None) -> tuple[str, int | None]:
    """(the text the model sees, the end-of-turn token to stop at) for a prompt: a chat run's
    prompt as a user turn (``system`` first) rendered by its saved template with the generation
    prompt, as training rendered it (``chat_data``); a plain run's prompt as it is."""
    from xtrain.train.tasks import chat_data

    if not loaded.parts.get("chat"):
        if system is not None:
            raise XtrainError(
                f"{loaded.source} was not trained on chat conversations: it continues text as it is",
                "leave out --system",
            )
        return prompt, None
    template = chat_data.require_template(loaded.tokenizer, None, loaded.source)
    render = chat_data.renderer(loaded.tokenizer, template)
    text = render(chat_data.user_turn(prompt, system=system, text_only=True), True)
    return text, chat_data.end_of_turn(render, loaded.tokenizer)


def predict(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    import torch

    from xtrain.train.tasks.predicting import to_model

    if request.inputs:
        raise XtrainError(
            f"{loaded.source} is a causal-lm model: it continues text, it reads no images or audio",
            "give it text prompts with --prompt TEXT instead of files",
        )
    chat, tokenizer, rows = bool(loaded.parts.get("chat")), loaded.tokenizer, []
    for prompt in request.prompts:  # one at a time: no left-padding subtleties, prompts are few
        text, stop = chat_prompt(loaded, prompt, request.system)
        # a rendered chat prompt holds its own special tokens, as in training (chat_data.encode)
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=not chat)
        eos = [t for t in (stop, tokenizer.eos_token_id) if t is not None]
        with torch.no_grad():
            ids = loaded.model.generate(
                **to_model(dict(enc), loaded.model),
                max_new_tokens=request.max_new_tokens,
                num_beams=request.num_beams,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos or None,
            )
        new = ids[0, enc["input_ids"].shape[1] :]
        rows.append({"input": prompt, "text": tokenizer.decode(new, skip_special_tokens=True).strip()})
    return rows


def _is_causal_lm(config: dict[str, Any]) -> bool:
    return any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])


TASK = Task(
    name=NAME,
    about="text, prompt/response or chat conversations; metric: next-token accuracy",
    build=build,
    aliases=("clm",),
    keys=frozenset(
        {
            "data.text_column",
            "data.prompt_column",
            "data.response_column",
            "data.messages_column",
            "data.chat_template",
            "data.packing",
            "data.group_by_length",
        }
    ),
    validate=validate,
    model_class="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    recognizes=_is_causal_lm,
    predicts=Predicts(takes="--prompt TEXT", load=load_for_predict, run=predict),
)
