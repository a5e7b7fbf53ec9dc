"""xtrain's GRPO against TRL's GRPOTrainer without vLLM (plain ``generate`` on both sides) on the
same job: the GRPO quickstart's (``builtin:tiny-llama-grpo``, the prompts of
``builtin:preference-pairs``, the regex reward of a whole sentence), LoRA r=8 / alpha 16 on
q/k/v/o, 8 completions a prompt of up to 24 tokens, 16 completions a micro-batch x 2 accumulation,
lr 5e-3 linear with 2 warm-up steps, loss dapo, beta 0, temperature 1, one thread each, on CPU.
Each side runs in a fresh process, alternating, and stamps every optimizer step with torch's global
optimizer-step pre-hook; the steps after the first ``--skip`` are timed by wall clock and by the
process's CPU time (the steadier figure on a shared machine). The generation share is the wall
time generating and scoring (xtrain: ``Workload.step_start``; TRL's
``_generate_and_score_completions``) over the wall time of the same steps (``generation_share``).
Prints the section of docs/performance.md ("GRPO").

    .venv/bin/pip install trl   # or an environment of its own: --trl-python .venv-trl/bin/python
    .venv/bin/python benchmarks/grpo_vs_trl.py --trl-python .venv/bin/python --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from preference_vs_trl import _run, per_step, trl_python  # noqa: E402

STEPS, PER_DEVICE, ACCUMULATION, GENERATIONS, LENGTH, LR = 12, 16, 2, 8, 24, 5e-3


def xtrain_side(out: str, steps: int = STEPS) -> None:
    """This process: xtrain's loop on the quickstart's job, stamps at every optimizer step."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from xtrain.planning.resolve import resolve
    from xtrain.tasks import build_workload
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    torch.set_num_threads(1)
    stamps: list[tuple[float, float]] = []
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    generating: list[float] = []  # seconds each step's rollout took
    rewards: list[float] = []

    def build(run, main_process_first):
        workload = build_workload(run, main_process_first)
        inner = workload.step_start

        def timed(model, batches, gather):
            start = time.perf_counter()
            inner(model, batches, gather)
            generating.append(time.perf_counter() - start)
            rewards.append(float(batches[0]["stat/reward"]))

        workload.step_start = timed
        return workload

    job = HERE.parent / "xtrain" / "builtin" / "jobs" / "quickstart-grpo.yaml"
    cfg = load_config(job, [
        f"run.output_dir={out}", f"run.max_steps={steps}", "run.eval_every=null", "run.eval_at_start=false",
        "data.eval=null", "run.log_every=4", "run.report_to=none", f"batch.per_device={PER_DEVICE}",
        f"batch.global_batch={PER_DEVICE * ACCUMULATION}", f"optim.lr={LR}", "optim.schedule=linear",
        "optim.warmup_steps=2", f"grpo.num_generations={GENERATIONS}",
        f"grpo.max_completion_length={LENGTH}",
    ])  # fmt: skip
    train(cfg, resolve(cfg, processes=1).plan, build=build)
    print("RESULT " + json.dumps({"stamps": stamps, "generating": generating, "rewards": rewards}))


def generation_share(stamps: list[list[float]], generating: list[float]) -> float:
    """Generation's share of the wall time between the first and the last optimizer step: each
    step generates before its update (its first generation falls before the first stamp)."""
    total = stamps[-1][0] - stamps[0][0] if len(stamps) > 1 else 0.0
    return sum(generating[1 : len(stamps)]) / total if total > 0 else 0.0


