"""Stages that chain (docs/chains.md): a trained result as the next stage's start.

The start is read from the result's files alone (``model.start``); a new adapter trains on top of
the result's adapters (kept frozen) or the last one trains on (``lora.continue_adapter``); the
reference of preference tuning and GRPO is exactly the start, proven twice: at step 0 the policy
equals it (DPO's loss ln 2, rewards 0; GRPO's KL 0), and the stage's first gradients equal the
loss written by hand over plain peft models built from the same base and the adapter files (16-bit
and 4-bit, new and continued adapter). The start's SFT stage is xtrain's own run, built once.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from support.chains import sft_result
from support.gradients import assert_same_gradients, jsonl, xtrain_gradients
from support.workloads import build_workload, this_machine

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.model.start import ADAPTER_WEIGHTS, RUN_FILE, start_of
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Path:
    return sft_result(tmp_path_factory)


def _dpo(root: Path, start: Path | str, *extra: str):
    pairs = builtin.preference_examples(8, 5)
    job = root / "dpo.yaml"  # (a job of its own: the default job's lora keys would count as given)
    root.mkdir(parents=True, exist_ok=True)
    job.write_text("model:\n  task: preference\n", encoding="utf-8")
    return load_config(
        job,
        [f"model.name_or_path={start}", "model.task=preference",
         f"data.train={jsonl(root / 'pairs.jsonl', pairs)}", "data.eval=null", "data.max_length=48",
         "optim.max_grad_norm=null", "optim.warmup_steps=0", "batch.per_device=4",
         "batch.global_batch=4", "run.max_steps=1", f"run.output_dir={root / 'out'}", "run.report_to=none",
         *extra],
    )  # fmt: skip


def test_a_result_is_read_from_its_files_alone(sft):
    """The run folder and its adapter/ name the same start: the base by its built-in name, one
    adapter with the hash its record names (the weights' own), the tokenizer saved with it."""
    for name in (sft, sft / "adapter"):
        start = start_of(str(name))
        assert start.base == "builtin:tiny-llama" and start.task == "causal-lm" and start.quantization is None
        (adapter,) = start.adapters
        assert adapter.path == str(sft / "adapter") and start.tokenizer == str(sft / "adapter")
    record = json.loads((sft / "adapter" / RUN_FILE).read_text(encoding="utf-8"))
    import hashlib

    digest = hashlib.sha256((sft / "adapter" / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    assert (record["base"], record["lineage"], record["mode"]) == ("builtin:tiny-llama", [], "new")
    assert record["adapter_sha256"] == digest  # a run from a base model: no stage before it
    assert start.lineage == (
        {"task": "causal-lm", "source": str(sft.absolute()), "adapter_sha256": digest, "mode": "new"},
    )  # the chain through the result: what a stage started from it records
    assert start_of("builtin:tiny-llama").adapters == () and not start_of("builtin:tiny-llama").result


def test_mistakes_are_one_line_before_anything_loads(sft, tmp_path):
    """Another model class, an adapter to continue on a base, keys of a new adapter with a
    continued one, a full fine-tune on adapters: refused by the preflight (the dry run's too); an
    adapter file replaced since its record: refused when it would load."""
    from support.workloads import local_run

    from xtrain.train.preflight.inputs import check_start

    def refused(cfg) -> str:
        with pytest.raises(XtrainError) as e:
            check_start(local_run(cfg), start_of(cfg.model.name_or_path))
        return e.value.one_line()

    seq = load_config(None, [f"model.name_or_path={sft}", "model.task=seq-cls", "run.report_to=none"])
    assert "is a causal-lm result (AutoModelForCausalLM); a seq-cls stage trains" in refused(seq)
    base = _dpo(tmp_path, "builtin:tiny-llama", "lora.continue_adapter=true")
    assert "holds no adapter" in refused(base)
    assert "lora.r are a new adapter's" in refused(
        _dpo(tmp_path, sft, "lora.continue_adapter=true", "lora.r=4")
    )
    full = load_config(None, [f"model.name_or_path={sft}", "model.task=causal-lm", "lora.enabled=false"])
    assert "start from its merged model" in refused(full)
    moved = tmp_path / "moved"
    shutil.copytree(sft, moved)
    weights = moved / "adapter" / ADAPTER_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(XtrainError, match="changed since its run recorded it"):
        build_workload(_dpo(tmp_path, moved))


def test_a_result_trained_in_4bit_starts_its_next_stage_in_4bit(sft, tmp_path):
    """The start's quantization (its record's) is the stage's unless the config names one."""
    four = tmp_path / "four"
    shutil.copytree(sft, four)
    record = four / "adapter" / RUN_FILE
    record.write_text(json.dumps({**json.loads(record.read_text()), "quantization": "4bit"}))
    assert _dpo(tmp_path, four).model.quantization == "4bit"
    assert _dpo(tmp_path, four, "model.quantization=null").model.quantization is None
    assert _dpo(tmp_path, sft).model.quantization is None


def _base_logps(workload, batch) -> torch.Tensor:
    from xtrain.tasks.preference.losses import sequence_logps

    inner = workload.model
    with torch.no_grad(), inner.disable_adapter():
        logits = inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return sequence_logps(logits, batch["labels"])[0]


@pytest.mark.parametrize("continued", [False, True])
def test_at_step_0_the_policy_is_the_start_and_the_reference_too(sft, tmp_path, continued):
    """DPO from the SFT result: loss ln 2 and rewards 0 at step 0, as a new adapter and as the
    continued one, live and precomputed; the reference is the SFT model, not the base (its
    log-probs differ from the adapters-off ones by far more than rounding)."""
    extra = ["lora.continue_adapter=true"] if continued else ["lora.r=4"]
    live = build_workload(_dpo(tmp_path, sft, *extra))
    stored = build_workload(_dpo(tmp_path, sft, *extra, "preference.precompute_reference=true"))
    for workload in (live, stored):
        batch = workload.collator([workload.train_dataset[i] for i in range(4)])
        workload.model.eval()
        out = workload.forward(workload.model, batch)
        assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6)
        assert float(out.stats["reward_chosen"].abs().max()) < 1e-5
    reference = live.forward.reference_logps(live.model, batch)
    assert float((reference - _base_logps(live, batch)).abs().max()) > 1.0, "the SFT moved the model"
    if continued:  # the adapter that trains is the SFT's, a frozen copy of it is the reference
        assert {n.split(".")[-2] for n, p in live.model.named_parameters() if p.requires_grad} == {"default"}


def _plain_models(capture, sft: Path, continued: bool):
    """(policy, reference) built by hand with peft alone: the model's class from its config, the
    base weights xtrain held (4-bit ones dequantized), the SFT adapter from its folder; the policy
    adds the new adapter as xtrain initialised it (or trains the SFT adapter on, as xtrain moved it).
    No dropout (preference tuning's rule; the GRPO jobs here set lora.dropout=0)."""
    from peft import PeftModel

    base = capture.model.get_base_model()
    config = copy.deepcopy(base.config)
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    plain = type(base)(config)
    weights = {
        n.removeprefix("base_model.model.").replace(".base_layer", ""): t
        for n, t in capture.initial.items()
        if "lora_" not in n
    }
    missing = plain.load_state_dict(weights, strict=False).missing_keys
    assert not missing, missing[:4]
    adapter = str(sft / "adapter")
    reference = PeftModel.from_pretrained(copy.deepcopy(plain), adapter).eval()
    if continued:
        policy = PeftModel.from_pretrained(plain, adapter, is_trainable=True)
    else:
        policy = PeftModel.from_pretrained(plain, adapter, adapter_name="sft")
        policy.add_adapter("default", copy.deepcopy(capture.model.peft_config["default"]))
        policy.base_model.set_adapter(["sft", "default"])
        policy.set_requires_grad("sft", requires_grad=False)
    state = dict(policy.named_parameters())
    with torch.no_grad():  # the trained adapter as xtrain's run started it
        for n, t in capture.initial.items():
            if ".default." in n:
                state[n].copy_(t)
    for module in policy.modules():  # preference tuning runs without dropout (TRL's default too)
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return policy.train(), reference


def _hand_dpo_loss(policy, reference, batch, beta: float) -> torch.Tensor:
    def logps(model) -> torch.Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        per_token = logits[:, :-1].float().log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        return (per_token * (labels != -100)).sum(-1)

    pol = logps(policy)
    with torch.no_grad():
        ref = logps(reference)
    n = len(pol) // 2
    margin = (pol[:n] - ref[:n]) - (pol[n:] - ref[n:])
    return -torch.nn.functional.logsigmoid(beta * margin).mean()


@pytest.mark.parametrize("quantization", [None, "4bit"])
@pytest.mark.parametrize("continued", [False, True])
def test_the_first_gradients_equal_dpo_by_hand_over_plain_peft_models(sft, tmp_path, continued, quantization):
    """One DPO step from the SFT result: xtrain's gradients against DPO written out over a plain
    peft policy (base + SFT adapter + the new one, or the SFT adapter trained on) and a plain
    peft reference (base + SFT adapter, from its folder), the trained B moved off zero first."""
    extra = ["lora.continue_adapter=true"] if continued else ["lora.r=4", "lora.alpha=8"]
    if quantization:
        extra.append(f"model.quantization={quantization}")
    batches: list[dict] = []

    def record(workload) -> None:
        forward = workload.forward
        with torch.no_grad():
            for name, p in workload.model.named_parameters():
                if p.requires_grad and "lora_B" in name:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)

        def recorded(model, batch):
            batches.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in batch.items()})
            return forward(model, batch)

        workload.forward = recorded

    capture = xtrain_gradients(_dpo(tmp_path, sft, *extra), on_workload=record)
    assert len(batches) == 1
    policy, reference = _plain_models(capture, sft, continued)
    _hand_dpo_loss(policy, reference, batches[0], beta=0.1).backward()
    want = {n: p.grad.detach().float().cpu() for n, p in policy.named_parameters() if p.grad is not None}
    assert_same_gradients(capture.grads, want)


