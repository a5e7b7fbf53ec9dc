"""Start-up: `xtrain --help`, `xtrain doctor`, and the time to the first optimizer step of xtrain
(`xtrain train C` and `python -m xtrain.run --config C`) vs Hugging Face Trainer.

The training job is the same for both: the bench's ``tiny`` llama-style model saved to a folder
(loaded with ``from_pretrained``), ~250 tiny stories in a jsonl file tokenized and packed into
128-token blocks with ``datasets.map``, LoRA r=16 on q/k/v/o, per-device batch 8, one process.
Time to the first step runs from the process start to the end of optimizer step 1 (xtrain: the
loop's first logging window in train_result.json with ``run.log_every=1``; Trainer: a
callback). One untimed run of each fills the caches (``datasets`` map cache, bytecode), so the
figures are warm starts. The variants alternate ``--repeats`` times.

    python benchmarks/startup.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_startup import heavy_imports  # noqa: E402
from common import PYTHON, Spread, bench_env, machine, run_json, time_to_first_step, wall  # noqa: E402

from xtrain.bench.job import job_config, prepare_job, write_config  # noqa: E402
from xtrain.bench.sizes import SIZES, ModelSize  # noqa: E402

HERE = Path(__file__).resolve().parent


def xtrain_exe() -> list[str]:
    exe = shutil.which("xtrain", path=os.path.dirname(PYTHON))
    return [exe] if exe else [PYTHON, "-m", "xtrain"]


def measure(repeats: int = 5, log: Any = None, warm: bool = True) -> dict[str, Any]:
    """``warm``: one untimed run of each variant first (file and datasets caches); the smoke run
    (``run_all.py --smoke``) leaves it out."""
    say = log or (lambda m: None)
    env = bench_env(1)
    root = Path(tempfile.mkdtemp(prefix="xtrain-bench-startup-"))
    size: ModelSize = SIZES["tiny"]
    try:
        job = prepare_job(root, size, 1)
        cli = xtrain_exe()
        results: dict[str, list[float]] = {"xtrain --help": [], "xtrain doctor": []}
        for name, cmd in (("xtrain --help", [*cli, "--help"]), ("xtrain doctor", [*cli, "doctor"])):
            if warm:
                wall(cmd, env)  # warm the file cache
            for _ in range(repeats):
                results[name].append(wall(cmd, env))
            say(f"startup: {name}: {Spread.of(results[name]).show(unit=' s')}")

        def xtrain_run(tag: str, via_cli: bool) -> float:
            out = root / f"out-{tag}"
            shutil.rmtree(out, ignore_errors=True)
            cfg = job_config(job, out, size.per_device, 2, 1, False, None, 16)
            path = write_config(root / f"{tag}.yaml", cfg)
            cmd = (
                [*cli, "train", str(path)] if via_cli else [PYTHON, "-m", "xtrain.run", "--config", str(path)]
            )
            return time_to_first_step(cmd, out, env)

        def trainer_run(tag: str) -> float:
            out = root / f"out-{tag}"
            t0 = time.time()
            cmd = [PYTHON, str(HERE / "hf_trainer_job.py"), "--model", str(job.model_dir), "--data",
                   str(job.data_file), "--out", str(out), "--max-length", str(size.seq_len),
                   "--per-device", str(size.per_device)]  # fmt: skip
            first = run_json(cmd, env)["first_step_time"]
            shutil.rmtree(out, ignore_errors=True)
            return first - t0

        variants = {
            "xtrain train C": lambda tag: xtrain_run(tag, True),
            "python -m xtrain.run --config C": lambda tag: xtrain_run(tag, False),
            "HF Trainer": trainer_run,
        }
        for name, fn in variants.items() if warm else ():  # untimed: fill the caches
            fn(f"warm-{abs(hash(name))}")
        names = list(variants)
        first: dict[str, list[float]] = {n: [] for n in names}
        for r in range(repeats):
            for name in names[r % 3 :] + names[: r % 3]:
                seconds = variants[name](f"r{r}-{abs(hash(name))}")
                first[name].append(seconds)
                say(f"startup: repeat {r + 1}/{repeats} {name}: first step after {seconds:.2f} s")
        heavy, modules = heavy_imports()
        return {
            "setup": {
                "repeats": repeats,
                "model": "tiny (4 x 128), seq 128, batch 8, LoRA r=16",
                "threads": 1,
            },
            "commands_s": {k: Spread.of(v).to_dict() for k, v in results.items()},
            "first_step_s": {k: Spread.of(v).to_dict() for k, v in first.items()},
            "runs": {**results, **first},
            "cli_heavy_imports": heavy,
            "cli_modules": modules,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.repeats, log=lambda m: print(m, file=sys.stderr))
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for section in ("commands_s", "first_step_s"):
        for name, d in result[section].items():
            print(f"{name:34} {d['median']:.2f} s ({d['min']:.2f}-{d['max']:.2f}, n={d['n']})")


if __name__ == "__main__":
    main()
