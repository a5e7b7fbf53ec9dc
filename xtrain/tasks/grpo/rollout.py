"""GRPO's log-probabilities: the per-token log-probabilities of the completions under the policy,
the old policy or the reference (adapters off), the head run in chunks on the completion's tokens
under the run's chunked loss (``model.chunked_loss``, told through ``Workload.use_chunked_loss``).

The completions themselves come from xtrain's decode loop (``xtrain.model.decoding``: each prompt
encoded once for its group, each completion drawn from its own generator seeded by (seed, step,
data row, sample index)), so a completion does not depend on which other rows share its batch, on
the process count, or on a resume: one micro-batch is generated at a time, the same micro-batches
at any process count (``data.sampler``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from xtrain.model.chunked_loss import LogitMap


def token_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float,
    chunks: tuple[LogitMap, int] | None = None,
) -> torch.Tensor:
    """[N, completion_len] log-probabilities of the sequence's last ``completion_len`` tokens, the
    logits divided by the sampling ``temperature`` (TRL's); positions counted from each row's
    first real token (left padding). With ``chunks`` (the head's logit map, positions a chunk: the
    run's chunked loss) the head runs on the completion's tokens only (``attention_mask`` 1),
    chunk by chunk (``chunked_logps``: no full-vocabulary logits held; 0 at the padding after a
    completion); without, on the completion's positions whole (``logits_to_keep``)."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions}
    if chunks is not None:
        from xtrain.model.chunked_logps import token_logps_call

        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, : input_ids.size(1) - completion_len] = -100
        mapping, rows = chunks
        return token_logps_call(model, inputs, labels, rows, mapping, temperature)[:, -completion_len:]
    logits = model(**inputs, logits_to_keep=completion_len + 1, use_cache=False).logits[:, :-1].float()
    logits = logits / temperature
    targets = input_ids[:, -completion_len:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