REWARDS = """
def letters(prompts, completions, **columns):
    return [c.count("e") / max(len(c), 1) + len(c) / 100 for c in completions]
"""


def _grpo(root: Path, start: Path, *extra: str):
    root.mkdir(parents=True, exist_ok=True)
    rewards = root / "my_rewards.py"
    rewards.write_text(REWARDS, encoding="utf-8")
    rows = [{"prompt": r["prompt"]} for r in builtin.preference_examples(8, 3)]
    job = root / "grpo.yaml"
    job.write_text("model:\n  task: grpo\n", encoding="utf-8")
    return load_config(
        job,
        [f"model.name_or_path={start}", f"data.train={jsonl(root / 'prompts.jsonl', rows)}", "data.eval=null",
         "data.max_length=32", "grpo.num_generations=4", "grpo.max_completion_length=6", "grpo.beta=0.3",
         "grpo.temperature=0.9", f"grpo.rewards=[{rewards}:letters]", "optim.max_grad_norm=null",
         "optim.warmup_steps=0", "batch.per_device=8", "batch.global_batch=16", "run.max_steps=1",
         f"run.output_dir={root / 'out'}", "run.report_to=none", *extra],
    )  # fmt: skip


@pytest.mark.parametrize(("continued", "quantization"), [(False, None), (True, "4bit")])
def test_grpo_from_a_result_starts_at_kl_0_and_its_gradients_equal_the_loss_by_hand(
    sft, tmp_path, continued, quantization
):
    """GRPO with beta > 0 from the SFT result: the first step's KL to the reference is 0 (the
    policy is the start); then, the trained B moved, xtrain's gradients equal GRPO's loss written
    out over a plain peft policy with the KL to a plain peft base + SFT adapter."""
    from support.gradients import dapo_gradients, grpo_token_loss

    extra = ["lora.continue_adapter=true"] if continued else ["lora.r=4", "lora.dropout=0.0"]
    if quantization:
        extra.append(f"model.quantization={quantization}")
    seen: list = []

    def kl_seen(workload) -> None:
        forward = workload.forward
        workload.forward = lambda model, batch: seen.append(forward(model, batch)) or seen[-1]

    xtrain_gradients(_grpo(tmp_path / "zero", sft, *extra), on_workload=kl_seen)
    assert len(seen) == 2 and all(float(out.metrics["kl"]) < 1e-6 for out in seen)

    batches: list[dict] = []

    def record(workload) -> None:
        from support.gradients import record_forward

        trained = {n for n, p in workload.model.named_parameters() if p.requires_grad}
        frozen = {n: p.detach().clone() for n, p in workload.model.named_parameters() if n not in trained}
        record_forward(workload, batches)  # (every B moved: the frozen adapters put back below)
        with torch.no_grad():
            for n, p in workload.model.named_parameters():
                if n in frozen:
                    p.copy_(frozen[n])

    capture = xtrain_gradients(_grpo(tmp_path / "moved", sft, *extra), on_workload=record)
    policy, reference = _plain_models(capture, sft, continued)

    def per_token(batch: dict) -> torch.Tensor:
        return grpo_token_loss(policy, batch, batch["advantages"], 0.9, 0.3, reference=reference)

    assert_same_gradients(capture.grads, dapo_gradients(policy, batches, per_token))


