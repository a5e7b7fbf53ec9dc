"""``xtrain predict --data FILE`` for a preference result: a causal LM, so it answers a data file as
an SFT result does, in two kinds of file:

- its own pairs (or KTO rows), in every shape preference tuning reads (``data.rows.preference``:
  TRL's prompt/chosen/rejected, conversational or text, the implicit prompt, LLaMA-Factory's alpaca
  and sharegpt shapes): each prompt answered greedily, rendered as training rendered it (the run's
  chat template, a text prompt as a user turn; a plain run's text as it is); the chosen answer is
  the reference (a KTO row's completion when it is desirable), scored by exact match;
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
    if not any(c in ds.column_names for c in PAIR_COLUMNS):
        return prompt_predict.read_text_file(cfg, record)
    return pair_examples(ds, source, bool(record.get("chat")))


def pair_examples(ds: Any, source: str, chat: bool) -> list[Example]:
    """Preference rows as prompts (checked as training checks them: a bad row is one line): a chat
    run's prompt as turns (a text prompt one user turn), a plain run's text as it is."""
    from xtrain.data.rows.preference import read_rows
    from xtrain.tasks.contract import Example
    from xtrain.tasks.predicting import last_user_text

    out = []
    for i, row in enumerate(read_rows(ds, source)):
        prompt = row.prompt
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
        reference = row.chosen if row.rejected is not None or row.desirable else None
        out.append(Example(i, {"input": shown}, feed, reference))
    return out
