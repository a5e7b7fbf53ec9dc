"""The exchanges of sequence parallelism between the processes of a group
(xtrain/model/sequence_parallel.py, ring_attention.py), and their gradients: all-to-all,
all-reduce and the ring's send/receive, staged through host memory where the backend cannot move
device tensors (gloo with CUDA tensors, Windows), as the CPU-staged all-reduce of the gradients
is (xtrain/train/distributed/comm_hook.py).

``shard_total`` sums a per-sequence value over a sequence's shards (the preference task's
log-probabilities) with the gradient of that sum: each shard's part gets the gradient of every
process's copy of what it enters, so a group's N identical sequence losses, averaged by DDP over
all processes, are the data-parallel groups' mean (xtrain/train/step_loss.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from xtrain.data.sequence_shards import Shards

# a function of transformers' attention registry: (module, query, key, value, mask, **kwargs)
AttentionFn = Callable[..., tuple[torch.Tensor, Any]]


@dataclass(frozen=True)
class Exchange:
    """This process's sequence-parallel group: its ``size`` ranks, this one's place in it, and
    whether tensors go through host memory (gloo with CUDA tensors)."""

    group: ProcessGroup | None
    size: int
    rank: int
    staged: bool = False
    mode: str = "ulysses"  # how attention crosses the shards: ulysses | ring (planning.sequence)

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: [size, ...], part i for rank i; returns [size, ...], part i from rank i."""
        import torch.distributed as dist

        if self.staged and x.device.type != "cpu":
            host = x.to("cpu").contiguous()
            out = torch.empty_like(host)
            dist.all_to_all_single(out, host, group=self.group)
            return out.to(x.device, non_blocking=False)
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=self.group)
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.staged and x.device.type != "cpu":
            host = x.to("cpu")
            dist.all_reduce(host, group=self.group)
            return host.to(x.device)
        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def send_recv(self, x: torch.Tensor, to: int, source: int) -> torch.Tensor:
        """Send ``x`` to group rank ``to`` and receive a tensor of its shape from ``source`` (the
        ring's step: every rank sends and receives at once)."""
        import torch.distributed as dist

        staged = self.staged and x.device.type != "cpu"
        out = torch.empty(x.shape, dtype=x.dtype, device="cpu" if staged else x.device)
        outgoing = x.to("cpu") if staged else x.contiguous()
        peer = (lambda r: dist.get_global_rank(self.group, r)) if self.group is not None else (lambda r: r)
        ops = [dist.P2POp(dist.isend, outgoing, peer(to), self.group),
               dist.P2POp(dist.irecv, out, peer(source), self.group)]  # fmt: skip
        if self.rank % 2:  # odd ranks receive first: gloo's pairs then never both wait to send
            ops.reverse()
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        return out.to(x.device) if staged else out

    def broadcast(self, tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """The group's first rank's ``tensors`` on every rank of the group (the others' are not
        read: they may send none), on ``device``. Through host memory, pickled (a step's completed
        rows: ids and masks, small beside its forward)."""
        import torch.distributed as dist

        box: list[Any] = [{k: v.detach().to("cpu") for k, v in tensors.items()}]
        first = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.broadcast_object_list(box, src=first, group=self.group)
        return {k: v.to(device) for k, v in box[0].items()}


_EXCHANGE: list[Exchange] = []  # this process's group, once the run set it (``activate``)


def activate(exchange: Exchange | None) -> None:
    """Make ``exchange`` this process's sequence-parallel group (the loop, before the first step;
    None: a run without one, after one that had it in this process)."""
    _EXCHANGE[:] = [exchange] if exchange is not None else []


def active() -> Exchange | None:
    """This process's sequence-parallel group, where its run has one (a task whose step makes its
    sequences, GRPO's rollout, cuts them itself: ``Workload.cuts_sequences``)."""
    return _EXCHANGE[0] if _EXCHANGE else None


def exchange() -> Exchange:
    if not _EXCHANGE:
        raise RuntimeError("a sequence-sharded batch reached attention before the run set its group")
    return _EXCHANGE[0]


class SelfAdjoint(torch.autograd.Function):
    """An exchange that is its own backward: an all-to-all of equal parts (part i from rank i, so
    the gradient's part i goes back to rank i the same way) and an all-reduce sum (every copy of
    the sum is used: each part gets the sum of their gradients). ``how``: ``Exchange``'s method."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ex: Exchange, how: str) -> torch.Tensor:
        ctx.ex, ctx.how = ex, how
        return getattr(ex, how)(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return getattr(ctx.ex, ctx.how)(grad.contiguous()), None, None


def all_to_all(x: torch.Tensor, ex: Exchange) -> torch.Tensor:
    """``Exchange.all_to_all`` with its gradient (the reverse all-to-all)."""
    return SelfAdjoint.apply(x, ex, "all_to_all")


def shard_total(x: torch.Tensor, shards: Shards | None) -> torch.Tensor:
    """``x`` summed over the shards of its sequences (identity for a batch that is not sharded);
    see the module docstring for its gradient."""
    if shards is None:
        return x
    return SelfAdjoint.apply(x, exchange(), "all_reduce")
