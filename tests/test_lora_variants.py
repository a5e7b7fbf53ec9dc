"""LoRA variants through peft (lora.use_dora, lora.use_rslora, lora.init_weights): runs train on
the built-in tiny llama, the saved adapter reloads in plain peft onto the ORIGINAL base and gives
the trained model's logits (PiSSA/OLoRA converted at save), the merged model matches, resume is
exact, and what cannot work is refused in one line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from test_loop import cpu_plan  # the CPU plan the loop tests train under

from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError
from xtrain.train.report import ListReporter

pytestmark = pytest.mark.usefixtures("private_caches")


def llama_config(out: Path, steps: int = 6, **lora: object) -> TrainConfig:
    cfg = TrainConfig()
    cfg.model.name_or_path = "builtin:tiny-llama"
    cfg.model.task = "causal-lm"
    cfg.data.train = "builtin:tiny-stories"
    cfg.data.max_length = 32
    cfg.data.max_train_samples = 64
    cfg.data.max_eval_samples = 8
    cfg.lora.r = 4
    cfg.lora.alpha = 8
    cfg.lora.dropout = 0.0
    for k, v in lora.items():
        setattr(cfg.lora, k, v)
    cfg.optim.lr = 5e-3
    cfg.optim.warmup_steps = 1
    cfg.batch.per_device = 4
    cfg.batch.global_batch = 8
    cfg.run.output_dir = str(out)
    cfg.run.max_steps = steps
    cfg.run.log_every = 1
    cfg.run.tensorboard = False
    cfg.run.seed = 3
    return cfg


def base_model(folder: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(3, 19).reshape(2, 8)
    with torch.no_grad():
        return model(input_ids=ids).logits


class LogitsAtEnd(ListReporter):
    """Takes the in-memory model's logits after the last step, before the outputs are written
    (the merged model is written next: the in-memory model is the reference)."""

    def __init__(self, model: dict, steps: int) -> None:
        super().__init__()
        self.model, self.steps, self.logits = model, steps, None

    def progress(self, step: int, total: int, metrics: dict[str, float] | None = None) -> None:
        super().progress(step, total, metrics)
        if step == self.steps and self.logits is None:
            m = self.model["model"]
            m.eval()
            self.logits = logits(m)
            m.train()


def train_variant(out: Path, reporter: ListReporter | None = None, kept: dict | None = None, **lora: object):
    """Train through xtrain's loop with its own task builder; ``kept["model"]``: the model."""
    from xtrain import tasks
    from xtrain.train.loop import train

    kept = {} if kept is None else kept

    def build(run, main_process_first):
        workload = tasks.build_workload(run, main_process_first)
        kept["model"] = workload.model
        return workload

    cfg = llama_config(out, **lora)
    cfg.run.save_merged = True
    return train(cfg, cpu_plan(), reporter, build=build)


def original_base() -> str:
    from xtrain import builtin

    return str(builtin.ensure_builtin_model("builtin:tiny-llama"))


