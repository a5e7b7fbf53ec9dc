"""Causal-LM packing on variable-length data: tokens/s with and without ``data.packing=concatenate``
(the concatenation into blocks; ``data.packing=on``, which keeps examples apart, is not measured here).

Data: 600 rows, each 1 to 4 of xtrain's built-in tiny stories joined (about 60 to 250 tokens,
uniform in the number of stories), ``data.max_length`` 256 so no row is cut. Without packing
each micro-batch is padded to its longest row (PadCollator); with packing rows are concatenated
and cut into full 256-token blocks. The bench's ``tiny`` model, per-device batch 8, one process,
LoRA; runs go through ``python -m xtrain.run`` and are timed by the loop's logging windows after
the first. tokens/s counts real tokens only (the attention mask), so padding is work that earns
nothing. The two variants alternate ``--repeats`` times.

    python benchmarks/packing.py [--repeats 5] [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Spread, bench_env, machine  # noqa: E402

from xtrain.bench.job import job_config, prepare_job, write_config
from xtrain.bench.rates import figures
from xtrain.bench.runner import output_to, plan_for, run_training
from xtrain.bench.sizes import SIZES, ModelSize

MAX_LENGTH = 256


def write_variable_rows(path: Path, rows: int = 600, seed: int = 3) -> list[int]:
    """Rows of 1-4 stories each; returns the number of stories per row."""
    from xtrain.builtin import story_examples

    rng = random.Random(seed)
    stories = [r["text"] for r in story_examples(rows * 4, seed)]
    counts = []
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for _ in range(rows):
            k = rng.randint(1, 4)
            counts.append(k)
            f.write(json.dumps({"text": " ".join(rng.sample(stories, k))}) + "\n")
    return counts


def padding_share(data_file: Path, model_dir: Path, per_device: int) -> float:
    """The share of padded positions when consecutive rows are batched unpacked (a shuffled
    loader gives about the same on average)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lengths = []
    for line in data_file.read_text(encoding="utf-8").splitlines():
        lengths.append(min(MAX_LENGTH, len(tok(json.loads(line)["text"])["input_ids"]) + 1))
    real = padded = 0
    for i in range(0, len(lengths) - per_device + 1, per_device):
        batch = lengths[i : i + per_device]
        real += sum(batch)
        padded += max(batch) * len(batch)
    return 1 - real / padded


def measure(repeats: int = 5, steps: int = 40, log: Any = None) -> dict[str, Any]:
    import os

    from xtrain.machine import probe

    say = log or (lambda m: None)
    env = bench_env(1)
    os.environ["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"]  # the launched run inherits it
    base = SIZES["tiny"]
    size = ModelSize(**{**base.__dict__, "seq_len": MAX_LENGTH})
    plan = plan_for(probe.collect(quick=True), 1, None, None)
    root = Path(tempfile.mkdtemp(prefix="xtrain-bench-packing-"))
    try:
        with output_to(root / "prepare.log"):
            job = prepare_job(root, size, 1)
        job.data_file = root / "variable.jsonl"
        stories = write_variable_rows(job.data_file)
        pad = padding_share(job.data_file, job.model_dir, size.per_device)
        tokens: dict[str, list[float]] = {"packed": [], "padded": []}
        samples: dict[str, list[float]] = {"packed": [], "padded": []}
        names = ["padded", "packed"]
        for r in range(repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                out = root / f"{name}-{r}"
                cfg = job_config(job, out, size.per_device, steps, max(1, steps // 8), False, None, 16,
                                 packing="concatenate" if name == "packed" else "off")  # fmt: skip
                path = write_config(root / f"{name}-{r}.yaml", cfg)
                run = figures(run_training(plan, path, out, root / f"{name}-{r}.log"), 1, steps)
                tokens[name].append(run.tokens_per_s)
                samples[name].append(run.samples_per_s)
                say(f"packing: repeat {r + 1}/{repeats} {name}: {run.tokens_per_s:,.0f} tokens/s")
                shutil.rmtree(out, ignore_errors=True)
        t = {k: Spread.of(v) for k, v in tokens.items()}
        return {
            "setup": {
                "repeats": repeats,
                "steps": steps,
                "max_length": MAX_LENGTH,
                "per_device": size.per_device,
                "rows": len(stories),
                "stories_per_row": "1-4",
                "model": "tiny (4 x 128), LoRA r=16",
            },  # fmt: skip
            "padding_share_unpacked": pad,
            "tokens_per_s": {k: v.to_dict() for k, v in t.items()},
            "samples_per_s": {k: Spread.of(v).to_dict() for k, v in samples.items()},
            "speedup": t["packed"].median / t["padded"].median,
            "runs": tokens,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.repeats, a.steps, log=lambda m: print(m, file=sys.stderr))
    result["machine"] = machine()
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for name, d in result["tokens_per_s"].items():
        print(f"{name:7} {d['median']:,.0f} tokens/s ({d['min']:,.0f}-{d['max']:,.0f}, n={d['n']})")
    print(f"packing speedup {result['speedup']:.2f}x; unpacked batches are "
          f"{result['padding_share_unpacked']:.0%} padding")  # fmt: skip


if __name__ == "__main__":
    main()
