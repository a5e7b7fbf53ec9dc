"""causal-lm's chat rows (``messages``, sharegpt, alpaca under a template, agent rows with tools)
encoded a map batch at a time, the ``Encoding`` the task hands to ``encoded.encode``: each row
read in its format (``formats.text_chat_turns``), checked (``tools.parse_text``: tools, calls,
results, reasoning), rendered and labelled with the batch's renders in as few template calls as
they allow (``chat.encode_many``), cut to ``data.max_length``; a row whose answers all lie past
the cut is dropped (as causal-lm's text rows are)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.encoded import Encoding, token_features
from xtrain.data.rows import formats
from xtrain.data.rows.chat import encode_many
from xtrain.data.rows.render import template_of
from xtrain.data.rows.tools import parse_text, read_tools, tools_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import DataConfig
    from xtrain.data.rows.chat import Conversation, Render

# Bump when these rows change what they hold (every cached encoding of chat rows is redone).
VERSION = 2
# The data.* settings the rows depend on (with the template, the tokenizer and the shared tools)
SETTINGS = ("messages_column", "images_column", "tools_column", "role_tag", "content_tag", "user_tag",
            "assistant_tag", "system_tag", "train_on", "max_length")  # fmt: skip


def encoding(
    d: DataConfig,
    fmt: str,
    source: str,
    render: Render,
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_key: str,
) -> Encoding:
    """The rows of ``source`` (in row format ``fmt``) as input_ids and labels (the attention mask:
    ``collate.PadCollator(masks=True)``);
    ``tokenizer_key``: the tokenizer's fingerprint (``tokenize.tokenizer_fingerprint``)."""
    shared = tools_file(d.tools)
    kwargs = {
        "d": d,
        "fmt": fmt,
        "source": source,
        "render": render,
        "tokenizer": tokenizer,
        "shared": shared,
    }
    settings = {name: getattr(d, name) for name in SETTINGS}
    key = ("causal-lm chat", VERSION, fmt, settings, shared, template_of(render), tokenizer_key)
    features = token_features(input_ids="int32", labels="int32")
    return Encoding("chat rows", columns, kwargs, key, features, processes=d.encode_processes)


def conversation(
    d: DataConfig, fmt: str, row: dict[str, Any], index: int, source: str, shared: list[dict[str, Any]] | None
) -> Conversation:
    """Row ``index`` of ``source`` checked: its turns in the format, its tools (its
    ``data.tools_column`` cell, else the ``data.tools`` file's ``shared``)."""
    turns = formats.text_chat_turns(d, fmt, row, index, source)
    tools = shared
    if d.tools_column in row:
        tools = read_tools(row[d.tools_column], f"row {index} of {source}", d.tools_column) or shared
    return parse_text(turns, index, source, tools)


def columns(
    batch: dict[str, list[Any]],
    indices: list[int],
    d: DataConfig,
    fmt: str,
    source: str,
    render: Render,
    tokenizer: PreTrainedTokenizerBase,
    shared: list[dict[str, Any]] | None,
) -> dict[str, list[list[int]]]:
    """A map batch of rows -> their input_ids and labels (top-level: it runs in the encoding
    processes)."""
    names = list(batch)
    convs = [
        conversation(d, fmt, {name: batch[name][k] for name in names}, index, source, shared)
        for k, index in enumerate(indices)
    ]
    wheres = [f"row {index} of {source}" for index in indices]
    out: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
    for enc in encode_many(render, tokenizer, convs, wheres, train_on=d.train_on):
        ids, labels = enc.input_ids[: d.max_length], enc.labels[: d.max_length]
        if all(t == IGNORE_INDEX for t in labels[1:]):  # the model shifts: position 0 never counts
            continue
        out["input_ids"].append(ids)  # (no attention mask: all ones, the collator makes it)
        out["labels"].append(labels)
    return out
