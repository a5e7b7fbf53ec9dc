"""The grpo task (issue 42): its numbers against hand formulas (advantages, the three loss
normalisations, clip and KL), the rows and the reward functions (built-ins,
the user's own, and every way they fail in one line), the gradients of a real step against the
loss written by hand over a plain peft model, and a failing reward mid-run leaving the last
checkpoint intact. The multi-process guarantees are in tests/test_grpo_processes.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from xtrain.errors import XtrainError
from xtrain.tasks.grpo import grpo as grpo_task
from xtrain.tasks.grpo import loss as gl
from xtrain.tasks.grpo import rewards as rw

REWARDS = '''\
def letters(prompts, completions, **columns):
    """A reward that varies between completions of a random model: its share of e's."""
    return [c.count("e") / max(len(c), 1) + len(c) / 100 for c in completions]


def needs_answer(prompts, completions, answer, **columns):
    return [1.0 if a in c else None for c, a in zip(completions, answer)]


def raises(prompts, completions, **columns):
    raise ValueError("boom")


def short(prompts, completions, **columns):
    return [0.0]


def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)


NOT_A_FUNCTION = 3


def no_completions(prompts):
    return []
'''


# -- the numbers, by hand --------------------------------------------------------------------------
def test_advantages_are_the_group_relative_rewards_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    g1, _g2 = r[:4], r[4:]
    mean1, std1 = float(g1.mean()), math.sqrt(sum((x - float(g1.mean())) ** 2 for x in g1.tolist()) / 3)
    want_group = [(x - mean1) / (std1 + 1e-4) for x in g1.tolist()] + [0.0] * 4
    torch.testing.assert_close(gl.advantages(r, 4, "group"), torch.tensor(want_group))
    all_mean = float(r.mean())
    batch_std = math.sqrt(sum((x - all_mean) ** 2 for x in r.tolist()) / 7)
    want_batch = [(x - mean1) / (batch_std + 1e-4) for x in g1.tolist()] + [0.0] * 4
    torch.testing.assert_close(gl.advantages(r, 4, "batch"), torch.tensor(want_batch))
    torch.testing.assert_close(
        gl.advantages(r, 4, "none"), torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    )
    assert gl.group_std(r, 4)[1] == 0  # the second group gives no signal
    # None rewards (NaN) count 0 in the weighted sum
    per_fn = torch.tensor([[1.0, float("nan")], [0.5, 2.0]])
    torch.testing.assert_close(gl.total_rewards(per_fn, torch.tensor([1.0, 0.5])), torch.tensor([1.0, 1.5]))


def _hand_loss(kind: str, token_loss: list[list[float]], mask: list[list[int]], max_len: int) -> float:
    if kind == "grpo":
        per_seq = [
            sum(t * m for t, m in zip(ts, ms, strict=False)) / max(sum(ms), 1)
            for ts, ms in zip(token_loss, mask, strict=False)
        ]
        return sum(per_seq) / len(per_seq)
    total = sum(t * m for ts, ms in zip(token_loss, mask, strict=False) for t, m in zip(ts, ms, strict=False))
    if kind == "dr_grpo":
        return total / (len(token_loss) * max_len)
    return total / sum(sum(ms) for ms in mask)  # dapo: over every completion token of the batch


@pytest.mark.parametrize("kind", grpo_task.LOSSES)
def test_the_three_normalisations_by_hand_and_split_into_micro_batches(kind):
    """TRL's definitions over a batch, and the same number from any split into equal micro-batches
    averaged as the loop averages them (accumulation and processes)."""
    g = torch.Generator().manual_seed(0)
    token_loss = torch.randn(6, 5, generator=g)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1] * 5, [1, 1, 1, 1, 0]]
    )
    s = gl.LossSettings(loss=kind, max_completion_length=8)
    want = _hand_loss(kind, token_loss.tolist(), mask.tolist(), 8)
    total = float(mask.sum())
    assert float(gl.normalised(s, token_loss, mask, total)) == pytest.approx(want, rel=1e-6)
    for parts in (2, 3):
        chunks = zip(token_loss.chunk(parts), mask.chunk(parts), strict=True)
        mean = sum(float(gl.micro_batch_loss(s, t, m, total, parts)) for t, m in chunks) / parts
        assert mean == pytest.approx(want, rel=1e-6)


def test_the_clipped_surrogate_and_kl_by_hand():
    s = gl.LossSettings(loss="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.1)
    logps = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.45]]))  # ratios 2, 1, 1.11
    ref = torch.log(torch.tensor([[0.4, 0.5, 0.6]]))
    for adv, want_clipped in ((1.0, [True, False, False]), (-1.0, [False, False, False])):
        loss, clipped, kl = gl.per_token_loss(s, logps, old, ref, torch.tensor([adv]))
        ratios = [2.0, 1.0, 0.5 / 0.45]
        surrogate = [-min(r * adv, min(max(r, 0.8), 1.28) * adv) for r in ratios]
        kls = [math.exp(d) - d - 1 for d in (math.log(0.4 / 0.5), 0.0, math.log(0.6 / 0.5))]
        want = [a + 0.1 * k for a, k in zip(surrogate, kls, strict=False)]
        torch.testing.assert_close(loss[0], torch.tensor(want), rtol=1e-5, atol=1e-6)
        assert clipped[0].tolist() == want_clipped
        torch.testing.assert_close(kl[0], torch.tensor(kls), rtol=1e-5, atol=1e-6)
    # one update per generation: old = current (detached), ratio 1, the gradient is A's
    loss, _, kl = gl.per_token_loss(gl.LossSettings(), logps, None, None, torch.tensor([2.0]))
    assert kl is None and loss.tolist() == [[-2.0, -2.0, -2.0]]


# -- rows -------------------------------------------------------------------------------------------
def test_every_prompt_shape_reads_with_its_columns_for_the_rewards():
    from xtrain.tasks.grpo.rows import BadPromptRow, read_row

    assert read_row({"prompt": "2+2=", "answer": "4"}, 0, "f").columns == {"answer": "4"}
    turns = [{"role": "user", "content": "hi"}]
    row = read_row({"prompt": turns, "tests": ["x"]}, 0, "f")
    assert row.conversational and row.prompt == turns and row.columns == {"tests": ["x"]}
    alpaca = read_row({"instruction": "add", "input": "2 2", "system": "be brief", "answer": "4"}, 0, "f")
    assert alpaca.prompt == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add\n\n2 2"},
    ]
    # the evaluation's samples show what a person asked, not the template's text around it
    assert alpaca.shown == "add\n\n2 2" and read_row({"prompt": "2+2="}, 0, "f").shown == "2+2="
    with pytest.raises(BadPromptRow, match="row 3 of f has no prompt"):
        read_row({"question": "?"}, 3, "f")


def test_predict_data_reads_the_prompts_as_training_read_them(tmp_path, reward_file):
    """``xtrain predict --data`` on a GRPO result: text prompts as they are, a chat run's turns as a
    conversation (its tools' schemas with it), turns without a template joined as training joins
    them; the run's answer column is the reference."""
    from support.gradients import jsonl

    from xtrain.predict import file_config
    from xtrain.tasks import get
    from xtrain.tasks.grpo.predict_file import read_prompt_file, record_of

    turns = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "7 squared?"}]
    rows = [{"prompt": "2+2=", "label": "4"}, {"prompt": turns, "label": 49}, {"prompt": "no answer"}]
    file = jsonl(tmp_path / "eval.jsonl", rows)
    cfg = file_config(get("grpo"), {}, file)
    run = _cfg(
        tmp_path,
        reward_file,
        "grpo.answer_column=label",
        "grpo.tools=[xtrain.builtin.agent_grpo:square]",
    )
    record = {**record_of(run), "chat": True}
    text, chat, bare = read_prompt_file(cfg, record)
    assert (text.feed, text.reference, text.shown) == ("2+2=", "4", {"input": "2+2="})
    assert chat.feed.messages == turns and chat.reference == "49" and chat.shown == {"input": "7 squared?"}
    assert [t["function"]["name"] for t in chat.feed.tools] == ["square"]
    assert bare.reference is None
    plain = read_prompt_file(cfg, {**record, "chat": False, "grpo": {"answer_column": "label"}})
    assert plain[1].feed == "be brief\n\n7 squared?"  # no template: the turns' words, as training


# -- reward functions ---------------------------------------------------------------------------------
def test_the_built_in_rewards():
    prompts = ["p"] * 3
    em = rw.exact_match("answer", r"answer: (\w+)")
    assert em(prompts, ["answer: 4", "answer: 5", "4"], answer=["4", "4", "4"]) == [1.0, 0.0, 0.0]
    assert rw.exact_match("answer", None)(prompts, [" 4 ", "x", "4"], answer=[4, 4, 4]) == [1.0, 0.0, 1.0]
    fmt = rw.format_match(r"<a>\d+</a>")
    assert fmt(prompts, ["<a>1</a>", "<a>x</a>", [{"role": "assistant", "content": "<a>2</a>"}]]) == [
        1.0,
        0,
        1.0,
    ]
    assert rw.length_penalty(4)(prompts, ["abc", "abcdef", "a" * 20]) == [0.0, -0.5, -1.0]


def _reward(name: str, step_row: tuple[int, list[int]] = (3, [0, 0, 1])):
    return rw.Reward(name, getattr(_module(), name.split(":")[-1]), 1.0)


def _module():
    import types

    m = types.ModuleType("grpo_test_rewards")
    exec(REWARDS, m.__dict__)
    return m


def test_a_user_function_gets_trl_s_arguments_and_none_is_no_reward():
    r = _reward("needs_answer")
    got = rw.call(r, ["p", "q"], ["it is 4", "no"], {"answer": ["4", "5"], "other": [1, 2]}, 0, [0, 1])
    assert got[0] == 1.0 and math.isnan(got[1])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "raises",
            "reward function raises at step 3 raised ValueError: boom (on the completions of rows [0, 1])",
        ),
        ("short", "reward function short at step 3 returned 1 rewards for 3 completions (rows [0, 1])"),
        ("nan", "reward function nan at step 3 returned nan for row 0 (completion 0 of the batch)"),
    ],
)
def test_a_failing_reward_is_one_line_naming_function_step_and_row(name, message):
    with pytest.raises(rw.RewardError) as e:
        rw.call(_reward(name), ["p"] * 3, ["a", "b", "c"], {}, 3, [0, 0, 1])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.py:f", "grpo.rewards: reward file missing.py not found"),
        ("{file}:nothing", "has no function 'nothing'"),
        ("{file}:NOT_A_FUNCTION", "is a int, not a function"),
        ("{file}:no_completions", "cannot take prompts= and completions= as keywords"),
        ("no_such_module_x:f", "grpo.rewards: module no_such_module_x cannot be imported"),
        ("exactmatch", "unknown reward function 'exactmatch'"),
    ],
)
def test_a_bad_reward_function_is_refused_when_the_config_is_read(reward_file, spec, message):
    from xtrain.tasks.validation import load_config

    with pytest.raises(XtrainError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, ["model.task=grpo", f"grpo.rewards=[{spec.format(file=reward_file)}]"])


def test_batch_sizes_count_whole_groups_and_weights_match_the_functions():
    from xtrain.tasks.validation import load_config

    with pytest.raises(XtrainError, match="batch.per_device=6 is not a multiple of grpo.num_generations=4"):
        load_config(None, ["model.task=grpo", "grpo.rewards=[length]", "grpo.num_generations=4",
                           "batch.per_device=6"])  # fmt: skip
    with pytest.raises(XtrainError, match="grpo.reward_weights has 2 numbers for 1 reward functions"):
        load_config(None, ["model.task=grpo", "grpo.rewards=[length]", "grpo.reward_weights=[1, 2]",
                           "batch.per_device=8"])  # fmt: skip


# -- a real step ----------------------------------------------------------------------------------------
pytestmark = pytest.mark.usefixtures("private_caches")


def _prompts(n: int, seed: int = 3) -> list[dict]:
    from xtrain.builtin.preference import preference_examples

    return [{"prompt": r["prompt"], "answer": r["chosen"].split()[0]} for r in preference_examples(n, seed)]


def _cfg(tmp_path: Path, reward_file: Path, *extra: str):
    from support.gradients import jsonl

    from xtrain.tasks.validation import load_config

    train = jsonl(tmp_path / "data" / "train.jsonl", _prompts(8))
    return load_config(
        None,
        [f"run.output_dir={tmp_path / 'out'}", "run.report_to=none", "run.max_steps=1",
         "run.eval_at_start=false",
         "run.eval_every=null", "optim.max_grad_norm=null", "optim.warmup_steps=0",
         "model.name_or_path=builtin:tiny-llama", "model.task=grpo", f"data.train={train}", "data.eval=null",
         "data.max_length=32", "lora.dropout=0.0", "grpo.num_generations=4", "grpo.max_completion_length=6",
         f"grpo.rewards=[{reward_file}:letters]", "batch.per_device=8", "batch.global_batch=16", *extra],
    )  # fmt: skip


@pytest.mark.parametrize("quantization", [None, "4bit"])
def test_the_gradients_equal_the_grpo_loss_by_hand_over_a_plain_peft_model(
    tmp_path, reward_file, quantization
):
    """A step of dapo with the KL to the adapters-off reference and two micro-batches: xtrain's
    gradients against the loss written out over a plain peft model's logits of the run's
    completions, the rewards and advantages recomputed from the completions' text; 4-bit QLoRA
    against the plain model with the weights bitsandbytes dequantizes."""
    from support.gradients import (
        assert_same_gradients,
        dapo_gradients,
        grpo_token_loss,
        record_forward,
        reference_model,
        xtrain_gradients,
    )

    beta, temperature, batches, seen = 0.3, 0.9, [], {}
    more = [f"model.quantization={quantization}"] if quantization else []
    options = [f"grpo.beta={beta}", f"grpo.temperature={temperature}", "grpo.loss=dapo", *more]
    cfg = _cfg(tmp_path, reward_file, *options)

    def record(workload):
        seen["tokenizer"], seen["step"] = workload.tokenizer, workload.forward
        record_forward(workload, batches)

    capture = xtrain_gradients(cfg, on_workload=record)
    assert len(batches) == 2 and seen["step"].chunks is not None  # the log-probs ran chunked
    # each group's prompt went through the model once, the completions continued its cache
    assert sum("cache" in inputs for inputs, _ in capture.inputs) == 2
    tok, ref = seen["tokenizer"], reference_model(capture).train()

    def per_token(batch: dict) -> torch.Tensor:
        width = batch["completion_mask"].shape[1]
        texts = tok.batch_decode(batch["input_ids"][:, -width:], skip_special_tokens=True)
        rewards = torch.tensor([t.count("e") / max(len(t), 1) + len(t) / 100 for t in texts]).view(-1, 4)
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(-1)
        torch.testing.assert_close(batch["advantages"], adv)
        return grpo_token_loss(ref, batch, adv, temperature, beta)

    # dapo: every completion token of the global batch
    assert_same_gradients(capture.grads, dapo_gradients(ref, batches, per_token))


def test_a_reward_failing_mid_run_is_one_line_and_the_checkpoint_stays(tmp_path, reward_file):
    """A reward that raises at its third step: one line naming the function, the step and the rows;
    the step-2 checkpoint is whole and resumable."""
    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.train.loop import train

    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        "calls = []\n"
        "def flaky(prompts, completions, **kw):\n"
        "    calls.append(1)\n"
        "    if len(calls) > 4:\n"  # two micro-batches a step: fails at step 2 (0-based)
        "        raise RuntimeError('grader offline')\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    cfg = _cfg(tmp_path, reward_file, f"grpo.rewards=[{flaky}:flaky]", "run.max_steps=4", "run.save_every=2")
    with pytest.raises(rw.RewardError) as e:
        train(cfg, make_plan(Facts(torch_version="2.13.0", gloo_available=True)))
    line = str(e.value)
    assert line.startswith(f"reward function {flaky}:flaky at step 2 raised RuntimeError: grader offline")
    assert "\n" not in line
    step = tmp_path / "out" / "checkpoints" / "step-2"
    assert json.loads((step / "xtrain_state.json").read_text())["step"] == 2


def test_a_run_without_eval_data_still_gets_the_task_s_warnings_at_its_end(tmp_path):
    """The warnings a GRPO run reads off its steps (no learning signal) come after each
    evaluation; a run without eval data gets them at its end."""
    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.train.loop import train
    from xtrain.train.report import ListReporter

    flat = tmp_path / "flat.py"
    flat.write_text("def flat(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    cfg = _cfg(tmp_path, flat, f"grpo.rewards=[{flat}:flat]")
    reporter = ListReporter()
    train(cfg, make_plan(Facts(torch_version="2.13.0", gloo_available=True)), reporter)
    notes = [m for kind, m in reporter.events if kind == "note"]
    said = "every group's completions got the same reward in the last 1 step: no learning signal"
    assert any(said in n for n in notes), notes


# -- the dry run ----------------------------------------------------------------------------------------
def _job(tmp_path: Path, rewards: str) -> Path:
    from support.gradients import jsonl

    train = jsonl(tmp_path / "data" / "train.jsonl", _prompts(8))
    job = tmp_path / "job.yaml"
    job.write_text(
        f"model: {{name_or_path: builtin:tiny-llama, task: grpo}}\n"
        f"grpo: {{num_generations: 4, max_completion_length: 16, rewards: {rewards}}}\n"
        f"data: {{train: {train}, max_length: 48}}\n"
        "batch: {per_device: 8, global_batch: 16}\n"
    )
    return job


def test_the_dry_run_shows_a_prompt_the_generation_the_rewards_and_the_kv_cache(
    tmp_path, reward_file, capsys, machines_dir
):
    """The data check's lines, and on a CUDA machine the plan's: the log-probs chunked, the memory
    estimate with generation's KV cache in it (the estimate's term checked by its numbers)."""
    from xtrain.cli import main
    from xtrain.model import memory
    from xtrain.tasks.sizes import offline_sizes
    from xtrain.tasks.validation import load_config

    job = _job(tmp_path, f"[exact_match, {reward_file}:letters]")
    facts = str(machines_dir / "linux-1xh100.json")
    code = main(["train", str(job), "--dry-run", "--facts", facts])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "question: " in out  # the first prompt, rendered
    assert "generation: 4 completions a prompt, up to 16 tokens" in out
    assert f"rewards: exact_match x1, {reward_file}:letters x1" in out
    # tiny llama: 2 layers, 2 KV heads of 16: 8 x 64 tokens x 2 x 2 x 2 x 16 x 2 bytes
    assert "generation's KV cache: 8 completions x up to 64 tokens" in out and "128 KiB in 16-bit" in out
    assert "Loss: per-token log-probs of the completions, chunked (model.chunked_loss=auto" in out
    assert "generation's KV cache ~128 KiB of it" in out, out  # the plan's Memory line
    sizes = offline_sizes(load_config(job, []))
    assert (sizes.kv_tokens, sizes.kv_values) == (48 + 16, 2 * 2 * 2 * 16)
    without = replace(sizes, kv_tokens=0)
    gib = [memory.estimate_run(s, 8, 48, False, "bf16")[0] for s in (sizes, without)]
    assert gib[0] - gib[1] == pytest.approx(1.1 * 8 * 64 * 128 * 2 / 2**30)


def test_a_bad_reward_function_stops_the_dry_run_in_one_line(tmp_path, reward_file, capsys):
    from xtrain.cli import main

    code = main(["train", str(_job(tmp_path, f"[{reward_file}:nothing]")), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"grpo.rewards: {reward_file} has no function 'nothing'" in err


def test_num_iterations_reuses_one_generation_with_the_old_log_probs(tmp_path, reward_file):
    """``num_iterations: 2``: the second step trains on the first step's completions, its ratio
    to the old policy's log-probs (taken before the first update) no longer 1."""
    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.tasks import build_workload
    from xtrain.train.loop import train

    seen: list[dict] = []

    def build(run, main_process_first):
        workload = build_workload(run, main_process_first)
        forward = workload.forward

        def recorded(model, batch):
            out = forward(model, batch)
            seen.append({"ids": batch["input_ids"].clone(), "clip": float(out.metrics["clip_ratio"]),
                         "old": batch["old_logps"].clone()})  # fmt: skip
            return out

        workload.forward = recorded
        return workload

    from support.gradients import jsonl

    evals = jsonl(tmp_path / "data" / "eval.jsonl", _prompts(3, seed=9))
    cfg = _cfg(tmp_path, reward_file, "grpo.num_iterations=2", "run.max_steps=2", "optim.lr=0.5",
               "grpo.epsilon=0.01", f"data.eval={evals}")  # fmt: skip
    result = train(cfg, make_plan(Facts(torch_version="2.13.0", gloo_available=True)), build=build)
    assert len(seen) == 4  # 2 steps x 2 micro-batches
    for first, again in zip(seen[:2], seen[2:], strict=True):
        assert torch.equal(first["ids"], again["ids"]) and torch.equal(first["old"], again["old"])
    assert all(s["clip"] == 0 for s in seen[:2]) and any(s["clip"] > 0 for s in seen[2:])
    # the final evaluation (issue 46): the reward and each function's by its name, no eval loss;
    # its samples are prompts and completions
    assert set(result.eval_metrics) == {"reward", "rewards/letters", "completion_length"}
    sample = result.predictions[0]
    assert tuple(sample["labels"]) == ("prompt", "completion")
    assert sample["reference"].startswith("question: ")


def test_reward_metrics_are_named_by_function_and_files_found_next_to_the_config(tmp_path, reward_file):
    """TRL's names (``rewards/correct``), a name two files share kept apart by the file's; a
    reward file written relative to the config file is found from any current folder."""
    from xtrain.tasks.validation import load_config

    assert rw.labels(["exact_match", "/x/a.py:score", "pkg.mod:other", "b.py:score"]) == [
        "exact_match", "a.score", "other", "b.score"
    ]  # fmt: skip
    job = _job(tmp_path, f"[format, {reward_file.name}:letters]")
    job.write_text(job.read_text().replace("rewards:", "format_pattern: x, rewards:"))
    cfg = load_config(job, [])
    assert cfg.grpo.rewards == ["format", f"{reward_file.resolve()}:letters"]
    assert [r.metric for r in rw.resolve(cfg.grpo)] == ["format", "letters"]