def measure(
    repeats: int = 2, log: Any = print, trl: str | None = None, steps: int = STEPS, skip: int = 3
) -> dict[str, Any]:
    """Both sides ``repeats`` times, interleaved; {"skipped": why} without TRL."""
    found_trl = trl_python(trl)
    if found_trl is None:
        why = "no environment with TRL found (`--trl-python`, `$XTRAIN_TRL_PYTHON`, else `.venv-trl`)"
        log(f"grpo: skipped: {why}")
        return {"skipped": why}
    from xtrain import builtin
    from xtrain.builtin.grpo import FORMAT_PATTERN

    model = builtin.ensure_builtin_model("builtin:tiny-llama-grpo")
    data = builtin.ensure_builtin_data("builtin:preference-pairs")
    version = subprocess.run([found_trl, "-c", "import trl; print(trl.__version__)"], capture_output=True,
                             text=True, check=False).stdout.strip()  # fmt: skip
    rows: dict[str, list[dict[str, Any]]] = {"xtrain": [], "TRL GRPOTrainer": []}
    skip = min(skip, max(0, steps - 3))
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            sides = {
                "xtrain": [sys.executable, __file__, "--xtrain-side", f"{tmp}/x{k}", "--steps", str(steps)],
                "TRL GRPOTrainer": [
                    found_trl, str(HERE / "grpo_trl_job.py"), "--model", str(model),
                    "--train", str(data / "train.jsonl"), "--out", f"{tmp}/t{k}",
                    "--pattern", FORMAT_PATTERN, "--steps", str(steps), "--per-device", str(PER_DEVICE),
                    "--accumulation", str(ACCUMULATION),
                    "--generations", str(GENERATIONS), "--completion-length", str(LENGTH), "--lr", str(LR),
                ],
            }  # fmt: skip
            for name, cmd in sides.items():
                found = _run(cmd)
                wall, cpu = per_step(found["stamps"], skip)
                share = generation_share(found["stamps"], found["generating"])
                run = {"wall": wall, "cpu": cpu, "share": share, "rewards": found["rewards"]}
                rows[name].append(run)
                log(f"grpo: {name} run {k + 1}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU, rewards "
                    f"{' '.join(f'{r:.2f}' for r in found['rewards'])}")  # fmt: skip
    measured = time.strftime("%Y-%m-%dT%H:%M:%S")
    return {"trl_version": version, "repeats": repeats, "steps": steps, "skip": skip, "runs": rows,
            "measured": measured}  # fmt: skip


def render(r: dict[str, Any]) -> str:
    """The performance page's section (a line when TRL was not there)."""
    head = "## GRPO: xtrain vs TRL's GRPOTrainer, no vLLM\n\n"
    if "skipped" in r:
        return head + f"Not measured in this run: {r['skipped']} (`benchmarks/grpo_vs_trl.py`).\n"
    lines = [
        f"The same job on both (`benchmarks/grpo_vs_trl.py`; TRL {r['trl_version']}, plain `generate` on "
        "both sides): the GRPO quickstart's (`builtin:tiny-llama-grpo`, the prompts of "
        "`builtin:preference-pairs`, a regex reward of a whole sentence), LoRA r=8 / alpha 16 on q/k/v/o, "
        f"{GENERATIONS} completions a prompt of up to {LENGTH} tokens, {PER_DEVICE} completions a "
        f"micro-batch x {ACCUMULATION} accumulation, {r['steps']} steps, lr {LR} linear with 2 warm-up "
        "steps, loss dapo, beta 0, dropout off, one process, one compute thread, CPU. Every optimizer step "
        f"is stamped by torch's global optimizer-step pre-hook on both sides; the medians of the steps "
        f"after the first {r['skip']}, {r['repeats']} interleaved runs each in a fresh process; the "
        "generation share is the wall time generating and scoring over the same steps'; measured "
        f"{r.get('measured', '?')} on a shared 2-core machine.",
        "",
        "| trainer | s/step (wall, median) | s/step (CPU, median) | generation share "
        "| mean reward by step (first run) |",
        "|---|---|---|---|---|",
    ]
    for name, runs in r["runs"].items():
        wall = statistics.median(x["wall"] for x in runs)
        cpu = statistics.median(x["cpu"] for x in runs)
        share = statistics.median(x["share"] for x in runs)
        curve = " ".join(f"{v:.2f}" for v in runs[0]["rewards"])
        lines.append(f"| {name} | {wall:.3f} | {cpu:.3f} | {share:.0%} | {curve} |")
    x, t = (statistics.median(v["cpu"] for v in runs) for runs in r["runs"].values())
    lines += ["", f"xtrain / TRL, CPU time per step: **{x / t:.2f}x** (the issue's goal: at most 0.7x)."]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trl-python", default=None, help="an environment with TRL (default: .venv-trl)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--xtrain-side", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.xtrain_side:
        return xtrain_side(a.xtrain_side, a.steps)
    log = lambda line: print(f"# {line}", file=sys.stderr)  # noqa: E731
    result = measure(a.repeats, log, a.trl_python, a.steps, a.skip)
    log("RESULT " + json.dumps(result))  # (render again without measuring: render(json))
    print(render(result))


if __name__ == "__main__":
    main()
