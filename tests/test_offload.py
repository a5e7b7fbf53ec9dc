"""Activation offloading (xtrain/model/offload.py) and the settings of the memory levers: on the CPU
the offloaded run's gradients are bit for bit the plain run's, weights never move, gradient
checkpointing leaves only its checkpoints to move; where either lever cannot work the plan says so
in one line. Through the real loop: tests/test_gradients.py."""

from __future__ import annotations

import pytest
import torch

from xtrain.errors import XtrainError
from xtrain.model.offload import ActivationOffload
from xtrain.planning.resolve import resolve, run_settings
from xtrain.tasks.validation import load_config


def _model(checkpointing: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))
    model.train()
    return model


def _step(model, seed: int = 3) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)  # the same dropout draws
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_offloaded_gradients_are_bitwise_the_plain_ones(checkpointing):
    model = _model(checkpointing)
    plain = _step(model)
    offload = ActivationOffload(model).attach()
    packed: list[torch.Tensor] = []
    pack = offload._pack
    offload._pack = lambda t: packed.append(t) or pack(t)  # every tensor autograd saved
    moved = _step(model)
    assert offload.moved > 0 and not offload.active  # the hooks ended with the forward
    assert plain.keys() == moved.keys() and plain
    for name, grad in plain.items():
        assert torch.equal(moved[name], grad), name
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    stayed = [t for t in packed if t.untyped_storage().data_ptr() in weights]
    assert stayed, "the frozen weights autograd saved (a Linear keeps its weight for the input's gradient)"
    offload.detach()
    assert torch.equal(_step(model)[next(iter(plain))], plain[next(iter(plain))])


def test_under_checkpointing_only_the_checkpoints_move():
    """Each checkpointed layer keeps its input (moved); what it saves inside is recomputed."""
    moved = {}
    for checkpointing in (False, True):
        model = _model(checkpointing)
        offload = ActivationOffload(model).attach()
        _step(model)
        moved[checkpointing] = offload.moved
    layer_input = 2 * 40 * 32 * 4  # batch x tokens x hidden, float32
    assert moved[True] < moved[False] / 3
    assert moved[True] >= 3 * layer_input  # the three layers' inputs at least


def _settings(machine: str, *overrides: str, facts=None):
    from conftest import load_machine

    cfg = load_config(None, ["model.task=causal-lm", "model.name_or_path=builtin:tiny-llama", *overrides])
    plan = resolve(cfg, facts=load_machine(machine)).plan
    return run_settings(cfg, plan, 1)


def test_the_settings_decide_the_levers_or_refuse_them_in_one_line():
    s = _settings("linux-1xh100")
    assert s.chunked_loss == "auto" and not s.activation_offload
    assert s.loss_for("next-token") == (True, s.loss_for("next-token")[1])
    assert s.loss_for(None)[0] is False
    assert s.loss_for("next-token", "its config sets output_router_logits")[0] is False
    on = _settings("linux-1xh100", "model.chunked_loss=on", "model.activation_offload=true")
    assert on.activation_offload
    with pytest.raises(XtrainError, match="output_router_logits"):
        on.loss_for("next-token", "its config sets output_router_logits")
    compiled = _settings("linux-cpu", "run.compile=true")
    assert compiled.chunked_loss == "off" and "run.compile" in compiled.loss_why
    with pytest.raises(XtrainError, match="model.chunked_loss=on does not run under run.compile"):
        _settings("linux-cpu", "run.compile=true", "model.chunked_loss=on")
    with pytest.raises(XtrainError, match="model.activation_offload does not run under run.compile"):
        _settings("linux-cpu", "run.compile=true", "model.activation_offload=true")
    with pytest.raises(XtrainError, match="Apple's GPU already uses it"):
        _settings("macos-arm64", "model.activation_offload=true")


def test_the_chunked_loss_is_refused_for_tasks_without_a_vocabulary():
    with pytest.raises(XtrainError, match="model.chunked_loss is for tasks"):
        load_config(None, ["model.task=seq-cls", "model.chunked_loss=on"])
    with pytest.raises(XtrainError, match="custom's loss is not a cross-entropy over a vocabulary"):
        load_config(None, ["model.task=custom", "model.custom=a:b", "model.chunked_loss=on"])
