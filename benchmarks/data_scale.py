"""Data at the scale of real datasets, xtrain beside TRL's SFTTrainer: N four-turn conversations
(20k, 200k, 1M: a JSONL file written once, seeded), the built-in tiny llama's chat tokenizer and
model folder on both sides, LoRA r=8 / alpha 16 on q_proj/v_proj, batch 8, max_length 256,
float32 (TRL's bf16 and gradient-checkpointing defaults off), one optimizer step.

Each side runs in a fresh process from a fresh ``HF_DATASETS_CACHE`` (the first run: the file
converted to Arrow, the rows encoded) and then again from the cache the first left (the second
run: what a resume, or a run with another learning rate, pays). Measured at the first optimizer
step (torch's global optimizer-step pre-hook, which then ends the process): the wall time since
the process was started, the CPU time of the process and of the encoding processes it waited
for, and the peak RSS of the process (of its encoding processes apart). The second run is repeated
(``--repeats``, interleaved over the sizes and sides: the median by wall time; the machine is
shared). xtrain finds the
assistant's tokens (the loss on them only); TRL trains on every token (its assistant mask needs
``{% generation %}`` markers in the template).

    python -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl peft   # TRL's own environment
    .venv/bin/python benchmarks/data_scale.py --trl-python .venv-trl/bin/python
    .venv/bin/python benchmarks/data_scale.py --sizes 20000 200000 1000000 --trl-sizes 20000 200000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from preference_vs_trl import trl_python  # noqa: E402

SIZES = (20_000, 200_000, 1_000_000)
TRL_SIZES = (20_000, 200_000)
MAX_LENGTH, PER_DEVICE = 256, 8
# whole words of the built-in tokenizer (its stories and chat): a turn of them is a few tokens a word
_TEXT = """the cat dog bird fish ball kite box hat cake book boat cup red blue green pink white black is in
park house forest river garden hill beach school what where how happy glad sleepy it a tell me color of does
feel play very today"""
WORDS = tuple(_TEXT.split())

CONFIG = """\
model:
  name_or_path: {model}
  task: causal-lm
lora:
  r: 8
  alpha: 16
  dropout: 0.05
  target_modules: [q_proj, v_proj]
data:
  train: {train}
  max_length: {max_length}
batch:
  per_device: {per_device}
  global_batch: {per_device}
run:
  output_dir: {out}
  max_steps: 1
  report_to: none
  seed: 42
"""


def write_conversations(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` rows of ``{"messages": [user, assistant, user, assistant]}`` (questions of 6-14 words,
    answers of 10-30), written once (a file of that size already there is kept)."""
    if path.is_file():
        return path
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))

    part = path.with_suffix(".part")
    with part.open("w", encoding="utf-8") as f:
        for _ in range(n):
            turns = [("user", 6, 14), ("assistant", 10, 30), ("user", 6, 14), ("assistant", 10, 30)]
            row = {"messages": [{"role": role, "content": words(lo, hi)} for role, lo, hi in turns]}
            f.write(json.dumps(row) + "\n")
    part.replace(path)
    return path


