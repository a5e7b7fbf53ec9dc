"""The distill task through xtrain's own loop (issue 61): the first step's gradients equal the
loss written out by hand over the recorded micro-batches (the step's token count over every
micro-batch); a run stopped at its step-2 checkpoint and resumed ends bitwise as the straight
run; 2 processes sample the same completions and train the same as 1; a chain SFT -> distill
whose student starts from the SFT result and learns from it starts at KL 0 and agreement 1 (the
teacher loaded as a trained result, the student's start applied under its new adapter); the result
runs in ``xtrain predict``. Bad input is one line each: a teacher with another tokenizer, a teacher
too big for the card by the memory estimate (the estimate counts the teacher), rows without the
answers GKD trains on, settings that contradict each other.

The losses themselves against their formulas: tests/test_distill_losses.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from support.gradients import jsonl

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

JOB = """\
model:
  name_or_path: {student}
  task: distill
distill:
  teacher: {teacher}
  mode: gkd
  beta: 0.5
  lmbda: 0.5
  max_completion_length: 8
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 32
lora:
  r: 4
  alpha: 8
  dropout: 0.0
optim:
  lr: 1.0e-2
  warmup_steps: 0
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  eval_every: 4
  eval_at_start: true
  log_every: 1
  save_every: 2
  report_to: none
  seed: 7
"""


def _rows(n: int, seed: int) -> list[dict]:
    """Prompts of the built-in kind with an answer each (the data steps of GKD train on them)."""
    return [{"prompt": r["prompt"], "completion": r["chosen"]} for r in builtin.preference_examples(n, seed)]


def teacher_folder(root: Path, student: Path) -> Path:
    """A teacher of the student's family: the built-in tiny llama's weights moved by seeded noise,
    its tokenizer the student's (a model folder as people have them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(student)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(root)
    AutoTokenizer.from_pretrained(student).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    root = tmp_path_factory.mktemp("distill-job")
    student = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    teacher = teacher_folder(root / "teacher", student)
    template = JOB.replace("{teacher}", str(teacher)).replace("{student}", "{model}")
    return task_job(root, template, student, _rows(24, 5), n_train=16)


def _train(job, out: Path, *extra: str):
    """The job in this process (one compute thread, as the job's processes have: the same sums)."""
    from support.workloads import this_machine

    from xtrain.train.loop import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(load_config(job.config, [f"run.output_dir={out}", *extra]), this_machine())
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def straight(job) -> Path:
    out = job.root / "straight"
    _train(job, out)
    return out


@pytest.mark.soak  # the step's normalisation by hand: tests/test_distill_losses.py (no loop, a second)
def test_the_first_gradients_equal_the_loss_by_hand_over_the_step_s_micro_batches(job, tmp_path):
    """On-policy, 2 micro-batches: each recorded micro-batch (the student's samples, completed by
    step_start) through a plain peft model and the plain teacher, every token's sampled reverse KL
    (its gradient k * grad log p) summed and divided by the step's trained tokens, back-propagated."""
    from support.distill import reference_loss
    from support.gradients import assert_same_gradients, record_forward, reference_model, xtrain_gradients

    batches, seen = [], {}

    def record(workload):
        seen["step"] = workload.forward
        record_forward(workload, batches)

    overrides = [f"run.output_dir={tmp_path / 'out'}", "distill.mode=on_policy", "optim.max_grad_norm=null"]
    cfg = load_config(job.config, overrides)
    capture = xtrain_gradients(cfg, on_workload=record)
    assert len(batches) == 2 and seen["step"].chunks is not None  # the heads ran in chunks
    ref, teacher = reference_model(capture).train(), seen["step"].teacher.model
    sums, tokens = zip(*(reference_loss(ref, teacher, b, "on_policy", 0.5) for b in batches), strict=True)
    counted = float(batches[0]["stat/total_tokens"])  # the step's, over its micro-batches
    assert sum(tokens) == sum(int(b["completion_mask"].sum()) for b in batches) == counted
    (sum(sums) / sum(tokens)).backward()
    want = {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}
    assert_same_gradients(capture.grads, want)


def test_a_run_resumed_from_its_step_2_checkpoint_ends_as_the_straight_run(job, straight):
    from support.jobs import assert_same_training

    result = json.loads((straight / "train_result.json").read_text())
    before, after = result["eval_history"][0], result["eval_metrics"]
    assert after["kl"] < before["kl"] and 0 <= after["agreement"] <= 1  # it learns
    record = json.loads((straight / "adapter" / "xtrain_run.json").read_text())
    assert record["task"] == "distill" and record["distill"]["teacher"] == str(job.root / "teacher")
    steps = {h["step"]: h["on_student_samples"] for h in result["log_history"]}
    assert set(steps.values()) == {0.0, 1.0}, steps  # GKD: steps on the student's samples and on answers
    resumed = job.root / "resumed"
    shutil.copytree(straight / "checkpoints" / "step-2", resumed / "checkpoints" / "step-2")
    _train(job, resumed)
    assert json.loads((resumed / "train_result.json").read_text())["resumed_from"]
    assert_same_training(straight, resumed, exact=True)


