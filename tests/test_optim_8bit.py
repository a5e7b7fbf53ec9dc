"""optim.name: adamw_8bit / paged_adamw_8bit (bitsandbytes) with the same groups, betas, eps and
weight decay as torch's AdamW; they train, their 8-bit state goes through accelerate's
save_state/load_state and resume is bitwise; where they cannot run it is one line."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from test_loop import cpu_plan  # the CPU plan the loop tests train under

from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError
from xtrain.train.report import ListReporter

pytestmark = pytest.mark.usefixtures("private_caches")
bnb = pytest.importorskip("bitsandbytes")


def job_config(out: Path, name: str, lora: bool) -> TrainConfig:
    cfg = TrainConfig()
    cfg.model.name_or_path = "builtin:tiny-llama"
    cfg.model.task = "causal-lm"
    cfg.data.train = "builtin:tiny-stories"
    cfg.data.max_length = 32
    cfg.data.max_train_samples = 64
    cfg.data.max_eval_samples = 8
    cfg.lora.enabled = lora
    cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout = 4, 8, 0.0
    cfg.optim.name = name
    cfg.optim.lr = 5e-3 if lora else 1e-3
    cfg.optim.warmup_steps = 1
    cfg.optim.weight_decay = 0.1
    cfg.batch.per_device = 4
    cfg.batch.global_batch = 8
    cfg.run.output_dir = str(out)
    cfg.run.max_steps = 6
    cfg.run.log_every = 1
    cfg.run.tensorboard = False
    cfg.run.seed = 5
    return cfg


def tiny_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
    )  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    ("name", "cls"), [("adamw_8bit", "AdamW8bit"), ("paged_adamw_8bit", "PagedAdamW8bit")]
)
def test_same_groups_and_hyperparameters_as_adamw(name: str, cls: str) -> None:
    from xtrain.train.optim import build_optimizer

    cfg = TrainConfig()
    cfg.optim.weight_decay, cfg.optim.betas, cfg.optim.eps = 0.05, [0.8, 0.95], 1e-7
    model = tiny_model()
    cfg.optim.name = "adamw"
    reference = build_optimizer(model, cfg, 3e-4, torch.device("cpu"))
    cfg.optim.name = name
    optimizer = build_optimizer(model, cfg, 3e-4, torch.device("cpu"))
    assert type(optimizer) is getattr(bnb.optim, cls)
    assert len(optimizer.param_groups) == len(reference.param_groups) == 2
    for got, want in zip(optimizer.param_groups, reference.param_groups, strict=True):
        assert [id(p) for p in got["params"]] == [id(p) for p in want["params"]]
        for key in ("lr", "betas", "eps", "weight_decay"):
            assert tuple(got[key]) == tuple(want[key]) if key == "betas" else got[key] == want[key], key
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.05, 0.0]  # none on norms


def test_refused_on_mps() -> None:
    from xtrain.train.optim import bnb_optimizer

    with pytest.raises(XtrainError, match="no 8-bit optimizer for Apple MPS") as e:
        bnb_optimizer("adamw_8bit", torch.device("mps"))
    assert e.value.hint == "use optim.name=adamw"


def test_missing_bitsandbytes_is_one_line_with_the_pip_command(monkeypatch) -> None:
    from xtrain.train.optim import bnb_optimizer

    monkeypatch.setitem(sys.modules, "bitsandbytes.optim", None)  # import fails as if not installed
    with pytest.raises(XtrainError, match="optim.name=paged_adamw_8bit needs bitsandbytes") as e:
        bnb_optimizer("paged_adamw_8bit", torch.device("cpu"))
    assert 'pip install "bitsandbytes>=0.46.1"' in e.value.hint


def _job(tmp_path: Path) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        "model:\n  name_or_path: builtin:tiny-llama\n  task: causal-lm\noptim:\n  name: adamw_8bit\n"
        f"run:\n  output_dir: {(tmp_path / 'out').as_posix()}\n"
    )
    return config


def test_missing_bitsandbytes_is_refused_before_a_process_starts(tmp_path, monkeypatch, capsys, machines_dir):
    """``xtrain train``: one line, exit 2, before the launcher; a ``--facts`` plan for another
    machine does not check this one."""
    from xtrain.cli import main
    from xtrain.commands import launching

    def launched(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launching, "launch_training", launched)
    from support.packages import hide_bitsandbytes

    hide_bitsandbytes(monkeypatch)
    config = _job(tmp_path)
    assert main(["train", str(config)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "optim.name=adamw_8bit needs bitsandbytes, which is not installed" in lines[0]
    assert 'pip install "bitsandbytes>=0.46.1", or use optim.name=adamw' in lines[0]
    facts = machines_dir / "windows-2x4090.json"
    assert main(["train", str(config), "--dry-run", "--facts", str(facts), "--platform", "windows"]) == 0


def test_the_worker_refuses_a_missing_bitsandbytes_before_loading_the_model(tmp_path, monkeypatch, capsys):
    """``python -m xtrain.run`` (no CLI check before it): one line, exit 2, no model loaded."""
    import xtrain.run

    def loads(*args, **kwargs):
        raise AssertionError("the worker went on to load the model")

    monkeypatch.setattr(xtrain.run, "run_worker", loads)
    monkeypatch.setattr(xtrain.run, "_spawn", loads)
    from support.packages import hide_bitsandbytes

    hide_bitsandbytes(monkeypatch)
    assert xtrain.run.main(["--config", str(_job(tmp_path))]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "optim.name=adamw_8bit needs bitsandbytes, which is not installed" in lines[0]


def model_weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(
        str(out / name / ("adapter_model.safetensors" if name == "adapter" else "model.safetensors"))
    )


@pytest.mark.slow
# (on CPU bitsandbytes runs the paged optimizer unpaged: the same kernels as adamw_8bit)
@pytest.mark.parametrize(("name", "lora"), [("adamw_8bit", False), ("paged_adamw_8bit", True)])
def test_trains_and_resumes_exactly(tmp_path: Path, name: str, lora: bool) -> None:
    """Full fine-tuning gives weights of more than 4096 values (bitsandbytes' min_8bit_size), so
    the checkpoint holds real 8-bit state (uint8 with block-wise absmax); stopped at step 4 and
    resumed, the run ends bitwise where the uninterrupted one does."""
    from xtrain.train.loop import TrainingStopped, train

    class InterruptAt(ListReporter):
        def progress(self, step, total, metrics=None):
            super().progress(step, total, metrics)
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl+C would: a checkpoint at step 4

    straight = train(job_config(tmp_path / "a", name, lora), cpu_plan())
    losses = [v for _, v in straight.losses]
    assert losses[-1] < losses[0]
    with pytest.raises(TrainingStopped):
        train(job_config(tmp_path / "b", name, lora), cpu_plan(), InterruptAt())
    step4 = tmp_path / "b" / "checkpoints" / "step-4"
    state = torch.load(step4 / "optimizer.bin", weights_only=False)["state"]
    kinds = {v.dtype for s in state.values() for v in _tensors(s)}
    assert (torch.uint8 in kinds) is (not lora)  # 8-bit state where the weights are big enough
    resumed = train(job_config(tmp_path / "b", name, lora), cpu_plan())
    assert resumed.resumed_from and resumed.losses == straight.losses
    folder = "adapter" if lora else "model"
    a, b = model_weights(tmp_path / "a", folder), model_weights(tmp_path / "b", folder)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _tensors(value: object) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
