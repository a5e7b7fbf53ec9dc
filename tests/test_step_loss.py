"""One step, one result: a step's loss is the sum of its token losses over the trained tokens of
the whole step (xtrain/train/step_loss.py), so every split of a global batch of 16 rows, per
device x accumulation x processes, back-propagates the gradient of the plain reference: the sum of
the 16 rows' token cross-entropies divided by their trained tokens (tests/support/gradients.py).

The rows differ clearly in length (so the micro-batches hold different numbers of trained tokens:
the mean of their means is another gradient), LoRA dropout is off (its masks follow the
micro-batch: equal in distribution only). One 2-process run (gloo, 8 rows each) serves both tasks.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl, reference_gradients, xtrain_gradients

from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

SPLITS = (16, 8, 4)  # per device on one process: accumulation 1, 2, 4 (global batch 16)
TASKS = ("causal-lm", "causal-lm-chat", "speech-to-text")
WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _common(*extra: str) -> list[str]:
    return ["run.report_to=none", "run.max_steps=1", "run.eval_at_start=false", "run.eval_every=null",
            "optim.max_grad_norm=null", "optim.warmup_steps=0", "data.eval=null", "lora.dropout=0.0",
            "batch.global_batch=16", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each task's config overrides: 16 rows whose answers run from one word to many (causal-lm:
    prompt and response, the prompt masked) or whose clips say one to three words (speech-to-text)."""
    import soundfile

    from xtrain.builtin import audio as builtin_audio

    data = tmp_path_factory.mktemp("split-data")
    rng = random.Random(4)
    rows = [{"prompt": f"count to {n}: ", "response": " ".join(WORDS[i % 12] for i in range(n))}
            for n in rng.sample(range(1, 33), 16)]  # fmt: skip
    chats = [{"messages": [turn("user", r["prompt"]), turn("assistant", r["response"]), turn("user", "again"),
                           turn("assistant", WORDS[i % 12])]} for i, r in enumerate(rows)]  # fmt: skip
    clips = []
    for i, text in enumerate(builtin_audio.clip_texts(16, seed=5)):
        soundfile.write(data / f"clip-{i}.wav", builtin_audio.synthesize(text, rng), builtin_audio.FILE_RATE)
        clips.append({"audio": str(data / f"clip-{i}.wav"), "text": text})
    return {
        "causal-lm": _common("model.name_or_path=builtin:tiny-llama", "model.task=causal-lm",
                             f"data.train={jsonl(data / 'counting.jsonl', rows)}", "data.max_length=48"),
        # chat rows (encoded once through datasets.map, read by both processes from one cache)
        "causal-lm-chat": _common("model.name_or_path=builtin:tiny-llama-chat", "model.task=causal-lm",
                                  f"data.train={jsonl(data / 'chats.jsonl', chats)}", "data.max_length=64"),
        "speech-to-text": _common("model.name_or_path=builtin:tiny-whisper", "model.task=speech-to-text",
                                  f"data.train={jsonl(data / 'clips.jsonl', clips)}", "data.max_length=24",
                                  "generation.max_new_tokens=8"),
    }  # fmt: skip


