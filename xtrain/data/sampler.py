"""Data order: which samples every rank trains on at every optimizer step.

The order is a pure function of (seed, dataset length, global batch, per-device batch), so it
does not depend on the number of processes and needs no iteration to reach a position:

- Each epoch is one permutation of the dataset drawn from ``(seed, epoch)``.
- Optimizer step ``s`` of the run (counted over epochs) consumes the ``global_batch`` samples
  at ``[k * global_batch, (k + 1) * global_batch)`` of epoch ``s // steps_per_epoch``'s
  permutation, with ``k = s % steps_per_epoch``. The incomplete last global batch of an
  epoch is dropped (so every step has exactly ``global_batch`` samples).
- Inside a step the samples are cut into micro-batches of ``per_device``; micro-batch ``m``
  (0 .. world * accumulation - 1) goes to rank ``m % world`` at accumulation index
  ``m // world``.

So one process with accumulation 2 and two processes with accumulation 1 see exactly the same
micro-batches per optimizer step, and resuming at step ``s`` (even with another process count)
starts directly at that step's samples.

Length grouping (``data.group_by_length``, ``lengths`` given): the order becomes a pure function
of (seed, lengths, global batch, per-device batch), still independent of the process count:

- the epoch's permutation is drawn as above and its incomplete last global batch dropped;
- it is cut into megabatches of ``MEGABATCH_STEPS`` global batches, each sorted by length
  (longest first; equal lengths keep their shuffled order), so a global batch, and each of its
  micro-batches, holds samples of similar length (less padding);
- the epoch's global batches are then shuffled (seeded by ``(seed, epoch)``), the one holding
  the epoch's longest sample first (an out-of-memory shows at the first step, not hours in), and
  the micro-batches inside each step are shuffled too, so no rank always gets the longest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from xtrain.errors import XtrainError

MEGABATCH_STEPS = 16  # global batches sorted together by length (HF's LengthGroupedSampler: 50)
_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, a, b) into distinct seeds
_MASK = (1 << 63) - 1


def mix_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed derived from ``seed`` and integer ``parts`` (deterministic, no hashing salt)."""
    value = seed & _MASK
    for p in parts:
        value = ((value ^ (p & _MASK)) * _MIX + 1) & _MASK
    return value


