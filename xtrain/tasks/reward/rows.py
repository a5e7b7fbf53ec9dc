"""A reward model's rows: preference pairs in every shape ``xtrain.data.rows.preference`` reads
(TRL's strings, turns or whole conversations, LLaMA-Factory's alpaca and sharegpt shapes), each
answer rendered after its prompt as SFT renders it (the chat template when there is one), cut to
``data.max_length`` after the whole prompt; a pair's margin from ``reward.margin_column`` when the
rows have that column. Encoded once (``encoded.encode``: cached, in parallel on a first run).

Unpaired rows (KTO's ``{prompt, completion, label}``) and pairs without a rejected answer are
refused in one line: a reward model learns from the comparison of two answers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from xtrain.data.rows import preference as rows_
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.encoded import Encoding
    from xtrain.data.rows.preference import Encoder

# Bump when the rows encoded here change what they hold (every cached encoding of them is redone).
VERSION = 1
DEFAULT_MARGIN = "margin"  # reward.margin_column's default: read when the rows have it (TRL's column)


def encoder_of(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, source: str) -> Encoder:
    """Answers rendered as SFT renders them, as the preference task renders them: the chat template
    (``data.chat_template`` or the tokenizer's) when there is one, else prompt and answer as plain
    text (the preference family's module imports causal-lm's predict, which GRPO's reward model
    import would close into a circle)."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows.preference import Encoder
    from xtrain.tasks.text.rows import chat_render

    template = chat_data.load_template(cfg.data.chat_template) or getattr(tokenizer, "chat_template", None)
    render = chat_render(cfg, tokenizer, source, "messages") if template else None
    return Encoder(tokenizer, cfg.data.max_length, render)


def margin_of(cfg: TrainConfig, ds: Dataset, source: str) -> str | None:
    """The column each pair's margin is read from: ``reward.margin_column`` when the rows have it;
    a column the user named that the rows lack is one line (the default is read only where it is);
    None (``reward.margin_column: null``): no margin, whatever the rows hold."""
    column = cfg.reward.margin_column
    if column is None or column in ds.column_names:
        return column
    if column != DEFAULT_MARGIN:
        raise XtrainError(
            f"reward.margin_column: {source} has no column '{column}' (its columns: "
            f"{', '.join(ds.column_names)})",
            "name the column that holds each pair's margin, or leave reward.margin_column unset",
        )
    return None


def check_paired(ds: Dataset, source: str) -> None:
    """Row 0 read in its shape: unpaired KTO rows are one line (a pair without its rejected answer
    is ``read_row``'s own line, naming the row)."""
    first = rows_.read_row(dict(ds[0]), 0, source)
    if first.rejected is None:
        raise XtrainError(
            f"{source} holds unpaired {{prompt, completion, label}} rows: a reward model learns from "
            "pairs of a chosen and a rejected answer",
            "give {prompt, chosen, rejected} rows (docs/reward-models.md#data)",
        )


def encoding(
    ds: Dataset,
    source: str,
    encoder: Encoder,
    margin: str | None,
    tokenizer_key: str,
    processes: int | None = None,
) -> Encoding:
    """How ``encoded.encode`` makes the rows of ``ds``: ``columns`` a map batch at a time, cached
    under the encoder's settings (``tokenizer_key``: the tokenizer's fingerprint) and the margin
    column."""
    from xtrain.data.encoded import Encoding
    from xtrain.data.rows.render import template_of

    check_paired(ds, source)
    first = rows_.read_row(dict(ds[0]), 0, source)
    template = template_of(encoder.render) if encoder.render is not None else None
    key = ("reward rows", VERSION, rows_.VERSION, encoder.max_length, template, tokenizer_key, margin)
    kwargs = {"encoder": encoder, "source": source, "first": first, "margin": margin}
    return Encoding("reward rows", columns, kwargs, key, processes=processes)


def columns(
    batch: dict[str, list[Any]],
    indices: list[int],
    encoder: Encoder,
    source: str,
    first: rows_.PreferenceRow,
    margin: str | None,
) -> dict[str, list[Any]]:
    """A map batch of pairs -> ``{chosen_input_ids, chosen_labels, rejected_input_ids,
    rejected_labels}`` (the preference task's paired rows: ``PreferenceCollator`` batches them)
    and ``margin`` (a float a pair) when the rows have one (top-level: it runs in the encoding
    processes)."""
    out = rows_.columns(batch, indices, encoder, source, first, False, None)  # type: ignore[arg-type]
    if margin is not None and out:
        out["margin"] = [_number(batch[margin][k], margin, i, source) for k, i in enumerate(indices)]
    return out


def _number(value: Any, column: str, index: int, source: str) -> float:
    """A pair's margin: a finite number (not a boolean, not empty)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise rows_.BadPreferenceRow(
            f"row {index} of {source}: field '{column}' is {value!r:.40}, not a number (a pair's margin)"
        )
    return float(value)