def xtrain_side(config: str, t0: float) -> None:
    """One xtrain run (``python -m xtrain.run``'s entry, one process), ended at its first optimizer
    step with the ``RESULT`` line."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda *_: _result(t0))
    from xtrain.run import main

    main(["--config", config])
    raise SystemExit("no optimizer step was taken")


def _result(t0: float) -> None:
    t = os.times()
    result = {
        "wall_s": time.time() - t0,
        "cpu_s": t.user + t.system + t.children_user + t.children_system,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "children_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)


def _run(cmd: list[str], cache: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "HF_DATASETS_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }  # one compute thread a process, as every benchmark here (performance.md)
    proc = subprocess.run(
        [*cmd, "--t0", repr(time.time())], capture_output=True, text=True, env=env, check=False
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def _command(side: str, n: int, data: Path, model: Path, root: Path, trl: str | None, k: int) -> list[str]:
    out = root / f"out-{side}-{n}-{k}"
    shutil.rmtree(out, ignore_errors=True)
    if side == "xtrain":
        config = root / f"{side}-{n}-{k}.yaml"
        config.write_text(CONFIG.format(model=model, train=data, out=out, max_length=MAX_LENGTH,
                                        per_device=PER_DEVICE), encoding="utf-8")  # fmt: skip
        return [sys.executable, str(Path(__file__)), "--side", "xtrain", "--config", str(config)]
    assert trl is not None
    job = HERE / "data_scale_trl_job.py"
    return [trl, str(job), "--model", str(model), "--train", str(data), "--out", str(out),
            "--per-device", str(PER_DEVICE), "--max-length", str(MAX_LENGTH)]  # fmt: skip


def measure(
    sizes: list[int], trl_sizes: list[int], root: Path, trl: str | None, repeats: int = 1, log: Any = print
) -> list[dict]:
    """Each size and side: the first run (a fresh cache) and a second (the cache it left); then
    ``repeats - 1`` more second runs of every size and side, interleaved (their median by wall
    time is the table's; the machine is shared)."""
    from xtrain import builtin

    model = builtin.ensure_builtin_model("builtin:tiny-llama-chat")
    results = []
    for n in sizes:
        data = write_conversations(root / f"chat-{n}.jsonl", n)
        for side in ("xtrain", "trl") if (trl is not None and n in trl_sizes) else ("xtrain",):
            cache = root / f"cache-{side}-{n}"
            shutil.rmtree(cache, ignore_errors=True)
            first = _run(_command(side, n, data, model, root, trl, 1), cache)
            second = _run(_command(side, n, data, model, root, trl, 2), cache)
            found = {"side": side, "rows": n, "first": first, "seconds": [second], "data": str(data)}
            results.append(found)
            log(render([_settle(found)]).splitlines()[-1])
    for k in range(repeats - 1):
        for r in results:
            cache = root / f"cache-{r['side']}-{r['rows']}"
            r["seconds"].append(
                _run(_command(r["side"], r["rows"], Path(r["data"]), model, root, trl, 3 + k), cache)
            )
    return [_settle(r) for r in results]


def _settle(r: dict[str, Any]) -> dict[str, Any]:
    """``second``: the median second run by wall time (and its spread)."""
    runs = sorted(r["seconds"], key=lambda x: x["wall_s"])
    return {**r, "second": runs[len(runs) // 2], "second_walls": [x["wall_s"] for x in runs]}


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        "| rows | side | 1st run: to step 1 (wall / CPU) | 2nd run (wall / CPU; median, wall range) "
        "| peak RSS 1st / 2nd run (encoding processes) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        a, b = r["first"], r["second"]
        workers = f" ({a['children_peak_rss_mb']:.0f} MB)" if a["children_peak_rss_mb"] > 1 else ""
        walls = r.get("second_walls") or [b["wall_s"]]
        spread = f" ({min(walls):.1f}-{max(walls):.1f})" if len(walls) > 1 else ""
        first = f"{a['wall_s']:.1f} s / {a['cpu_s']:.1f} s"
        second = f"{b['wall_s']:.1f} s / {b['cpu_s']:.1f} s{spread}"
        rss = f"{a['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f} MB{workers}"
        lines.append(f"| {r['rows']:,} | {r['side']} | {first} | {second} | {rss} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--trl-sizes", type=int, nargs="*", default=list(TRL_SIZES))
    p.add_argument("--trl-python", default=None, help="TRL's environment's python (default: .venv-trl)")
    p.add_argument(
        "--root", default=None, help="where the data, caches and runs go (default: a temporary folder)"
    )
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--repeats", type=int, default=3, help="second runs of each size and side (median)")
    p.add_argument("--side", choices=("xtrain",), help=argparse.SUPPRESS)  # one run, in its own process
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side == "xtrain":
        xtrain_side(a.config, a.t0)
        return
    import tempfile

    root = Path(a.root) if a.root else Path(tempfile.mkdtemp(prefix="xtrain-data-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    trl = trl_python(a.trl_python)
    if trl is None:
        print("TRL: not measured (no TRL environment: see this file's docstring)")
    results = measure(a.sizes, a.trl_sizes, root, trl, a.repeats)
    print(render(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
