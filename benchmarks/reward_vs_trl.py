"""xtrain's reward model against TRL's RewardTrainer on the same job, like for like: the built-in
tiny llama as a one-output sequence classifier in float32, the built-in preference pairs (400 train,
100 eval), LoRA r=8 / alpha 16 on q/k/v/o with the head trained whole, no dropout, no gradient
checkpointing, 8 pairs a micro-batch x 2 accumulation, 30 steps, lr 2e-3 cosine with 5 warm-up
steps, ``center_rewards_coefficient`` 0.01, max_length 64, one thread each, on CPU (TRL's bf16
default off: it is emulated on most CPUs). Each side runs in a fresh process (TRL in its own
environment, ``--trl-python``; never a dependency of xtrain), alternating, and stamps every
optimizer step with torch's global optimizer-step pre-hook; the steps after the first ``--skip``
are timed by wall clock and by the process's CPU time.

The losses on the same batch: TRL's job saves its first collated batch and its trainable weights
(at the start, and after its training) with its own ``compute_loss`` of them; xtrain's reward
forward computes the loss of that batch with those weights loaded into xtrain's model (the names
are peft's on both sides). They must agree to float32 rounding. The page also says whether
xtrain's own encoding of those pairs is TRL's token for token.

    python -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl peft
    .venv/bin/python benchmarks/reward_vs_trl.py --trl-python .venv-trl/bin/python --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from preference_vs_trl import _run, find_trl, per_step  # noqa: E402  (the shared runner)

STEPS, PER_DEVICE, ACCUMULATION, LR, CENTER, MAX_LENGTH = 30, 8, 2, 2e-3, 0.01, 64
TARGETS = "[q_proj,k_proj,v_proj,o_proj]"


def _overrides(out: str, steps: int) -> list[str]:
    return [
        "model.name_or_path=builtin:tiny-llama", f"run.output_dir={out}", f"run.max_steps={steps}",
        "run.eval_every=null", "run.eval_at_start=false", "run.log_every=10", "run.report_to=none",
        f"batch.per_device={PER_DEVICE}", f"batch.global_batch={PER_DEVICE * ACCUMULATION}",
        f"optim.lr={LR}", "optim.schedule=cosine", "optim.warmup_steps=5",
        f"reward.center_rewards_coefficient={CENTER}", f"data.max_length={MAX_LENGTH}", "lora.r=8",
        "lora.alpha=16", "lora.dropout=0.0", f"lora.target_modules={TARGETS}",
    ]  # fmt: skip


JOB = HERE.parent / "xtrain" / "builtin" / "jobs" / "quickstart-reward.yaml"


def xtrain_side(out: str, steps: int = STEPS) -> None:
    """This process: xtrain's loop on the job, stamps at every optimizer step."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    torch.set_num_threads(1)
    stamps: list[tuple[float, float]] = []
    register_optimizer_step_pre_hook(lambda *_: stamps.append((time.perf_counter(), time.process_time())))
    cfg = load_config(JOB, _overrides(out, steps))
    result = train(cfg, resolve(cfg, processes=1).plan)
    print("RESULT " + json.dumps({"stamps": stamps, "accuracy": result.eval_metrics["rewards/accuracy"]}))