@dataclass(frozen=True)
class DataOrder:
    """The run's data order (see the module docstring)."""

    num_samples: int
    global_batch: int
    per_device: int
    world_size: int
    seed: int
    shuffle: bool = True
    # one per sample: group each step by length (kept as a numpy array: 8 bytes a sample)
    lengths: Sequence[float] | None = field(default=None, compare=False, repr=False)
    _cache: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        micro = self.per_device * self.world_size
        if self.per_device < 1 or self.global_batch < 1:
            raise XtrainError(
                f"batch sizes must be positive (per_device={self.per_device}, global={self.global_batch})",
                "set batch.per_device and batch.global_batch to 1 or more",
            )
        if self.global_batch % micro:
            raise XtrainError(
                f"global batch {self.global_batch} is not divisible by per-device batch "
                f"{self.per_device} x {self.world_size} processes",
                f"use a global batch that is a multiple of {micro}",
            )
        if self.num_samples < self.global_batch:
            raise XtrainError(
                f"the training set has {self.num_samples} samples, fewer than one global batch "
                f"({self.global_batch})",
                "use more data or a smaller batch.global_batch",
            )
        if self.lengths is not None and len(self.lengths) != self.num_samples:
            raise ValueError(f"{len(self.lengths)} lengths for {self.num_samples} samples")
        if self.lengths is not None:
            object.__setattr__(self, "lengths", np.asarray(self.lengths, dtype=np.float64))

    @property
    def micro_per_step(self) -> int:
        """Micro-batches per optimizer step, over all ranks."""
        return self.global_batch // self.per_device

    @property
    def accumulation(self) -> int:
        return self.micro_per_step // self.world_size

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch

    def permutation(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s sample order (cached: one epoch is kept), as a numpy array: 8 bytes a
        sample, not a Python list of them."""
        perm = self._cache.get(epoch)
        if perm is None:
            if self.shuffle:
                g = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
                perm = torch.randperm(self.num_samples, generator=g).numpy()
            else:
                perm = np.arange(self.num_samples, dtype=np.int64)
            if self.lengths is not None:
                perm = self._grouped(perm, epoch)
            self._cache.clear()
            self._cache[epoch] = perm
        return perm

    def _grouped(self, perm: np.ndarray, epoch: int) -> np.ndarray:
        """``perm`` (the epoch's shuffle) regrouped by length; see the module docstring."""
        lengths = np.asarray(self.lengths)
        size = self.global_batch
        perm = perm[: self.steps_per_epoch * size]  # the dropped tail stays a random one
        mega = MEGABATCH_STEPS * size
        chunks = []
        for start in range(0, len(perm), mega):
            chunk = perm[start : start + mega]  # a stable sort: equal lengths keep their (shuffled) order
            chunks.append(chunk[np.argsort(-lengths[chunk], kind="stable")])
        batches = np.concatenate(chunks).reshape(-1, size)  # one global batch a row
        g = torch.Generator().manual_seed(mix_seed(self.seed, epoch, 1))
        count = len(batches)
        order = torch.randperm(count, generator=g).tolist() if self.shuffle else list(range(count))
        longest = int(np.argmax(lengths[batches[:, 0]]))  # the first of the longest
        order.remove(longest)
        steps = batches[[longest, *order]]
        b, micro = self.per_device, self.micro_per_step
        if self.shuffle:  # whole micro-batches shuffled inside each step: no rank always gets the longest
            mg = torch.Generator().manual_seed(mix_seed(self.seed, epoch, 2))
            within = torch.argsort(torch.rand(len(steps), micro, generator=mg), dim=1).numpy()
        else:
            within = np.tile(np.arange(micro), (len(steps), 1))
        micro_batches = steps.reshape(len(steps), micro, b)
        return np.take_along_axis(micro_batches, within[:, :, None], axis=1).reshape(-1)

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of global optimizer step ``step``."""
        return divmod(step, self.steps_per_epoch)

    def step_samples(self, step: int) -> list[int]:
        """All ``global_batch`` sample indices of optimizer step ``step``, in micro-batch order."""
        epoch, k = self.position(step)
        start = k * self.global_batch
        return self.permutation(epoch)[start : start + self.global_batch].tolist()

    def micro_batch(self, step: int, m: int) -> list[int]:
        """Micro-batch ``m`` (0 .. micro_per_step - 1) of optimizer step ``step``."""
        samples = self.step_samples(step)
        return samples[m * self.per_device : (m + 1) * self.per_device]

    def rank_batches(self, step: int, rank: int) -> list[list[int]]:
        """Rank ``rank``'s micro-batches of step ``step``, in accumulation order."""
        samples = self.step_samples(step)
        b = self.per_device
        return [samples[m * b : (m + 1) * b] for m in range(rank, self.micro_per_step, self.world_size)]

    def micro_index(self, rank: int, accumulation_index: int) -> int:
        """Global micro-batch number ``m`` of this rank's ``accumulation_index``-th micro-batch."""
        return accumulation_index * self.world_size + rank


class RankBatchSampler(Sampler[list[int]]):
    """Yields one rank's micro-batches for optimizer steps ``[start_step, end_step)``.

    Used as a DataLoader ``batch_sampler``. Starting at ``start_step`` costs nothing: the
    position is computed, not reached by iterating."""

    def __init__(self, order: DataOrder, rank: int, start_step: int, end_step: int) -> None:
        self.order = order
        self.rank = rank
        self.start_step = start_step
        self.end_step = end_step

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.end_step):
            yield from self.order.rank_batches(step, self.rank)

    def __len__(self) -> int:
        return max(0, self.end_step - self.start_step) * self.order.accumulation


def train_lengths(workload: Any) -> np.ndarray:
    """One length per training sample for ``data.group_by_length``: the task's own
    (``Workload.train_lengths``: audio seconds for speech-to-text), else the token count of a
    tokenized data set's ``input_ids`` (causal-lm, seq-cls), read from its Arrow column without
    touching the rows."""
    if workload.train_lengths is not None:
        lengths = np.asarray(workload.train_lengths(), dtype=np.float64)
    else:
        ds = workload.train_dataset
        if "input_ids" not in (getattr(ds, "column_names", None) or ()):
            raise XtrainError(
                "data.group_by_length needs the length of every training sample, and this task gives none",
                "set data.group_by_length=false (or, in a custom task, set Workload.train_lengths)",
            )
        import pyarrow.compute as pc

        column = ds.with_format("arrow")["input_ids"]  # follows any select/shuffle indices
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.float64)
    if len(lengths) != len(workload.train_dataset):
        raise XtrainError(
            f"the task gave {len(lengths)} sample lengths for {len(workload.train_dataset)} training samples",
            "Workload.train_lengths must return one length per training sample",
        )
    return lengths


def padding_fraction(order: DataOrder, lengths: Sequence[float], steps: range) -> float:
    """The share of padding when every micro-batch of ``steps`` is padded to its longest sample:
    ``1 - sum(lengths) / sum(longest x batch size)`` (what ``data.group_by_length`` lowers)."""
    used = padded = 0.0
    for step in steps:
        for m in range(order.micro_per_step):
            batch = [lengths[i] for i in order.micro_batch(step, m)]
            used += sum(batch)
            padded += max(batch) * len(batch)
    return 1.0 - used / padded if padded else 0.0
