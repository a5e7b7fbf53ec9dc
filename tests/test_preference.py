"""preference: the task added as modules and one registry line. Rows in every shape read, the
prompt masked and never cut, bad rows one line with the row; each loss raises the reward accuracy
of the built-in job (DPO from log 2 and chance); precomputed and live references give the same
loss; 4-bit DPO trains; the adapter loads in plain peft; 1 vs 2 processes and kill + resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support.workloads import build_workload

from xtrain import builtin
from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows import preference as rows_
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _pairs(n: int, seed: int = 5) -> list[dict]:
    return builtin.preference_examples(n, seed)


def _cfg(root: Path, train: list[dict], *extra: str, eval_: list[dict] | None = None):
    overrides = [
        "model.name_or_path=builtin:tiny-llama",
        "model.task=preference",
        f"data.train={_jsonl(root / 'train.jsonl', train)}",
        f"data.eval={_jsonl(root / 'eval.jsonl', eval_) if eval_ else 'null'}",
        "data.max_length=48",
        f"run.output_dir={root / 'out'}",
        "run.report_to=none",
        *extra,
    ]
    return load_config(None, overrides)


# -- the data -------------------------------------------------------------------------------------------
def test_every_row_shape_reads_as_one_prompt_and_two_answers():
    turns = [{"role": "user", "content": "hi?"}]
    shapes = [
        {"prompt": "hi?", "chosen": "hello.", "rejected": "go."},
        {"prompt": turns, "chosen": [{"role": "assistant", "content": "hello."}],
         "rejected": [{"role": "assistant", "content": "go."}]},
        {"chosen": [*turns, {"role": "assistant", "content": "hello."}],
         "rejected": [*turns, {"role": "assistant", "content": "go."}]},
        {"instruction": "hi?", "chosen": "hello.", "rejected": "go."},
        {"conversations": [{"from": "human", "value": "hi?"}], "chosen": {"from": "gpt", "value": "hello."},
         "rejected": {"from": "gpt", "value": "go."}},
    ]  # fmt: skip
    for i, shape in enumerate(shapes):
        row = rows_.read_row(shape, i, "x.jsonl")
        prompt = row.prompt if isinstance(row.prompt, str) else row.prompt[-1]["content"]
        assert (prompt, row.chosen, row.rejected, row.desirable) == ("hi?", "hello.", "go.", None), shape
    kto = rows_.read_row({"prompt": "hi?", "completion": "hello.", "label": False}, 0, "x")
    assert (kto.chosen, kto.rejected, kto.desirable) == ("hello.", None, False)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "p", "rejected": "r"}, "row 1 of x.jsonl: field 'chosen' is missing or empty"),
        ({"prompt": "p", "chosen": "same", "rejected": "same "}, "row 1 of x.jsonl: 'chosen' and 'rej"),
        ({"prompt": "p", "completion": "c", "label": "yes"}, "row 1 of x.jsonl: field 'label' is 'yes'"),
    ],
)  # fmt: skip
def test_bad_rows_are_one_line_with_the_row(row, message):
    with pytest.raises(XtrainError) as e:
        rows_.read_rows([{"prompt": "p", "chosen": "c", "rejected": "r"}, row], "x.jsonl")
    assert (
        e.value.one_line().startswith(message) and e.value.exit_code == 2 and "\n" not in e.value.one_line()
    )


def test_the_prompt_is_masked_kept_whole_and_a_too_long_prompt_refused(tmp_path):
    from xtrain.model import load as models

    tokenizer = models.load_tokenizer(str(builtin.ensure_builtin_model("builtin:tiny-llama")), False)
    encoder = rows_.Encoder(tokenizer, max_length=12)
    row = rows_.PreferenceRow("tom went to the park", "tom played with the dog all day long", "no")
    (pair,) = rows_.paired_rows([row], encoder, "x.jsonl")
    prompt = len(tokenizer("tom went to the park")["input_ids"])
    for part in ("chosen", "rejected"):
        ids, labels = pair[f"{part}_input_ids"], pair[f"{part}_labels"]
        assert ids[:prompt] == pair["chosen_input_ids"][:prompt], "both answers follow the same prompt"
        assert labels[:prompt] == [IGNORE_INDEX] * prompt and IGNORE_INDEX not in labels[prompt:]
    assert len(pair["chosen_input_ids"]) == 12, "the answer is cut, after the whole prompt"
    with pytest.raises(XtrainError, match=r"row 0 of x.jsonl: the prompt is \d+ tokens, data.max_length 4"):
        rows_.paired_rows([row], rows_.Encoder(tokenizer, max_length=4), "x.jsonl")
    # the same through the task's build: refused before the model loads, naming the row
    long = {"prompt": "word " * 80, "chosen": "a", "rejected": "b"}
    with pytest.raises(XtrainError, match="row 2 of .*train.jsonl: the prompt is"):
        build_workload(_cfg(tmp_path, [*_pairs(2), long]))


def test_the_data_check_reads_the_rows_as_the_run_does(tmp_path):
    from xtrain.tasks.preference.preference import TASK

    report = TASK.check_data(_cfg(tmp_path, _pairs(5)), 100)
    (train,) = report.sources
    assert train.row_format == "pairs" and len(train.lengths) == 5 and report.example is not None
    bad = [*_pairs(3), {"prompt": "p", "chosen": "c"}]
    with pytest.raises(XtrainError, match="row 3 of .*train.jsonl: field 'rejected' is missing or empty"):
        TASK.check_data(_cfg(tmp_path, bad), 100)


def test_chat_rows_render_by_the_template_and_label_the_last_answer_only(tmp_path):
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    conv = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "and?"},
    ]
    rows = [{"prompt": conv, "chosen": "fine thanks", "rejected": "meh"}] * 2
    workload = build_workload(_cfg(tmp_path, rows, f"data.chat_template={template}", "data.max_length=64"))
    tok, row = workload.tokenizer, workload.train_dataset[0]
    trained = [t for t in row["chosen_labels"] if t != IGNORE_INDEX]
    assert tok.decode(trained) == "fine thanks</s>" and workload.chat
    assert tok.decode(row["chosen_input_ids"]).startswith("<|user|>hi</s><|assistant|>yo</s>")


def test_a_batch_is_chosen_then_rejected_in_one_forward(tmp_path):
    workload = build_workload(_cfg(tmp_path, _pairs(6), "batch.per_device=3", "batch.global_batch=3"))
    rows = [workload.train_dataset[i] for i in range(3)]
    batch = workload.collator(rows)
    assert batch["input_ids"].shape[0] == 6
    for i, row in enumerate(rows):
        n, m = len(row["chosen_input_ids"]), len(row["rejected_input_ids"])
        assert batch["input_ids"][i, :n].tolist() == row["chosen_input_ids"]
        assert batch["input_ids"][3 + i, :m].tolist() == row["rejected_input_ids"]
    import pickle  # spawned DataLoader workers (Windows, macOS) get the rows and the collator pickled

    assert torch.equal(pickle.loads(pickle.dumps(workload.collator))(rows)["input_ids"], batch["input_ids"])
    out = workload.forward(workload.model, batch)
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6), "policy = reference: log 2"
    # .metrics are the micro-batch's sums; the window's reduction (Workload.window_metrics) makes them rates
    assert workload.window_metrics(out.metrics, 1)["rewards/accuracy"] == 0.5


def test_kto_reads_pairs_as_labelled_completions_and_unpaired_rows_need_kto(tmp_path):
    workload = build_workload(_cfg(tmp_path, _pairs(3), "preference.loss=kto"))
    assert [r["desirable"] for r in workload.train_dataset] == [1, 0, 1, 0, 1, 0]
    kto = [
        {"prompt": "p", "completion": "c", "label": True},
        {"prompt": "q", "completion": "d", "label": False},
    ]
    with pytest.raises(XtrainError, match="unpaired .* preference.loss=dpo needs pairs"):
        build_workload(_cfg(tmp_path, kto))
    with pytest.raises(
        XtrainError, match="preference.precompute_reference: preference.loss=orpo uses no reference"
    ):
        _cfg(tmp_path, kto, "preference.loss=orpo", "preference.precompute_reference=true")
    with pytest.raises(
        XtrainError, match="preference.sft_weight: orpo's loss holds the chosen answers' NLL"
    ) as e:
        _cfg(tmp_path, kto, "preference.loss=orpo", "preference.sft_weight=1")
    assert "preference.orpo_lambda" in e.value.hint
    with pytest.raises(XtrainError) as e:
        _cfg(tmp_path, kto, "preference.rpo_alpha=1")
    assert "rpo_alpha (TRL) is preference.sft_weight" in (e.value.hint or "")


def test_precomputed_and_live_reference_give_the_same_loss(tmp_path):
    """The stored reference (built once, named by the data's fingerprint, read again by a second
    build) against the adapters switched off, with the policy moved away from the reference."""
    pairs = _pairs(8)
    live = build_workload(_cfg(tmp_path, pairs, "batch.per_device=4"))
    stored = build_workload(
        _cfg(tmp_path, pairs, "batch.per_device=4", "preference.precompute_reference=true")
    )
    files = list((tmp_path / "out" / "preference-reference").glob("*.pt"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    again = build_workload(
        _cfg(tmp_path, pairs, "batch.per_device=2", "preference.precompute_reference=true")
    )
    assert files[0].stat().st_mtime_ns == stamp, "read back, not computed again"
    assert again.train_dataset[0]["ref_first"] == stored.train_dataset[0]["ref_first"]
    torch.manual_seed(0)
    for workload in (live, stored):
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    batch = live.collator([live.train_dataset[i] for i in range(4)])
    with_ref = stored.collator([stored.train_dataset[i] for i in range(4)])
    a, b = live.forward(live.model, batch), stored.forward(stored.model, with_ref)
    assert a.loss.item() != pytest.approx(math.log(2), abs=1e-3), "the policy moved"
    assert b.loss.item() == pytest.approx(a.loss.item(), rel=1e-5)
    assert torch.allclose(a.stats["reward_chosen"], b.stats["reward_chosen"], atol=1e-5)


def _moved(model: torch.nn.Module) -> None:
    """LoRA's B matrices away from 0: the policy no longer its reference."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(len(name))) * 0.05)


