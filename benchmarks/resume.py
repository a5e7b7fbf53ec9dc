"""Resume cost: time from start to the first optimizer step when resuming at step 10 vs 10,000.

Both checkpoints are real: a micro llama-style model (1 layer x 32, 16-token blocks, global
batch 2, ~240 samples, so ~120 steps per epoch) is trained for 10 and for 10,000 steps (83
epochs) through ``python -m xtrain.run``; nothing is edited by hand. Each timed run copies one
checkpoint into a fresh output folder and resumes it with ``run.resume=auto`` for 3 more steps;
its time to the first step is measured from the process start to the loop's first logging window
(train_result.json, ``run.log_every=1``). The runs alternate between the two checkpoints ``--repeats`` times.

xtrain's sampler computes the resumed step's samples from (seed, epoch, position) directly, so
the cost must not grow with the step; a loader that skipped batches by iterating would pay for
10,000 x global-batch samples here.

    python benchmarks/resume.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, Spread, bench_env, machine, model_size, time_to_first_step, wall  # noqa: E402

from xtrain.bench.job import job_config, prepare_job, write_config  # noqa: E402

MICRO = model_size("micro")
STARTS = (10, 10_000)


def measure(repeats: int = 5, starts: tuple[int, ...] = STARTS, log: Any = None) -> dict[str, Any]:
    say = log or (lambda m: None)
    env = bench_env(1)
    root = Path(tempfile.mkdtemp(prefix="xtrain-bench-resume-"))
    try:
        job = prepare_job(root, MICRO, 1)
        sources: dict[int, Path] = {}
        train_s: dict[int, float] = {}
        for start in starts:
            out = root / f"train-{start}"
            cfg = job_config(job, out, MICRO.per_device, start, 100, False, "no", 4)
            cfg["run"]["tensorboard"] = False
            path = write_config(root / f"train-{start}.yaml", cfg)
            say(f"resume: training the checkpoint at step {start}")
            train_s[start] = wall([PYTHON, "-m", "xtrain.run", "--config", str(path)], env)
            sources[start] = out / "checkpoints" / f"step-{start}"
            state = json.loads((sources[start] / "xtrain_state.json").read_text(encoding="utf-8"))
        first: dict[int, list[float]] = {s: [] for s in starts}
        for r in range(repeats):
            for start in starts if r % 2 == 0 else tuple(reversed(starts)):
                out = root / f"resume-{start}-{r}"
                shutil.copytree(sources[start], out / "checkpoints" / f"step-{start}")
                cfg = job_config(job, out, MICRO.per_device, start + 3, 1, False, "no", 4)
                cfg["run"]["resume"] = "auto"
                path = write_config(root / f"resume-{start}-{r}.yaml", cfg)
                seconds = time_to_first_step([PYTHON, "-m", "xtrain.run", "--config", str(path)], out, env)
                first[start].append(seconds)
                say(f"resume: repeat {r + 1}/{repeats} from step {start}: first step after {seconds:.2f} s")
                shutil.rmtree(out, ignore_errors=True)
        spreads = {s: Spread.of(v) for s, v in first.items()}
        lo, hi = min(starts), max(starts)
        return {
            "setup": {
                "repeats": repeats,
                "model": "1 layer x 32, seq 16, global batch 2",
                "starts": list(starts),
            },
            "training_s": train_s,
            "num_samples": state["num_samples"],
            "epochs_at_last": state["epoch"],
            "first_step_s": {s: v.to_dict() for s, v in spreads.items()},
            "runs": first,
            "ratio": spreads[hi].median / spreads[lo].median,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    t0 = time.perf_counter()
    result = measure(a.repeats, log=lambda m: print(m, file=sys.stderr))
    result["machine"] = machine()
    result["elapsed_s"] = time.perf_counter() - t0
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for start, d in result["first_step_s"].items():
        print(
            f"resume at step {start:>6}: first step after {d['median']:.2f} s "
            f"({d['min']:.2f}-{d['max']:.2f}, n={d['n']})"
        )
    print(f"ratio 10,000 / 10: {result['ratio']:.3f}")


if __name__ == "__main__":
    main()
