"""One distillation step on the loop's hooks: ``at_step`` (the step's number: the sampling seeds and
GKD's choice of samples), ``step_start`` (every micro-batch of this process completed: by the
student's samples, the teacher's samples (``seq_kd``) or the data's answers; the step's trained
tokens counted over every process) and the forward (the teacher's hidden states at the trained
positions without gradient, the student's, and the loss over them: ``losses``).

Which completions a step trains on is a function of the step alone, so that any process count and
any split of the global batch train the same: ``on_policy`` always the student's samples; ``gkd``
the student's on a share ``lmbda`` of the steps (drawn from the run's seed and the step's number;
TRL's GKDTrainer draws a coin per micro-batch), on the others the data's answers, or with
``seq_kd`` the teacher's samples. Each completion is sampled from its own generator, seeded by
(seed, step, data row, who samples), one micro-batch at a time on xtrain's decode loop
(``model.decoding``, as GRPO's rollout): a completion does not depend on the rows beside it, the
process count or a resume.

A step's loss is the sum of its token losses over the trained tokens of the whole step (every
micro-batch, every process: ``train/step_loss.py``'s contract). The tokens are only known once the
completions are, so ``step_start`` gathers each micro-batch's count (one gather a step) and each
forward returns its token sum scaled so that the loop's mean over the step's micro-batches is that
sum over the step's tokens (as GRPO's loss is normalised).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.sampler import mix_seed
from xtrain.data.sequence_shards import KEY, cut_completed
from xtrain.model import sequence_parallel as sp
from xtrain.model.decoding import DecodeSettings, Sampling, generate
from xtrain.model.shard_exchange import active
from xtrain.tasks.distill import losses
from xtrain.tasks.distill.teacher import Teacher, hidden_at
from xtrain.tasks.grpo import sharded
from xtrain.tasks.grpo.rollout import unwrapped
from xtrain.tasks.grpo.step import synced

if TYPE_CHECKING:
    from collections.abc import Callable

    from xtrain.config.schema import DistillConfig
    from xtrain.model.chunked_loss import LogitMap

Batch = dict[str, Any]
STUDENT, TEACHER, DATA = "student", "teacher", "data"  # who completes a step's prompts
_CHOICE = 2**31 - 1  # the step's draw of GKD's samples (apart from every data row's seeds)
_NOT_SHOWN = ("stat/total_tokens", "stat/micro_batches")
_COMPLETED = ("input_ids", "attention_mask", "labels", "completion_mask")  # what ``complete`` makes


@dataclass
class StepOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def source_of(d: DistillConfig, seed: int, step: int) -> str:
    """Who completes step ``step``'s prompts (module docstring)."""
    if d.mode == "on_policy":
        return STUDENT
    if random.Random(mix_seed(seed, step, _CHOICE)).random() < d.lmbda:
        return STUDENT
    return TEACHER if d.seq_kd else DATA