@pytest.mark.soak  # its sampling is GRPO's, seeded per completion: test_grpo_processes' 2-process case
def test_two_processes_sample_and_train_as_one(job, straight):
    from support.jobs import assert_same_training, train_once

    two, _ = train_once(job, "two", "--processes", "2")
    a, b = (json.loads((o / "train_result.json").read_text()) for o in (straight, two))
    assert (a["world_size"], a["accumulation"], b["world_size"], b["accumulation"]) == (1, 2, 2, 1)
    for x, y in zip(a["log_history"], b["log_history"], strict=True):  # the same completions, so lengths
        assert y["completions/mean_length"] == x["completions/mean_length"]
    assert b["eval_metrics"]["agreement"] == a["eval_metrics"]["agreement"]
    assert b["eval_metrics"]["kl"] == pytest.approx(a["eval_metrics"]["kl"], rel=1e-4)
    assert_same_training(straight, two)


def test_predict_continues_a_prompt_with_the_distilled_student(straight, capsys):
    from xtrain.cli import main

    code = main(["predict", str(straight), "--prompt", "question: where did tom play? answer: ",
                 "--max-new-tokens", "4"])  # fmt: skip
    assert code == 0, capsys.readouterr().err


def test_a_chain_sft_then_distill_then_dpo(tmp_path_factory, job):
    """The student starts from an SFT result (its adapter frozen, a new one on top) and its teacher
    is that same result (loaded as a trained run: base + adapter): at step 0 they are one model, so
    the KL is 0 and every greedy answer agrees; the record names the SFT stage in its lineage. DPO
    then starts from the distilled result, its reference that result (ln 2 at step 0)."""
    from support.chains import sft_result

    sft = sft_result(tmp_path_factory)
    out = tmp_path_factory.mktemp("chain") / "distill"
    _train(job, out, f"model.name_or_path={sft}", f"distill.teacher={sft}", "run.max_steps=1",
           "run.save_every=null", "batch.global_batch=4")  # fmt: skip
    result = json.loads((out / "train_result.json").read_text())
    first = result["eval_history"][0]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and first["agreement"] == 1.0
    record = json.loads((out / "adapter" / "xtrain_run.json").read_text())
    assert [stage["task"] for stage in record["lineage"]] == ["causal-lm"]
    assert record["distill"]["teacher_adapters"] and record["mode"] == "new"
    # and DPO from the distilled result: its reference is exactly that result (DPO's loss ln 2 at step 0)
    from support.chains import train_stage

    pairs = jsonl(out.parent / "pairs.jsonl", builtin.preference_examples(8, 5))
    dpo = train_stage(tmp_path_factory, "dpo", [
        f"model.name_or_path={out}", "model.task=preference", f"data.train={pairs}", f"data.eval={pairs}",
        "data.max_length=48", "batch.per_device=4", "batch.global_batch=4", "run.max_steps=1",
        "run.eval_at_start=true",
    ])  # fmt: skip
    before = json.loads((dpo / "train_result.json").read_text())["eval_history"][0]
    assert before["eval_loss"] == pytest.approx(math.log(2), abs=1e-5)
    lineage = json.loads((dpo / "adapter" / "xtrain_run.json").read_text())["lineage"]
    assert [stage["task"] for stage in lineage] == ["causal-lm", "distill"]


# -- bad input: one line each -------------------------------------------------------------------


def _dry_run(job, capsys, *extra: str) -> tuple[int, str]:
    from xtrain.cli import main

    code = main(["train", str(job.config), "--dry-run", f"run.output_dir={job.root / 'dry'}", *extra])
    return code, capsys.readouterr().err


def test_a_teacher_with_another_tokenizer_is_one_line_at_the_dry_run(job, capsys):
    code, err = _dry_run(job, capsys, "distill.teacher=builtin:tiny-agent")
    assert code != 0 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "distill.teacher=builtin:tiny-agent has another tokenizer than the student" in line


