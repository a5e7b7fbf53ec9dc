"""The reward task (docs/reward-models.md): a one-output head on a causal LM trained on preference
pairs with the Bradley-Terry loss. Its loss and gradients against the model and the loss written
out by hand (the pooling at the last real token, the head, the margin, the centring term); the
same model at 1 and 2 processes and after a resume; the head saved and loaded back (predict after
reload scores as the model did at the end of training); a stage from an SFT result; GRPO's
``model:RUN`` rewards equal to ``xtrain predict``'s scores for the same texts; bad input one line
each."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

JOB = """\
model:
  name_or_path: {model}
  task: reward
reward:
  center_rewards_coefficient: 0.01
lora:
  r: 4
  alpha: 8
  dropout: 0.0
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 48
optim:
  lr: 1.0e-2
  schedule: constant
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  eval_every: 2
  eval_at_start: true
  log_every: 1
  save_every: 2
  seed: 7
"""


def _pairs(n: int, seed: int = 3) -> list[dict]:
    """Pairs with a margin column (0, 0.5 or 1 a pair): the loss reads it."""
    return [
        {**r, "margin": [0.0, 0.5, 1.0][i % 3]} for i, r in enumerate(builtin.preference_examples(n, seed))
    ]


def _caches(mp: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A module fixture's built-ins and datasets cache: the session's (``private_caches``')."""
    import datasets

    root = tmp_path_factory.getbasetemp() / "offline-caches"
    mp.setenv("XTRAIN_CACHE", str(root / "xtrain"))
    mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "datasets"))


def _train(job, out: Path, *overrides: str):
    from support.workloads import this_machine

    from xtrain.train.loop import train

    return train(
        load_config(job.config, [f"run.output_dir={out}", "run.report_to=none", *overrides]), this_machine()
    )


@pytest.fixture(scope="module")
def rm_job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    model = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    return task_job(tmp_path_factory.mktemp("reward-job"), JOB, model, _pairs(32), n_train=24)


@pytest.fixture(scope="module")
def straight(rm_job, tmp_path_factory) -> Path:
    """The job in this process: 4 steps, checkpoints at 2 and 4."""
    with pytest.MonkeyPatch.context() as mp:
        _caches(mp, tmp_path_factory)
        _train(rm_job, rm_job.root / "straight")
    return rm_job.root / "straight"


# -- the loss and its gradients, by hand ---------------------------------------------------------------
def test_the_loss_and_its_gradients_equal_a_reward_model_written_out_by_hand(rm_job, tmp_path):
    """The step's gradients (2 micro-batches, margins, the centring term) against the body's
    hidden states read at each sequence's last real token (its length - 1: right padding), the
    head's row, and ``mean(-log sigmoid(r_c - r_r - m) + c (r_c + r_r)^2)`` over the step's pairs,
    with the adapters and the head moved off their start first (a zero head passes no gradient):
    support/reward_models.py."""
    from support.reward_models import hand_gradients, reward_step

    cfg = load_config(rm_job.config, [
        f"run.output_dir={tmp_path}", "run.report_to=none", "run.max_steps=1", "run.eval_at_start=false",
        "run.eval_every=null", "optim.max_grad_norm=null",
    ])  # fmt: skip
    capture, batches = reward_step(cfg)
    assert len(batches) == 2 and all("margin" in b for b in batches)
    assert any(bool((b["attention_mask"] == 0).any()) for b in batches), "some rows are padded"
    want = hand_gradients(capture, batches, cfg.reward.center_rewards_coefficient)
    assert any("score" in n for n in want) and any("lora_A" in n for n in want)
    assert_same_gradients(capture.grads, want)


