"""1 process vs N processes through the real launch path (what `xtrain bench` does), repeated.

The bench's model and data (``--size``, default ``tiny`` on CPU), the same global batch in both
runs (``per_device x N``: the one-process run accumulates N micro-batches), rates from the loop's
logging windows after the first. The 1- and N-process runs alternate ``--repeats`` times; the
speedup is the ratio of the medians, and each adjacent pair also gives its own efficiency.
Every process gets ``--threads`` compute threads (default 1: on CPU each process then owns one
core, so the comparison is data parallelism over cores, not threads against processes). The
all-reduce bandwidth of the planned backend comes from `xtrain doctor --smoke`'s code.

The ceiling: N copies of the one-process run started together, no process group between them,
their rates summed. It is what N processes can do on this machine with no communication at all
(cores that share caches and memory bandwidth, a VM's neighbours), so ``speedup / ceiling`` is
what data parallelism itself costs: the all-reduce, the sync, the launcher.

    python benchmarks/scaling.py [--processes 2] [--repeats 5] [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Spread, machine  # noqa: E402

from xtrain.bench.flops import scaling
from xtrain.bench.job import job_config, prepare_job, write_config
from xtrain.bench.rates import figures, read_windows
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
        ceiling: list[float] = []
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
            copies = independent_copies(root / f"r{r}-1p.yaml", root / f"r{r}-copies", processes, steps)
            ceiling.append(sum(copies))
            say(f"scaling: repeat {r + 1}/{repeats}, {processes} copies at once: {sum(copies):.1f} samples/s")
        with output_to(root / "smoke.log"):
            smoke = run_smoke(plans[processes])
        one, many = Spread.of(rates[1]), Spread.of(rates[processes])
        speedup, efficiency = scaling(one.median, many.median, processes)
        paired = [scaling(a, b, processes)[1] for a, b in zip(rates[1], rates[processes], strict=True)]
        top = Spread.of(ceiling)
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
            # N one-process runs at once, no communication: the machine's own ceiling
            "ceiling_samples_per_s": top.to_dict(),
            "ceiling_speedup": top.median / one.median if one.median else None,
            "of_ceiling": many.median / top.median if top.median else None,
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


def independent_copies(config: Path, folder: Path, copies: int, steps: int) -> list[float]:
    """Samples/s of each of ``copies`` one-process runs of ``config`` started together (``python
    -m xtrain.run``, no process group between them), from their own logging windows."""
    procs = []
    for i in range(copies):
        out = folder / f"copy-{i}"
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "xtrain.run", "--config", str(config), f"run.output_dir={out}"]
        with open(folder / f"copy-{i}.log", "w") as log:
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), out))
    rates = []
    for proc, out in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"an independent copy failed: see {out.parent}")
        result = json.loads((out / "train_result.json").read_text(encoding="utf-8"))
        result["windows"] = read_windows(out)
        rates.append(figures(result, 1, steps).samples_per_s)
    shutil.rmtree(folder, ignore_errors=True)
    return rates


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
    c = result["ceiling_samples_per_s"]
    print(
        f"ceiling ({a.processes} independent one-process runs at once): {c['median']:.1f} samples/s, "
        f"{result['ceiling_speedup']:.2f}x; {a.processes} processes reach {result['of_ceiling']:.0%} of it"
    )
    ar = result["allreduce"]
    if ar["busbw_gbps"] is not None:
        print(
            f"all-reduce ({ar['backend']}, {ar['size_mib']:g} MiB): {ar['busbw_gbps']:.2f} GB/s bus bandwidth"
        )


if __name__ == "__main__":
    main()
