"""xtrain's distillation (``model.task: distill``, GKD) against TRL's GKDTrainer, like for like: the
built-in tiny chat llama as the student (LoRA r=8 / alpha 16 on q/k/v/o, dropout 0), the built-in
``tiny-llama-sft`` as the teacher (a whole model folder), conversations of the built-in prompts
answered in the teacher's style ({"messages": [user, assistant]}, the student's chat template),
float32 on both (TRL's bf16 off), no gradient checkpointing (TRL's default on), one thread each,
CPU, linear schedule without warm-up, the same batch, steps, learning rate, beta, lmbda, temperature
and completion length.

1. **The loss, the same number**: 4 conversations, one a micro-batch (no padding: TRL passes no
   position ids, so a left-padded row's positions would differ from xtrain's), 4 micro-batches, one
   optimizer step from the same initial weights (LoRA's B is 0: the student is its base), at beta 0,
   0.5 and 1 on the data's answers (lmbda 0): TRL's loss as it back-propagates it (the sum over the
   step's micro-batches of what ``accelerator.backward`` got) against xtrain's logged step loss;
   and the token ids of both sides' micro-batches.
2. **A step's time**: 400 conversations, 8 a micro-batch x 2, ``--steps`` steps, on the data's
   answers (lmbda 0: teacher and student forwards, no generation) and on the student's samples
   (lmbda 1: generation of 24 tokens, then the forwards); every optimizer step stamped by torch's
   global optimizer-step pre-hook on both sides; the medians of the steps after the first
   ``--skip``, ``--repeats`` interleaved runs each in a fresh process.

Each side runs in a fresh process (TRL in its own environment, ``--trl-python``; never a dependency
of xtrain). Prints the section of docs/performance.md ("Distillation").

    python -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl peft
    .venv/bin/python benchmarks/distill_vs_trl.py --trl-python .venv-trl/bin/python --repeats 3
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
sys.path.insert(0, str(HERE))
from preference_vs_trl import find_trl, per_step  # noqa: E402

STEPS, PER_DEVICE, ACCUMULATION, LR, NEW_TOKENS, MAX_LENGTH = 20, 8, 2, 1e-3, 24, 128
JOB = """\
model:
  name_or_path: {student}
  task: distill
distill:
  teacher: {teacher}
  mode: gkd
  beta: {beta}
  lmbda: {lmbda}
  max_completion_length: {new_tokens}
lora:
  r: 8
  alpha: 16
  dropout: 0.0
  target_modules: [q_proj, k_proj, v_proj, o_proj]
data:
  train: {train}
  eval: null
  max_length: 64
optim:
  lr: {lr}
  warmup_steps: 0
  schedule: linear
batch:
  per_device: {per_device}
  global_batch: {global_batch}
run:
  output_dir: {out}
  max_steps: {steps}
  log_every: 1
  report_to: none
  seed: 42
