"""GRPO's generation and log-probabilities: completions sampled with the model's own ``generate``
(its KV cache, LoRA adapters on, no merge, under the run's autocast and sharding), and the
per-token log-probabilities of those completions under the policy, the old policy or the
reference (adapters off).

Sampling is seeded per completion: the ``SeededSampling`` logits processor draws each row's next
token from that row's own generator, seeded by (seed, step, data row, sample index), and leaves
``generate`` only that token to pick (greedy over one finite score). So a completion does not
depend on which other rows share its batch, on the process count, or on a resume: one micro-batch
is generated at a time, the same micro-batches at any process count (``data.sampler``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Sequence


class SeededSampling:
    """A ``LogitsProcessor``: per row, temperature and top-p, then one token drawn from the row's
    own generator; every other token's score set to -inf (``generate`` runs greedily on it)."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, device: torch.device) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = top_p_filter(probs, self.top_p)
        picked = torch.stack(
            [torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(self.generators)]
        )
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, picked.unsqueeze(1), 0.0)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest set of most likely tokens whose probability reaches ``top_p`` (at least one),
    renormalised (HF's ``TopPLogitsWarper``'s set)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above
    keep_sorted = before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


@dataclass
class Completions:
    """One micro-batch's completions: token ids, which tokens count (up to and with the first end
    token), and which ran to the limit without one (truncated)."""

    ids: torch.Tensor  # [N, L] (padding after the end token)
    mask: torch.Tensor  # [N, L] 1 for the completion's tokens
    truncated: torch.Tensor  # [N] bool


def completion_mask(ids: torch.Tensor, eos: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, L] mask through the first end token, [N] no end token) of generated ``ids``."""
    is_end = torch.isin(ids, torch.tensor(list(eos), device=ids.device))
    has_end = is_end.any(dim=1)
    first = torch.where(
        has_end, is_end.int().argmax(dim=1), torch.full_like(has_end, ids.size(1), dtype=torch.long)
    )
    positions = torch.arange(ids.size(1), device=ids.device).unsqueeze(0)
    return (positions <= first.unsqueeze(1)).long(), ~has_end


def generate(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    pad_id: int,
    eos: Sequence[int],
    sampling: SeededSampling | None,
    **more: object,
) -> Completions:
    """``model.generate`` on left-padded prompts: sampled by ``sampling``, greedy without it."""
    from transformers import LogitsProcessorList

    processors = LogitsProcessorList([sampling] if sampling is not None else [])
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=max_new_tokens,
            do_sample=False, num_beams=1, logits_processor=processors, pad_token_id=pad_id,
            eos_token_id=list(eos), temperature=None, top_p=None, top_k=None, **more,
        )  # fmt: skip
    ids = out[:, prompt_ids.size(1) :]
    mask, truncated = completion_mask(ids, eos)
    ids = ids.masked_fill(mask == 0, pad_id)
    return Completions(ids, mask, truncated)


def token_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float,
) -> torch.Tensor:
    """[N, completion_len] log-probabilities of the sequence's last ``completion_len`` tokens, the
    logits divided by the sampling ``temperature`` (TRL's), only the completion's logits computed
    (``logits_to_keep``); positions counted from each row's first real token (left padding)."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
        logits_to_keep=completion_len + 1, use_cache=False,
    ).logits[:, :-1].float()  # fmt: skip
    logits = logits / temperature
    targets = input_ids[:, -completion_len:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