def xtrain_losses(probe: str, out: str) -> None:
    """This process: xtrain's reward forward on the batch TRL's job saved, with its weights (at the
    start, and trained), and xtrain's own encoding of the same pairs."""
    import contextlib

    import torch
    from safetensors.torch import load_file

    from xtrain.planning.context import LaunchContext
    from xtrain.planning.resolve import resolve
    from xtrain.planning.run import for_process
    from xtrain.tasks import build_workload
    from xtrain.tasks.validation import load_config

    torch.set_num_threads(1)
    cfg = load_config(JOB, _overrides(out, 1))
    run = for_process(cfg, LaunchContext(), plan=resolve(cfg, processes=1).plan)
    workload = build_workload(run, contextlib.nullcontext)
    model = workload.model.train()
    losses = {}
    for name in ("start", "trained"):
        weights = load_file(f"{probe}/{name}-weights.safetensors")
        own = dict(model.named_parameters())
        missing = sorted(set(weights) - set(own))
        assert not missing, f"TRL's weights that xtrain's model lacks: {missing[:4]}"
        with torch.no_grad():
            for k, v in weights.items():
                own[k].copy_(v)
        batch = torch.load(f"{probe}/{name}-batch.pt", weights_only=True)
        with torch.no_grad():
            losses[name] = float(workload.forward(model, batch).loss)
    rows = [workload.train_dataset[i] for i in range(PER_DEVICE)]
    ids = [r["chosen_input_ids"] for r in rows] + [r["rejected_input_ids"] for r in rows]
    print("RESULT " + json.dumps({"losses": losses, "ids": ids}))


def measure(
    repeats: int = 3, log: Any = print, trl: str | None = None, steps: int = STEPS, skip: int = 5
) -> dict[str, Any]:
    """Both sides ``repeats`` times, interleaved, and the losses on TRL's first batch; {"skipped":
    why} without a TRL environment."""
    trl_found = find_trl(trl, "reward", log)
    if isinstance(trl_found, dict):
        return trl_found
    found_trl, version = trl_found
    from xtrain import builtin

    model = builtin.ensure_builtin_model("builtin:tiny-llama")
    data = builtin.ensure_builtin_data("builtin:preference-pairs")
    rows: dict[str, list[tuple[float, float, float]]] = {"xtrain": [], "TRL RewardTrainer": []}
    skip = min(skip, max(0, steps - 3))
    probe: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            sides = {
                "xtrain": [sys.executable, __file__, "--xtrain-side", f"{tmp}/x{k}", "--steps", str(steps)],
                "TRL RewardTrainer": [
                    found_trl, str(HERE / "reward_trl_job.py"), "--model", str(model),
                    "--train", str(data / "train.jsonl"), "--eval", str(data / "eval.jsonl"),
                    "--out", f"{tmp}/t{k}", "--probe", f"{tmp}/probe{k}", "--steps", str(steps),
                    "--per-device", str(PER_DEVICE), "--accumulation", str(ACCUMULATION), "--lr", str(LR),
                    "--center", str(CENTER), "--max-length", str(MAX_LENGTH),
                ],
            }  # fmt: skip
            for name, cmd in sides.items():
                found = _run(cmd)
                wall, cpu = per_step(found["stamps"], skip)
                rows[name].append((wall, cpu, float(found["accuracy"])))
                log(f"reward: {name} run {k + 1}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU, "
                    f"eval accuracy {found['accuracy']:.3f}")  # fmt: skip
                if name != "xtrain" and not probe:
                    mine = _run([sys.executable, __file__, "--losses", f"{tmp}/probe{k}", "--steps", "1"])
                    probe = {
                        "trl": {"start": found["loss_start"], "trained": found["loss_trained"]},
                        "xtrain": mine["losses"], "same_ids": mine["ids"] == found["ids"],
                        "kept": found["kept"],
                    }  # fmt: skip
                    log(f"reward: losses on TRL's first batch: {probe}")
    measured = time.strftime("%Y-%m-%dT%H:%M:%S")  # run_all.py stamps its own over it
    return {"trl_version": version, "repeats": repeats, "steps": steps, "skip": skip, "runs": rows,
            "probe": probe, "measured": measured}  # fmt: skip