def test_the_loss_is_trl_s_formula_and_the_metrics_count_ties_half():
    from xtrain.tasks.reward.loss import bradley_terry, reduce

    chosen, rejected = torch.tensor([1.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 2.0])
    margin = torch.tensor([0.5, 0.0, 1.0])
    stats = bradley_terry(chosen, rejected, margin, center=0.1)
    want = [-math.log(1 / (1 + math.exp(-(c - r - m)))) + 0.1 * (c + r) ** 2
            for c, r, m in zip(chosen.tolist(), rejected.tolist(), margin.tolist(), strict=True)]  # fmt: skip
    torch.testing.assert_close(stats["loss_sum"], torch.tensor(want))
    metrics = reduce(stats)
    assert metrics["rewards/accuracy"] == pytest.approx(0.5)  # right, tie (half), wrong
    assert metrics["rewards/margin"] == pytest.approx((1.0 + 0.0 - 3.0) / 3)


# -- resume, any split of the batch, two processes; the head saved and loaded back ---------------------------
def test_step_0_is_chance_and_a_resume_ends_bitwise(rm_job, straight, tmp_path_factory):
    """Step 0 is chance (a new head at zero: every reward 0, accuracy 0.5, each pair's loss
    -log sigmoid(-margin), ln 2 without a margin) and the model learns; a run stopped after its
    checkpoint of step 2, resumed, ends bitwise where the straight run did (the head included: it is in the
    adapter, ``modules_to_save``). (Any split of a step's pairs: the gradient test's two
    micro-batches against the mean over the step's pairs; two processes: the soak test below.)"""
    from support.jobs import assert_same_training

    one = json.loads((straight / "train_result.json").read_text())
    start = one["eval_history"][0]
    assert start["step"] == 0 and start["rewards/accuracy"] == 0.5
    margins = [p["margin"] for p in _pairs(32)[24:]]  # the eval rows'
    at_zero = sum(math.log(1 + math.exp(m)) for m in margins) / len(margins)
    assert start["eval_loss"] == pytest.approx(at_zero, abs=1e-6)
    assert one["eval_history"][-1]["rewards/accuracy"] > 0.5
    config = json.loads((straight / "adapter" / "adapter_config.json").read_text())
    assert "score" in config["modules_to_save"]
    resumed = rm_job.root / "resumed"  # a run stopped after its checkpoint of step 2: that checkpoint
    shutil.copytree(straight / "checkpoints" / "step-2", resumed / "checkpoints" / "step-2")
    with pytest.MonkeyPatch.context() as mp:
        _caches(mp, tmp_path_factory)
        result = _train(rm_job, resumed)
    assert result.resumed_from and result.resumed_from.endswith("step-2")
    assert_same_training(straight, resumed, exact=True)


@pytest.mark.soak  # 2 spawned processes: ~20 s of CPU on CI, for what the loop proves for every task
def test_one_and_two_processes_train_the_same_reward_model(rm_job, straight):
    """2 spawned gloo processes (1 micro-batch each) against 1 process accumulating 2: the same
    losses, eval metrics and adapter (its head included)."""
    from support.jobs import assert_same_training, one_and_two_processes

    out, one, two = one_and_two_processes(rm_job, straight)
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert b["rewards/accuracy"] == a["rewards/accuracy"]
        assert b["rewards/margin"] == pytest.approx(a["rewards/margin"], rel=1e-4, abs=1e-6)
    assert_same_training(straight, out)


