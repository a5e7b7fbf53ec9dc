"""GRPO's log-probabilities: the per-token log-probabilities of the completions under the policy,
the old policy or the reference (adapters off).

- **A group's prompt once**: the ``group`` completions of a prompt share it, so the prompt goes
  through the model once (its keys and values, gradients and all, expanded to the group in the
  cache, as generation expands them) and only the completions' tokens after it
  (``_shared_prompt``): the same function of the weights as every row's whole sequence (up to
  float rounding), at a fraction of the tokens when prompts are long. Where the model's cache is
  not one of plain full-attention layers, under gradient checkpointing (which turns the cache off)
  or DeepSpeed (whose ZeRO-3 hooks trace one forward a backward) each row runs whole.
- **The head in chunks** on the completion's tokens only under the run's chunked loss
  (``model.chunked_loss``, told through ``Workload.use_chunked_loss``): no full-vocabulary
  logits held (``chunked_logps``).

The completions themselves come from xtrain's decode loop (``xtrain.model.decoding``: each prompt
encoded once for its group, each completion drawn from its own generator seeded by (seed, step,
data row, sample index)), so a completion does not depend on which other rows share its batch, on
the process count, or on a resume: one micro-batch is generated at a time, the same micro-batches
at any process count (``data.sampler``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from xtrain.model.chunked_loss import LogitMap

_WHOLE_ROWS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # models whose cache cannot be shared


def token_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float,
    chunks: tuple[LogitMap, int] | None = None,
    group: int = 1,
) -> torch.Tensor:
    """[N, completion_len] log-probabilities of the sequence's last ``completion_len`` tokens, the
    logits divided by the sampling ``temperature`` (TRL's); positions counted from each row's
    first real token (left padding). ``group``: consecutive rows that share their prompt (row
    ``b * group + k``), encoded once. With ``chunks`` (the head's logit map, positions a chunk) the
    head runs on the completion's tokens only (``attention_mask`` 1), chunk by chunk (0 at the
    padding after a completion); without, on the completion's positions whole."""
    if group > 1 and _shares_prompts(model):
        found = _shared_prompt(model, input_ids, attention_mask, completion_len, temperature, chunks, group)
        if found is not None:
            return found
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


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_torch_compile=False)


def _shares_prompts(model: torch.nn.Module) -> bool:
    inner = _unwrapped(model)
    if inner in _WHOLE_ROWS:
        return False
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in inner.modules())
    return not checkpointing and not any(hasattr(p, "ds_id") for p in inner.parameters())


def _shared_prompt(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int,
    temperature: float, chunks: tuple[LogitMap, int] | None, group: int,
) -> torch.Tensor | None:  # fmt: skip
    """``token_logps`` with each group's prompt through the model once: the prompts' forward (the
    model unwrapped: one data-parallel forward a backward, the completions') keeps their cache and
    the logits of their last position (the first completion token's); the cache expanded to the
    group, the completions' forward continues it. None where the cache is not plain full
    attention (the model is then remembered and runs whole rows)."""
    from xtrain.model.decoding import CacheCall

    inner = _unwrapped(model)
    call = CacheCall.of(inner)
    P = input_ids.size(1) - width
    prompt, prompt_mask = input_ids[::group, :P], attention_mask[::group, :P]
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    keep = {"logits_to_keep": 1} if call.keep_last else {}
    out = inner(input_ids=prompt, attention_mask=prompt_mask, position_ids=positions, use_cache=True, **keep)
    cache = getattr(out, "cache", None) or out.past_key_values
    if not getattr(cache, "layers", None) or any(type(x).__name__ != "DynamicLayer" for x in cache.layers):
        _WHOLE_ROWS.add(inner)
        return None
    cache.batch_repeat_interleave(group)
    completion, mask = input_ids[:, P:], attention_mask[:, P:]
    first = torch.log_softmax(out.logits[:, -1].float() / temperature, -1).repeat_interleave(group, 0)
    first = first.gather(1, completion[:, :1])  # [N, 1]: the first token, from the prompt's last position
    inputs = {
        "input_ids": completion, "attention_mask": attention_mask, "use_cache": True, call.cache_key: cache,
        "position_ids": positions[:, -1:].repeat_interleave(group, 0) + mask.cumsum(-1),
    }  # fmt: skip
    if chunks is not None:
        from xtrain.model.chunked_logps import token_logps_call

        mapping, rows = chunks
        labels = completion.masked_fill(mask == 0, -100)
        rest = token_logps_call(model, inputs, labels, rows, mapping, temperature)[:, 1:]
    else:
        logits = model(**inputs).logits[:, :-1].float() / temperature
        rest = torch.log_softmax(logits, dim=-1).gather(-1, completion[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([first, rest], 1)
