"""Tasks that decode images or audio read their rows in DataLoader workers (the plan's
``media_workers``). On Windows and macOS those workers are spawned: the data set and the collator
travel to them pickled, and every batch must be the one the training process would have made."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from support.workloads import build_workload

from xtrain.tasks import all_tasks
from xtrain.tasks.validation import load_config

DATA = Path(__file__).resolve().parents[1] / "xtrain" / "builtin" / "jobs"
MEDIA = sorted(name for name, t in all_tasks().items() if t.decodes_media)


def quickstart_workload(task: str):
    job = DATA / f"quickstart-{task}.yaml"
    return build_workload(load_config(str(job), ["data.eval=null"]))


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_the_media_tasks_are_the_ones_that_decode():
    assert MEDIA == [
        "image-classification", "image-to-text", "speech-to-text", "vision-language", "vision-preference"
    ]  # fmt: skip


# the tasks with a built-in job (every media task's)
@pytest.mark.parametrize("task", [name for name in MEDIA if all_tasks()[name].quickstart is not None])
def test_rows_and_collator_survive_the_trip_to_a_spawned_worker(task: str):
    w = quickstart_workload(task)
    rows = [w.train_dataset[i] for i in range(4)]
    dataset, collator = pickle.loads(pickle.dumps((w.train_dataset, w.collator)))
    assert same(collator([dataset[i] for i in range(4)]), w.collator(rows))


@pytest.mark.slow
def test_a_spawned_worker_makes_the_same_batches():
    from torch.utils.data import DataLoader

    w = quickstart_workload("image-to-text")
    order = [list(range(i, i + 4)) for i in range(0, 12, 4)]
    here = list(DataLoader(w.train_dataset, batch_sampler=order, collate_fn=w.collator))
    spawned = DataLoader(
        w.train_dataset, batch_sampler=order, collate_fn=w.collator, num_workers=1,
        multiprocessing_context="spawn", persistent_workers=True,
    )  # fmt: skip
    assert all(same(a, b) for a, b in zip(here, spawned, strict=True))
