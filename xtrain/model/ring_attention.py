"""Ring attention (Liu et al. 2023), the second sequence-parallel mode (``parallel.sequence_mode:
ring``): for models whose attention or key/value heads do not divide by the processes of a
sequence, where Ulysses cannot split the heads.

Each process keeps its shard's queries; the keys and values travel around the ring of the group
(``Exchange.send_recv``: point-to-point only), one shard a step, and each process folds every
block it receives into its output with the log-sum-exp merge of blockwise softmax (as flash
attention's forward does): after N blocks every query has attended to every key it may see. The
mask of a block is exact: causal by global position, inside a segment (``Shards.segments``: a
packed row's examples, a left-padded row's tokens), within a sliding window where the layer has
one; a block wholly in a query shard's future is skipped (its keys still pass on).

The backward is its own (``_Ring.backward``): the blocks again in ring order, each recomputed from
the saved log-sum-exp (no block's probabilities are kept), the queries' gradient kept here and
each block's key and value gradients travelling with it, so that after N - 1 steps and one more
hop every shard's gradients are back with the process that holds it.

The arithmetic is plain matrix products in float32, a block of queries at a time (``QUERY_ROWS``),
not a fused kernel: exact on every device and backend (gloo on CPU or CUDA, NCCL), memory bounded
by the block, slower than Ulysses' fused attention. Attention dropout and soft-capping are refused.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.sequence_shards import Shards

if TYPE_CHECKING:
    from xtrain.model.shard_exchange import Exchange

# float32 scores a block of queries holds at once: rows x keys x heads x batch (64M: 256 MiB)
SCORE_ENTRIES = 1 << 26


def segment_ids(shards: Shards, rows: int, device: torch.device) -> torch.Tensor:
    """[rows, T]: each position's segment within its row (all 0 for rows of one sequence)."""
    if shards.segments is None:
        return torch.zeros(rows, shards.length, dtype=torch.long, device=device)
    return torch.stack(
        [
            torch.repeat_interleave(torch.arange(len(n), device=device), torch.tensor(n, device=device))
            for n in shards.segments
        ]
    )


def _mask(seg: torch.Tensor, q0: int, k0: int, rows: int, keys: int, window: int | None) -> torch.Tensor:
    """[B, 1, rows, keys] bool: queries at global positions q0.. attend to keys at k0.."""
    q = torch.arange(q0, q0 + rows, device=seg.device)
    k = torch.arange(k0, k0 + keys, device=seg.device)
    keep = k[None, :] <= q[:, None]
    if window is not None:
        keep = keep & (q[:, None] - k[None, :] < window)
    same = seg[:, q0 : q0 + rows, None] == seg[:, None, k0 : k0 + keys]
    return (keep[None] & same)[:, None]


