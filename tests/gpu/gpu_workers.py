"""Spawn targets of the GPU suite (top level, importable by name)."""

from __future__ import annotations

import os


def comm_hook_equality(rank: int, world: int, port: int, out_dir: str) -> None:
    """Two ranks on cuda:0 over gloo: DDP's default all-reduce and xtrain's CPU-staged hook must
    give the same averaged gradients for the same per-rank inputs."""
    import torch
    import torch.distributed as dist

    from xtrain.train.distributed import comm_hook

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    grads = {}
    for hooked in (False, True):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0])
        if hooked:
            assert comm_hook.register(ddp)
        g = torch.Generator(device="cuda").manual_seed(100 + rank)
        x = torch.randn(16, 64, device="cuda", generator=g)
        ddp(x).square().mean().backward()
        grads[hooked] = torch.cat([p.grad.flatten() for p in ddp.parameters()]).cpu()
    torch.save(grads, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