def trained_positions(labels: torch.Tensor, shifted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(the flat positions whose next token trains, those tokens) of [N, T] ``labels`` (-100: no;
    ``shifted``: each at the position that predicts it already, a sequence shard's)."""
    flat = (labels if shifted else F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]).reshape(-1)
    keep = (flat != IGNORE_INDEX).nonzero().squeeze(1)  # the one host sync
    return keep, flat.index_select(0, keep)


def model_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    """A completed micro-batch's forward inputs: positions counted from each row's first token."""
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": batch["input_ids"], "attention_mask": mask, "position_ids": positions}


def divergence_sums(
    model: torch.nn.Module, teacher: Teacher, batch: Batch, how: losses.Divergence,
    chunks: tuple[LogitMap, int] | None,
) -> tuple[losses.Sums, torch.Tensor]:  # fmt: skip
    """(the micro-batch's sums over its trained tokens (``batch["labels"]``), their flat positions):
    the teacher's hidden states there without gradient, then the student's, the head in chunks
    (``chunks``: its logit map, positions a chunk) or on every position (None). On a sequence
    shard (``sharded.CUT``) both models run on the shard, the teacher on the sequence-parallel
    attention too (``sequence_parallel.also_split``), the sums this shard's."""
    from xtrain.model.chunked_logps import with_head

    shard = batch.get(sharded.CUT)
    if shard is None:
        inputs = model_inputs(batch)
        keep, targets = trained_positions(batch["labels"])
    else:
        sp.also_split(teacher.model)
        inputs = sharded.model_inputs(shard)
        keep, targets = trained_positions(shard["shift_labels"], shifted=True)
    with torch.no_grad():
        t_hidden, t_head = hidden_at(teacher.model, inputs, keep)
    if chunks is None:
        logits = model(**inputs, use_cache=False).logits
        student = logits.reshape(-1, logits.shape[-1]).index_select(0, keep)
        with torch.no_grad():
            t_logits = teacher.mapping(t_head(t_hidden).float())
        return losses.plain(student, t_logits, targets, how), keep
    mapping, rows = chunks

    def compute(head: torch.nn.Module, hidden: torch.Tensor) -> tuple[losses.Sums, torch.Tensor]:
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
        params = [p for p in head.parameters() if p.requires_grad]  # FSDP2: the gathered ones
        sums = losses.chunked(h, t_hidden, targets, (head.forward, t_head), (mapping, teacher.mapping), how,
                              rows, params)  # fmt: skip
        # what the head returns instead of logits: empty, made from the loss (chunked_logps' stand-in)
        stand_in = sums.loss.to(hidden.dtype).reshape([1] * hidden.dim()).expand(*hidden.shape[:-1], 0)
        stand_in = stand_in.clone()
        sums.loss = sums.loss + stand_in.sum()
        return sums, stand_in

    return with_head(model, inputs, compute), keep


class DistillStep:
    """``Workload.at_step``, ``step_start`` and ``forward`` of the distill task."""

    def __init__(self, d: DistillConfig, teacher: Teacher, seed: int, pad_id: int, stop: list[int],
                 decode: DecodeSettings | None = None) -> None:  # fmt: skip
        self.d, self.teacher, self.seed, self.pad_id, self.stop = d, teacher, seed, pad_id, stop
        self.how = losses.Divergence(d.mode, d.beta, teacher.vocab)
        self.decode = decode or DecodeSettings()
        self.chunks: tuple[LogitMap, int] | None = None  # the chunked loss (use_chunked_loss)
        self.step = 0
        self.steps_seen = 0  # the warnings' evidence since the last evaluation (``notes``)
        self.truncated = 0.0

    # -- hooks ----------------------------------------------------------------------------------
    def use_chunked_loss(self, mapping: LogitMap, rows: int) -> None:
        """``Workload.use_chunked_loss``: the heads run on the trained tokens only, ``rows`` at a
        time (``model.chunked_loss``)."""
        self.chunks = (mapping, rows)

    def at_step(self, step: int) -> None:
        """``Workload.at_step``: the optimizer step about to run."""
        self.step = step

    def step_start(self, model: torch.nn.Module, micro_batches: list[Batch], gather: Callable) -> None:
        """``Workload.step_start``: this process's micro-batches completed, then the step's trained
        tokens and completion statistics over every process (one gather)."""
        source, ex = source_of(self.d, self.seed, self.step), active()
        for batch in micro_batches:
            if sharded.generates(ex):  # (a group's first rank under parallel.sequence)
                self.complete(model, batch, source)
            if ex is not None:  # one set of completions a group, each process's shard of it
                made = batch.get("truncated")
                batch["truncated"] = sharded.same_in_group(ex, batch, _COMPLETED, made)
                ids, mask, labels = (batch[k] for k in ("input_ids", "attention_mask", "labels"))
                sharded.keep(batch, cut_completed(ids, mask, labels, ex.size, ex.rank))
        rank, device = _rank(), micro_batches[0]["input_ids"].device
        local = [
            torch.tensor([float(a), float(rank), float(b["completion_mask"].sum()),
                          float(b["truncated"].sum()), float(b["completion_mask"].size(0))], device=device)
            for a, b in enumerate(micro_batches)
        ]  # fmt: skip
        everything = gather(torch.stack(local)).cpu()
        if ex is not None:  # a sequence-parallel group's rows once
            everything = sharded.distinct(everything, ex.size)
        tokens, cut, sequences = (float(everything[:, i].sum()) for i in (2, 3, 4))
        stats = {
            "total_tokens": tokens, "micro_batches": float(everything.size(0)),
            "on_student_samples": float(source == STUDENT),
            "completions/mean_length": tokens / max(sequences, 1.0),
            "completions/clipped_ratio": cut / max(sequences, 1.0),
        }  # fmt: skip
        self.steps_seen += 1
        self.truncated += stats["completions/clipped_ratio"]
        for batch in micro_batches:
            batch.update({f"stat/{k}": torch.tensor(v, device=device) for k, v in stats.items()})

    def __call__(self, model: torch.nn.Module, batch: Batch) -> StepOutput:
        """``Workload.forward``: the micro-batch's share of the step's loss, and its metrics."""
        sums, _ = divergence_sums(model, self.teacher, batch, self.how, self.chunks)
        total, micro = float(batch["stat/total_tokens"]), float(batch["stat/micro_batches"])
        loss = sums.loss * (micro / max(total, 1.0))  # the loop averages over the step's micro-batches
        numbers = [sums.kl.sum(), sums.agree.sum(), torch.tensor(float(sums.tokens), device=sums.kl.device)]
        shard = batch.get(sharded.CUT)
        if shard is not None:  # this shard's part of the group's loss, times N (grpo/sharded.py)
            loss = loss * shard[KEY].size
            numbers = sharded.group_sums(shard, *numbers)
        tokens = numbers[2].clamp(min=1.0)
        metrics = {k[5:]: v for k, v in batch.items() if k.startswith("stat/") and k not in _NOT_SHOWN}
        metrics["kl"] = numbers[0] / tokens
        metrics["token_agreement"] = numbers[1] / tokens
        return StepOutput(loss, metrics)

    # -- the completions ------------------------------------------------------------------------
    def complete(self, model: torch.nn.Module, batch: Batch, source: str) -> None:
        """``batch``'s prompts followed by their completions, in place: ``input_ids``,
        ``attention_mask``, ``labels`` (the completions' tokens), ``completion_mask``,
        ``truncated``."""
        prompt, prompt_mask = batch["input_ids"], batch["attention_mask"]
        if source == DATA:
            ids, mask = batch["answer_ids"], batch["answer_mask"]
            truncated = torch.zeros(ids.size(0), dtype=torch.bool, device=ids.device)
        else:
            student = source == STUDENT
            who = unwrapped(model) if student else self.teacher.model
            seeds = [mix_seed(self.seed, self.step, r, 0 if student else 1) for r in batch["row"].tolist()]
            with sp.whole_attention(who):  # (under parallel.sequence: whole sequences, its own attention)
                done = generate(
                    who, prompt, prompt_mask, max_new_tokens=self.d.max_completion_length, pad_id=self.pad_id,
                    stop=self.stop, sampling=Sampling(self.d.temperature), seeds=seeds,
                    synced=synced(model) if student else False, settings=self.decode if student else None,
                )  # fmt: skip
            ids, mask, truncated = done.ids, done.mask, done.truncated
        labels = torch.cat(
            [torch.full_like(prompt, IGNORE_INDEX), ids.masked_fill(mask == 0, IGNORE_INDEX)], 1
        )
        batch.update(
            input_ids=torch.cat([prompt, ids], 1), attention_mask=torch.cat([prompt_mask, mask], 1),
            labels=labels, completion_mask=mask, truncated=truncated,
        )  # fmt: skip

    # -- warnings -------------------------------------------------------------------------------
    def notes(self, history: list[dict[str, float]]) -> list[str]:
        """``Workload.notes``: completions at the length limit most of the time since the last
        evaluation (their ends never trained)."""
        seen, cut = self.steps_seen, self.truncated
        self.steps_seen, self.truncated = 0, 0.0
        if seen and cut / seen > 0.5:
            return [
                f"distill: {cut / seen:.0%} of completions ran to distill.max_completion_length="
                f"{self.d.max_completion_length} without ending (raise it: their ends are never trained)"
            ]
        return []
