"""Sequence parallelism on CUDA (issue 58; docs/long-context.md): what tests/test_sequence_parallel.py
proves over gloo on the CPU, with CUDA tensors: over NCCL (two GPUs), and over gloo, whose
exchanges of CUDA tensors go through host memory (``Exchange.staged``, the Windows path; two ranks
on one GPU). The shards' gradients summed over the ranks equal one process's on the whole batch,
Ulysses and ring; then the loop itself, one process against two holding half of each sequence.

Written by review on a machine without a GPU (the session that wrote it had none): run it with
``python -m pytest -q tests/gpu/test_sequence_parallel_gpu.py`` on a CUDA machine."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
@pytest.mark.parametrize(
    "backend", ["gloo", pytest.param("nccl", marks=pytest.mark.two_gpus)]
)  # fmt: skip
def test_the_shards_gradients_sum_to_the_whole_sequences(tmp_path: Path, backend: str, mode: str) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from gpu import sequence_workers

    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL (Windows)")
    mp.start_processes(sequence_workers.sequence_parallel_equality, nprocs=2, join=True, start_method="spawn",
                       args=(2, backend, _free_port(), str(tmp_path), mode))  # fmt: skip
    for rank in (0, 1):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        assert float(saved["want"].abs().max()) > 0
        torch.testing.assert_close(saved["got"], saved["want"], rtol=1e-4, atol=1e-6)


@pytest.mark.two_gpus
def test_the_loop_on_two_gpus_trains_as_one(tmp_path: Path) -> None:
    """xtrain.run on one GPU and on two with parallel.sequence: 2 (NCCL, fp32): the same logged
    step losses and the same adapter, within float32 rounding."""
    from support.jobs import make_job, run_xtrain

    job = make_job(tmp_path / "job", steps=4, save_every=4)
    results = {}
    for processes, extra in ((1, []), (2, ["parallel.sequence=2"])):
        out = tmp_path / f"p{processes}"
        cmd = [sys.executable, "-m", "xtrain.run", "--processes", str(processes), "--config", str(job.config),
               f"run.output_dir={out}", "run.mixed_precision=no", "lora.dropout=0.0", *extra]  # fmt: skip
        proc = run_xtrain(cmd, job.env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results[processes] = json.loads((out / "train_result.json").read_text())
    assert results[2]["run_info"]["sequence_parallel"] == 2
    for (_, one), (_, two) in zip(results[1]["losses"], results[2]["losses"], strict=True):
        assert two == pytest.approx(one, rel=1e-4)


@pytest.mark.parametrize(
    "backend", ["gloo", pytest.param("nccl", marks=pytest.mark.two_gpus)]
)  # fmt: skip
def test_a_rollout_is_the_same_on_every_process_of_a_group(tmp_path: Path, backend: str) -> None:
    """GRPO's and distillation's completions made the same in a group (xtrain/tasks/grpo/sharded.py):
    the group's first rank's CUDA tensors, of other shapes than the others', on every rank's device."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from gpu import sequence_workers

    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL (Windows)")
    mp.start_processes(sequence_workers.rollout_broadcast, nprocs=2, join=True, start_method="spawn",
                       args=(2, backend, _free_port(), str(tmp_path)))  # fmt: skip
    first, second = (torch.load(tmp_path / f"broadcast{rank}.pt") for rank in (0, 1))
    assert second["input_ids"].shape == (4, 10) and int(second["input_ids"].max()) == 0
    torch.testing.assert_close(second["rewards"], first["rewards"])
    assert all(d.startswith("cuda") for d in first["devices"] + second["devices"])
