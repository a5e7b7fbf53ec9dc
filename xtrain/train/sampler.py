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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import Sampler

from xtrain.errors import XtrainError

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
    _cache: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)

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

    def permutation(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s sample order (cached: one epoch is kept)."""
        perm = self._cache.get(epoch)
        if perm is None:
            if self.shuffle:
                g = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
                perm = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                perm = list(range(self.num_samples))
            self._cache.clear()
            self._cache[epoch] = perm
        return perm

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of global optimizer step ``step``."""
        return divmod(step, self.steps_per_epoch)

    def step_samples(self, step: int) -> list[int]:
        """All ``global_batch`` sample indices of optimizer step ``step``, in micro-batch order."""
        epoch, k = self.position(step)
        start = k * self.global_batch
        return self.permutation(epoch)[start : start + self.global_batch]

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
