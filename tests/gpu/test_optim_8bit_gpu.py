"""bitsandbytes' 8-bit optimizers on CUDA: under fp16 the GradScaler unscales their gradients and
skips their step on overflow (torch/amp/grad_scaler.py: ``unscale_`` walks the optimizer's
param_groups, ``step`` calls ``optimizer.step()`` only without inf/NaN; bitsandbytes' optimizers
declare no ``_step_supports_amp_scaling``, so nothing else is asked of them); LoftQ on a 4-bit
base (peft computes it on CUDA only). Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from support.jobs import make_job, run_xtrain

RUN = [sys.executable, "-m", "xtrain.run"]
bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    return make_job(tmp_path_factory.mktemp("gpu-8bit"), steps=30, save_every=1000)


def train(job, name: str, *overrides: str) -> dict:
    out = job.root / name
    proc = run_xtrain([*RUN, "--config", str(job.config), f"run.output_dir={out}", *overrides], job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "train_result.json").read_text())


@pytest.mark.parametrize(
    ("optimizer", "lora"),
    [("adamw_8bit", "true"), ("paged_adamw_8bit", "true"), ("adamw_8bit", "false")],
)
def test_8bit_optimizer_trains_under_fp16(job, optimizer: str, lora: str) -> None:
    overrides = [f"optim.name={optimizer}", f"lora.enabled={lora}", "run.mixed_precision=fp16"]
    if lora == "false":
        overrides.append("optim.lr=0.0005")
    r = train(job, f"{optimizer}-lora-{lora}", *overrides)
    losses = [v for _, v in r["losses"]]
    assert all(v == v for v in losses) and losses[-1] < losses[0], losses
    assert r["run_info"]["device"].startswith("cuda")
    assert r["run_info"]["skip_check"] == "loss scale"
    assert r["skipped_steps"] < r["total_steps"] // 2


@pytest.mark.parametrize("cls", ["AdamW8bit", "PagedAdamW8bit"])
def test_grad_scaler_skips_a_bnb_step_on_overflow_and_unscales_the_next(cls: str) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 256, device="cuda")  # 65536 values: 8-bit state
    optimizer = getattr(bnb.optim, cls)(layer.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
    x = torch.randn(8, 256, device="cuda")

    def step(scale_input: float) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = (layer(x * scale_input) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # what accelerate's clip_grad_norm_ does first
        scaler.step(optimizer)
        scaler.update()

    before = layer.weight.detach().clone()
    step(1e4)  # fp16 overflow: inf gradients
    assert scaler.get_scale() == 2.0**15  # halved: the step was skipped
    assert torch.equal(layer.weight, before) and len(optimizer.state) == 0  # bnb's step never ran
    step(1.0)
    assert not torch.equal(layer.weight, before)
    assert optimizer.state[layer.weight]["state1"].dtype == torch.uint8  # 8-bit moments
    assert torch.isfinite(layer.weight).all()


def test_loftq_fits_the_adapter_to_a_4bit_base(tmp_path) -> None:
    """init_weights=loftq: A and B start where they cancel part of the quantization error, so
    the adapted 4-bit model is closer to the 16-bit one than plain 4-bit."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain import builtin
    from xtrain.config.schema import TrainConfig
    from xtrain.model import lora
    from xtrain.tasks.validation import check_variants

    folder = str(builtin.ensure_builtin_model("builtin:tiny-llama", tmp_path / "builtin"))
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )

    def four_bit():
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant, device_map={"": 0})
        return model.eval()

    def logits(model) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=torch.arange(3, 19, device="cuda").reshape(2, 8)).logits.float()

    want = logits(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval())
    plain = logits(four_bit())
    cfg = TrainConfig()
    cfg.lora.r, cfg.lora.init_weights, cfg.model.quantization = 8, "loftq", "4bit"
    check_variants(cfg)
    fitted = logits(lora.apply_lora(four_bit(), cfg.lora, "CAUSAL_LM").eval())
    assert (fitted - want).abs().mean() < (plain - want).abs().mean()
