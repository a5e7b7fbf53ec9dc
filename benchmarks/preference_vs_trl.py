"""xtrain's DPO against TRL's DPOTrainer on the same job: the built-in tiny llama, the built-in
preference pairs (400 train, 100 eval), LoRA r=8 / alpha 16 on q/k/v/o (the reference: the
adapters off), 8 pairs per micro-batch x 2 accumulation, 30 steps, lr 5e-3 cosine with 5 warm-up
steps, beta 0.1, max_length 64, one thread each, on CPU. Each side runs in a fresh process
(TRL in its own environment, ``--trl-python``; never a dependency of xtrain), alternating, and
stamps every optimizer step with torch's global optimizer-step pre-hook; the steps after the
first ``--skip`` are timed by wall clock and by the process's CPU time (the steadier figure on a
shared machine). Prints the section of docs/performance.md ("Preference tuning"), which
``benchmarks/run_all.py`` renders too (``measure``/``render``; skipped with a line when no TRL
environment is found: ``--trl-python``, ``$XTRAIN_TRL_PYTHON`` or ``.venv-trl``).

    python -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl peft
    .venv/bin/python benchmarks/preference_vs_trl.py --trl-python .venv-trl/bin/python --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS, PER_DEVICE, ACCUMULATION, LR, BETA, MAX_LENGTH = 30, 8, 2, 5e-3, 0.1, 64


def xtrain_side(out: str, steps: int = STEPS) -> None:
    """This process: xtrain's loop on the quickstart-shaped job (on the random tiny llama, as TRL's
    side), stamps at every optimizer step."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    torch.set_num_threads(1)
    stamps: list[tuple[float, float]] = []
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    job = HERE.parent / "xtrain" / "builtin" / "jobs" / "quickstart-preference.yaml"
    cfg = load_config(job, [
        "model.name_or_path=builtin:tiny-llama", f"run.output_dir={out}", f"run.max_steps={steps}",
        "run.eval_every=null", "run.eval_at_start=false",
        "run.log_every=10", "run.report_to=none", f"batch.per_device={PER_DEVICE}",
        f"batch.global_batch={PER_DEVICE * ACCUMULATION}", f"optim.lr={LR}", "optim.schedule=cosine",
        "optim.warmup_steps=5", f"preference.beta={BETA}", f"data.max_length={MAX_LENGTH}",
    ])  # fmt: skip
    result = train(cfg, resolve(cfg, processes=1).plan)
    accuracy = result.eval_metrics["rewards/accuracy"]
    print("RESULT " + json.dumps({"stamps": stamps, "reward_accuracy": accuracy}))


