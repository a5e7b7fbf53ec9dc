"""GPU rows: tokens/s and MFU of LoRA and full fine-tuning of the ~110M-parameter llama-style
``base`` model in bf16 and fp16, xtrain (through the real launch path, as `xtrain bench` runs
it) next to the hand-written loop with and without ``torch.compile``. One process, one GPU.

    python benchmarks/gpu.py [--steps 40] [--json]           # on a CUDA machine
    python benchmarks/gpu.py --size tiny --steps 6 --precisions bf16 --no-compile   # a CPU check

The "compile" rows: the hand-written loop with ``torch.compile``, and xtrain's loop with
``run.compile`` (run in-process by ``loops.py --worker xtrain --compile``: the same loop
``python -m xtrain.run`` runs). MFU uses ``xtrain.bench``'s FLOPs rule
(4 N + 2 N_trainable per token, 6 N for full fine-tuning) and peak table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, bench_env, machine, run_json  # noqa: E402

from xtrain.bench.flops import flops_per_token, mfu, peak_tflops  # noqa: E402
from xtrain.bench.runner import BenchOptions, run_bench  # noqa: E402
from xtrain.bench.sizes import SIZES  # noqa: E402

HERE = Path(__file__).resolve().parent


def measure(
    size: str = "base",
    steps: int = 40,
    precisions: tuple[str, ...] = ("bf16", "fp16"),
    compile_rows: bool = True,
    log: Any = None,
) -> dict[str, Any]:
    import torch

    from xtrain.machine import probe

    say = log or (lambda m: None)
    facts = probe.collect(quick=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    s = SIZES[size]
    rows = []
    for full in (False, True):
        mode = "full" if full else "LoRA"
        total, emb, trainable = s.param_counts(None if full else 16)
        fpt = flops_per_token(total, emb, trainable)
        for precision in precisions:
            peak = peak_tflops(gpu, precision)
            say(f"gpu: xtrain {mode} {precision}")
            result = run_bench(
                facts,
                BenchOptions(
                    size=size, steps=steps, processes=1, full=full, precision=precision, smoke=False
                ),
            )
            run = result.runs[0]
            rows.append({"loop": "xtrain", "mode": mode, "precision": precision, "compile": False,
                         "tokens_per_s": run.tokens_per_s, "mfu": run.mfu})  # fmt: skip
            say(json.dumps(rows[-1]))  # each row as it comes: a cut-off run keeps what it measured
            for compiled in (False, True) if compile_rows else (False,):
                say(f"gpu: plain loop {mode} {precision} compile={compiled}")
                cmd = [PYTHON, str(HERE / "loops.py"), "--worker", "plain", "--size", size,
                       "--steps", str(steps), "--warmup", "5", "--per-device", str(s.per_device),
                       "--accum", "1", "--precision", precision]  # fmt: skip
                cmd += ["--full"] if full else []
                cmd += ["--compile"] if compiled else []
                steps_per_s = run_json(cmd, bench_env(None))["steps_per_s"]
                tps = steps_per_s * s.per_device * s.seq_len
                row_mfu = mfu(tps, fpt, 1, peak) if gpu else None
                rows.append({"loop": "plain", "mode": mode, "precision": precision, "compile": compiled,
                             "tokens_per_s": tps, "mfu": row_mfu})  # fmt: skip
                say(json.dumps(rows[-1]))
                if compiled:  # xtrain's loop with run.compile
                    say(f"gpu: xtrain loop {mode} {precision} compile=True")
                    cmd[cmd.index("plain")] = "xtrain"
                    steps_per_s = run_json(cmd, bench_env(None))["steps_per_s"]
                    tps = steps_per_s * s.per_device * s.seq_len
                    row_mfu = mfu(tps, fpt, 1, peak) if gpu else None
                    rows.append({"loop": "xtrain", "mode": mode, "precision": precision, "compile": True,
                                 "tokens_per_s": tps, "mfu": row_mfu})  # fmt: skip
                    say(json.dumps(rows[-1]))
    return {
        "setup": {
            "size": size,
            "steps": steps,
            "seq_len": s.seq_len,
            "per_device": s.per_device,
            "params": SIZES[size].param_counts(None)[0],
        },  # fmt: skip
        "gpu": gpu,
        "peak_note": "dense peak from xtrain.bench.flops.PEAKS",
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="base", choices=sorted(SIZES))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--precisions", default="bf16,fp16")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.size, a.steps, tuple(a.precisions.split(",")), not a.no_compile,
                     log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"GPU: {result['gpu'] or 'none (CPU check)'}; {a.size} model, {a.steps} steps")
    for r in result["rows"]:
        m = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(f"{r['loop']:7} {r['mode']:5} {r['precision']:5} compile={str(r['compile']):5} "
              f"{r['tokens_per_s']:>10,.0f} tokens/s  MFU {m}")  # fmt: skip


if __name__ == "__main__":
    main()
