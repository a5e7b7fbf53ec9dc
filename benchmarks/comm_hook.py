"""Cost of the CPU-staged gradient all-reduce (the Windows gloo path) against gloo's own CUDA
all-reduce, on CUDA tensors: two processes sharing GPU 0 (as many as the machine has), DDP over
gloo, ms per backward+reduce for a LoRA-sized and a full-model-sized set of gradients.

    python benchmarks/comm_hook.py [--steps 30]      # on a CUDA machine (Linux: gloo's CUDA path works)

Not run in CI. Two processes on one GPU share its compute, so read the figures as "what the hook
adds", not as a two-GPU speed."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {"lora-like (2.4M grads)": (24, 1024, 100), "full-like (113M grads)": (12, 3072, 3072)}


def worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from xtrain.train.distributed import comm_hook

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    rows = []
    for name, (layers, width, rank_dim) in SIZES.items():
        for hooked in (False, True):
            torch.manual_seed(0)
            blocks = [torch.nn.Sequential(torch.nn.Linear(width, rank_dim), torch.nn.Linear(rank_dim, width))
                      for _ in range(layers)]  # fmt: skip
            net = torch.nn.Sequential(*blocks).to(device)
            ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index])
            if hooked:
                comm_hook.register(ddp)
            x = torch.randn(8, width, device=device)
            times = []
            for i in range(steps + 5):
                torch.cuda.synchronize()
                t = time.perf_counter()
                ddp(x).square().mean().backward()
                torch.cuda.synchronize()
                if i >= 5:
                    times.append(time.perf_counter() - t)
            grads = sum(p.numel() for p in net.parameters())
            times.sort()
            rows.append({"set": name, "grads": grads, "hook": hooked, "ms": 1000 * times[len(times) // 2]})
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def main() -> None:
    import tempfile

    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.start_processes(worker, args=(2, port, a.steps, out), nprocs=2, join=True, start_method="spawn")
        rows = json.loads(Path(out).read_text())
    for r in rows:
        how = "CPU-staged hook" if r["hook"] else "gloo CUDA allreduce"
        print(f"{r['set']:24} {how:20} {r['ms']:8.2f} ms/step")


if __name__ == "__main__":
    main()