"""


def models() -> tuple[str, str]:
    """(the student's folder: the built-in tiny chat llama, the teacher's: builtin:tiny-llama-sft's
    model, trained once by xtrain's own SFT stage)."""
    from xtrain import builtin
    from xtrain.model.start import start_of
    from xtrain.train.builtin_stages import ensure
    from xtrain.train.loop import train_run

    student = builtin.ensure_builtin_model("builtin:tiny-llama-chat")
    ensure("builtin:tiny-llama-sft", train_run)
    return str(student), start_of("builtin:tiny-llama-sft").base


def conversations(path: Path, n: int) -> Path:
    """``n`` conversations of the built-in prompts answered in the friendly style."""
    from xtrain import builtin

    rows = builtin.preference_examples(n, 7)
    turns = [[{"role": "user", "content": r["prompt"].strip()}, {"role": "assistant", "content": r["chosen"]}]
             for r in rows]  # fmt: skip
    lines = [json.dumps({"messages": t}) for t in turns]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def xtrain_side(args: dict[str, Any]) -> None:
    """This process: xtrain's loop on the job, stamps at every optimizer step, each step's logged
    loss and the first step's completed micro-batches' token ids."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from xtrain.planning.resolve import resolve
    from xtrain.tasks import build_workload
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    torch.set_num_threads(1)
    stamps: list[tuple[float, float]] = []
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    first: list[list[list[int]]] = []

    def build(run: Any, main_process_first: Any) -> Any:
        workload = build_workload(run, main_process_first)
        start = workload.step_start

        def recorded(model: Any, batches: list[dict], gather: Any) -> None:
            start(model, batches, gather)
            if not first:
                first.extend(b["input_ids"][b["attention_mask"].bool()].view(1, -1).tolist() for b in batches)

        workload.step_start = recorded
        return workload

    job = Path(args["out"]) / "job.yaml"
    job.parent.mkdir(parents=True, exist_ok=True)
    job.write_text(JOB.format(**args), encoding="utf-8")
    cfg = load_config(job, [])
    result = train(cfg, resolve(cfg, processes=1).plan, build=build)
    losses = [loss for _, loss in result.losses]
    print("RESULT " + json.dumps({"stamps": stamps, "losses": losses, "first_batches": first}))


def _run(cmd: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def _sides(
    trl: str, tmp: str, name: str, data: Path, student: str, teacher: str, **job: Any
) -> dict[str, list]:
    """Both sides' commands on one job (``job``: steps, per_device, accumulation, beta, lmbda)."""
    x = {"student": student, "teacher": teacher, "train": str(data), "lr": LR, "new_tokens": NEW_TOKENS,
         "out": f"{tmp}/x-{name}", "global_batch": job["per_device"] * job["accumulation"],
         **job}  # fmt: skip
    return {
        "xtrain": [sys.executable, __file__, "--xtrain-side", json.dumps(x)],
        "TRL GKDTrainer": [
            trl, str(HERE / "distill_trl_job.py"), "--student", student, "--teacher", teacher, "--train",
            str(data), "--out", f"{tmp}/t-{name}", "--steps", str(job["steps"]), "--per-device",
            str(job["per_device"]), "--accumulation", str(job["accumulation"]), "--lr", str(LR), "--beta",
            str(job["beta"]), "--lmbda", str(job["lmbda"]), "--max-new-tokens", str(NEW_TOKENS),
            "--max-length", str(MAX_LENGTH),
        ],
    }  # fmt: skip


def measure(repeats: int = 3, log: Any = print, trl: str | None = None, steps: int = STEPS,
            skip: int = 5) -> dict[str, Any]:  # fmt: skip
    """The losses on one batch, then both sides' step times ``repeats`` times, interleaved; {"skipped":
    why} without a TRL environment."""
    trl_found = find_trl(trl, "distill", log)
    if isinstance(trl_found, dict):
        return trl_found
    found_trl, version = trl_found
    student, teacher = models()
    parity: list[dict[str, Any]] = []
    times: dict[str, dict[str, list[tuple[float, float]]]] = {}
    skip = min(skip, max(0, steps - 3))
    with tempfile.TemporaryDirectory() as tmp:
        four, rows = conversations(Path(tmp) / "four.jsonl", 4), conversations(Path(tmp) / "rows.jsonl", 400)
        for beta in (0.0, 0.5, 1.0):
            one = {"steps": 1, "per_device": 1, "accumulation": 4, "beta": beta, "lmbda": 0.0}
            found = {k: _run(cmd) for k, cmd in _sides(found_trl, tmp, f"p{beta}", four, student, teacher,
                                                       **one).items()}  # fmt: skip
            x, t = found["xtrain"], found["TRL GKDTrainer"]
            same = sorted(map(str, x["first_batches"])) == sorted(map(str, t["first_batches"]))
            first = {"xtrain": x["losses"][0], "trl": t["losses"][0]}
            parity.append({"beta": beta, **first, "same_tokens": same})
            log(f"distill: beta {beta}: loss xtrain {x['losses'][0]:.7f}, TRL {t['losses'][0]:.7f}, "
                f"the same token ids: {same}")  # fmt: skip
        for lmbda in (0.0, 1.0):
            job = {"steps": steps, "per_device": PER_DEVICE, "accumulation": ACCUMULATION, "beta": 0.5,
                   "lmbda": lmbda}  # fmt: skip
            key = "the data's answers (lmbda 0)" if lmbda == 0 else "the student's samples (lmbda 1)"
            times[key] = {}
            for k in range(repeats):
                sides = _sides(found_trl, tmp, f"l{lmbda}-{k}", rows, student, teacher, **job)
                for name, cmd in sides.items():
                    wall, cpu = per_step(_run(cmd)["stamps"], skip)
                    times[key].setdefault(name, []).append((wall, cpu))
                    log(f"distill: {key}, {name} run {k + 1}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU")
    measured = time.strftime("%Y-%m-%dT%H:%M:%S")
    return {"trl_version": version, "repeats": repeats, "steps": steps, "skip": skip, "parity": parity,
            "times": times, "measured": measured, "load": Path("/proc/loadavg").read_text().split()[:3]
            if Path("/proc/loadavg").exists() else None}  # fmt: skip


def render(r: dict[str, Any]) -> str:
    """The performance page's section (a line when TRL was not there)."""
    head = "## Distillation: xtrain's GKD vs TRL's GKDTrainer\n\n"
    if "skipped" in r:
        return head + f"Not measured in this run: {r['skipped']} (`benchmarks/distill_vs_trl.py`).\n"
    lines = [
        f"The same job on both (`benchmarks/distill_vs_trl.py`; TRL {r['trl_version']} in an environment of "
        "its own, `.venv-trl`, never a dependency of xtrain): the built-in tiny chat llama as the student "
        "(2 layers x 64, LoRA r=8 / alpha 16 on q/k/v/o, dropout 0), `builtin:tiny-llama-sft` as the "
        "teacher, the built-in prompts as conversations answered in the teacher's style, float32 on both "
        "(TRL's bf16 off), no gradient checkpointing (TRL's default on), one process, one compute thread, "
        f"CPU; measured {r.get('measured', '?')} (load average {' '.join(r.get('load') or ['?'])}).",
        "",
        "**The same loss.** 4 conversations, one a micro-batch, one optimizer step from the same weights, "
        "on the data's answers (lmbda 0): TRL's loss as it back-propagates it against xtrain's logged step "
        "loss, and whether both sides' micro-batches hold the same token ids.",
        "",
        "| beta | xtrain | TRL GKDTrainer | the same token ids |",
        "|---|---|---|---|",
        *(f"| {p['beta']:g} | {p['xtrain']:.7f} | {p['trl']:.7f} | {'yes' if p['same_tokens'] else 'no'} |"
          for p in r["parity"]),
        "",
        f"**A step's time.** 400 conversations, {PER_DEVICE} a micro-batch x {ACCUMULATION} accumulation, "
        f"beta 0.5, lr {LR} linear, completions of {NEW_TOKENS} tokens at temperature 1 where the student "
        f"samples, {r['steps']} steps; the medians of the steps after the first {r['skip']}, "
        f"{r['repeats']} interleaved runs each in a fresh process.",
        "",
        "| completions | trainer | s/step (wall, median) | s/step (CPU, median) |",
        "|---|---|---|---|",
    ]  # fmt: skip
    for key, sides in r["times"].items():
        for name, runs in sides.items():
            wall, cpu = statistics.median(x[0] for x in runs), statistics.median(x[1] for x in runs)
            lines.append(f"| {key} | {name} | {wall:.3f} | {cpu:.3f} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trl-python", default=None, help="TRL's environment (default: .venv-trl)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--json", default=None, help="also write the measurements here")
    p.add_argument("--xtrain-side", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.xtrain_side:
        return xtrain_side(json.loads(a.xtrain_side))
    log = lambda line: print(f"# {line}", file=sys.stderr)  # noqa: E731
    result = measure(a.repeats, log, a.trl_python, a.steps, a.skip)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(render(result))


if __name__ == "__main__":
    main()