def test_no_training_loop_is_left_in_the_built_ins():
    """The trained built-ins come from xtrain's own SFT stage (jobs/sft-*.yaml), not from loops of
    their own in xtrain/builtin/."""
    folder = Path(builtin.__file__).parent
    loops = [
        p.name for p in folder.glob("*.py") if ".backward(" in p.read_text() or "optimizer" in p.read_text()
    ]
    assert not loops
    for name in builtin.STAGES:
        job = load_config(builtin.stage_job(f"builtin:{name}"), [])
        assert job.model.task == "causal-lm" and job.run.max_steps


STAGE_SCRIPT = """
import sys
from xtrain import builtin
from xtrain.train.builtin_stages import ensure
from xtrain.train.loop import train_run

builtin.STAGES["tiny-test"] = sys.argv[1]
print("result", ensure("builtin:tiny-test", train_run, lambda line: print("said", line)), flush=True)
"""


def test_a_trained_built_in_is_trained_once_by_processes_that_start_together(tmp_path):
    """Two processes that name a trained built-in at once (each a rank of a launch here: the stage
    then runs in a process of its own, without the launch variables) train it once, under the
    lock; both get the same result, a start read from its files."""
    import os
    import subprocess
    import sys

    job = tmp_path / "sft-tiny-test.yaml"
    job.write_text(
        "model: {name_or_path: builtin:tiny-llama, task: causal-lm}\n"
        "data: {train: builtin:preference-sft, eval: null, max_length: 48, max_samples: 32}\n"
        "batch: {per_device: 8}\nrun: {max_steps: 2, report_to: none}\n",
        encoding="utf-8",
    )
    procs = []
    for rank in (0, 1):
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "NODE_RANK")},
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
        }
        cmd = [sys.executable, "-c", STAGE_SCRIPT, str(job)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    said = [line for out, _ in outs for line in out.splitlines() if line.startswith("said")]
    assert len(said) == 2 and "training it once" in said[0] and "trained in" in said[1], said
    results = {line for out, _ in outs for line in out.splitlines() if line.startswith("result")}
    assert len(results) == 1
    folder = Path(results.pop().split(" ", 1)[1])
    assert not (folder / "checkpoints").exists() and (folder / "adapter" / RUN_FILE).is_file()


def test_a_continued_adapter_stopped_and_resumed_trains_as_one_run(sft, tmp_path):
    """DPO continuing the SFT adapter, stopped at its step-2 checkpoint (Ctrl+C) and run again:
    the checkpoint holds the trained adapter only, the resume puts the start's frozen copy (the
    reference) back from the result's files, and the adapter ends as an unstopped run's."""
    import os
    import signal

    from safetensors.torch import load_file

    from xtrain.train.failures import TrainingStopped
    from xtrain.train.loop import train
    from xtrain.train.report import ListReporter

    class StopAtTwo(ListReporter):
        def checkpoint_saved(self, step: int, path: str) -> None:
            super().checkpoint_saved(step, path)
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C: the loop stops at this checkpoint

    extra = ("lora.continue_adapter=true", "run.max_steps=4", "run.save_every=2", "optim.lr=1e-3")
    straight = _dpo(tmp_path / "straight", sft, *extra)
    train(straight, this_machine())
    stopped = _dpo(tmp_path / "stopped", sft, *extra)
    with pytest.raises((TrainingStopped, XtrainError)):
        train(stopped, this_machine(), StopAtTwo())
    assert not (tmp_path / "stopped" / "out" / "adapter").exists()
    result = train(_dpo(tmp_path / "stopped", sft, *extra), this_machine())
    assert result.resumed_from is not None
    a, b = (
        load_file(str(p / "out" / "adapter" / ADAPTER_WEIGHTS))
        for p in (tmp_path / "straight", tmp_path / "stopped")
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
