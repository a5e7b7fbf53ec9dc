"""A DDP communication hook that all-reduces gradients through CPU copies.

On Windows, gloo's all-reduce of CUDA tensors crashed with an access violation in torch
2.9-2.12 (pytorch#186535, FIELD_NOTES), while CPU tensors work. This hook copies each gradient
bucket to the CPU, all-reduces it there with gloo, and copies the average back, so DDP over gloo
works with CUDA gradients. With LoRA the buckets are small, so the copies cost little.

It mirrors ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook`` (divide
by the world size first, then sum), so on CPU it gives the same gradients as DDP's default.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations at runtime.
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CpuStagedState:
    """The hook's state: the gloo group to reduce in (None: the default group) and one pinned
    host buffer per gradient bucket, reused every step."""

    group: dist.ProcessGroup | None = None
    buffers: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def staging_buffer(self, index: int, like: torch.Tensor) -> torch.Tensor:
        """Pinned memory makes the device-to-host copy a DMA that can run without a bounce
        buffer (about twice the bandwidth of pageable memory). DDP rebuilds its buckets after the
        first step, so a bucket whose size changed gets a new buffer."""
        buf = self.buffers.get(index)
        if buf is None or buf.numel() != like.numel() or buf.dtype != like.dtype:
            buf = torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
            self.buffers[index] = buf
        return buf


def cpu_staged_allreduce_hook(
    state: CpuStagedState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over all ranks through a CPU copy; the result lands in the bucket.

    DDP calls this from backward as soon as a bucket's gradients are ready, so the copy and the
    gloo all-reduce of one bucket overlap with the backward of the layers still to come. The host
    waits only for this bucket's copy (an event), not for the whole queue of backward kernels."""
    grad = bucket.buffer()
    if grad.device.type == "cuda":
        staged = state.staging_buffer(bucket.index(), grad)
        staged.copy_(grad, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        copied.synchronize()  # gloo reads host memory: the copy must have landed
    else:
        staged = grad.detach().to("cpu", copy=True)  # always a copy: never reduce DDP's buffer in place
    staged.div_(state.world_size)
    fut = dist.all_reduce(staged, group=state.group, async_op=True).get_future()

    def copy_back(f):  # torch.futures.Future[list[Tensor]] -> Tensor
        # From pinned memory the copy is asynchronous and stream-ordered: DDP's use of the bucket
        # and the next step's copy into the same buffer both queue behind it.
        grad.copy_(f.value()[0], non_blocking=grad.device.type == "cuda")
        return grad

    return fut.then(copy_back)


def register(model: torch.nn.Module, group: dist.ProcessGroup | None = None) -> bool:
    """Register the hook on a DDP-wrapped model. Returns False (and does nothing) when the model
    is not wrapped in DistributedDataParallel (a single process)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return False
    if group is None and dist.get_backend() != "gloo":
        # The default group is not gloo (e.g. nccl): reduce the CPU copies in a gloo side group.
        group = dist.new_group(backend="gloo")
    model.register_comm_hook(CpuStagedState(group), cpu_staged_allreduce_hook)
    return True