# Each rank of a torchrun runs xtrain's loop (support.gradients.xtrain_gradients) on each task's
# config in turn, in one process group (kept between the runs: ``release`` resets accelerate's
# state only; no trackers), and saves its gradients at the first optimizer step (after the all-reduce).
WORKER = """
import json, os, sys

import torch
import torch.distributed as dist

sys.path.insert(0, sys.argv[1])
from support.gradients import xtrain_gradients

import xtrain.train.loop as loop
from xtrain.machine.facts import Facts
from xtrain.planning.plan import Overrides
from xtrain.planning.rules import make_plan
from xtrain.tasks.validation import load_config


def keep_group(accelerator):  # release() without end_training(), which destroys the group
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


loop.release = keep_group
plan = make_plan(Facts(torch_version="2.13.0", gloo_available=True, cpu_count=2), Overrides(num_processes=2))
for name, overrides in json.loads(sys.argv[2]).items():
    grads = xtrain_gradients(load_config(None, overrides), plan).grads
    torch.save(grads, os.path.join(os.environ["TEST_OUT"], f"{name}-{dist.get_rank()}.pt"))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_processes(jobs: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Each task's first-step gradients on each of 2 processes x 8 rows (one torchrun, gloo)."""
    from support.jobs import offline_env, run_xtrain

    from xtrain.launch.rendezvous import free_port

    root = tmp_path_factory.mktemp("two-processes")
    worker = root / "worker.py"
    worker.write_text(WORKER)
    configs = {t: [*o, "batch.per_device=8", f"run.output_dir={root / t}"] for t, o in jobs.items()}
    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain"  # conftest's private_caches
    env = {**offline_env(root, cache), "TEST_OUT": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(worker), str(Path(__file__).parent),
           json.dumps(configs)]  # fmt: skip
    proc = run_xtrain(cmd, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {t: [torch.load(root / f"{t}-{rank}.pt") for rank in (0, 1)] for t in jobs}


@pytest.mark.parametrize("task", TASKS)
def test_every_split_of_the_global_batch_gives_the_plain_gradient(jobs, two_processes, task, tmp_path):
    """16 x 1, 8 x 2, 4 x 4 on one process and 8 x 1 on each of two: the first step's LoRA
    gradients equal the plain reference's (the 16 rows' token cross-entropies over their trained
    tokens) within float32 rounding."""
    captures = {}
    for per_device in SPLITS:
        out = tmp_path / f"{per_device}x{16 // per_device}"
        cfg = load_config(None, [*jobs[task], f"batch.per_device={per_device}", f"run.output_dir={out}"])
        captures[per_device] = capture = xtrain_gradients(cfg)
        assert len(capture.inputs) == 16 // per_device
    shift = 1 if task.startswith("causal-lm") else 0
    counts = [int((k["labels"][..., shift:] != -100).sum()) for k, _ in captures[4].inputs]
    assert len(set(counts)) > 1, counts  # the micro-batches' trained tokens differ
    want = reference_gradients(captures[16])
    for capture in captures.values():
        assert_same_gradients(capture.grads, want)
    for rank_grads in two_processes[task]:
        assert_same_gradients(rank_grads, want)


def test_a_micro_batch_without_trained_tokens_adds_nothing():
    """Its mean is 0/0 (NaN: the model's own loss and the chunked one): its share of the step's
    loss and its gradient are 0, and the step's loss and gradient are the other micro-batch's
    token mean's, with the model's own loss and the chunked one."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from xtrain.model.chunked_loss import chunked_cross_entropy
    from xtrain.train.step_loss import StepLoss

    torch.manual_seed(0)
    head, hidden = torch.nn.Linear(4, 7), torch.randn(2, 5, 4)
    labels = torch.randint(0, 7, (2, 5))
    labels[0, :3] = -100
    batches = [{"labels": torch.full((2, 5), -100)}, {"labels": labels}]
    step = StepLoss.of("next-token", None, accumulation=2, world=1, group=None)
    counts, total = step.tokens(batches)
    assert counts == [0, int((labels[:, 1:] != -100).sum())] and total == counts[1]

    def own(y):
        return F.cross_entropy(head(hidden)[:, :-1].reshape(-1, 7), y[:, 1:].reshape(-1), ignore_index=-100)

    def chunked(y):
        return chunked_cross_entropy(head, hidden, y, shift=True, rows=3)

    own(labels).backward()
    want = head.weight.grad.clone()
    for loss_fn in (own, chunked):
        head.zero_grad()
        shares = []
        for batch, count in zip(batches, counts, strict=True):
            out = SimpleNamespace(loss=loss_fn(batch["labels"]))
            backward, share = step.micro(out, count, total)
            (backward / 2).backward()  # accelerate's backward divides by the accumulation
            shares.append(share)
        assert float(shares[0]) == 0.0
        assert float(sum(shares)) == pytest.approx(float(own(labels).detach()), rel=1e-6)
        torch.testing.assert_close(head.weight.grad, want)


@pytest.mark.soak  # four 40-step trainings of the built-in chat job, one of them on 2 processes: minutes
def test_the_built_in_chat_job_ends_alike_in_every_split(tmp_path, tmp_path_factory):
    """Issue 46's measure: the built-in chat job (global batch 16), 40 steps as 16 x 1, 8 x 2,
    4 x 4 on one process and 8 x 1 on each of two, LoRA dropout 0: eval losses within 1e-3 of
    each other (before the step's loss was defined once: 1.4366, 1.4496, 1.4494, 1.4496) and the
    logged training losses, each step's token mean, within 1e-4."""
    from support.jobs import offline_env, run_xtrain

    from xtrain import builtin

    job = Path(builtin.__file__).parent / "jobs" / "quickstart-chat.yaml"
    env = offline_env(tmp_path, tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain")
    results = []
    for per_device, processes in ((16, 1), (8, 1), (4, 1), (8, 2)):
        out = tmp_path / f"{per_device}x{processes}"
        proc = run_xtrain([sys.executable, "-m", "xtrain", "train", str(job), "-n", str(processes),
                           "run.max_steps=40", "lora.dropout=0.0", "run.eval_at_start=false",
                           "run.report_to=none", f"batch.per_device={per_device}", f"run.output_dir={out}"],
                          env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads((out / "train_result.json").read_text()))
    evals = [r["eval_metrics"]["eval_loss"] for r in results]
    assert max(evals) - min(evals) < 1e-3, evals
    for r in results[1:]:
        assert [s for s, _ in r["losses"]] == [s for s, _ in results[0]["losses"]]
        for (_, got), (_, want) in zip(r["losses"], results[0]["losses"], strict=True):
            assert got == pytest.approx(want, rel=1e-4)
