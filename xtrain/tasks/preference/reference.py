"""The preference task's forward (``Workload.forward``) and its reference model.

One forward of the policy over the micro-batch's 2B sequences (chosen then rejected, or KTO's
completions then their KL mismatches) gives each sequence's summed answer log-probability; the
reference's come from, in this order:

- the batch itself (``ref_first``/``ref_second``): ``preference.precompute_reference``, computed
  once before training, each process its share (``precompute``), and stored under
  ``run.output_dir`` named by the data's fingerprint, so a resumed run or one with another
  process count reads the same numbers;
- a frozen copy of the model (a full fine-tune: the weights that train cannot be the reference);
- the policy itself as the stage started, under ``no_grad``: no second copy in memory. On a base
  model that is its LoRA adapter switched off (peft's ``disable_adapter``); on a trained result
  (``model.chain``) its earlier adapters stay on: the new adapter alone is off, or a continued
  adapter is swapped for its frozen copy where it started (``chain.reference``).

ORPO and SimPO read no reference. The SFT term (``preference.sft_weight``) reads the chosen
answers' summed log-probs and token counts of the same forward: no extra pass, and the chunked
path's log-probs serve it as they serve the preference loss. In training it is the output's
``token_sum`` (the loop divides it by the step's chosen tokens: xtrain/train/step_loss.py); in an
evaluation each pair's share of the batch's term (``losses.sft_shares``). Dropout is off
in the whole model (``no_dropout``, TRL's default): the reference is then the same function whether
computed now or before training.

KTO's KL estimate in training spans the step's whole global batch (``step_start``, the loop's
``Workload.step_start``): before the step's first forward, the policy and the reference read the
mismatched completions of every micro-batch of this process's share, without gradients, and one
gather sums every process's; the step's forwards then run the B completions alone against that
estimate. So the estimate is the same for any process count and accumulation (TRL averages it
over the processes' micro-batches only), and the forward with gradients holds half the sequences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from xtrain.data.sequence_shards import KEY as SHARDS
from xtrain.model import chain
from xtrain.model.shard_exchange import shard_total
from xtrain.tasks.preference import losses as pl

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xtrain.data.sequence_shards import Shards
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.planning.run import Run

Autocast = Callable[[], contextlib.AbstractContextManager]
Batch = dict[str, torch.Tensor]
Gather = Callable[[torch.Tensor], torch.Tensor]  # every process's tensors, concatenated (dim 0)


@dataclass
class PreferenceOutput:
    """What the loop reads off a preference forward: the loss to back-propagate, the micro-batch's
    summed statistics for the logging window (``losses.sums``: ``losses.window_metrics`` reduces
    a window's), and the per-example statistics the evaluation gathers."""

    loss: torch.Tensor  # the mean over the micro-batch's sequences
    stats: dict[str, torch.Tensor]
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    token_sum: torch.Tensor | None = None  # training: the SFT term's sum over the chosen tokens


def autocast_for(run: Run) -> Autocast:
    """The autocast the loop's Accelerator runs the policy under, for the reference computed
    outside it (a frozen copy, the precomputed pass): the same precision on both sides."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=run.device_type, dtype=dtype)


def no_dropout(model: torch.nn.Module) -> None:
    """Every dropout of the model (LoRA's included) off, and attention dropout read off modules."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


# batch keys that are not the model's inputs (the rest: input ids, mask, a VLM's pixel values)
NOT_INPUTS = ("labels", "shift_labels", "ref_first", "ref_second", "desirable")
PER_ROW = ("ref_first", "ref_second", "desirable")  # [B], one value a row, not a sequence


def model_inputs(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k not in NOT_INPUTS}


def part(batch: Mapping[str, torch.Tensor], which: int) -> dict[str, torch.Tensor]:
    """The first (``which=0``: chosen, KTO's completions) or second half of a batch's 2B sequences,
    with the rows' own values (a text batch: every sequence tensor has 2B rows)."""
    n = len(batch["input_ids"]) // 2
    whole = (*PER_ROW, "use_cache")  # (a sequence shard's flag; its ``Shards`` cut by rows too)
    return {k: v if k in whole else v[which * n : (which + 1) * n] for k, v in batch.items()}


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model)


class PreferenceForward:
    """``Workload.forward`` of the preference task: policy log-probs, the reference's, the loss.

    With ``chunked`` set (``use_chunked_loss``: the run's ``model.chunked_loss``, by the loop's
    levers) a training forward runs the output head on the labelled positions only, in chunks
    recomputed in the backward (``chunked_logps.chunked_sequence_logps``); an evaluation runs the
    model's full logits."""

    def __init__(
        self,
        settings: pl.LossSettings,
        reference: torch.nn.Module | None = None,
        autocast: Autocast | None = None,
    ) -> None:
        self.settings = settings
        self.reference = reference  # a frozen copy (full fine-tune); None: adapters off, or none needed
        self.autocast = autocast or contextlib.nullcontext
        self.step_kl: torch.Tensor | None = None  # KTO: the estimate of the step in training
        self.chunked: tuple[LogitMap, int] | None = None  # (the head's logit map, positions a chunk)

    def use_chunked_loss(self, mapping: LogitMap, rows: int) -> None:
        """``Workload.use_chunked_loss``: the head on the trained tokens only, ``rows`` at a time."""
        self.chunked = (mapping, rows)

    def logps(
        self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor], training: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed log-probs of each sequence's labelled tokens, their count) under ``model``; a
        sequence shard's (``parallel.sequence``: labels shifted before the cut) summed over the
        shards of its sequences."""
        inputs, labels = model_inputs(batch), batch["labels"]
        shards = batch.get(SHARDS)
        if self.chunked is not None and training:
            from xtrain.model.chunked_logps import sequence_logps_call

            sums, counts = sequence_logps_call(
                model, inputs, labels, self.chunked[1], self.chunked[0], shifted=shards is not None
            )
        else:
            logits = model(**{**inputs, "use_cache": False}).logits
            sums, counts = pl.sequence_logps(logits, labels, shifted=shards is not None)
        return shard_total(sums, shards), shard_total(counts, shards)

    def step_start(self, model: torch.nn.Module, micro_batches: list[Batch], gather: Gather) -> None:
        """``Workload.step_start`` (KTO): the KL estimate over the step's global batch, from this
        process's micro-batches and one ``gather`` (every process's sums; the Accelerator's)."""
        totals = []
        with torch.no_grad():
            for batch in micro_batches:
                mismatched = part(batch, 1)
                pol = self.logps(model, mismatched, model.training)[0].float()
                if "ref_second" in batch:
                    ref = batch["ref_second"].to(pol)
                else:
                    ref = self.reference_logps(model, mismatched).float()
                count = torch.full((), float(len(pol)), device=pol.device)
                totals.append(torch.stack([(pol - ref).sum(), count]))
            summed = gather(torch.stack(totals).sum(0, keepdim=True)).sum(0)
        self.step_kl = (summed[0] / summed[1]).clamp(min=0)

    def reference_logps(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The reference's summed log-probs of the batch's sequences, without gradients (chunked
        as the policy's when the policy is training)."""
        with torch.no_grad():
            if self.reference is not None:
                with self.autocast():
                    return self.logps(self.reference, batch, model.training)[0]
            inner = _unwrapped(model)
            with chain.reference(inner):  # the stage's start: the base, or its earlier adapters
                return self.logps(inner, batch, model.training)[0]

    def __call__(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> PreferenceOutput:
        s = self.settings
        if s.loss in pl.UNPAIRED and self.step_kl is not None and model.training:
            return self._kto_in_step(model, batch, self.step_kl)
        logps, counts = self.logps(model, batch, model.training)
        ref = None
        if pl.needs_reference(s.loss):
            if "ref_first" in batch:
                ref = torch.cat([batch["ref_first"], batch["ref_second"]]).to(logps.device)
            else:
                ref = self.reference_logps(model, batch)
        s = self._losses(model.training)
        if s.loss in pl.UNPAIRED:
            assert ref is not None
            stats = pl.kto_loss(s, logps, ref, batch["desirable"], counts=counts)
        else:
            stats = pl.paired_loss(s, logps, counts, ref)
        return self._output(stats, model.training, batch.get(SHARDS))

    def _kto_in_step(self, model: torch.nn.Module, batch: Batch, kl: torch.Tensor) -> PreferenceOutput:
        """KTO in a training step: the B completions alone, against the step's KL estimate (an
        evaluation, or a forward outside the loop, estimates it from its own micro-batch)."""
        completions = part(batch, 0)
        logps, counts = self.logps(model, completions, model.training)
        if "ref_first" in batch:
            ref = batch["ref_first"].to(logps.device)
        else:
            ref = self.reference_logps(model, completions)
        s = self._losses(training=True)
        stats = pl.kto_loss(s, logps, ref, batch["desirable"], kl.to(logps.device), counts)
        return self._output(stats, training=True, shards=batch.get(SHARDS))

    def _losses(self, training: bool) -> pl.LossSettings:
        """The loss's settings: in training without the SFT term, which is the output's
        ``token_sum`` then (the step's, ``_output``)."""
        return replace(self.settings, sft_weight=0.0) if training else self.settings

    def _output(
        self, stats: dict[str, torch.Tensor], training: bool, shards: Shards | None = None
    ) -> PreferenceOutput:
        weight = self.settings.sft_weight
        # a sequence shard: each of its group's N processes holds the whole term and counts its own
        # shard's tokens (step_loss.py), so each adds 1/N of it
        weight = weight / shards.size if shards is not None else weight
        token_sum = weight * stats["nll_sum"].sum() if training and weight else None
        return PreferenceOutput(stats["loss_sum"].mean(), stats, pl.sums(stats), token_sum)


def eval_stats(outputs: PreferenceOutput, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``Workload.eval_batch``: the forward's per-example statistics, as they are."""
    return outputs.stats
