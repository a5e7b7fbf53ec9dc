"""A step's loss, defined once: the sum of its token losses over the trained tokens of the whole
step (every micro-batch, every process), and the mean of its sequence losses over the step's
sequences. So any split of the global batch (per-device x accumulation x processes) gives the same
gradient, as HF Trainer's ``num_items_in_batch`` with ``average_tokens_across_devices`` (on by
default in transformers 5) gives it for the models whose forward takes that count; here it holds
for every model, Whisper's and ``VisionEncoderDecoderModel``'s own mean losses included.

What a micro-batch's loss is, the task says through the contract (``Task.token_loss``,
``Workload.trained_tokens``):

- per token (``next-token``: causal-lm and chat, vision-language; ``decoder``: image-to-text,
  speech-to-text): the model's ``.loss``, its own or the chunked one, is the mean over the
  micro-batch's trained tokens. Those are counted here on the host, from the collated CPU batch:
  its labels that are not -100, after the shift of a next-token loss (position t predicts label
  t + 1, so a row's first label is never a target: transformers' ``ForCausalLMLoss`` and the chunked
  loss count the same; a packed row's examples each start at a -100 label). The micro-batch's token
  sum is that mean times its count; a micro-batch without trained tokens adds 0 (its mean is 0/0).
- per sequence (preference losses, seq-cls, image classification, a custom task's ``.loss``): the
  mean over the micro-batch's sequences. Every micro-batch holds ``batch.per_device`` rows (the data
  order), so their mean over the step's micro-batches is the mean over the step's sequences. GRPO's
  loss is already normalised over the step (``tasks/grpo/loss.py``) and is averaged the same way.
- both: a forward's ``token_sum`` beside its ``.loss`` (``preference.sft_weight``: the chosen
  answers' NLL, over the tokens ``Workload.trained_tokens`` counts).

The step's trained tokens are summed over the processes by one all-reduce of one number a step,
on the CPU (the stop group: gloo beside NCCL), before the first forward: no device sync.

The backward: accelerate's ``backward`` divides a loss by the accumulation A (DeepSpeed's engine
does under DeepSpeed), and DDP, FSDP2, ZeRO and the CPU-staged all-reduce average the W processes'
gradients; fp16's loss scale multiplies and is divided out again. So each micro-batch back-propagates
its share of the step's loss times A x W: ``mean + token_sum x A x W / N`` for N trained tokens in
the step, and the gradient is the step's loss's whatever A and W are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.collate import IGNORE_INDEX

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from xtrain.tasks.contract import Batch, TrainedTokensFn

# Task.token_loss values whose model loss is a mean over trained tokens -> the labels' shift
SHIFTS = {"next-token": 1, "decoder": 0}


def labelled_tokens(batch: Batch, shift: int) -> int:
    """A micro-batch's trained tokens: its labels that are not -100 from position ``shift`` on
    (1: a next-token loss, whose first label per row is never predicted); a batch whose labels are
    shifted already (``shift_labels``: a sequence shard, xtrain/data/sequence_shards.py) all of
    them. On the host tensors."""
    shifted = batch.get("shift_labels")
    if shifted is not None:
        return int((shifted != IGNORE_INDEX).sum())
    labels = batch["labels"]
    return int((labels[..., shift:] != IGNORE_INDEX).sum())


@dataclass(frozen=True)
class StepLoss:
    """How this run's micro-batch losses make its step's loss (the module docstring)."""

    micro_batches: int  # per step, over every process: A x W
    world: int = 1
    group: ProcessGroup | None = None  # where the count is summed (None: the default group)
    count: TrainedTokensFn | None = None  # a collated micro-batch's trained tokens; None: no token loss
    token_mean: bool = False  # ``.loss`` is the mean over those tokens (the model's own loss)

    @classmethod
    def of(
        cls,
        token_loss: str | None,
        trained_tokens: TrainedTokensFn | None,
        accumulation: int,
        world: int,
        group: ProcessGroup | None,
    ) -> StepLoss:
        """The step's loss of a task whose ``Task.token_loss`` and ``Workload.trained_tokens`` are
        these, trained with ``accumulation`` micro-batches on each of ``world`` processes."""
        common = {"micro_batches": accumulation * world, "world": world, "group": group}
        if trained_tokens is not None:  # a token term beside a sequence loss (its ``token_sum``)
            return cls(**common, count=trained_tokens)
        if token_loss in SHIFTS:
            return cls(**common, count=partial(labelled_tokens, shift=SHIFTS[token_loss]), token_mean=True)
        return cls(**common)

    def tokens(self, batches: Sequence[Batch]) -> tuple[list[int], int]:
        """(each of this process's micro-batches' trained tokens, the step's over every process):
        counted on the host, summed by one all-reduce of one number on the CPU."""
        if self.count is None:
            return [0] * len(batches), 0
        counts = [self.count(b) for b in batches]
        total = sum(counts)
        if self.world > 1:
            import torch.distributed as dist

            summed = torch.tensor([total], dtype=torch.int64)
            dist.all_reduce(summed, group=self.group)
            total = int(summed.item())
        return counts, total

    def micro(self, out: Any, count: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the loop back-propagates for a micro-batch's output ``out``, the micro-batch's
        share of the step's loss, detached) for its ``count`` of the step's ``total`` trained
        tokens (``tokens``)."""
        loss: torch.Tensor = out.loss
        if self.token_mean:
            mean = None
            # no trained token: its mean is 0/0; its gradient stays 0 (nan_to_num passes none)
            token_sum = loss * count if count else loss.nan_to_num(0.0) * 0.0
        else:
            mean, token_sum = loss, getattr(out, "token_sum", None)
        if token_sum is None:
            assert mean is not None
            return mean, mean.detach().float() / self.micro_batches
        tokens = max(total, 1)  # none in the whole step: every token sum is 0
        backward = token_sum * (self.micro_batches / tokens)
        share = token_sum.detach().float() / tokens
        if mean is not None:
            backward = mean + backward
            share = share + mean.detach().float() / self.micro_batches
        return backward, share