def test_a_teacher_too_big_for_the_card_is_one_line_and_the_estimate_counts_the_teacher(job, capsys):
    """A 70B-shaped teacher (its config and tokenizer only) for a 4090 plan: refused, the 4-bit
    size named; a 7B-shaped teacher in 4 bits fits and its weights are a term of the estimate."""
    from xtrain.builtin.text import tiny_llama_config

    shapes = {"big": (8192, 28672, 80, 64, 8), "seven": (3584, 18944, 28, 28, 4)}
    folders = {}
    for name, (hidden, mlp, layers, heads, kv) in shapes.items():
        folder = job.root / f"teacher-{name}"
        shutil.copytree(job.root / "teacher", folder, ignore=shutil.ignore_patterns("*.safetensors"))
        tiny_llama_config(hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, vocab_size=702,
                          dtype="bfloat16").save_pretrained(folder)  # fmt: skip
        folders[name] = folder
    facts = Path(__file__).parent / "fixtures" / "machines" / "windows-2x4090.json"
    code, err = _dry_run(job, capsys, "--facts", str(facts), f"distill.teacher={folders['big']}")
    assert code != 0 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert f"distill.teacher={folders['big']} alone needs ~140" in line and "RTX 4090 (24 GiB)" in line
    assert "distill.teacher_quantization=4bit (~36" in line
    from xtrain.cli import main
    from xtrain.tasks.sizes import other_sizes

    seven = [f"distill.teacher={folders['seven']}", "distill.teacher_quantization=4bit"]
    args = ["train", str(job.config), "--dry-run", "--facts", str(facts)]
    args.append(f"run.output_dir={job.root / 'dry'}")
    assert main([*args, *seven]) == 0
    out = capsys.readouterr().out
    ((_, weights),) = other_sizes(load_config(job.config, seven))
    assert 3.0 < weights / 2**30 < 3.3  # 6.5B Linear weights in 4 bits (NF4, double quantization)
    assert f"distill.teacher {folders['seven']} ~{1.1 * weights / 2**30:.1f} GiB of it (in 4bit)" in out


def test_mistakes_in_the_settings_and_rows_are_one_line(job, tmp_path, capsys):
    def refused(*overrides: str) -> str:
        with pytest.raises(XtrainError) as e:
            load_config(job.config, list(overrides))
        return e.value.message

    assert refused("distill.teacher=null").startswith("model.task=distill needs distill.teacher")
    assert refused("distill.beta=1.5") == "distill.beta must be a number in [0, 1], got 1.5"
    assert "is for distill.mode=gkd" in refused("distill.mode=on_policy", "distill.lmbda=0.2")
    other = refused("model.task=grpo", "grpo.rewards=[format]")
    assert other.startswith("distill.teacher is for task distill")
    bare = jsonl(tmp_path / "prompts.jsonl", [{"prompt": r["prompt"]} for r in _rows(4, 1)])
    code, err = _dry_run(job, capsys, f"data.train={bare}", "distill.lmbda=0.5")
    assert code != 0 and "Traceback" not in err
    assert "row 0 of" in err and "has no answer: distill.mode=gkd trains on the data's answers" in err
    assert _dry_run(job, capsys, f"data.train={bare}", "distill.seq_kd=true")[0] == 0  # the teacher answers


@pytest.mark.soak  # its teacher's SFT stage (~30 s) and 200 steps at 1 and 2 processes: minutes
def test_the_quickstart_learns_the_teacher_s_answers_at_one_and_two_processes(tmp_path_factory):
    """``xtrain quickstart --task distill``: the plain tiny llama's greedy answers agree with
    builtin:tiny-llama-sft's on none of the eval prompts, then on 0.84 of them (at least 0.8), the
    same at 1 and 2 processes; the teacher's SFT stage named in the record."""
    from support.jobs import session_quickstart

    runs = []
    for args in ((), ("--processes", "2")):
        proc, run = session_quickstart(tmp_path_factory, "--task", "distill", *args)
        result = json.loads((run / "train_result.json").read_text())
        first, last = result["eval_history"][0], result["eval_metrics"]
        assert first["agreement"] == 0.0 and last["agreement"] >= 0.8, (first, last)
        assert last["kl"] < 0.05 < first["kl"]
        assert "agreement with the teacher 0.0000 -> " in proc.stdout
        assert "runs the model just trained" in proc.stdout  # the whole student, not an adapter
        record = json.loads((run / "model" / "xtrain_run.json").read_text())
        assert record["distill"]["teacher"] == "builtin:tiny-llama-sft" and record["mode"] == "full"
        runs.append(last)
    assert runs[0]["agreement"] == runs[1]["agreement"]
    assert runs[0]["kl"] == pytest.approx(runs[1]["kl"], rel=1e-3)


