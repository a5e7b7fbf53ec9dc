"""`xtrain doctor --smoke`: start the planned processes for real and time an all-reduce.

The parent (``run_smoke``) starts ``python -m xtrain.launch.smoke RESULT_DIR ...`` on every planned
process through ``xtrain.launch.launcher.launch``, the same path training uses (spawn on Windows,
accelerate launch elsewhere). Each worker reads the plan from ``XTRAIN_PLAN``, joins the process
group with the plan's backend, checks one all-reduce (rank r contributes r+1 everywhere, so every
element must be n(n+1)/2), times a few more after a warm-up, and writes ``rank-R.json`` into
the result directory: files work with any launcher and any start method.

Bandwidth is reported as nccl-tests does: algbw = bytes / time per all-reduce, and
busbw = algbw * 2(n-1)/n, the traffic each link carries in a ring all-reduce, which is
comparable across process counts and with the link's hardware speed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.launch.launcher import launch
from xtrain.launch.worker_errors import WorkerFailed
from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Plan
from xtrain.runtime import lifetime
from xtrain.runtime.process_group import init_worker_group

DEFAULT_SIZE_MIB = 16.0
DEFAULT_ITERS = 10
WARMUP_ITERS = 2
DEFAULT_TIMEOUT_S = 120  # process-group timeout: a hung collective fails instead of hanging


@dataclass
class RankResult:
    rank: int
    ok: bool
    device: str = ""
    value: float | None = None  # what the checked all-reduce gave (first element)
    expected: float | None = None
    seconds: float | None = None  # time for the timed all-reduces on this rank
    error: str | None = None


@dataclass
class SmokeResult:
    ok: bool
    world_size: int
    backend: str | None
    device: str
    launcher: str | None  # spawn | accelerate; None: one process, nothing launched
    allreduce_ok: bool | None  # None: no process group needed
    size_mib: float
    iters: int
    seconds_per_iter: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    elapsed_s: float = 0.0
    cpu_staged: bool = False
    ranks: list[RankResult] = field(default_factory=list)
    note: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bus_bandwidth(nbytes: int, seconds_per_iter: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) for one all-reduce of ``nbytes``, nccl-tests style."""
    algbw = nbytes / seconds_per_iter / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


# -- parent side -----------------------------------------------------------------------------------
def run_smoke(
    plan: Plan,
    size_mib: float = DEFAULT_SIZE_MIB,
    iters: int = DEFAULT_ITERS,
    port: int | None = None,
    timeout_s: int = DEFAULT_TIMEOUT_S,
) -> SmokeResult:
    """Start the plan's processes, check and time an all-reduce; never raises for a failed
    worker (the result says what failed), only for bad arguments."""
    if size_mib <= 0 or iters < 1:
        raise XtrainError(f"smoke needs size > 0 and iters >= 1, got {size_mib} MiB x {iters}")
    if plan.num_machines > 1:
        raise XtrainError(
            "--smoke runs on one machine", "run it without the multi-machine options on each machine"
        )
    start = time.perf_counter()
    if plan.world_size == 1:
        result = _single_process(plan, size_mib, iters)
        result.elapsed_s = time.perf_counter() - start
        return result

    result = SmokeResult(
        ok=False,
        world_size=plan.world_size,
        backend=plan.backend,
        device=plan.device,
        launcher=plan.launcher,
        allreduce_ok=False,
        size_mib=size_mib,
        iters=iters,
        cpu_staged=plan.cpu_staged_allreduce,
    )
    with atomic.temporary_folder("xtrain-smoke-") as tmp:
        argv = [tmp, str(size_mib), str(iters), str(timeout_s)]
        try:
            launch("xtrain.launch.smoke", argv, plan, port=port)
        except WorkerFailed as e:
            result.error = e.one_line()
        result.ranks = _read_ranks(Path(tmp), plan.world_size)
    result.elapsed_s = time.perf_counter() - start
    # accelerate's launcher knows only the exit code: add the rank's own error from its file
    first_error = next((r.error for r in result.ranks if r.error), None)
    if result.error and first_error and first_error not in result.error:
        result.error += f": {first_error}"
    result.allreduce_ok = len(result.ranks) == plan.world_size and all(r.ok for r in result.ranks)
    if result.allreduce_ok and result.error is None:
        result.ok = True
        # the collective is as slow as its slowest rank
        per_iter = max(r.seconds or 0.0 for r in result.ranks) / iters
        nbytes = _numel(size_mib) * 4
        result.seconds_per_iter = per_iter
        if per_iter > 0:
            result.algbw_gbps, result.busbw_gbps = bus_bandwidth(nbytes, per_iter, plan.world_size)
        result.note = f"all-reduce correct on all {plan.world_size} ranks"
    elif result.error is None:
        missing = sorted(set(range(plan.world_size)) - {r.rank for r in result.ranks})
        bad = [r for r in result.ranks if not r.ok]
        result.error = (
            f"ranks {missing} reported nothing"
            if missing
            else f"rank {bad[0].rank}: {bad[0].error or f'got {bad[0].value}, expected {bad[0].expected}'}"
        )
    return result