def test_predict_after_reload_scores_as_the_model_did_at_the_end_of_training(rm_job, straight, tmp_path):
    """``xtrain predict RUN --data eval.jsonl`` (the adapter and its head loaded onto a fresh base)
    gives the final evaluation's figures: its reward accuracy, and each pair's rewards whose means
    are the evaluation's chosen and rejected rewards; ``-p``/``-a`` scores a pair as the file's row
    does; a checkpoint (``checkpoints/step-2``, its adapter inside) is a result of its own; ``xtrain
    export --to merged`` writes one classifier that scores the same (a GGUF is refused: one line)."""
    from xtrain import predict as lib
    from xtrain.tasks.contract import PredictRequest

    final = json.loads((straight / "train_result.json").read_text())["eval_metrics"]
    results = lib.predict_file(straight, rm_job.root / "eval.jsonl", PredictRequest([], [], batch_size=3))
    rows = results.rows
    assert results.metrics["reward_accuracy"] == final["rewards/accuracy"]
    for key, metric in (("score_chosen", "rewards/chosen"), ("score_rejected", "rewards/rejected")):
        assert sum(r[key] for r in rows) / len(rows) == pytest.approx(final[metric], rel=1e-5, abs=1e-6)
    first = rows[0]
    request = PredictRequest([], [first["prompt"]], answers=[first["chosen"], first["rejected"]])
    scored = lib.predict(straight, request)
    assert [r["score"] for r in scored] == pytest.approx(
        [first["score_chosen"], first["score_rejected"]], abs=1e-6
    )
    early = lib.predict(straight / "checkpoints" / "step-2", request)
    assert [r["score"] for r in early] != [r["score"] for r in scored]  # the model of step 2
    from xtrain.export.pipeline import ExportRequest, export, prepare

    export(ExportRequest(str(straight), "merged", tmp_path / "merged"))  # one plain classifier folder
    merged = lib.predict(tmp_path / "merged", request)
    assert [r["score"] for r in merged] == pytest.approx([r["score"] for r in scored], abs=1e-5)
    with pytest.raises(XtrainError, match="a reward result: a classifier has no GGUF or Ollama form"):
        prepare(ExportRequest(str(straight), "gguf", tmp_path / "gguf"))


# -- GRPO's reward model ------------------------------------------------------------------------------
LOGGER = """\
import json, os

def logged(prompts, completions, **columns):
    with open(os.environ["REWARD_TEST_LOG"], "a") as f:
        f.write(json.dumps([prompts, completions]) + "\\n")
    return [0.0] * len(completions)
"""


@pytest.mark.slow
def test_grpo_rewards_are_the_reward_model_s_scores(rm_job, straight, tmp_path, monkeypatch):
    """A GRPO step and its evaluation with ``grpo.rewards: [model:RUN, logged]`` (``logged`` writes
    what it is given): the step's logged ``rewards/straight/mean`` and the evaluation's
    ``rewards/straight`` are the means of ``xtrain predict RUN``'s scores for the same prompts and
    completions, and each sample the evaluation shows carries its own score."""
    from support.workloads import this_machine

    from xtrain import predict as lib
    from xtrain.tasks.contract import PredictRequest
    from xtrain.train.loop import train

    (tmp_path / "logged.py").write_text(LOGGER)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("REWARD_TEST_LOG", str(log))
    prompts = jsonl(tmp_path / "prompts.jsonl", [{"prompt": r["prompt"]} for r in _pairs(4, seed=9)])
    evals = jsonl(tmp_path / "evals.jsonl", [{"prompt": r["prompt"]} for r in _pairs(2, seed=8)])
    model = json.loads((straight / "adapter" / "xtrain_run.json").read_text())["base"]
    cfg = load_config(None, [
        f"model.name_or_path={model}", "model.task=grpo", f"data.train={prompts}", f"data.eval={evals}",
        f"grpo.rewards=[model:{straight},{tmp_path / 'logged.py'}:logged]", "grpo.num_generations=4",
        "grpo.max_completion_length=6", "batch.per_device=8", "batch.global_batch=8", "run.max_steps=1",
        "run.log_every=1", "data.max_length=48", f"run.output_dir={tmp_path / 'grpo'}", "run.report_to=none",
        "run.eval_at_start=false",
    ])  # fmt: skip
    result = train(cfg, this_machine())
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [len(c[1]) for c in calls] == [8, 2]  # the step (2 prompts x 4), then the evaluation

    texts = [pc for c in calls for pc in zip(*c, strict=True)]  # the step's 8, then the evaluation's 2
    file = jsonl(tmp_path / "texts.jsonl", [{"prompt": p, "completion": c} for p, c in texts])
    scored = [r["score"] for r in lib.predict_file(straight, file, PredictRequest([], [], batch_size=5)).rows]
    trained, evaluated = scored[:8], scored[8:]
    window = result.log_history[0]
    assert window["rewards/straight/mean"] == pytest.approx(sum(trained) / len(trained), rel=1e-5, abs=1e-6)
    final = result.eval_metrics
    assert final["rewards/straight"] == pytest.approx(sum(evaluated) / len(evaluated), rel=1e-5, abs=1e-6)
    shown = json.loads((tmp_path / "grpo" / "eval_samples.json").read_text())["evaluations"][-1]["samples"]
    by_text = {(p, c.strip()): v for (p, c), v in zip(texts[8:], evaluated, strict=True)}
    for sample in shown:
        text = sample["prediction"].rsplit("  [reward", 1)[0]
        assert sample["details"]["rewards"]["straight"] == pytest.approx(
            by_text[(sample["reference"], text)], abs=1e-6
        )