# -- docs/distillation.md's memory table: xtrain's own estimate ------------------------------------
QWEN = {  # the published config.json sizes: hidden, MLP, layers, heads, key/value heads, vocabulary, tied
    "Qwen2.5-1.5B-Instruct": (1536, 8960, 28, 12, 2, 151936, True),
    "Qwen2.5-7B-Instruct": (3584, 18944, 28, 28, 4, 152064, False),
    "Qwen2.5-14B-Instruct": (5120, 13824, 48, 40, 8, 152064, False),
    "Qwen2.5-32B-Instruct": (5120, 27648, 64, 40, 8, 152064, False),
}
MEMORY_ROWS = [  # teacher, its quantization, prompt (= completion) tokens, gradient checkpointing
    ("Qwen2.5-7B-Instruct", None, 256, False), ("Qwen2.5-7B-Instruct", None, 512, True),
    ("Qwen2.5-7B-Instruct", None, 1024, True), ("Qwen2.5-7B-Instruct", "4bit", 256, False),
    ("Qwen2.5-7B-Instruct", "4bit", 512, False), ("Qwen2.5-7B-Instruct", "4bit", 512, True),
    ("Qwen2.5-7B-Instruct", "4bit", 1024, True), ("Qwen2.5-14B-Instruct", "4bit", 256, False),
    ("Qwen2.5-14B-Instruct", "4bit", 512, True), ("Qwen2.5-32B-Instruct", "4bit", 256, True),
]  # fmt: skip


def memory_table(folder: Path, tokenizer: Path) -> str:
    """The page's table: a Qwen2.5-1.5B-shaped student and Qwen2.5-shaped teachers (their
    config.json sizes beside ``tokenizer``'s files), each row's ``xtrain train --dry-run`` Memory
    line on the two-4090 Windows machine (``python tests/test_distill.py`` prints it)."""
    import contextlib
    import io
    import re

    from xtrain.builtin.text import tiny_llama_config
    from xtrain.cli import main
    from xtrain.model import memory

    for name, (hidden, mlp, layers, heads, kv, vocab, tied) in QWEN.items():
        shutil.copytree(
            tokenizer, folder / name, ignore=shutil.ignore_patterns("*.safetensors", "config.json")
        )
        shape = tiny_llama_config(hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                                  num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                                  tie_word_embeddings=tied, dtype="bfloat16")  # fmt: skip
        shape.save_pretrained(folder / name)
    data = jsonl(folder / "prompts.jsonl", [{"prompt": "question: where is the cat? answer: "}] * 8)
    (folder / "job.yaml").write_text("model:\n  task: distill\n", encoding="utf-8")
    facts = Path(__file__).parent / "fixtures" / "machines" / "windows-2x4090.json"
    columns = ["teacher", "prompt + completion tokens", "gradient checkpointing", "estimate a process",
               "the teacher's share"]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|---|---|---|---|---|"]
    for teacher, quantization, tokens, checkpointing in MEMORY_ROWS:
        args = ["train", str(folder / "job.yaml"), "--dry-run", "--facts", str(facts),
                f"model.name_or_path={folder / 'Qwen2.5-1.5B-Instruct'}",
                f"distill.teacher={folder / teacher}",
                f"distill.teacher_quantization={quantization or 'null'}", f"data.train={data}",
                "data.eval=null", f"data.max_length={tokens}", f"distill.max_completion_length={tokens}",
                "batch.per_device=4", "lora.r=32", "lora.alpha=64", "lora.target_modules=all-linear",
                "run.mixed_precision=bf16", f"model.gradient_checkpointing={str(checkpointing).lower()}",
                f"run.output_dir={folder / 'out'}"]  # fmt: skip
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            assert main(args) == 0, said.getvalue()[-2000:]
        found = re.search(r"Memory: ~([\d.]+) GiB a process .*~([\d.]+) GiB of it", said.getvalue())
        assert found, said.getvalue()[-2000:]
        gib, share = float(found.group(1)), found.group(2)
        fits = "**does not fit**" if gib > 24 else "tight" if gib > memory.TIGHT * 24 else "fits"
        shown = f"{teacher.removesuffix('-Instruct')} in {'4 bits' if quantization else 'bf16'}"
        lines.append(f"| {shown} | {tokens} + {tokens} | {'yes' if checkpointing else 'no'} | "
                     f"{gib:.1f} GiB ({fits}) | {share} GiB |")  # fmt: skip
    return "\n".join(lines)


def test_the_memory_table_is_xtrain_s_estimate(tmp_path_factory, tmp_path):
    from support.jobs import session_builtin

    page = (Path(__file__).resolve().parents[1] / "docs" / "distillation.md").read_text(encoding="utf-8")
    want = memory_table(tmp_path, session_builtin(tmp_path_factory, "builtin:tiny-llama"))
    assert want in page, f"docs/distillation.md's table should read:\n{want}"


if __name__ == "__main__":
    import os
    import sys
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = builtin.ensure_builtin_model("builtin:tiny-llama")
        sys.stdout.write(memory_table(Path(folder), Path(tokenizer)) + "\n")
