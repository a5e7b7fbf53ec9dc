"""The training loop in one process: data order, training, outputs, checkpoints, stop and resume
errors. Multi-process launches are in test_launch_modes.py, kill-and-resume in test_resume.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from xtrain.config.schema import TrainConfig
from xtrain.data.sampler import DataOrder, RankBatchSampler
from xtrain.errors import XtrainError
from xtrain.machine.facts import Facts
from xtrain.planning.rules import make_plan
from xtrain.planning.run import Run
from xtrain.tasks.contract import Workload
from xtrain.train.report import ListReporter


# -- a tiny hand-written workload (no tasks.py involved) -------------------------------------------
class ListDataset(torch.utils.data.Dataset):
    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
    ids = torch.tensor([r["input_ids"] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def tiny_base_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def tiny_rows(n: int, seed: int) -> list[dict]:
    # learnable: each sequence counts up from a random start (mod 32)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 32, (n,), generator=g).tolist()
    return [{"input_ids": [(s + i) % 32 for i in range(12)]} for s in starts]


def build_tiny(run: Run, main_process_first) -> Workload:
    from peft import LoraConfig, get_peft_model

    cfg = run.cfg
    model = get_peft_model(
        tiny_base_model(),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=cfg.lora.dropout, target_modules=["q_proj", "v_proj"]),
    )
    return Workload(
        model=model,
        train_dataset=ListDataset(tiny_rows(64, 1)),
        eval_dataset=ListDataset(tiny_rows(10, 2)),
        collator=collate,
    )


def tiny_config(out: Path, **run: object) -> TrainConfig:
    cfg = TrainConfig()
    cfg.run.output_dir = str(out)
    cfg.run.max_steps = 6
    cfg.run.log_every = 1
    cfg.run.tensorboard = False
    cfg.batch.per_device = 4
    cfg.batch.global_batch = 8
    cfg.optim.lr = 1e-2
    cfg.optim.warmup_steps = 1
    for k, v in run.items():
        setattr(cfg.run, k, v)
    return cfg


def cpu_plan():
    return make_plan(Facts(torch_version="2.13.0", gloo_available=True))


def adapter_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter" / "adapter_model.safetensors"))


# -- data order ----------------------------------------------------------------------------------------
def test_same_micro_batches_for_any_process_count() -> None:
    one = DataOrder(num_samples=50, global_batch=8, per_device=2, world_size=1, seed=3)
    two = DataOrder(num_samples=50, global_batch=8, per_device=2, world_size=2, seed=3)
    four = DataOrder(num_samples=50, global_batch=8, per_device=2, world_size=4, seed=3)
    assert (one.accumulation, two.accumulation, four.accumulation) == (4, 2, 1)
    for step in range(one.steps_per_epoch * 3):
        expected = [one.micro_batch(step, m) for m in range(4)]
        for order in (one, two, four):
            got: dict[int, list[int]] = {}
            for rank in range(order.world_size):
                for a, mb in enumerate(order.rank_batches(step, rank)):
                    got[order.micro_index(rank, a)] = mb
            assert [got[m] for m in range(4)] == expected


def test_epochs_are_permutations_and_the_tail_is_dropped() -> None:
    order = DataOrder(num_samples=50, global_batch=8, per_device=4, world_size=1, seed=0)
    assert order.steps_per_epoch == 6  # 48 of 50 samples; the incomplete last global batch is dropped
    epoch0 = [i for s in range(6) for i in order.step_samples(s)]
    epoch1 = [i for s in range(6, 12) for i in order.step_samples(s)]
    assert len(set(epoch0)) == 48 and len(set(epoch1)) == 48
    assert epoch0 != epoch1  # a fresh permutation each epoch
    assert order.position(7) == (1, 1)


def test_sampler_starts_at_any_step_without_iterating() -> None:
    order = DataOrder(num_samples=40, global_batch=8, per_device=2, world_size=2, seed=5)
    full = list(RankBatchSampler(order, rank=1, start_step=0, end_step=12))
    tail = list(RankBatchSampler(order, rank=1, start_step=7, end_step=12))
    assert tail == full[7 * order.accumulation :]
    assert len(tail) == 5 * order.accumulation


@pytest.mark.parametrize(
    ("n", "global_batch", "per_device", "world"),
    [(40, 10, 4, 1), (40, 8, 2, 3), (5, 8, 2, 1), (40, 0, 2, 1)],
)
def test_bad_batch_shapes_are_user_errors(n: int, global_batch: int, per_device: int, world: int) -> None:
    with pytest.raises(XtrainError):
        DataOrder(num_samples=n, global_batch=global_batch, per_device=per_device, world_size=world, seed=0)


# -- training in one process ------------------------------------------------------------------------
@pytest.mark.slow
def test_single_process_trains_and_writes_outputs(tmp_path: Path) -> None:
    from xtrain.train.loop import train

    out = tmp_path / "run"
    cfg = tiny_config(out, max_steps=8, eval_every=4, save_every=2, keep_checkpoints=2)
    cfg.run.save_merged = True
    rep = ListReporter()
    result = train(cfg, cpu_plan(), rep, build=build_tiny)

    assert result.final_step == 8 and result.accumulation == 2 and result.global_batch == 8
    assert [s for s, _ in result.losses] == list(range(1, 9))
    assert result.losses[-1][1] < result.losses[0][1]  # it learns
    assert [h["step"] for h in result.eval_history] == [4, 8]
    assert result.samples_per_s > 0 and result.tokens_per_s > 0
    # banner, progress, eval, checkpoint events
    kinds = [k for k, _ in rep.events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert rep.events[0][1].batch_line == "global batch 8 = 4 per-device x 1 process x 2 accumulation"
    assert [s for k, (s, *_) in ((k, v) for k, v in rep.events if k == "checkpoint")] == [2, 4, 6, 8]
    # rotation keeps the last 2; no partial writes left
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-6", "step-8"]
    state = json.loads((out / "checkpoints" / "step-8" / "xtrain_state.json").read_text())
    assert state["step"] == 8 and state["samples_seen"] == 64 and state["world_size"] == 1
    # checkpoints hold the trainable weights only
    from safetensors.torch import load_file

    ckpt = load_file(str(out / "checkpoints" / "step-8" / "model.safetensors"))
    assert ckpt and all("lora_" in k for k in ckpt)
    # outputs
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "merged" / "config.json").is_file()
    saved = json.loads((out / "train_result.json").read_text())
    assert saved["final_step"] == 8 and saved["eval_metrics"] == result.eval_metrics


@pytest.mark.slow
def test_saved_adapter_reloads_and_reproduces_eval_loss(tmp_path: Path) -> None:
    from peft import PeftModel

    from xtrain.train.loop import train

    out = tmp_path / "run"
    result = train(tiny_config(out), cpu_plan(), build=build_tiny)
    model = PeftModel.from_pretrained(tiny_base_model(), str(out / "adapter"))
    model.eval()
    total, count = 0.0, 0
    rows = tiny_rows(10, 2)
    with torch.no_grad():
        for i in range(0, len(rows), 4):  # the eval batches the loop used (per-device 4)
            batch = collate(rows[i : i + 4])
            n = batch["input_ids"].shape[0]
            total += float(model(**batch).loss) * n
            count += n
    assert total / count == pytest.approx(result.eval_metrics["eval_loss"], rel=1e-5)


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_resume_matches(tmp_path: Path) -> None:
    from xtrain.train.loop import TrainingStopped, train

    class InterruptAt(ListReporter):
        def progress(self, step, total, metrics=None):
            super().progress(step, total, metrics)
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl+C would, during step 4

    straight = train(tiny_config(tmp_path / "a"), cpu_plan(), build=build_tiny)

    out = tmp_path / "b"
    with pytest.raises(TrainingStopped) as stopped:
        train(tiny_config(out), cpu_plan(), InterruptAt(), build=build_tiny)
    assert stopped.value.exit_code == 130 and stopped.value.step == 4  # the step boundary after it
    assert (out / "checkpoints" / "step-4" / "xtrain_state.json").is_file()
    assert not (out / "adapter").exists()

    resumed = train(tiny_config(out), cpu_plan(), build=build_tiny)
    assert resumed.resumed_from and resumed.resumed_from.endswith("step-4")
    assert resumed.losses == straight.losses  # the history carries over the stop
    a, b = adapter_tensors(tmp_path / "a"), adapter_tensors(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise


@pytest.mark.slow
def test_resume_auto_ignores_and_removes_partial_checkpoints(tmp_path: Path) -> None:
    from xtrain.train.loop import train

    out = tmp_path / "run"
    train(tiny_config(out, max_steps=4, save_every=2), cpu_plan(), build=build_tiny)
    partial = out / "checkpoints" / "step-6.tmp"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    result = train(tiny_config(out, max_steps=6, save_every=2), cpu_plan(), build=build_tiny)
    assert result.resumed_from and result.resumed_from.endswith("step-4")
    assert not partial.exists()
    assert result.final_step == 6


def test_resume_errors_come_before_anything_is_written(tmp_path: Path) -> None:
    from xtrain.train.checkpoint.resume import find_resume

    out = tmp_path / "run"
    step = out / "checkpoints" / "step-4"
    step.mkdir(parents=True)
    (step / "xtrain_state.json").write_text("{}")
    before = sorted(str(p) for p in out.rglob("*"))
    with pytest.raises(XtrainError, match="resume=off would overwrite"):
        find_resume(out, "off")
    with pytest.raises(XtrainError, match="does not exist"):
        find_resume(out, str(tmp_path / "nowhere"))
    tmp = out / "checkpoints" / "step-8.tmp"
    tmp.mkdir()
    with pytest.raises(XtrainError, match="incomplete"):
        find_resume(out, str(tmp))
    assert find_resume(out, "auto") == step
    assert find_resume(tmp_path / "fresh", "auto") is None
    assert find_resume(tmp_path / "fresh", "off") is None
    assert sorted(str(p) for p in out.rglob("*")) == sorted([*before, str(tmp)])


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    from dataclasses import asdict

    from xtrain.train.checkpoint.layout import TrainState
    from xtrain.train.checkpoint.resume import read_state

    cfg = TrainConfig()
    step = tmp_path / "step-2"
    step.mkdir()
    state = TrainState(
        step=2, epoch=0, step_in_epoch=2, samples_seen=16, seed=1, global_batch=8, per_device=4,
        world_size=1, accumulation=2, num_samples=64, total_steps=6, config=asdict(cfg),
    )  # fmt: skip
    (step / "xtrain_state.json").write_text(state.to_json())
    assert read_state(step, asdict(cfg)).step == 2
    other = TrainConfig()
    other.lora.r = 16
    with pytest.raises(XtrainError, match="lora.r=8"):
        read_state(step, asdict(other))


@pytest.mark.slow
def test_rerunning_a_finished_run_trains_and_writes_nothing(tmp_path: Path) -> None:
    from xtrain.train.loop import train

    out = tmp_path / "run"
    first = train(tiny_config(out), cpu_plan(), build=build_tiny)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rep = ListReporter()
    again = train(tiny_config(out), cpu_plan(), rep, build=build_tiny)
    assert again.losses == first.losses and again.eval_metrics == first.eval_metrics  # its train_result.json
    assert [e[0] for e in rep.events] == ["note"] and "already finished, nothing trained" in rep.events[0][1]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    longer = train(tiny_config(out, max_steps=7), cpu_plan(), rep, build=build_tiny)  # a longer run trains on
    assert longer.resumed_from and longer.resumed_from.endswith("step-6") and longer.final_step == 7


@pytest.mark.slow
def test_accumulation_tells_accelerate_which_backward_ends_the_step(tmp_path: Path, monkeypatch) -> None:
    """The hot path passes accelerate's own ``sync_gradients`` flag: False on every micro-batch
    but the last. DeepSpeed's backward ends its accumulation (and steps its engine) on that flag,
    so a flag that stayed True would make every micro-batch an optimizer step there."""
    from accelerate import Accelerator

    from xtrain.train.loop import train

    seen: list[bool] = []
    original = Accelerator.backward

    def recording(self, loss, **kwargs):
        seen.append(bool(self.sync_gradients))
        return original(self, loss, **kwargs)

    monkeypatch.setattr(Accelerator, "backward", recording)
    result = train(tiny_config(tmp_path / "run", max_steps=3), cpu_plan(), build=build_tiny)
    assert result.accumulation == 2
    assert seen == [False, True] * 3