@pytest.mark.parametrize("precompute", [False, True])
def test_kto_s_kl_estimate_spans_the_whole_step(tmp_path, precompute):
    """The loop's ``step_start`` with two micro-batches of 2 rows: each micro-batch's losses are
    those of one forward over all 4 rows (the plain reference: the micro-batch estimate over the
    union), and the forward with gradients runs the completions alone."""
    extra = ["preference.loss=kto", "batch.per_device=2", f"preference.precompute_reference={precompute}"]
    workload = build_workload(_cfg(tmp_path, _pairs(2), *extra))
    _moved(workload.model)
    rows = [workload.train_dataset[i] for i in range(4)]
    whole = workload.collator(rows)
    micro = [workload.collator(rows[:2]), workload.collator(rows[2:])]
    want = workload.forward(workload.model, whole).stats  # no step estimate: the batch's own
    assert workload.step_start is not None
    workload.step_start(workload.model, micro, lambda t: t)  # one process: gather is the identity
    assert workload.forward.step_kl.item() == pytest.approx(want["kl"][0].item(), rel=1e-5)
    assert want["kl"][0].item() > 0, "a real estimate, not the clamp"
    seen = []
    count = lambda m, a, kw: seen.append(kw["input_ids"].shape[0])  # noqa: E731
    workload.model.register_forward_pre_hook(count, with_kwargs=True)
    for i, batch in enumerate(micro):
        got = workload.forward(workload.model, batch).stats
        for key in ("loss_sum", "reward_chosen", "reward_rejected", "kl"):
            torch.testing.assert_close(got[key], want[key][2 * i : 2 * i + 2], rtol=1e-5, atol=1e-6)
    assert seen[-2:] == [2, 2] if precompute else seen[-4:] == [2, 2, 2, 2]  # B sequences, not 2B
    workload.model.eval()  # an evaluation estimates from its own micro-batch
    assert workload.forward(workload.model, micro[0]).stats["kl"][0] != pytest.approx(want["kl"][0].item())