def render(r: dict[str, Any]) -> str:
    """The performance page's section (a line when TRL was not there)."""
    head = "## Reward models: xtrain vs TRL's RewardTrainer\n\n"
    if "skipped" in r:
        return head + f"Not measured in this run: {r['skipped']} (`benchmarks/reward_vs_trl.py`).\n"
    p = r["probe"]
    lines = [
        f"The same job on both (`benchmarks/reward_vs_trl.py`; TRL {r['trl_version']} in an environment "
        "of its own, `.venv-trl`, never a dependency of xtrain): the built-in tiny llama as a one-output "
        "sequence classifier in float32 (TRL's `bf16` default off), LoRA r=8 / alpha 16 on q/k/v/o with "
        "the head trained whole, no dropout, no gradient checkpointing (TRL's default on), the built-in "
        f"preference pairs (400 train, 100 eval), {PER_DEVICE} pairs a micro-batch x {ACCUMULATION} "
        f"accumulation, {r['steps']} steps, lr {LR} cosine with 5 warm-up steps, "
        f"`center_rewards_coefficient` {CENTER}, max_length {MAX_LENGTH}, one process, one compute "
        "thread, CPU. Every optimizer step is stamped by torch's global optimizer-step pre-hook on both "
        f"sides; the medians of the steps after the first {r['skip']}, {r['repeats']} interleaved runs each "
        f"in a fresh process; measured {r.get('measured', '?')}.",
        "",
        "| trainer | s/step (wall, median) | s/step (CPU, median) | final eval accuracy |",
        "|---|---|---|---|",
    ]
    for name, runs in r["runs"].items():
        wall = statistics.median(x[0] for x in runs)
        cpu = statistics.median(x[1] for x in runs)
        lines.append(f"| {name} | {wall:.3f} | {cpu:.3f} | {', '.join(f'{x[2]:.2f}' for x in runs)} |")
    x, t = (statistics.median(v[1] for v in runs) for runs in r["runs"].values())
    lines += [
        "",
        f"xtrain / TRL, CPU time per step: **{x / t:.2f}x**.",
        "",
        "The loss on the same batch (TRL's first collated batch of 8 pairs, its own `compute_loss`; "
        "xtrain's reward forward on that batch with TRL's trainable weights loaded into xtrain's model):",
        "",
        "| weights | TRL | xtrain | difference |",
        "|---|---|---|---|",
    ]
    for name, said in (("start", "at the start (TRL's head as transformers initialises it)"),
                       ("trained", f"after TRL's {r['steps']} steps")):  # fmt: skip
        a, b = p["trl"][name], p["xtrain"][name]
        lines.append(f"| {said} | {a:.8f} | {b:.8f} | {abs(a - b):.1e} |")
    same = "the same token ids as" if p["same_ids"] else "different token ids from"
    lines += [
        "",
        f"xtrain's own encoding of those 8 pairs gives {same} TRL's (TRL kept {p['kept']} of the 400 "
        "training pairs under max_length). On plain-text pairs TRL tokenizes prompt + answer + eos as one "
        "string, xtrain the prompt, then the answer (as its SFT and DPO do, and TRL's DPO): where the prompt "
        "ends in a space (the built-in pairs' `answer: `) the token at the seam differs. Chat pairs render "
        "through the template on both sides. Where the runs differ too: xtrain's "
        "new head starts at zero (every reward 0 at step 0: accuracy 0.5, loss ln 2) where TRL's starts at "
        "transformers' random initialisation, and xtrain cuts an answer at max_length where TRL drops "
        "the pair; a tie counts half in xtrain's accuracy and as wrong in TRL's.",
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trl-python", default=None, help="TRL's environment (default: .venv-trl)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--xtrain-side", help=argparse.SUPPRESS)
    p.add_argument("--losses", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.xtrain_side:
        return xtrain_side(a.xtrain_side, a.steps)
    if a.losses:
        with tempfile.TemporaryDirectory() as out:
            return xtrain_losses(a.losses, out)
    log = lambda line: print(f"# {line}", file=sys.stderr)  # noqa: E731
    result = measure(a.repeats, log, a.trl_python, a.steps, a.skip)
    print(render(result))


if __name__ == "__main__":
    main()
