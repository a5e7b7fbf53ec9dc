"""NEFTune (optim.neftune_alpha): noise on the input embeddings in training mode only, bounded by
alpha/sqrt(L*d); evaluation sees the model as it is; a tiny run trains with it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.workloads import build_workload

from xtrain.errors import XtrainError
from xtrain.model import neftune
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

ALPACA = [{"instruction": f"Repeat {i}.", "input": "", "output": f"{i} {i}"} for i in range(16)]


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def test_training_embeddings_get_bounded_noise_and_eval_is_untouched():
    plain, noisy = _tiny_llama(), _tiny_llama()
    noisy.load_state_dict(plain.state_dict())
    alpha = 5.0
    handle = neftune.attach(noisy, alpha)
    ids = torch.randint(0, 64, (2, 8))
    embed_plain, embed_noisy = plain.get_input_embeddings(), noisy.get_input_embeddings()

    noisy.train()
    clean, shaken = embed_plain(ids), embed_noisy(ids)
    delta = (shaken - clean).abs()
    bound = alpha / (8 * 16) ** 0.5  # L = 8 tokens, d = 16
    assert delta.max() > 0 and delta.max() <= bound + 1e-6
    assert not torch.equal(embed_noisy(ids), shaken)  # fresh noise every forward pass

    plain.eval(), noisy.eval()
    with torch.no_grad():
        assert torch.equal(embed_noisy(ids), clean)
        assert torch.equal(noisy(input_ids=ids).logits, plain(input_ids=ids).logits)
    handle.remove()
    noisy.train()
    assert torch.equal(embed_noisy(ids), clean)  # the handle takes it off again


def test_the_causal_lm_build_attaches_it_to_the_unwrapped_model(tmp_path):
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ALPACA), encoding="utf-8")
    base = ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", f"data.train={data}"]
    workload = build_workload(load_config(None, [*base, "data.eval=null", "optim.neftune_alpha=5"]))
    hooks = workload.model.get_input_embeddings()._forward_hooks.values()
    assert [h.alpha for h in hooks if isinstance(h, neftune.NEFTuneHook)] == [5.0]
    without = build_workload(load_config(None, [*base, "data.eval=null"]))
    assert not without.model.get_input_embeddings()._forward_hooks


def test_the_key_is_checked():
    with pytest.raises(XtrainError, match="optim.neftune_alpha must be a positive number, got -1"):
        load_config(None, ["model.task=causal-lm", "optim.neftune_alpha=-1"])
    with pytest.raises(XtrainError, match="optim.neftune_alpha is for task causal-lm, not seq-cls"):
        load_config(None, ["model.task=seq-cls", "optim.neftune_alpha=5"])


def test_a_tiny_run_trains_with_it(tmp_path):
    """Alpaca rows (prompt/response: no chat template) with NEFTune, end to end in a real process."""
    from support.jobs import adapter_weights, make_job, python_run, run_xtrain

    job = make_job(tmp_path / "job", steps=3)
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ALPACA), encoding="utf-8")
    out = tmp_path / "out"
    args = ("--config", str(job.config), f"data.train={data}", "data.eval=null", "optim.neftune_alpha=5")
    proc = run_xtrain(python_run(*args, f"run.output_dir={out}"), job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "train_result.json").read_text())
    assert result["final_step"] == 3 and all(math.isfinite(loss) for _, loss in result["losses"])
    weights = adapter_weights(out)  # LoRA B starts at zero: non-zero means gradients flowed
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in weights.items())