def _repeat(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _fold(x: torch.Tensor, groups: int) -> torch.Tensor:
    """A gradient of repeated key/value heads summed back onto the heads they repeat."""
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x.view(b, h // groups, groups, n, d).sum(2)


class _Ring(torch.autograd.Function):
    """Queries [B, H, L, D], keys and values [B, Hkv, L, D] of this shard -> output [B, H, L, D]."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ex: Exchange,
                seg: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:  # fmt: skip
        n, r, length = ex.size, ex.rank, q.shape[2]
        groups = q.shape[1] // k.shape[1]
        qf = q.float()
        out = torch.zeros_like(qf)
        lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)
        block = (k, v)
        for step in range(n):
            j = (r - step) % n  # the shard whose keys this process holds now
            if j <= r:
                kj, vj = (_repeat(t, groups).float() for t in block)
                for a in range(0, length, _rows(q)):
                    rows = slice(a, min(a + _rows(q), length))
                    keep = _mask(seg, r * length + a, j * length, rows.stop - a, length, window)
                    s = torch.matmul(qf[:, :, rows], kj.transpose(2, 3)) * scale
                    s = s.masked_fill(~keep, -math.inf)
                    block_lse = torch.logsumexp(s, dim=-1)
                    part = torch.matmul(torch.exp(s - block_lse[..., None]).nan_to_num(0.0), vj)
                    merged = torch.logaddexp(lse[:, :, rows], block_lse)
                    old = torch.exp(lse[:, :, rows] - merged).nan_to_num(0.0)[..., None]
                    new = torch.exp(block_lse - merged).nan_to_num(0.0)[..., None]
                    out[:, :, rows] = out[:, :, rows] * old + part * new
                    lse[:, :, rows] = merged
            if step < n - 1:
                block = tuple(ex.send_recv(t, (r + 1) % n, (r - 1) % n) for t in block)
        ctx.save_for_backward(q, k, v, out, lse, seg)
        ctx.ex, ctx.scale, ctx.window = ex, scale, window
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, seg = ctx.saved_tensors
        ex, scale, window = ctx.ex, ctx.scale, ctx.window
        n, r, length = ex.size, ex.rank, q.shape[2]
        groups = q.shape[1] // k.shape[1]
        qf, go = q.float(), grad.float()
        delta = (go * out).sum(-1)  # [B, H, L]: rowsum(dO * O)
        dq = torch.zeros_like(qf)
        block = (k, v, torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32))
        for step in range(n):
            j = (r - step) % n
            kb, vb, dk, dv = block
            if j <= r:
                kj, vj = (_repeat(t, groups).float() for t in (kb, vb))
                dkj, dvj = torch.zeros_like(kj), torch.zeros_like(vj)
                for a in range(0, length, _rows(q)):
                    rows = slice(a, min(a + _rows(q), length))
                    keep = _mask(seg, r * length + a, j * length, rows.stop - a, length, window)
                    s = torch.matmul(qf[:, :, rows], kj.transpose(2, 3)) * scale
                    p = torch.exp(s - lse[:, :, rows, None]).masked_fill(~keep, 0.0)
                    dvj += torch.matmul(p.transpose(2, 3), go[:, :, rows])
                    dp = torch.matmul(go[:, :, rows], vj.transpose(2, 3))
                    ds = p * (dp - delta[:, :, rows, None]) * scale
                    dq[:, :, rows] += torch.matmul(ds, kj)
                    dkj += torch.matmul(ds.transpose(2, 3), qf[:, :, rows])
                dk, dv = dk + _fold(dkj, groups), dv + _fold(dvj, groups)
            if step < n - 1:
                block = tuple(ex.send_recv(t, (r + 1) % n, (r - 1) % n) for t in (kb, vb, dk, dv))
            else:  # every process's share added: one more hop brings each shard's home
                block = (kb, vb, *(ex.send_recv(t, (r + 1) % n, (r - 1) % n) for t in (dk, dv)))
        dk, dv = block[2], block[3]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def _rows(q: torch.Tensor) -> int:
    """Queries a block computes at once: its scores within ``SCORE_ENTRIES``."""
    b, h, length, _ = q.shape
    return max(1, min(length, SCORE_ENTRIES // max(1, b * h * length)))


def ring(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         shards: Shards, ex: Exchange, kwargs: dict[str, Any]) -> torch.Tensor:  # fmt: skip
    """Ring attention on this shard's queries [B, heads, L, D] -> its output [B, L, heads, D]."""
    if module.training and kwargs.get("dropout", 0.0):
        raise RuntimeError("ring attention drops no attention weights out: set the attention dropout to 0")
    if kwargs.get("softcap") is not None:
        raise RuntimeError("ring attention does not soft-cap scores (parallel.sequence_mode=ulysses does)")
    scale = kwargs.get("scaling")
    scale = float(scale) if scale is not None else query.shape[-1] ** -0.5
    seg = segment_ids(shards, query.shape[0], query.device)
    out = _Ring.apply(query, key, value, ex, seg, scale, kwargs.get("sliding_window"))
    return out.transpose(1, 2).contiguous()