def _read_ranks(folder: Path, world_size: int) -> list[RankResult]:
    ranks = []
    for r in range(world_size):
        f = folder / f"rank-{r}.json"
        if f.exists():
            try:
                ranks.append(RankResult(**json.loads(f.read_text(encoding="utf-8"))))
            except (ValueError, TypeError) as e:
                ranks.append(RankResult(rank=r, ok=False, error=f"unreadable result: {e}"))
    return ranks


def _numel(size_mib: float) -> int:
    return max(1, int(size_mib * 1024 * 1024) // 4)  # fp32 elements


def _device(plan: Plan, local_rank: int):
    import torch

    if plan.device == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if plan.device == "mps":
        return torch.device("mps")
    return torch.device("cpu")


def _matmul_check(device) -> None:
    """The device computes: a small matmul agrees with the CPU's answer."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=g)
    want = a @ a
    got = (a.to(device) @ a.to(device)).cpu()
    if not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
        raise RuntimeError(
            f"matmul on {device} disagrees with the CPU (max error {(got - want).abs().max()})"
        )


def _single_process(plan: Plan, size_mib: float, iters: int) -> SmokeResult:
    """One process: no process group to test, but the device must work."""
    result = SmokeResult(
        ok=False,
        world_size=1,
        backend=None,
        device=plan.device,
        launcher=None,
        allreduce_ok=None,
        size_mib=size_mib,
        iters=iters,
        note="one process: no process group needed; checked a matmul on the device",
    )
    try:
        device = _device(plan, 0)
        _matmul_check(device)
    except Exception as e:  # a broken device is the finding, not a crash
        result.error = f"{type(e).__name__}: {e}"
        result.ranks = [RankResult(rank=0, ok=False, device=plan.device, error=result.error)]
        return result
    result.ok = True
    result.ranks = [RankResult(rank=0, ok=True, device=str(device))]
    return result


# -- worker side ------------------------------------------------------------------------------------
def worker(result_dir: str, size_mib: float, iters: int, timeout_s: int) -> None:
    """One smoke rank (started by the launcher; rank variables and XTRAIN_PLAN are in the env)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    context = LaunchContext.from_env()  # the launcher's rank variables and XTRAIN_PLAN
    lifetime.watch_parent(context)  # a killed launcher takes this worker with it
    plan = context.sent_plan
    if plan is None:
        raise XtrainError("the smoke worker was started without XTRAIN_PLAN", "run `xtrain doctor --smoke`")
    rank, world, local_rank = context.rank, context.world_size, context.local_rank
    out = RankResult(rank=rank, ok=False)
    try:
        device = _device(plan, local_rank)
        out.device = str(device)
        _matmul_check(device)
        if not init_worker_group(plan.backend or "gloo", rank, world, timeout_s):
            dist.init_process_group(
                backend=plan.backend or "gloo",
                init_method="env://",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=timeout_s),
            )
        staged = plan.cpu_staged_allreduce and device.type != "cpu"

        def all_reduce(t: torch.Tensor) -> None:
            # Windows CUDA + gloo: reduce a CPU copy (gloo's CUDA all-reduce crashes there).
            if staged:
                c = t.cpu()
                dist.all_reduce(c)
                t.copy_(c)
            else:
                dist.all_reduce(t)

        n = _numel(size_mib)
        check = torch.full((n,), float(rank + 1), device=device)
        all_reduce(check)
        expected = world * (world + 1) / 2
        out.value, out.expected = float(check[0].item()), expected
        ok = bool((check == expected).all().item())

        buf = torch.zeros(n, device=device)  # zeros stay zeros: no overflow however many iters
        for _ in range(WARMUP_ITERS):
            all_reduce(buf)
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            all_reduce(buf)
        _sync(device)
        out.seconds = time.perf_counter() - t0
        out.ok = ok
        if not ok:
            out.error = f"all-reduce gave {out.value}, expected {expected}"
        dist.barrier()
    except Exception as e:
        out.error = f"{type(e).__name__}: {e}"
        _write(result_dir, out)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    _write(result_dir, out)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _write(result_dir: str, out: RankResult) -> None:
    atomic.write_text(Path(result_dir) / f"rank-{out.rank}.json", json.dumps(asdict(out)))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        raise SystemExit("usage: python -m xtrain.launch.smoke RESULT_DIR SIZE_MIB ITERS TIMEOUT_S")
    worker(args[0], float(args[1]), int(args[2]), int(args[3]))


if __name__ == "__main__":
    main()