# -- a stage from an SFT result --------------------------------------------------------------------------
def _sft_result(folder: Path, model: str) -> Path:
    """An SFT result as xtrain writes one (a causal LM's LoRA adapter moved off zero, its tokenizer,
    its record), made by peft directly: the start of a reward stage."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model), lora)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    peft_model.save_pretrained(str(folder / "adapter"))
    AutoTokenizer.from_pretrained(model).save_pretrained(str(folder / "adapter"))
    record = {"task": "causal-lm", "chat": False, "base": model, "lineage": [], "mode": "new"}
    (folder / "adapter" / "xtrain_run.json").write_text(json.dumps(record))
    return folder


@pytest.mark.slow
def test_a_reward_model_trains_on_an_sft_result_and_its_merged_model_scores_alike(rm_job, tmp_path):
    """Start: an SFT run's folder. Its adapter stays under the head (frozen, the lineage recorded),
    the reward adapter trains on top; the chain is two kinds of adapter (a causal LM's, a
    classifier's), so the result is also written merged, and the merged classifier scores as
    ``xtrain predict`` runs the chain."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from xtrain import predict as lib
    from xtrain.tasks.contract import PredictRequest
    from xtrain.tasks.reward.scoring import Scorer, encoder_for

    model = rm_job.config.read_text().split("name_or_path: ")[1].split()[0]
    sft = _sft_result(tmp_path / "sft", model)
    out = tmp_path / "rm"
    _train(rm_job, out, f"model.name_or_path={sft}", "run.max_steps=2", "run.eval_every=null",
           "run.eval_at_start=false", "run.save_every=null")  # fmt: skip
    record = json.loads((out / "adapter" / "xtrain_run.json").read_text())
    assert [e["task"] for e in record["lineage"]] == ["causal-lm"] and record["task"] == "reward"
    assert (out / "merged").is_dir() and not (out / "adapter-chain").exists()
    prompt, answers = "question: where did tom play with the cat? answer: ", ["in the park.", "no idea."]
    chain = [r["score"] for r in lib.predict(out, PredictRequest([], [prompt], answers=answers))]
    merged = AutoModelForSequenceClassification.from_pretrained(str(out / "merged")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out / "merged"))
    scorer = Scorer(merged, tokenizer, encoder_for(record["data"], tokenizer, str(out / "merged")))
    assert scorer.scores([(prompt, a) for a in answers]) == pytest.approx(chain, abs=1e-5)
    assert chain[0] != chain[1]


