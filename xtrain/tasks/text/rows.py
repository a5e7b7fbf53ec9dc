"""causal-lm's rows from the data as read to what its loop reads: which rows are chat (``is_chat``),
the chat template's renderer (``chat_render``), and the rows encoded once (``encoded_sets``: chat
rows through ``text_chat``, text and prompt/response rows through ``tokenize_causal_lm``, both by
``encoded.encode``, the training rows packed with ``data.packing=on``). The run's build and the dry
run's ``encoding_note`` take the same steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xtrain.data.rows import formats as row_formats
from xtrain.data.rows.columns import row_format
from xtrain.data.rows.formats import text_columns
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Render

NAME = "causal-lm"


def is_chat(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, fmt: str) -> bool:
    """Conversations rendered by a chat template: messages and sharegpt always; alpaca when there
    is a template (``data.chat_template`` or the tokenizer's), else it is prompt/response."""
    from xtrain.data.rows import chat as chat_data

    if fmt in row_formats.CHAT:
        return True
    if fmt != "alpaca":
        return False
    return bool(chat_data.load_template(cfg.data.chat_template) or getattr(tokenizer, "chat_template", None))


def encoded_sets(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    train: Dataset,
    eval_ds: Dataset | None,
    train_name: str,
    eval_name: str,
) -> tuple[str, bool, Dataset, Dataset | None]:
    """(row format, chat or not, the training rows and the eval rows encoded): the rows as read
    to what the loop reads, for the run and the dry run's ``encoding_note``."""
    fmt = row_format(cfg, train, train_name)
    chat = is_chat(cfg, tokenizer, fmt)
    sets = (train, train_name), (eval_ds, eval_name)
    if chat:
        return fmt, chat, *chat_rows(cfg, tokenizer, source, fmt, *sets)
    return fmt, chat, *text_rows(cfg, tokenizer, fmt, *sets)


def chat_rows(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    fmt: str,
    train: tuple[Dataset, str],
    eval_: tuple[Dataset | None, str],
) -> tuple[Dataset, Dataset | None]:
    """Conversations -> input_ids/attention_mask/labels (assistant turns only), checked row by
    row, encoded once (``encoded.encode``: cached, in parallel on a first run); the training
    rows packed with ``data.packing=on``."""
    from xtrain.data.encoded import encode
    from xtrain.data.packing import pack
    from xtrain.data.rows import text_chat
    from xtrain.data.tokenize import tokenizer_fingerprint
    from xtrain.tasks.common import require_nonempty

    d = cfg.data
    render = chat_render(cfg, tokenizer, source, fmt)
    key = tokenizer_fingerprint(tokenizer)
    out: list[Dataset | None] = []
    for (ds, name), role in ((train, "train"), (eval_, "eval")):
        if ds is None:
            out.append(None)
            continue
        row_formats.chat_columns(ds, d, fmt, name)  # the columns it reads, there
        rows = encode(ds, text_chat.encoding(d, fmt, name, render, tokenizer, key), f"encoding {role}")
        require_nonempty(rows, name, "training" if role == "train" else "eval")
        if d.packing == "on" and role == "train":  # the training rows only, as for text
            rows = pack(rows, d.max_length, "packing train")
        out.append(rows)
    assert out[0] is not None
    return out[0], out[1]


def text_rows(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    fmt: str,
    train: tuple[Dataset, str],
    eval_: tuple[Dataset | None, str],
) -> tuple[Dataset, Dataset | None]:
    """Text or prompt/response rows (alpaca ones without a template) -> input_ids/labels, encoded
    once as chat rows are; the training rows packed with ``data.packing=on`` (eval examples stay
    whole rows, so eval loss and accuracy are per example, comparable with an unpacked run)."""
    from xtrain.data.packing import pack
    from xtrain.data.tokenize import require_columns, tokenize_causal_lm
    from xtrain.tasks.common import require_nonempty, tokenizing

    d = cfg.data
    prompt, response, columns = text_columns(cfg, fmt)
    kwargs = {
        "tokenizer": tokenizer,
        "text_column": d.text_column,
        "prompt_column": prompt,
        "response_column": response,
        "max_length": d.max_length,
        "packing": "concatenate" if d.packing == "concatenate" else "off",
    }
    tokenize = tokenizing(NAME, tokenize_causal_lm, kwargs, d.encode_processes)
    out: list[Dataset | None] = []
    for (ds, name), role in ((train, "train"), (eval_, "eval")):
        if ds is not None:
            if fmt == "alpaca":
                ds = row_formats.alpaca_as_prompt_response(ds, name)
            require_columns(ds, columns, name)
            ds = tokenize(ds, role)
            require_nonempty(ds, name, "training" if role == "train" else "eval")
            if d.packing == "on" and role == "train":
                ds = pack(ds, d.max_length, "packing train")
        out.append(ds)
    assert out[0] is not None
    return out[0], out[1]


def chat_render(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, source: str, fmt: str) -> Render:
    """The chat template's renderer (``data.chat_template`` or the tokenizer's)."""
    from xtrain.data.rows import chat as chat_data

    d = cfg.data
    if d.packing == "concatenate":
        hint = "set data.packing=on (whole conversations packed, kept apart) or off"
        if fmt == "alpaca":
            hint += " (alpaca rows are chat conversations when the tokenizer has a chat template)"
        raise XtrainError("data.packing=concatenate would cut conversations mid-turn", hint)
    template = chat_data.require_template(tokenizer, chat_data.load_template(d.chat_template), source)
    if d.chat_template is not None:
        tokenizer.chat_template = template  # saved with the adapter: predict renders the same way
    return chat_data.renderer(tokenizer, template, d.chat_template, d.chat_template_kwargs)
