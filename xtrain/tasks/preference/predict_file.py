"""``xtrain predict --data FILE`` for a preference result: a causal LM, so it answers a data file as
an SFT result does, in two kinds of file:

- its own pairs (or KTO rows), in every shape preference tuning reads (``data.rows.preference``:
  TRL's prompt/chosen/rejected, conversational or text, the implicit prompt, LLaMA-Factory's alpaca
  and sharegpt shapes): each prompt answered greedily, rendered as training rendered it (the run's
  chat template, a text prompt as a user turn; a plain run's text as it is); the chosen answer is
  the reference (a KTO row's completion when it is desirable), scored by exact match;
- a file of ``prompt`` alone (text or turns, as pairs hold it): each prompt answered, no reference;
- chat rows and prompt rows (messages, sharegpt, prompt/response, alpaca, text): causal-lm's own
  reader (``prompt_predict.read_text_file``), the row format found in the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.contract import Example

PAIR_COLUMNS = ("chosen", "completion")  # a column only preference data has (paired; KTO)


def read_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """The file's rows as prompts with their references (see the module's docstring)."""
    from xtrain.tasks import prompt_predict
    from xtrain.tasks.predicting import load_file

    ds, source, _ = load_file(cfg)
    columns = set(ds.column_names)
    if columns & set(PAIR_COLUMNS):
        return pair_examples(ds, source, bool(record.get("chat")))
    if "prompt" in columns and "response" not in columns:  # its prompts alone: answered, no reference
        return prompt_examples(ds, source, bool(record.get("chat")))
    return prompt_predict.read_text_file(cfg, record)


def pair_examples(ds: Any, source: str, chat: bool) -> list[Example]:
    """Preference rows as prompts (checked as training checks them: a bad row is one line), the
    chosen answer (a desirable KTO completion) the reference."""
    from xtrain.data.rows.preference import read_rows

    out = []
    for i, row in enumerate(read_rows(ds, source)):
        reference = row.chosen if row.rejected is not None or row.desirable else None
        out.append(_example(i, row.prompt, source, chat, reference))
    return out


def prompt_examples(ds: Any, source: str, chat: bool) -> list[Example]:
    """Rows of a ``prompt`` alone (text or turns, as pairs hold it): answered, without a reference."""
    from xtrain.data.rows.preference import BadPreferenceRow

    out = []
    for i, cell in enumerate(ds["prompt"]):
        if not (isinstance(cell, str) and cell.strip()) and not (isinstance(cell, list) and cell):
            raise BadPreferenceRow(
                f"row {i} of {source}: field 'prompt' is missing, empty, or neither text nor turns"
            )
        out.append(_example(i, cell, source, chat, None))
    return out


def _example(i: int, prompt: Any, source: str, chat: bool, reference: str | None) -> Example:
    """One prompt as the run renders it: a chat run's prompt as turns (a text prompt one user turn),
    a plain run's text as it is."""
    from xtrain.tasks.contract import Example
    from xtrain.tasks.predicting import last_user_text

    if chat:
        feed: Any = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        shown = prompt if isinstance(prompt, str) else last_user_text(prompt)
    elif isinstance(prompt, str):
        feed, shown = prompt, prompt
    else:
        raise XtrainError(
            f"row {i} of {source}: its prompt is a conversation, and the run has no chat template",
            "give text prompts, as the run trained on",
        )
    return Example(i, {"input": shown}, feed, reference)
