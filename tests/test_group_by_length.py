"""data.group_by_length: each optimizer step's micro-batches hold samples of similar length, while
the data order stays a pure function of (seed, lengths, global batch, per-device batch): the same
micro-batches for any process count, any step reachable without iterating (exact resume),
a fresh grouping every epoch. Lengths come cheaply: audio seconds from file headers, token counts
from an Arrow column."""

from __future__ import annotations

import random

import pytest

from xtrain.data.sampler import MEGABATCH_STEPS, DataOrder, RankBatchSampler, padding_fraction, train_lengths
from xtrain.errors import XtrainError
from xtrain.tasks.contract import Workload
from xtrain.tasks.validation import load_config

N, GLOBAL, PER_DEVICE = 1000, 16, 4
_RNG = random.Random(0)
LENGTHS = tuple(float(_RNG.randint(1, 100)) for _ in range(N))


def order(world: int = 1, lengths: tuple[float, ...] | None = LENGTHS, seed: int = 3) -> DataOrder:
    return DataOrder(N, GLOBAL, PER_DEVICE, world, seed, lengths=lengths)


def test_grouping_cuts_the_padding() -> None:
    steps = range(3 * order().steps_per_epoch)
    plain = padding_fraction(order(lengths=None), LENGTHS, steps)
    grouped = padding_fraction(order(), LENGTHS, steps)
    # uniform 1..100: a micro-batch of 4 is padded to its longest, ~40 % padding; grouped ~1 %
    assert plain > 0.35 and grouped < 0.03, (plain, grouped)


def test_same_micro_batches_for_any_process_count() -> None:
    one, two, four = order(1), order(2), order(4)
    for step in range(2 * one.steps_per_epoch):
        expected = [one.micro_batch(step, m) for m in range(one.micro_per_step)]
        for o in (two, four):
            got = {
                o.micro_index(rank, a): mb
                for rank in range(o.world_size)
                for a, mb in enumerate(o.rank_batches(step, rank))
            }
            assert [got[m] for m in range(o.micro_per_step)] == expected


def test_every_epoch_is_a_new_grouping_of_distinct_samples() -> None:
    o = order()
    spe = o.steps_per_epoch
    epochs = [[i for s in range(e * spe, (e + 1) * spe) for i in o.step_samples(s)] for e in range(3)]
    for samples in epochs:
        assert len(samples) == len(set(samples)) == spe * GLOBAL  # no repeats; the tail is dropped
    assert epochs[0] != epochs[1] != epochs[2]
    assert [o.step_samples(s) for s in range(spe)] != [o.step_samples(s) for s in range(spe, 2 * spe)]
    for e in range(3):  # the step with the epoch's longest sample comes first (OOM shows at once)
        first = o.step_samples(e * spe)
        assert max(LENGTHS[i] for i in first) == max(LENGTHS[i] for i in epochs[e])
    # samples of one step come from one length-sorted megabatch: their spread is narrow
    spreads = [
        max(LENGTHS[i] for i in o.step_samples(s)) - min(LENGTHS[i] for i in o.step_samples(s))
        for s in range(spe)
    ]
    assert sum(spreads) / spe < 100 / (MEGABATCH_STEPS / 2), spreads


def test_any_step_is_reached_without_iterating_and_does_not_depend_on_history() -> None:
    """Exact resume: a fresh order (a new process, maybe another process count) gives the same
    samples at step s as the run that got there step by step."""
    full = order(2)
    for s in range(full.steps_per_epoch * 2):
        full.step_samples(s)
    resumed = order(1)  # nothing computed before
    s = full.steps_per_epoch + 5  # mid-epoch 1
    assert resumed.step_samples(s) == full.step_samples(s)
    a = list(RankBatchSampler(order(2), rank=1, start_step=0, end_step=40))
    b = list(RankBatchSampler(order(2), rank=1, start_step=s, end_step=40))
    assert b == a[s * order(2).accumulation :]


def test_the_order_is_a_pure_function_of_seed_and_lengths() -> None:
    assert order().permutation(1).tolist() == order().permutation(1).tolist()
    assert order(seed=4).permutation(0).tolist() != order().permutation(0).tolist()
    other = tuple(reversed(LENGTHS))
    assert order(lengths=other).permutation(0).tolist() != order().permutation(0).tolist()
    with pytest.raises(ValueError):
        order(lengths=LENGTHS[:-1])


def test_token_lengths_come_from_the_input_ids_column() -> None:
    import datasets
    import torch

    ds = datasets.Dataset.from_dict({"input_ids": [[1] * k for k in (3, 7, 5, 1)]}).select([3, 1, 0, 2])
    work = Workload(model=torch.nn.Linear(1, 1), train_dataset=ds, collator=lambda rows: rows)
    assert train_lengths(work).tolist() == [1.0, 7.0, 3.0, 5.0]  # follows the selection
    work.train_lengths = lambda: [2, 2, 2, 2]
    assert train_lengths(work).tolist() == [2.0] * 4
    work.train_lengths = lambda: [2]
    with pytest.raises(XtrainError, match="1 sample lengths for 4"):
        train_lengths(work)
    plain = Workload(model=torch.nn.Linear(1, 1), train_dataset=[{"x": 1}], collator=lambda rows: rows)
    with pytest.raises(XtrainError, match="needs the length of every training sample"):
        train_lengths(plain)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.packing=true", "model.task=causal-lm"], "packed rows are all filled up to max_length"),
        (["model.task=image-to-text"], "data.group_by_length is for tasks .*, not image-to-text"),
    ],
)
def test_nothing_to_group_is_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(XtrainError, match=message):
        load_config(None, ["data.group_by_length=true", *overrides])
    assert load_config(None, ["data.group_by_length=true"]).data.group_by_length is True