VARIANTS = {
    "dora": {"use_dora": True},
    "rslora": {"use_rslora": True},
    "pissa": {"init_weights": "pissa"},
    "olora": {"init_weights": "olora"},
    "pissa-rslora": {"init_weights": "pissa", "use_rslora": True},
    "gaussian-rslora": {"init_weights": "gaussian", "use_rslora": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_trains_and_its_adapter_fits_the_original_base(tmp_path: Path, variant: str) -> None:
    from peft import PeftModel

    lora = VARIANTS[variant]
    kept: dict = {}
    reporter = LogitsAtEnd(kept, steps=6)
    result = train_variant(tmp_path / "run", reporter, kept, **lora)
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < losses[0]  # it learns

    adapter = tmp_path / "run" / "adapter"
    on_base = PeftModel.from_pretrained(base_model(original_base()), str(adapter)).eval()
    torch.testing.assert_close(logits(on_base), reporter.logits, rtol=1e-4, atol=1e-4)
    merged = base_model(str(tmp_path / "run" / "merged"))
    torch.testing.assert_close(logits(merged), reporter.logits, rtol=1e-4, atol=1e-4)

    recorded = json.loads((adapter / "adapter_config.json").read_text())
    assert recorded["use_dora"] is bool(lora.get("use_dora"))
    assert recorded["use_rslora"] is bool(lora.get("use_rslora"))
    if lora.get("init_weights") in ("pissa", "olora"):  # converted: a plain LoRA of rank 2r
        assert recorded["init_lora_weights"] is True
        alpha = 8 * 2**0.5 if lora.get("use_rslora") else 16  # the same scale at twice the rank
        assert recorded["r"] == 8 and recorded["lora_alpha"] == pytest.approx(alpha)
    else:
        assert recorded["init_lora_weights"] == {"gaussian": "gaussian"}.get(lora.get("init_weights"), True)


@pytest.mark.slow
def test_pissa_resume_is_exact(tmp_path: Path) -> None:
    """Checkpoints hold A and B only; resume rebuilds the residual base by the same full SVD."""
    from xtrain.train.loop import TrainingStopped

    class InterruptAt(ListReporter):
        def progress(self, step, total, metrics=None):
            super().progress(step, total, metrics)
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl+C would

    cfg = {"init_weights": "pissa", "use_rslora": True}
    straight = train_variant(tmp_path / "a", **cfg)
    with pytest.raises(TrainingStopped):
        train_variant(tmp_path / "b", InterruptAt(), **cfg)
    resumed = train_variant(tmp_path / "b", **cfg)
    assert resumed.resumed_from and resumed.losses == straight.losses
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "a" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_layer_by_layer_decomposition_is_peft_own_init(init: str) -> None:
    """xtrain runs peft's pissa_init/olora_init one layer at a time (on a GPU when there is one):
    on the same device it gives exactly what get_peft_model(init_lora_weights=init) gives."""
    from peft import LoraConfig, get_peft_model

    from xtrain.model import lora

    cfg = TrainConfig()
    cfg.lora.r, cfg.lora.alpha, cfg.lora.init_weights = 4, 8, init
    ours = lora.apply_lora(base_model(original_base()), cfg.lora, "CAUSAL_LM")
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=cfg.lora.dropout,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=init,
    )
    theirs = get_peft_model(base_model(original_base()), config)
    assert ours.peft_config["default"].init_lora_weights == init  # recorded as the init it is
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pissa_adapter_keeps_the_head_trained_whole(tmp_path: Path) -> None:
    """peft's PiSSA conversion keeps lora_A/lora_B only; the classifier of a seq-cls model
    (modules_to_save) must still be in the saved adapter."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from xtrain import builtin
    from xtrain.model import lora

    folder = str(builtin.ensure_builtin_model("builtin:tiny-bert"))
    cfg = TrainConfig()
    cfg.lora.r, cfg.lora.init_weights = 4, "pissa"

    def load():
        return AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()

    torch.manual_seed(0)
    model = lora.apply_lora(load(), cfg.lora, "SEQ_CLS")
    with torch.no_grad():  # as if trained: every trainable weight moves
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    ids = torch.arange(5, 21).reshape(2, 8)
    with torch.no_grad():
        want = model.eval()(input_ids=ids).logits
    lora.save_pretrained(model, str(tmp_path / "adapter"))
    again = PeftModel.from_pretrained(load(), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)


def test_loftq_on_a_4bit_base_needs_cuda() -> None:
    """init_weights=loftq on a 4-bit base goes through peft's replace_lora_weights_loftq, which
    computes on CUDA: on CPU it is one line (tests/gpu/test_optim_8bit_gpu.py runs it on a GPU)."""
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain.model import lora
    from xtrain.tasks.validation import check_variants

    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    model = AutoModelForCausalLM.from_pretrained(original_base(), quantization_config=quant, device_map="cpu")
    cfg = TrainConfig()
    cfg.lora.r, cfg.lora.init_weights, cfg.model.quantization = 8, "loftq", "4bit"
    check_variants(cfg)
    with pytest.raises(XtrainError, match="loftq computes on a CUDA GPU"):
        lora.apply_lora(model, cfg.lora, "CAUSAL_LM")


# -- refusals -----------------------------------------------------------------------------------------
REFUSED = [
    ({"enabled": False, "use_dora": True}, None, "lora.use_dora is a LoRA setting and lora.enabled=false"),
    ({"enabled": False, "init_weights": "pissa"}, None, "lora.init_weights is a LoRA setting"),
    ({"init_weights": "pissa", "use_dora": True}, None, "cannot be saved as an adapter of the original"),
    ({"init_weights": "olora"}, "4bit", "lora.init_weights=olora rewrites the base weights"),
    ({"init_weights": "pissa"}, "8bit", "lora.init_weights=pissa rewrites the base weights"),
    ({"init_weights": "loftq"}, None, "needs model.quantization=4bit"),
    ({"init_weights": "loftq"}, "8bit", "needs model.quantization=4bit"),
    ({"init_weights": "loftq", "use_dora": True}, "4bit", "stale magnitudes"),
]


@pytest.mark.parametrize(("lora", "quantization", "message"), REFUSED)
def test_combinations_that_cannot_work_are_refused(
    lora: dict, quantization: str | None, message: str
) -> None:
    from xtrain.tasks.validation import check_variants

    cfg = TrainConfig()
    cfg.model.quantization = quantization
    for k, v in lora.items():
        setattr(cfg.lora, k, v)
    with pytest.raises(XtrainError, match=message) as e:
        check_variants(cfg)
    assert e.value.hint


def test_combinations_that_work_pass() -> None:
    from xtrain.tasks.validation import check_variants

    for quantization in (None, "4bit", "8bit"):
        cfg = TrainConfig()
        cfg.model.quantization = quantization
        cfg.lora.use_dora = cfg.lora.use_rslora = True  # DoRA runs on bitsandbytes layers too
        check_variants(cfg)
    cfg = TrainConfig()
    cfg.lora.use_rslora, cfg.lora.init_weights = True, "olora"
    check_variants(cfg)


def test_olora_on_gpt2_conv1d_is_refused() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from xtrain.model import lora

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)
    )
    cfg = TrainConfig()
    cfg.lora.init_weights = "olora"
    with pytest.raises(XtrainError, match="olora does not work on Conv1D layers"):
        lora.apply_lora(model, cfg.lora, "CAUSAL_LM")


def test_refusal_is_one_line_exit_2(tmp_path: Path) -> None:
    import sys

    from support.jobs import make_job, run_xtrain

    job = make_job(tmp_path / "job")
    cmd = [sys.executable, "-m", "xtrain", "train", str(job.config), "--dry-run"]
    proc = run_xtrain([*cmd, "lora.init_weights=pissa", "lora.use_dora=true"], job.env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "lora.use_dora=true cannot be saved" in proc.stderr


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("lora", "use_dora", True), ("lora", "use_rslora", True), ("lora", "init_weights", "pissa"),
     ("optim", "name", "adamw_8bit")],
)  # fmt: skip
def test_resume_refuses_another_variant_or_optimizer(tmp_path: Path, section: str, key: str, value) -> None:
    """Same shapes, another model (rsLoRA's scale, PiSSA's residual base) or optimizer state."""
    from dataclasses import asdict

    from xtrain.train.checkpoint.layout import TrainState
    from xtrain.train.checkpoint.resume import read_state

    step = tmp_path / "step-2"
    step.mkdir()
    state = TrainState(
        step=2, epoch=0, step_in_epoch=2, samples_seen=16, seed=1, global_batch=8, per_device=4,
        world_size=1, accumulation=2, num_samples=64, total_steps=6, config=asdict(TrainConfig()),
    )  # fmt: skip
    (step / "xtrain_state.json").write_text(state.to_json())
    other = TrainConfig()
    setattr(getattr(other, section), key, value)
    with pytest.raises(XtrainError, match=f"{section}.{key}="):
        read_state(step, asdict(other))


def test_dora_on_gpt2_conv1d_saves_and_reloads(tmp_path: Path) -> None:
    """DoRA works on GPT-2's Conv1D (peft handles fan_in_fan_out there; OLoRA does not)."""
    from peft import PeftModel
    from transformers import GPT2Config, GPT2LMHeadModel

    from xtrain.model import lora

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    base = GPT2LMHeadModel(config)
    base.save_pretrained(str(tmp_path / "base"))
    cfg = TrainConfig()
    cfg.lora.r, cfg.lora.use_dora = 4, True
    model = lora.apply_lora(base, cfg.lora, "CAUSAL_LM")
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    want = logits(model.eval())
    lora.save_pretrained(model, str(tmp_path / "adapter"))
    again = PeftModel.from_pretrained(
        GPT2LMHeadModel.from_pretrained(str(tmp_path / "base")), str(tmp_path / "adapter")
    )
    torch.testing.assert_close(logits(again.eval()), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_dora_trains_on_a_quantized_base(quantization: str) -> None:
    """DoRA on bitsandbytes layers (peft dequantizes for the weight norm): gradients reach the
    magnitudes and the adapters."""
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain.model import lora
    from xtrain.tasks.validation import check_variants

    if quantization == "4bit":
        quant = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
    else:
        quant = BitsAndBytesConfig(load_in_8bit=True)
    model = AutoModelForCausalLM.from_pretrained(original_base(), quantization_config=quant, device_map="cpu")
    cfg = TrainConfig()
    cfg.lora.use_dora, cfg.model.quantization = True, quantization
    check_variants(cfg)
    model = lora.apply_lora(model, cfg.lora, "CAUSAL_LM")
    ids = torch.arange(3, 19).reshape(2, 8)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    assert any("lora_magnitude_vector" in n for n in grads) and any("lora_B" in n for n in grads)
