"""Where two CPU processes lose time: a hand-written DDP loop over gloo, taken apart.

The bench's model (``--size``, default ``tiny``: 4 layers x 128, LoRA r=16 on q/k/v/o), fixed
rows of token ids, global batch ``per_device x 2``, AdamW, clipping at 1.0, a local loss read
every 10 steps, fp32, one compute thread a process. Variants, interleaved ``--repeats`` times:

- ``one``: one process, accumulating 2 micro-batches (the reference).
- ``copies``: two such processes started together, no process group: the machine's ceiling.
- ``ddp``: two ranks, ``DistributedDataParallel`` over gloo (DDP's default 25 MB buckets: LoRA's
  0.25 MB of gradients is one bucket, reduced after the whole backward pass).
- ``ddp_noop``: the same DDP with a comm hook that returns each bucket as it is: DDP's machinery
  without any communication or waiting for the other rank.
- ``ddp_buckets``: DDP with 0.05 MB buckets (several per backward pass), so the all-reduce of the
  first buckets can overlap the rest of the backward pass.

Global samples/s: ``global batch / median step time`` of the slower rank for the DDP variants,
the sum of both processes' rates for ``copies`` and ``ddp_noop`` (which do not wait for each
other). Each rank also reports the CPU time per step, which tells computing from waiting.

    python benchmarks/ddp_parts.py [--repeats 3] [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, REPO, Spread, bench_env, machine, model_size  # noqa: E402

VARIANTS = ("one", "copies", "ddp", "ddp_noop", "ddp_buckets")
WARMUP = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the worker (one rank, or one process alone) --------------------------------------------------------
def _noop_hook(state: Any, bucket: Any) -> Any:
    """A DDP comm hook that communicates nothing: the bucket's local gradients, as a done future."""
    import torch

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from common import hand_written_loop, set_threads_from_env
    from loops import collate, make_data, make_model
    from transformers import get_scheduler

    set_threads_from_env()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    model = make_model(a)
    params = [p for p in model.parameters() if p.requires_grad]
    net: Any = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        cap = 0.05 if a.variant == "ddp_buckets" else 25
        net = DDP(model, bucket_cap_mb=cap, find_unused_parameters=False, gradient_as_bucket_view=True)
        if a.variant == "ddp_noop":
            # DDP checks the hook's annotations as objects (this module's are strings)
            future = torch.futures.Future[torch.Tensor]
            _noop_hook.__annotations__ = {"bucket": dist.GradBucket, "return": future}
            net.register_comm_hook(None, _noop_hook)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    sched = get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=a.steps)
    data = make_data(a)
    g = torch.Generator().manual_seed(rank)
    loader = torch.utils.data.DataLoader(data, batch_size=a.per_device, shuffle=True, generator=g,
                                         collate_fn=collate)  # fmt: skip

    def batches() -> Any:
        while True:
            yield from loader

    cpu: list[float] = []
    times = hand_written_loop(net, batches(), steps=a.steps, accum=a.accum, optimizer=opt, scheduler=sched,
                              max_grad_norm=1.0, log_every=10, cpu_times=cpu)  # fmt: skip
    steps = [b - t for t, b in zip(times[WARMUP:], times[WARMUP + 1 :], strict=False)]
    cpus = [b - t for t, b in zip(cpu[WARMUP:], cpu[WARMUP + 1 :], strict=False)]
    result = {"rank": rank, "step_s": statistics.median(steps), "cpu_s": statistics.median(cpus)}
    Path(a.out).write_text(json.dumps(result), encoding="utf-8")
    sys.stdout.flush()
    if world > 1:
        dist.barrier()
        os._exit(0)  # skip gloo's teardown race at exit (see tests/test_comm_hook.py); the result is written


# -- the parent --------------------------------------------------------------------------------------
def _start(variant: str, size: str, steps: int, per_device: int, folder: Path) -> list[Path]:
    """Start the variant's processes, wait for them, return their result files."""
    n = 1 if variant == "one" else 2
    ranked = variant.startswith("ddp")
    accum = 1 if ranked else 2
    port = str(_free_port())
    procs, outs = [], []
    for i in range(n):
        out = folder / f"{variant}-{i}.json"
        env = bench_env(1)
        if ranked:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(i), WORLD_SIZE=str(n))
        cmd = [PYTHON, str(Path(__file__).resolve()), "--worker", "--variant", variant, "--size", size,
               "--steps", str(steps), "--per-device", str(per_device), "--accum", str(accum),
               "--out", str(out)]  # fmt: skip
        log = (folder / f"{variant}-{i}.log").open("w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log))
        outs.append(out)
    for proc, log in procs:
        code = proc.wait(timeout=900)
        log.close()
        if code != 0:
            raise RuntimeError(f"ddp_parts {variant} exited {code}:\n{Path(log.name).read_text()[-3000:]}")
    return outs


def measure(repeats: int = 3, steps: int = 40, size: str = "tiny", log: Any = None) -> dict[str, Any]:
    say = log or (lambda m: None)
    s = model_size(size)
    per_device = s.per_device
    global_batch = per_device * 2
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    step_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
    folder = Path(tempfile.mkdtemp(prefix="xtrain-bench-ddp-"))
    try:
        for r in range(repeats):
            order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
            for variant in order:
                files = _start(variant, size, steps, per_device, folder)
                results = [json.loads(p.read_text()) for p in files]
                slowest = max(x["step_s"] for x in results)
                if variant in ("copies", "ddp_noop"):  # independent paces: the rates add up
                    per_process = per_device * (2 if variant == "copies" else 1)
                    rate = sum(per_process / x["step_s"] for x in results)
                else:
                    rate = global_batch / slowest
                rates[variant].append(rate)
                step_s[variant].append(slowest)
                cpu_s[variant].append(max(x["cpu_s"] for x in results))
                say(
                    f"ddp-parts: repeat {r + 1}/{repeats} {variant}: {rate:.1f} samples/s, "
                    f"step {slowest * 1e3:.0f} ms"
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    one = statistics.median(rates["one"])
    return {
        "setup": {
            "repeats": repeats,
            "steps": steps,
            "size": size,
            "per_device": per_device,
            "global_batch": global_batch,
            "warmup": WARMUP,
            "threads": 1,
        },  # fmt: skip
        "samples_per_s": {v: Spread.of(x).to_dict() for v, x in rates.items()},
        "step_ms": {v: Spread.of([t * 1e3 for t in x]).to_dict() for v, x in step_s.items()},
        "cpu_ms": {v: Spread.of([t * 1e3 for t in x]).to_dict() for v, x in cpu_s.items()},
        "speedup": {v: statistics.median(x) / one for v, x in rates.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--size", default="tiny")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--per-device", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--accum", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        a.full = False
        worker(a)
        return
    result = measure(a.repeats, a.steps, a.size, log=lambda m: print(m, file=sys.stderr))
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for v in VARIANTS:
        d, st, c = result["samples_per_s"][v], result["step_ms"][v], result["cpu_ms"][v]
        x = result["speedup"][v]
        print(f"{v:12} {d['median']:7.1f} samples/s ({d['min']:.1f}-{d['max']:.1f})  {x:.2f}x  "
              f"step {st['median']:.0f} ms, CPU {c['median']:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
