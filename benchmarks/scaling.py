"""1 process vs N processes through the real launch path (what `xtrain bench` does), repeated.

The bench's model and data (``--size``, default ``tiny`` on CPU), the same global batch in both
runs (``per_device x N``: the one-process run accumulates N micro-batches), rates from the loop's
logging windows after the first. The 1- and N-process runs alternate ``--repeats`` times; the
speedup is the ratio of the medians, and each adjacent pair also gives its own efficiency.
Every process gets ``--threads`` compute threads (default 1: on CPU each process then owns one
core, so the comparison is data parallelism over cores, not threads against processes). The
all-reduce bandwidth of the planned backend comes from `xtrain doctor --smoke`'s code.

    python benchmarks/scaling.py [--processes 2] [--repeats 5] [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Spread, machine  # noqa: E402

from xtrain.bench.flops import scaling
from xtrain.bench.job import job_config, prepare_job, write_config
from xtrain.bench.rates import figures
from xtrain.bench.runner import output_to, plan_for, run_training
from xtrain.bench.sizes import SIZES


def measure(
    processes: int = 2,
    repeats: int = 5,
    steps: int = 40,
    size: str = "tiny",
    threads: int | None = 1,
    precision: str | None = None,
    log: Any = None,
) -> dict[str, Any]:
    from xtrain.launch.smoke import run_smoke
    from xtrain.machine import probe

    say = log or (lambda m: None)
    if threads is not None:  # launched workers inherit this process's environment
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    facts = probe.collect(quick=True)
    plans = {1: plan_for(facts, 1, precision, None), processes: plan_for(facts, processes, precision, None)}
    s = SIZES[size]
    root = Path(tempfile.mkdtemp(prefix="xtrain-bench-scaling-"))
    try:
        with output_to(root / "prepare.log"):
            job = prepare_job(root, s, processes)
        rates: dict[int, list[float]] = {1: [], processes: []}
        tokens: dict[int, list[float]] = {1: [], processes: []}
        counts = [1, processes]
        for r in range(repeats):
            for n in counts if r % 2 == 0 else counts[::-1]:
                out = root / f"r{r}-{n}p"
                cfg = job_config(
                    job, out, s.per_device * processes, steps, max(1, steps // 8), False, precision, 16
                )
                path = write_config(root / f"r{r}-{n}p.yaml", cfg)
                run = figures(run_training(plans[n], path, out, root / f"r{r}-{n}p.log"), n, steps)
                rates[n].append(run.samples_per_s)
                tokens[n].append(run.tokens_per_s)
                say(f"scaling: repeat {r + 1}/{repeats}, {n} process(es): {run.samples_per_s:.1f} samples/s")
                shutil.rmtree(out, ignore_errors=True)
        with output_to(root / "smoke.log"):
            smoke = run_smoke(plans[processes])
        one, many = Spread.of(rates[1]), Spread.of(rates[processes])
        speedup, efficiency = scaling(one.median, many.median, processes)
        paired = [scaling(a, b, processes)[1] for a, b in zip(rates[1], rates[processes], strict=True)]
        return {
            "setup": {
                "processes": processes,
                "repeats": repeats,
                "steps": steps,
                "size": size,
                "threads": threads,
                "global_batch": s.per_device * processes,
                "seq_len": s.seq_len,
                "backend": plans[processes].backend,
                "launcher": plans[processes].launcher,
                "device": plans[processes].device,
            },  # fmt: skip
            "samples_per_s": {"1": one.to_dict(), str(processes): many.to_dict()},
            "tokens_per_s": {str(k): Spread.of(v).to_dict() for k, v in tokens.items()},
            "speedup": speedup,
            "efficiency": efficiency,
            "paired_efficiency": Spread.of([e for e in paired if e is not None]).to_dict(),
            "runs": rates,
            "allreduce": {
                "ok": smoke.ok,
                "busbw_gbps": smoke.busbw_gbps,
                "size_mib": smoke.size_mib,
                "backend": smoke.backend,
                "error": smoke.error,
            },  # fmt: skip
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--threads", type=int, default=1, help="compute threads per process (0: torch's default)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.processes, a.repeats, a.steps, a.size, a.threads or None,
                     log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for n, d in result["samples_per_s"].items():
        print(f"{n} process(es): {d['median']:.1f} samples/s ({d['min']:.1f}-{d['max']:.1f}, n={d['n']})")
    pe = result["paired_efficiency"]
    print(f"speedup {result['speedup']:.2f}x, efficiency {result['efficiency']:.0%} "
          f"(paired {pe['min']:.0%}-{pe['max']:.0%})")  # fmt: skip
    ar = result["allreduce"]
    if ar["busbw_gbps"] is not None:
        print(
            f"all-reduce ({ar['backend']}, {ar['size_mib']:g} MiB): {ar['busbw_gbps']:.2f} GB/s bus bandwidth"
        )


if __name__ == "__main__":
    main()
