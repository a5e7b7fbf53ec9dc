"""A tiny distributed worker for tests/test_launch.py, usable both ways xtrain starts workers:
as a function (spawn) and as a module (``python -m launch_worker DIR [FAIL_RANK]`` under
accelerate launch). Each rank all-reduces rank+1 over gloo and writes what it saw to
DIR/rank-R.json, including the launch environment it was given."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "USE_LIBUV",
    "XTRAIN_PLAN",
    "XTRAIN_TEST_MARK",
)


def allreduce(result_dir: str, fail_rank: int = -1) -> None:
    # The environment is read before torch.distributed exists: the launcher must have set it.
    env = {k: os.environ.get(k) for k in ENV_KEYS}
    rank = int(os.environ["RANK"])
    if rank == fail_rank:
        raise RuntimeError(f"boom on rank {rank}")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    world = dist.get_world_size()
    dist.destroy_process_group()
    out = {"rank": rank, "sum": t.item(), "world": world, "env": env}
    Path(result_dir, f"rank-{rank}.json").write_text(json.dumps(out), encoding="utf-8")


def single(result_dir: str) -> None:
    """One process, no process group: record the environment, then write the launch variables
    accelerate's CPU state writes (the launcher must not leave them behind in its process)."""
    env = {k: os.environ.get(k) for k in ENV_KEYS}
    Path(result_dir, "single.json").write_text(json.dumps({"env": env}), encoding="utf-8")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_PORT="29500")


def main(argv: list[str]) -> None:
    if argv[0] == "single":
        single(argv[1])
    else:
        allreduce(argv[0], int(argv[1]) if len(argv) > 1 else -1)


if __name__ == "__main__":
    main(sys.argv[1:])