@pytest.mark.parametrize("loss, extra", [("dpo", ()), ("kto", ()), ("simpo", ("lora.enabled=false",))])
def test_the_chunked_log_probs_equal_the_full_logits_ones(tmp_path, loss, extra):
    """The head on the trained tokens only, 5 positions a chunk recomputed in the backward, against
    every position's logits: the same loss and the same gradients (LoRA's; a full fine-tune's,
    the head's included), to float32 tolerance; DPO and KTO with the SFT term on the chosen answers
    (``preference.sft_weight``: the same per-sequence log-probs)."""
    from xtrain.model.chunked_loss import LogitMap

    sft = [] if extra else ["preference.sft_weight=0.5"]
    workload = build_workload(_cfg(tmp_path, _pairs(4), f"preference.loss={loss}", *extra, *sft))
    if not extra:
        _moved(workload.model)
    batch = workload.collator([workload.train_dataset[i] for i in range(4)])
    params = [(n, p) for n, p in workload.model.named_parameters() if p.requires_grad]
    results = []
    for chunked in (False, True):
        workload.forward.chunked = (LogitMap(), 5) if chunked else None
        workload.model.zero_grad(set_to_none=True)
        out = workload.forward(workload.model, batch)
        out.loss.backward()
        results.append((out.loss.detach(), {n: p.grad.clone() for n, p in params if p.grad is not None}))
    (full, full_grads), (chunks, chunk_grads) = results
    assert chunks.item() == pytest.approx(full.item(), rel=1e-5)
    assert full_grads.keys() == chunk_grads.keys() and len(full_grads) > 0
    head = "lm_head.weight"
    assert (head in full_grads) == bool(extra), "a full fine-tune trains the head"
    for name, g in full_grads.items():
        torch.testing.assert_close(chunk_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_the_plan_s_loss_line_says_which_log_probs_run(tmp_path, machines_dir, capsys):
    from xtrain.cli import main

    config = tmp_path / "job.yaml"
    train = _jsonl(tmp_path / "train.jsonl", _pairs(4))
    model = "model:\n  name_or_path: builtin:tiny-llama\n  task: preference\n"
    config.write_text(f"{model}data:\n  train: {train}\n")
    facts = str(machines_dir / "linux-1xh100.json")
    lines = {}
    for asked in ("auto", "off"):
        assert main(["train", str(config), f"model.chunked_loss={asked}", "--dry-run", "--facts", facts]) == 0
        lines[asked] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Loss:")]
    head = "Loss: per-sequence log-probs of the trained tokens,"
    assert lines["auto"] == [f"{head} chunked (model.chunked_loss=auto: the task's loss reads log-probs "
                             "over the vocabulary)"]  # fmt: skip
    assert lines["off"] == [f"{head} all logits (model.chunked_loss=off)"]


def test_a_full_fine_tune_keeps_a_frozen_reference(tmp_path):
    workload = build_workload(_cfg(tmp_path, _pairs(4), "lora.enabled=false", "batch.per_device=2"))
    reference = workload.forward.reference
    assert reference is not None and not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in workload.model.parameters())