# -- bad input, one line each ----------------------------------------------------------------------------
def _result(folder: Path, task: str) -> Path:
    """A result's files as a run writes them (what a start or a reward path is read from)."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "builtin:tiny-llama"}))
    (folder / "xtrain_run.json").write_text(json.dumps({"task": task, "chat": False}))
    return folder


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"prompt": "p", "chosen": "a"}], r"row 0 of .*train.jsonl: field 'rejected' is missing or empty"),
        (
            [{"prompt": "p", "completion": "a", "label": True}],
            "holds unpaired {prompt, completion, label} rows: a reward model learns from pairs",
        ),  # fmt: skip
        (
            [{"prompt": "p", "chosen": "a", "rejected": "b", "margin": "big"}],
            r"row 0 of .*: field 'margin' is 'big', not a number",
        ),  # fmt: skip
    ],
)
def test_bad_pairs_are_one_line(tmp_path, rows, message):
    from xtrain import tasks

    data = jsonl(tmp_path / "train.jsonl", rows)
    cfg = load_config(None, ["model.task=reward", f"data.train={data}", "data.eval=null"])
    with pytest.raises(XtrainError, match=message):
        tasks.get("reward").check_data(cfg, 100)


def test_a_reward_path_that_is_not_a_reward_model_is_one_line(tmp_path, capsys):
    from xtrain.cli import main

    sft = _result(tmp_path / "sft", "causal-lm")
    with pytest.raises(
        XtrainError, match=f"grpo.rewards: model:{sft} is a causal-lm result, not a reward model"
    ):
        load_config(None, ["model.task=grpo", f"grpo.rewards=[model:{sft}]"])
    with pytest.raises(XtrainError, match=f"model:{tmp_path / 'nope'}: {tmp_path / 'nope'} is not a folder"):
        load_config(None, ["model.task=grpo", f"grpo.rewards=[model:{tmp_path / 'nope'}]"])
    data = jsonl(tmp_path / "train.jsonl", _pairs(2))
    cfg = load_config(None, ["model.task=reward", f"data.train={data}", "reward.margin_column=score"])
    with pytest.raises(XtrainError, match="reward.margin_column: .* has no column 'score'"):
        from xtrain import tasks

        tasks.get("reward").check_data(cfg, 100)
    assert main(["predict", str(sft), "-p", "hi", "-a", "there"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --answer gives a reward model answers to score; a causal-lm result scores none "
                   "(leave out --answer: it is for reward results)"]  # fmt: skip


# -- docs/reward-models.md's memory table: xtrain's own estimate -------------------------------------------
def memory_table(folder: Path) -> str:
    """The page's table: the published config.json values of three Qwen2.5 sizes as reward models
    (one pair of 1024-token answers a micro-batch, fp16, one RTX 4090), sized on the meta device
    and estimated as ``xtrain train --dry-run`` does (``python tests/test_reward.py`` prints it)."""
    from dataclasses import replace

    from test_memory_fitting import _QWEN2, CARD, CARD_GIB

    from xtrain.model import memory
    from xtrain.tasks.sizes import offline_sizes

    qwen = dict(_QWEN2, architectures=["Qwen2ForCausalLM"], model_type="qwen2", max_position_embeddings=32768)
    models = [
        ("Qwen2.5-1.5B-Instruct", dict(qwen, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True)),
        ("Qwen2.5-7B-Instruct", dict(qwen, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False)),
        ("Qwen2.5-14B-Instruct", dict(qwen, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                                      num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                                      tie_word_embeddings=False)),
    ]  # fmt: skip
    options = [("16-bit LoRA", None, False), ("16-bit LoRA + checkpointing", None, True),
               ("4-bit QLoRA", "4bit", False), ("4-bit QLoRA + checkpointing", "4bit", True)]  # fmt: skip
    lines = ["| model | parameters (with LoRA) | " + " | ".join(o[0] for o in options) + " |",
             "|" + "---|" * (2 + len(options))]  # fmt: skip
    for name, config in models:
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps(config), encoding="utf-8")
        sizes = offline_sizes(load_config(None, [f"model.name_or_path={(folder / name).as_posix()}",
                                                 "model.task=reward"]))  # fmt: skip
        assert not isinstance(sizes, str), sizes
        cells = [name, f"{sizes.params / 1e9:.2f}B"]
        for _, quantization, checkpointing in options:
            sized = replace(sizes, quantization=quantization)
            gib = memory.check_memory(sized, 1, 1024, checkpointing, "fp16", CARD_GIB, CARD).estimate_gib
            tight = f"{gib:.1f} tight" if gib > memory.TIGHT * CARD_GIB else f"{gib:.1f}"
            cells.append(f"**{gib:.1f}** over" if gib > CARD_GIB else tight)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_memory_table_is_xtrain_s_estimate(tmp_path):
    page = (Path(__file__).resolve().parents[1] / "docs" / "reward-models.md").read_text(encoding="utf-8")
    want = memory_table(tmp_path)
    assert want in page, f"docs/reward-models.md's table should read:\n{want}"


if __name__ == "__main__":
    import os
    import sys
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory() as folder:
        sys.stdout.write(memory_table(Path(folder)) + "\n")
