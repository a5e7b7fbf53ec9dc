"""CUDA paths that a CPU cannot stand in for: fp16 with a GradScaler (and fused AdamW's skipped
steps), bf16, full fine-tuning of a float16 checkpoint, TF32, the CPU-staged comm hook on CUDA
tensors, NCCL, peak memory. Each training case is a real ``python -m xtrain.run`` process."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch
from support.jobs import make_job, run_xtrain

RUN = [sys.executable, "-m", "xtrain.run"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    return make_job(tmp_path_factory.mktemp("gpu"), steps=30, save_every=1000)


def train(job, name: str, *overrides: str, env: dict | None = None, cmd: list[str] | None = None) -> dict:
    out = job.root / name
    proc = run_xtrain([*(cmd or RUN), "--config", str(job.config), f"run.output_dir={out}", *overrides],
                      {**job.env, **(env or {})})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "train_result.json").read_text())


def learned(result: dict) -> bool:
    losses = [v for _, v in result["losses"]]
    return all(map(lambda v: v == v, losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize("precision", ["fp16", "bf16", "no"])
def test_lora_trains_in_each_precision(job, precision: str) -> None:
    r = train(job, f"lora-{precision}", f"run.mixed_precision={precision}")
    info = r["run_info"]
    assert info["device"].startswith("cuda") and info["precision"] == precision
    assert learned(r), r["losses"]
    assert info["skip_check"] == ("loss scale" if precision == "fp16" else None)
    assert r["skipped_steps"] < r["total_steps"] // 2
    assert info["peak_mem_mib"] and info["peak_mem_mib"] < 2048
    # the loop's memory estimate on this card (a tiny model: far below it, no warning)
    assert 0 < info["memory_estimate_gib"] < 1


def test_full_finetune_of_a_float16_checkpoint(job, tmp_path: Path) -> None:
    """dtype auto keeps the checkpoint's float16 on a GPU; fp16 autocast needs float32 master
    weights (the GradScaler refuses float16 gradients): the loop upcasts the trainable ones."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = job.config.read_text().split("name_or_path: ")[1].split("\n")[0].strip()
    half = tmp_path / "fp16-model"
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.float16).save_pretrained(half)
    AutoTokenizer.from_pretrained(src).save_pretrained(half)
    r = train(job, "full-fp16", f"model.name_or_path={half}", "lora.enabled=false",
              "run.mixed_precision=fp16", "optim.lr=1e-3")  # fmt: skip
    assert learned(r), r["losses"]


def test_fused_adamw_overflow_is_a_skipped_step() -> None:
    """accelerate decides "skipped" by whether optimizer.step ran; fused AdamW always runs and
    skips inside the kernel. xtrain reads the loss scale: skipped, no update, no lr step."""
    from accelerate import Accelerator

    from xtrain.train.distributed.accelerator import release
    from xtrain.train.precision import SkipDetector

    acc = Accelerator(mixed_precision="fp16")
    model = torch.nn.Linear(8, 8).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model, opt, sched = acc.prepare(model, opt, sched)
    skips = SkipDetector(acc.scaler)
    with acc.autocast():
        loss = model(torch.randn(4, 8, device="cuda")).float().sum() * float("inf")
    acc.backward(loss)
    before = model.weight.detach().clone()
    skips.before_step()
    opt.step()
    skips.record()
    assert skips.settle() is True
    assert opt.step_was_skipped is False  # accelerate's own flag misses it (the reason for SkipDetector)
    assert torch.equal(model.weight.detach(), before)
    opt.zero_grad()
    with acc.autocast():
        loss = model(0.1 * torch.randn(4, 8, device="cuda")).float().mean()  # no fp16 overflow
    acc.backward(loss)
    skips.before_step()
    opt.step()
    skips.record()
    assert skips.settle() is False
    assert not torch.equal(model.weight.detach(), before)
    release(acc)  # the next test builds its own Accelerator in this process


def test_tf32_is_on_for_fp32_matmuls(job) -> None:
    r = train(job, "tf32", "run.mixed_precision=no", "run.max_steps=2")
    assert r["run_info"]["device"].startswith("cuda")
    from xtrain.config.schema import TrainConfig
    from xtrain.machine import probe
    from xtrain.planning import rules
    from xtrain.planning.context import LaunchContext
    from xtrain.planning.run import for_process
    from xtrain.train.distributed.accelerator import build_accelerator, release

    plan = rules.make_plan(probe.collect(quick=True))
    assert plan.tf32 == (torch.cuda.get_device_capability(0) >= (8, 0))
    acc = build_accelerator(for_process(TrainConfig(), LaunchContext(), plan=plan))
    try:
        matmul = torch.backends.cuda.matmul
        # never read allow_tf32 after fp32_precision was set: torch raises on mixing the two APIs
        on = matmul.fp32_precision == "tf32" if hasattr(matmul, "fp32_precision") else matmul.allow_tf32
        assert on == plan.tf32
    finally:
        release(acc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cpu_staged_hook_equals_plain_allreduce_on_cuda(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from gpu import gpu_workers

    mp.start_processes(gpu_workers.comm_hook_equality, args=(2, _free_port(), str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")  # fmt: skip
    g0, g1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    torch.testing.assert_close(g0[True], g0[False], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g0[True], g1[True], rtol=0, atol=0)  # every rank holds the average


def test_nccl_one_process_torchrun(job) -> None:
    """torchrun with one process: world size 1, the plan's path on Linux (no process group)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "xtrain.run"]
    r = train(job, "torchrun-1", "run.max_steps=4", cmd=cmd)
    assert r["world_size"] == 1 and r["run_info"]["device"] == "cuda:0"


@pytest.mark.two_gpus
@pytest.mark.parametrize("mode", ["nccl", "windows-path"])
def test_two_gpus_match_one(job, mode: str) -> None:
    """2 GPUs (NCCL, or the Windows path forced: spawn + gloo + CPU-staged hook) against one GPU
    with the same global batch; fp32 so the comparison is not about autocast rounding."""
    ref = train(job, "two-ref", "run.mixed_precision=no", "run.max_steps=8")
    env = {"XTRAIN_PLATFORM": "windows", "XTRAIN_FORCE_CPU_STAGED": "1"} if mode == "windows-path" else {}
    r = train(job, f"two-{mode}", "run.mixed_precision=no", "run.max_steps=8",
              cmd=[*RUN, "--processes", "2"], env=env)  # fmt: skip
    assert r["world_size"] == 2
    assert r["run_info"]["backend"] == ("gloo" if mode == "windows-path" else "nccl")
    assert ref["losses"][-1][1] == pytest.approx(r["losses"][-1][1], rel=1e-3)