# -- training: each loss learns the built-in preference ----------------------------------------------
def _train(tmp_path: Path, *extra: str):
    from support.workloads import this_machine

    from xtrain.train.loop import train

    cfg = _cfg(
        tmp_path, _pairs(48), "batch.per_device=8", "batch.global_batch=8", "optim.lr=1e-2",
        "optim.warmup_steps=0", "run.max_steps=8", "run.eval_at_start=true", "run.log_every=4",
        *extra, eval_=_pairs(32, seed=9),
    )  # fmt: skip
    return train(cfg, this_machine())


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["dpo", "ipo", "orpo", "simpo", "kto"])
def test_each_loss_raises_the_reward_accuracy(tmp_path, loss):
    extra = {"ipo": ["preference.beta=0.5"], "simpo": ["preference.beta=2.0"]}.get(loss, [])
    result = _train(tmp_path, f"preference.loss={loss}", *extra)
    before, after = result.eval_history[0], result.eval_metrics
    if loss in ("dpo", "ipo", "kto"):  # the policy is its own reference at step 0
        assert before["rewards/accuracy"] == 0.5
    if loss == "dpo":
        assert before["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)
        # each evaluation answers the first eval prompts: the chosen answer next to the policy's
        assert len(result.predictions) == 3 and all(p["reference"] for p in result.predictions)
    assert after["rewards/accuracy"] >= 0.9 and after["rewards/accuracy"] > before["rewards/accuracy"]
    assert after["rewards/margin"] > before["rewards/margin"]


def test_the_logging_window_averages_a_task_s_metrics_per_micro_batch():
    from xtrain.train.window import LogWindow

    class OneRank:
        def gather(self, t):
            return t

    window = LogWindow(torch.device("cpu"))
    for accuracy in (0.5, 1.0, 0.75, 0.25):
        # each micro-batch's share of its step's loss (train/step_loss.py): the step's loss is 0.7
        window.add(torch.tensor(0.35), None, {"rewards/accuracy": torch.tensor(accuracy)})
        if accuracy in (1.0, 0.25):
            window.end_step()
    stats = window.close(OneRank(), micro_batches_per_step=2, global_batch=4)
    assert stats.metrics(1e-3)["rewards/accuracy"] == 0.625 and stats.loss == pytest.approx(0.7)
    window.reset()
    assert float(window.task["rewards/accuracy"]) == 0.0


@pytest.mark.slow
def test_4bit_dpo_trains_and_the_adapter_loads_in_plain_peft(tmp_path):
    pytest.importorskip("bitsandbytes")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result = _train(tmp_path, "model.quantization=4bit")
    assert (
        result.eval_metrics["rewards/accuracy"] >= 0.9 and result.eval_history[0]["rewards/accuracy"] == 0.5
    )
    adapter = Path(result.outputs["adapter"])
    base = AutoModelForCausalLM.from_pretrained(str(builtin.ensure_builtin_model("builtin:tiny-llama")))
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = torch.tensor([[1, 5, 9]])
    assert model(input_ids=ids).logits.shape[:2] == (1, 3)
    record = json.loads((adapter / "xtrain_run.json").read_text())
    assert record["task"] == "preference"


def test_notes_warn_at_chance_and_when_both_rewards_fall():
    from xtrain.tasks.preference.preference import notes

    base = {"rewards/chosen": 0.1, "rewards/rejected": -0.1, "rewards/margin": 0.2}
    assert notes([{"step": 0, "rewards/accuracy": 0.5, **base}]) == []
    (line,) = notes([{"step": 0, **base}, {"step": 50, "rewards/accuracy": 0.51, **base}])
    assert "reward accuracy 0.51 at step 50 is chance" in line
    fell = {"rewards/chosen": -0.3, "rewards/rejected": -0.4, "rewards/margin": 0.1}
    (line,) = notes(
        [{"step": 10, "rewards/accuracy": 0.8, **base}, {"step": 20, "rewards/accuracy": 0.8, **fell}]
    )
    assert "both rewards fell from step 10 to 20" in line


def test_notes_warn_when_the_accuracy_rises_while_the_chosen_answers_are_lost():
    """The run of docs/preference.md#a-broken-run: reward accuracy up, and between the same two
    evaluations the greedy answers equal to the chosen one fewer, or the chosen log-probs down by
    more than a nat; not when those hold, nor when the accuracy fell or sits at chance."""
    from xtrain.tasks.preference.preference import notes, unlearning

    base = {"rewards/chosen": 0.0, "rewards/rejected": -0.1, "rewards/margin": 0.1}
    before = {"step": 0, "rewards/accuracy": 0.5, "greedy/match": 0.9, "logps/chosen": -5.0, **base}
    lost = {"step": 30, "rewards/accuracy": 1.0, "greedy/match": 0.4, "logps/chosen": -5.5, **base}
    (line,) = notes([before, lost])
    assert line.startswith(
        "preference: reward accuracy 0.50 -> 1.00 from step 0 to 30, but the share of greedy"
    )
    assert "fell from 0.90 to 0.40" in line and "preference.sft_weight" in line
    fell = {**lost, "greedy/match": 0.9, "logps/chosen": -9.0}
    (line,) = notes([before, fell])
    assert "the chosen answers' log-prob fell from -5.0 to -9.0" in line
    both = unlearning(before, {**lost, "logps/chosen": -9.0})[0]
    assert "0.90 to 0.40 and the chosen answers' log-prob" in both
    kept = {**lost, "greedy/match": 0.9, "logps/chosen": -5.9}  # within a nat: not "fell"
    assert notes([before, kept]) == []
    assert (
        unlearning({**lost, "rewards/accuracy": 1.0}, {**lost, "step": 40, "greedy/match": 0.3}) != []
    )  # held
    assert unlearning({**before, "rewards/accuracy": 0.9}, {**lost, "rewards/accuracy": 0.8}) == []  # fell
    assert unlearning(before, {**lost, "rewards/accuracy": 0.52}) == []  # chance: the other warning's
    assert unlearning({"step": 0, "rewards/accuracy": 0.5}, lost) == []  # nothing to compare


# -- the guarantees of SFT: 1 vs 2 processes, kill + resume ------------------------------------------
JOB = """\
model:
  name_or_path: {model}
  task: preference
data:
  train: {root}/train.jsonl
  eval: {root}/eval.jsonl
  max_length: 48
optim:
  lr: 1.0e-2
batch:
  per_device: 4
  global_batch: 8
run:
  max_steps: 4
  eval_every: 2
  log_every: 1
  save_every: 2
  save_merged: true
  seed: 7
"""


@pytest.fixture(scope="module")
def pref_job(tmp_path_factory):
    from support.jobs import session_builtin, task_job

    root = tmp_path_factory.mktemp("preference-job")
    # 24 training pairs, 6 eval pairs: the last eval batch is partial on 2 ranks
    model = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    return task_job(root, JOB, model, _pairs(30), n_train=24)


@pytest.fixture(scope="module")
def pref_straight(pref_job):
    from support.jobs import train_once

    return train_once(pref_job)[0]


@pytest.mark.soak  # the default run's 2-process case is KTO's below (the reference precomputed too)
def test_one_and_two_processes_train_the_same_dpo(pref_job, pref_straight):
    """`accelerate launch --multi_gpu -m xtrain.run` (2 gloo processes on CPU) against one process
    with the same global batch: the same eval metrics and adapter. The two processes precompute the
    reference, each its half of the rows (gathered), against the one process's live reference (the
    adapters off at every step). (torchrun and the other launchers: test_launch_modes.)"""
    from support.jobs import assert_same_training, run_xtrain, two_process_command

    out = pref_job.root / "two"
    command, env = two_process_command("accelerate", pref_job.root, pref_job.env)
    extra = "preference.precompute_reference=true"
    proc = run_xtrain([*command, "--config", str(pref_job.config), f"run.output_dir={out}", extra], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((pref_straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert (two["world_size"], two["accumulation"], one["accumulation"]) == (2, 1, 2)
    assert two["run_info"]["backend"] == "gloo"
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert b["rewards/accuracy"] == a["rewards/accuracy"]
        assert b["rewards/margin"] == pytest.approx(a["rewards/margin"], rel=1e-4, abs=1e-6)
    assert_same_training(pref_straight, out)
    (stored,) = (out / "preference-reference").glob("*.pt")
    values = torch.load(stored, weights_only=True)
    assert [len(values[s]) for s in ("eval", "train")] == [6, 24]  # 3 + 3 eval rows, 12 + 12 train


@pytest.mark.slow
def test_one_and_two_processes_train_the_same_kto(pref_job):
    """KTO's KL estimate spans the step's global batch (one gather a step): 2 processes with
    accumulation 1 train as 1 process with accumulation 2. The two processes precompute the
    reference, each its half of the rows (gathered), against the one process's live reference."""
    from support.jobs import assert_same_training, python_run, run_xtrain

    outs = []
    two = (("--processes", "2"), ("preference.precompute_reference=true",))
    for name, (extra, more) in (("kto-one", ((), ())), ("kto-two", two)):
        out = pref_job.root / name
        args = [*extra, "--config", str(pref_job.config), f"run.output_dir={out}", *more]
        proc = run_xtrain(python_run(*args, "preference.loss=kto", "run.save_merged=false"), pref_job.env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(out)
    one, two = (json.loads((o / "train_result.json").read_text()) for o in outs)
    assert (one["accumulation"], two["world_size"], two["accumulation"]) == (2, 2, 1)
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert b["rewards/accuracy"] == a["rewards/accuracy"]
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-4, abs=1e-6)
    assert_same_training(*outs)
    (stored,) = (outs[1] / "preference-reference").glob("*.pt")
    values = torch.load(stored, weights_only=True)
    assert [len(values[s]) for s in ("eval", "train")] == [12, 48]  # each row once, gathered from both


@pytest.mark.slow
def test_lora_dpo_under_fsdp2_trains_like_one_process(pref_job, pref_straight):
    """Two FSDP2 ranks (accelerate's FSDP2 path on CPU, support/fsdp.py): the reference is the
    sharded policy with its adapters off, every forward all-gathers; the same losses, eval
    metrics and adapter as one process. (A merged save is refused under FSDP: sharded.py.)"""
    from support.fsdp import fsdp_run
    from support.jobs import assert_same_training

    out = pref_job.root / "fsdp"
    fsdp_run(pref_job, out, "run.save_merged=false")
    one = json.loads((pref_straight / "train_result.json").read_text())
    two = json.loads((out / "train_result.json").read_text())
    assert two["run_info"]["distributed_type"] == "DistributedType.FSDP"
    for a, b in zip(one["eval_history"], two["eval_history"], strict=True):
        assert b["rewards/accuracy"] == a["rewards/accuracy"]
    assert_same_training(pref_straight, out)


@pytest.mark.slow
def test_the_merged_save_loads_in_plain_transformers_as_base_plus_adapter(pref_job, pref_straight):
    """`run.save_merged: true` (the job's): `merged/` is a plain causal LM whose logits are the
    base model's with the trained adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = AutoModelForCausalLM.from_pretrained(str(pref_straight / "merged")).eval()
    assert type(merged.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # no peft left
    base_path = pref_job.config.read_text().split("name_or_path: ")[1].split()[0]
    base = AutoModelForCausalLM.from_pretrained(base_path)
    adapted = PeftModel.from_pretrained(base, str(pref_straight / "adapter")).eval()
    tok = AutoTokenizer.from_pretrained(str(pref_straight / "merged"))
    ids = tok(["question: where did tom play? answer: with the dog"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want, got = adapted(input_ids=ids).logits, merged(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base_path)(input_ids=ids).logits
    assert (want - plain).abs().max() > 1e-3, "the adapter moved the logits"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_kill_and_resume_is_exact(pref_job, pref_straight):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    out = pref_job.root / "killed"
    args = ["--config", str(pref_job.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), pref_job.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), pref_job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(pref_straight, out, exact=True)


@pytest.mark.slow
def test_predict_continues_a_prompt_with_the_trained_run(pref_job, pref_straight):
    from xtrain.cli import main

    out = pref_job.root / "predicted.jsonl"
    prompt = "question: where did tom play with the cat? answer: "
    args = ["predict", str(pref_straight), "--prompt", prompt, "--max-new-tokens", "6", "-o", str(out)]
    assert main(args) == 0
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["input"] == prompt and row["output"]


# -- the SFT term keeps the answers that plain DPO at a high lr loses (the built-in job) -------------
JOB_FILE = Path(builtin.__file__).parent / "jobs" / "quickstart-preference.yaml"


def own_answer_pairs(n: int, seed: int) -> list[dict]:
    """Pairs on the built-in prompts whose chosen answer is what the built-in job's model
    (builtin:tiny-llama-sft) already says greedily, where that is a friendly answer naming the
    prompt's own person, animal or place, and whose rejected answer is the row's curt one: the
    greedy match starts at 1 (the built-in pairs' chosen answers name a place or thing the prompt
    does not, so no model matches them but by chance). Generated as the evaluation generates: 16
    left-padded prompts a call."""
    from xtrain.predict import load_predictor
    from xtrain.train.builtin_stages import ensure
    from xtrain.train.loop import train_run

    _, loaded = load_predictor(ensure("builtin:tiny-llama-sft", train_run))  # the chain's model
    tok, model = loaded.tokenizer, loaded.model
    rows, out = builtin.preference_examples(n, seed), []
    for start in range(0, n, 16):
        batch = rows[start : start + 16]
        ids = [tok(r["prompt"])["input_ids"] for r in batch]
        width = max(map(len, ids))
        x = torch.tensor([[tok.pad_token_id] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        with torch.no_grad():
            said = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=24, do_sample=False,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
        for row, answer in zip(
            batch, tok.batch_decode(said[:, width:], skip_special_tokens=True), strict=True
        ):
            if _answers(row["prompt"], answer.strip()):
                out.append({**row, "chosen": answer.strip()})
    return out


def _answers(prompt: str, answer: str) -> bool:
    """A friendly answer about the prompt's own person and animal (or place)."""
    import re

    if played := re.match(r"question: where did (\w+) play with the (\w+)\?", prompt):
        return answer.startswith(f"{played[1]} played with the {played[2]} in the ") and answer.endswith(
            "happy."
        )
    found = re.match(r"question: what did (\w+) find in the (\w+)\?", prompt)
    return (
        bool(found)
        and answer.startswith(f"{found[1]} found a ")
        and answer.endswith(f"in the {found[2]}, and it was a lovely day.")
    )


@pytest.fixture(scope="module")
def own_answers(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("own-answers")
    return own_answer_files(root, (64, 11), (32, 12))


def own_answer_files(root: Path, train: tuple[int, int], eval_: tuple[int, int]) -> tuple[Path, Path]:
    """``own_answer_pairs`` of (rows, seed) written as the train and eval files."""
    return _jsonl(root / "train.jsonl", own_answer_pairs(*train)), _jsonl(
        root / "eval.jsonl", own_answer_pairs(*eval_)
    )


def _high_lr_job(root: Path, data: tuple[Path, Path], *extra: str):
    """The built-in preference job at a high lr (3e-2, no warm-up), 6 steps of 8 pairs, evaluated
    before and after (``extra``: more overrides)."""
    from support.workloads import this_machine

    from xtrain.train.loop import train
    from xtrain.train.report import ListReporter

    overrides = [
        f"data.train={data[0]}", f"data.eval={data[1]}", f"run.output_dir={root}", "run.report_to=none",
        "optim.lr=3e-2", "optim.warmup_steps=0", "run.max_steps=6", "run.eval_every=null",
        "batch.global_batch=8", *extra,
    ]  # fmt: skip
    reporter = ListReporter()
    result = train(load_config(JOB_FILE, overrides), this_machine(), reporter)
    return result, [e[1] for e in reporter.events if e[0] == "note"]


@pytest.mark.soak  # training builtin:tiny-llama-sft (its SFT stage) alone: minutes on a loaded machine
def test_the_sft_term_keeps_the_greedy_answers_that_plain_dpo_loses(tmp_path, own_answers):
    """Plain DPO at a high lr learns the preference (reward accuracy 0.5 -> 1.0) by unlearning the
    chosen answers (fewer greedy answers equal to them; the chosen log-probs fall) and the run
    warns; with ``preference.sft_weight=1`` the same run keeps most of them. The figures of a longer run:
    docs/preference.md#keeping-the-chosen-answers-the-sft-term (the soak case below)."""
    plain, plain_notes = _high_lr_job(tmp_path / "plain", own_answers)
    sft, _ = _high_lr_job(tmp_path / "sft", own_answers, "preference.sft_weight=1.0")
    for result in (plain, sft):
        before = result.eval_history[0]
        assert before["greedy/match"] == 1.0 and before["rewards/accuracy"] == 0.5
        assert result.eval_metrics["rewards/accuracy"] == 1.0
    # measured (11 eval prompts): plain 1.0 -> 0.18, sft_weight 1: 1.0 -> 0.64 (3: 1.0)
    assert plain.eval_metrics["greedy/match"] <= 0.4, plain.eval_metrics
    assert sft.eval_metrics["greedy/match"] >= 0.5, sft.eval_metrics
    assert sft.eval_metrics["logps/chosen"] > plain.eval_metrics["logps/chosen"] + 3
    assert any("by unlearning the answers it should keep" in n for n in plain_notes), plain_notes


@pytest.mark.soak
def test_the_sft_term_keeps_the_greedy_answers_over_a_longer_run(tmp_path_factory):
    """The figures of docs/preference.md#keeping-the-chosen-answers-the-sft-term: 200 + 60
    prompts' own answers, lr 1e-2, 20 steps of 8 pairs, evaluated every 10."""
    root = tmp_path_factory.mktemp("own-answers-long")
    data = own_answer_files(root, (200, 11), (60, 12))
    longer = ("optim.lr=1e-2", "run.max_steps=20", "run.eval_every=10")
    plain, plain_notes = _high_lr_job(root / "plain", data, *longer)
    sft, _ = _high_lr_job(root / "sft", data, *longer, "preference.sft_weight=1.0")
    for name, result in (("plain", plain), ("sft", sft)):
        for h in result.eval_history:
            keys = ("rewards/accuracy", "greedy/match", "logps/chosen", "logps/rejected", "nll/chosen")
            print(name, int(h["step"]), {k: round(h[k], 3) for k in keys})
    assert plain.eval_metrics["greedy/match"] <= 0.1 and sft.eval_metrics["greedy/match"] >= 0.6
    assert any("by unlearning the answers it should keep" in n for n in plain_notes)


def test_the_quickstart_summary_labels_the_sample_pairs_under_the_greedy_match():
    """The pairs under "reward accuracy 0.5 -> 1.0" read as chosen | the model's answer after
    training (not before -> after), under the share of greedy answers equal to the chosen one."""
    from rich.console import Console

    from xtrain.commands.quickstart import _print_result
    from xtrain.tasks.preference.preference import TASK

    result = {
        "eval_history": [{"step": 0, "eval_loss": 0.69, "rewards/accuracy": 0.5, "greedy/match": 0.25}],
        "eval_metrics": {"eval_loss": 0.3, "rewards/accuracy": 1.0, "greedy/match": 0.75},
        "predictions": [{"reference": "a cake.", "prediction": "a boat."}],
    }
    console = Console(record=True, width=300)
    assert TASK.quickstart is not None
    _print_result(console, load_config(JOB_FILE, []), TASK.quickstart, result, 1.0)
    lines = [ln.rstrip() for ln in console.export_text().splitlines()]
    at = lines.index("chosen answer | the model's greedy answer after training:")
    assert lines[at - 2].startswith("reward accuracy 0.5000 -> 1.0000")
    assert lines[at - 1].startswith("greedy answers equal to the chosen one") and lines[at - 1].endswith(
        " 0.2500 -> 0.7500"
    )
    assert lines[at + 1] == "  'a cake.' | 'a boat.'"
