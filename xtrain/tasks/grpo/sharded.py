"""Sequence parallelism (``parallel.sequence``, docs/long-context.md) for the tasks whose step makes
the sequences it trains: GRPO's rollout and distillation's completions (``Workload.cuts_sequences``:
the loader's prompts stay whole, the step cuts what it completed).

- **Generation whole, once a group.** Every process of a sequence-parallel group reads the same
  prompts (its data-parallel rank's); the group's first rank alone generates their completions on
  the model's own attention over whole sequences (``sequence_parallel.whole_attention``) and scores
  them (reward functions and tools run once, as without sequence parallelism), and
  ``same_in_group`` hands its completions and rewards to the others (``generates``: one broadcast
  over the group), so the group trains on one set of episodes.
- **The step's numbers once a group.** The step's one gather brings every process's rows, a group's
  N times: ``distinct`` keeps its first rank's, numbered by data-parallel rank, so the advantages,
  the token counts and the statistics are those of the data-parallel run.
- **The forward on the shard.** ``cut``: the completed rows aligned left and cut
  (``sequence_shards.cut_completed``: labels shifted first, global positions), ``token_logps``: each
  trained token's log-probability on the shard that predicts it. A token loss summed over a shard is
  that shard's part of the step's sum; each of the group's N processes back-propagates its part
  times N, because DDP averages over all W = N x D processes where the data-parallel run averages
  over D (``SCALE``'s use in the steps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.sequence_shards import KEY, cut_completed

if TYPE_CHECKING:
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.model.shard_exchange import Exchange

CUT = "sequence_cut"  # the batch key of a completed micro-batch's shard (``cut``)
# what a rollout puts in a micro-batch, made the same in a group (``same_in_group``)
ROLLED = ("input_ids", "attention_mask", "completion_mask", "loss_mask", "truncated", "episode_stats")


def generates(ex: Exchange | None) -> bool:
    """Whether this process makes its micro-batches' completions (without sequence parallelism,
    every process; with it, a group's first rank: ``same_in_group`` hands them to the others)."""
    return ex is None or ex.rank == 0


def same_in_group(
    ex: Exchange, batch: dict[str, Any], keys: tuple[str, ...], extra: torch.Tensor | None
) -> torch.Tensor:
    """``batch[keys]`` and ``extra`` (a rollout's rewards) as the group's first rank made them
    (the others made none: ``generates``), on every rank of the group, in place; returns
    ``extra``'s."""
    sent = {k: batch[k] for k in keys if k in batch}
    found = ex.broadcast(sent if extra is None else {**sent, "_extra": extra}, batch["input_ids"].device)
    extra = found.pop("_extra")
    batch.update(found)
    return extra


def distinct(everything: torch.Tensor, size: int, rank_column: int = 1) -> torch.Tensor:
    """The rows of a step's gather (each process's, its rank in ``rank_column``) from the first
    rank of each sequence-parallel group of ``size``, that rank renumbered as its group (the
    data-parallel rank)."""
    ranks = everything[:, rank_column]
    kept = everything[(ranks.long() % size) == 0].clone()
    kept[:, rank_column] = torch.div(kept[:, rank_column], size, rounding_mode="floor")
    return kept


def cut(ex: Exchange, input_ids: torch.Tensor, attention_mask: torch.Tensor, trained: torch.Tensor) -> dict:
    """This process's shard of completed rows whose last ``trained.size(1)`` positions are the
    completions, ``trained`` 1 at the tokens that train (their log-probs read): the model's inputs
    with ``Shards`` and the shifted labels (``shift_labels``: each at the position that predicts it)."""
    prompt = input_ids.size(1) - trained.size(1)
    trained = torch.cat([trained.new_zeros(trained.size(0), prompt), trained], dim=1)
    labels = input_ids.masked_fill(trained == 0, IGNORE_INDEX)
    return cut_completed(input_ids, attention_mask, labels, ex.size, ex.rank)


def keep(batch: dict[str, Any], shard: dict[str, Any]) -> None:
    """``shard`` in ``batch`` for the forward, and its ``Shards`` at the top (the loop counts a
    shard's own real tokens for tokens/s: ``collate.batch_tokens``)."""
    batch[CUT], batch[KEY] = shard, shard[KEY]


def model_inputs(shard: dict[str, Any]) -> dict[str, Any]:
    return {k: shard[k] for k in ("input_ids", "attention_mask", "position_ids", KEY, "use_cache")}


def token_logps(
    model: torch.nn.Module, shard: dict[str, Any], temperature: float, chunks: tuple[LogitMap, int] | None
) -> torch.Tensor:
    """[rows, local] float32: at each position of the shard whose shifted label trains, that
    token's log-probability (logits over ``temperature``); 0 elsewhere. With ``chunks`` the head
    runs on those positions only, in chunks (``chunked_logps``)."""
    labels = shard["shift_labels"]
    if chunks is not None:
        from xtrain.model.chunked_logps import token_logps_call

        mapping, rows = chunks
        return token_logps_call(model, model_inputs(shard), labels, rows, mapping, temperature, shifted=True)
    logits = model(**model_inputs(shard)).logits.float() / temperature
    at = labels.clamp(min=0).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, at).squeeze(-1) * (labels != IGNORE_INDEX)


def trained_mask(shard: dict[str, Any]) -> torch.Tensor:
    """[rows, local] 1 where the shard's position predicts a trained token."""
    return (shard["shift_labels"] != IGNORE_INDEX).long()


def group_sums(shard: dict[str, Any], *values: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``values`` (detached numbers of this shard) summed over the group's shards (the
    metrics a user reads: the step's, not a shard's)."""
    from xtrain.model.shard_exchange import shard_total

    with torch.no_grad():
        summed = shard_total(torch.stack([v.detach().float().reshape(()) for v in values]), shard[KEY])
    return list(summed.unbind())