def _run(cmd: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def per_step(stamps: list[list[float]], skip: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) between consecutive steps after the first ``skip``."""
    kept = stamps[skip:]
    walls = [b[0] - a[0] for a, b in zip(kept, kept[1:], strict=False)]
    cpus = [b[1] - a[1] for a, b in zip(kept, kept[1:], strict=False)]
    return statistics.median(walls), statistics.median(cpus)


def trl_python(given: str | None = None) -> str | None:
    """The TRL environment's python: ``given``, else ``$XTRAIN_TRL_PYTHON``, else the checkout's
    ``.venv-trl``; None when it is not there or has no ``trl``."""
    path = given or os.environ.get("XTRAIN_TRL_PYTHON") or str(HERE.parent / ".venv-trl" / "bin" / "python")
    if not Path(path).is_file():
        return None
    probe = subprocess.run([path, "-c", "import trl"], capture_output=True, check=False)
    return path if probe.returncode == 0 else None


NO_TRL = (
    "no TRL environment found (`--trl-python`, `$XTRAIN_TRL_PYTHON`, else `.venv-trl`: `python -m venv "
    ".venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl peft`)"
)


def find_trl(given: str | None, section: str, log: Any) -> tuple[str, str] | dict[str, str]:
    """(the TRL environment's python, TRL's version), or the section's {"skipped": why} (said in
    ``log``) without one: what every side-by-side with TRL starts with."""
    found = trl_python(given)
    if found is None:
        log(f"{section}: skipped: {NO_TRL}")
        return {"skipped": NO_TRL}
    version = subprocess.run([found, "-c", "import trl; print(trl.__version__)"], capture_output=True,
                             text=True, check=False).stdout.strip()  # fmt: skip
    return found, version


def measure(
    repeats: int = 3, log: Any = print, trl: str | None = None, steps: int = STEPS, skip: int = 5
) -> dict[str, Any]:
    """Both sides ``repeats`` times, interleaved; {"skipped": why} without a TRL environment."""
    trl_found = find_trl(trl, "preference", log)
    if isinstance(trl_found, dict):
        return trl_found
    found_trl, version = trl_found
    from xtrain import builtin

    model = builtin.ensure_builtin_model("builtin:tiny-llama")
    data = builtin.ensure_builtin_data("builtin:preference-pairs")
    rows: dict[str, list[tuple[float, float, float]]] = {"xtrain": [], "TRL DPOTrainer": []}
    skip = min(skip, max(0, steps - 3))
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            sides = {
                "xtrain": [sys.executable, __file__, "--xtrain-side", f"{tmp}/x{k}", "--steps", str(steps)],
                "TRL DPOTrainer": [
                    found_trl, str(HERE / "preference_trl_job.py"), "--model", str(model),
                    "--train", str(data / "train.jsonl"), "--eval", str(data / "eval.jsonl"),
                    "--out", f"{tmp}/t{k}", "--steps", str(steps), "--per-device", str(PER_DEVICE),
                    "--accumulation", str(ACCUMULATION), "--lr", str(LR), "--beta", str(BETA),
                    "--max-length", str(MAX_LENGTH),
                ],
            }  # fmt: skip
            for name, cmd in sides.items():
                found = _run(cmd)
                wall, cpu = per_step(found["stamps"], skip)
                rows[name].append((wall, cpu, float(found["reward_accuracy"])))
                log(f"preference: {name} run {k + 1}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU, "
                    f"reward accuracy {found['reward_accuracy']:.3f}")  # fmt: skip
    measured = time.strftime("%Y-%m-%dT%H:%M:%S")  # run_all.py stamps its own over it
    return {"trl_version": version, "repeats": repeats, "steps": steps, "skip": skip, "runs": rows,
            "measured": measured}  # fmt: skip


def render(r: dict[str, Any]) -> str:
    """The performance page's section (a line when TRL was not there)."""
    head = "## Preference tuning: xtrain's DPO vs TRL's DPOTrainer\n\n"
    if "skipped" in r:
        return head + f"Not measured in this run: {r['skipped']} (`benchmarks/preference_vs_trl.py`).\n"
    lines = [
        f"The same job on both (`benchmarks/preference_vs_trl.py`; TRL {r['trl_version']} in an "
        "environment of its own, `.venv-trl`, never a dependency of xtrain): the built-in tiny llama "
        "(2 layers x 64, LoRA r=8 / alpha 16 on q/k/v/o, the reference = the adapters switched off on "
        "both sides), the built-in preference pairs (400 train, 100 eval), "
        f"{PER_DEVICE} pairs a micro-batch x {ACCUMULATION} accumulation, {r['steps']} steps, lr {LR} "
        f"cosine with 5 warm-up steps, beta {BETA}, max_length {MAX_LENGTH}, DPO's sigmoid loss, dropout "
        "off, one process, one compute thread, CPU. Every optimizer step is stamped by torch's global "
        f"optimizer-step pre-hook on both sides; the medians of the steps after the first {r['skip']}, "
        f"{r['repeats']} interleaved runs each in a fresh process; measured {r.get('measured', '?')}.",
        "",
        "| trainer | s/step (wall, median) | s/step (CPU, median) | final eval reward accuracy |",
        "|---|---|---|---|",
    ]
    for name, runs in r["runs"].items():
        wall = statistics.median(x[0] for x in runs)
        cpu = statistics.median(x[1] for x in runs)
        lines.append(f"| {name} | {wall:.3f} | {cpu:.3f} | {', '.join(f'{x[2]:.2f}' for x in runs)} |")
    x, t = (statistics.median(v[1] for v in runs) for runs in r["runs"].values())
    lines += ["", f"xtrain / TRL, CPU time per step: **{x / t:.2f}x** (the issue's goal: at most 0.9x)."]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trl-python", default=None, help="TRL's environment (default: .venv-trl)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--xtrain-side", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.xtrain_side:
        return xtrain_side(a.xtrain_side, a.steps)
    log = lambda line: print(f"# {line}", file=sys.stderr)  # noqa: E731
    result = measure(a.repeats, log, a.trl_python, a.steps, a.skip)
    print(render(result))


if __name__ == "__main__":
    main()
