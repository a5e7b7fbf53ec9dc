"""The memory estimate with 4-bit and 8-bit weights, and the warning that names what fits: the
pure arithmetic (NF4 with double quantization, LLM.int8), the alternatives' order, Qwen2-7B- and
Qwen2.5-14B-shaped models (their published config.json values) in the plan of the Windows 2x4090
snapshot, and the counts of a real 4-bit model on the CPU equal to the plan's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from xtrain.model import lora_layers, memory
from xtrain.tasks.validation import load_config

RTX_4090_GIB = 24564 / 1024
# Qwen2-7B / Qwen2.5-7B and Qwen2.5-14B as published on the Hugging Face hub (config.json)
QWEN2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             torch_dtype="bfloat16", vocab_size=152064, tie_word_embeddings=False)  # fmt: skip
QWEN = {
    "7b": dict(QWEN2, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4),
    "14b": dict(QWEN2, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8),
}  # fmt: skip


def test_nf4_with_double_quantization_and_int8_bytes():
    # QLoRA section 3: 4 bits + 8/64 + 32/(64 x 256) = 4.127 bits a weight
    assert pytest.approx(4.127, abs=5e-4) == memory.NF4_BITS
    assert memory.quantized_bytes(1_000_000, "4bit", 4096) == pytest.approx(515_869, abs=1)
    assert memory.quantized_bytes(4096, "8bit", 4096) == 4096 + 4  # int8 + one float32 scale a row
    shape = memory.Shape(4096, 32, 11008, 32000)
    plain = memory.ModelSizes(7_000_000_000, 20_000_000, shape, 2, quantizable=6_000_000_000)
    gib = {
        q: memory.check_memory(replace(plain, quantization=q), 1, 512, True, "bf16", 80, "H100").estimate_gib
        for q in (None, "8bit", "4bit")
    }
    assert gib["4bit"] < gib["8bit"] < gib[None]
    # the weights alone: 6B quantized + 1B at float32 (peft's prepare_model_for_kbit_training)
    rest = 1_000_000_000 * 4
    weights = {"4bit": 6e9 * memory.NF4_BITS / 8 + rest, "8bit": 6e9 * (1 + 4 / 4096) + rest, None: 7e9 * 2}
    assert gib["8bit"] - gib["4bit"] == pytest.approx(1.1 * (weights["8bit"] - weights["4bit"]) / memory.GIB)
    assert gib[None] - gib["4bit"] == pytest.approx(1.1 * (weights[None] - weights["4bit"]) / memory.GIB)


def test_the_warning_names_the_smallest_changes_that_fit_best_first():
    shape = memory.Shape(3584, 28, 18944, 152064)
    sizes = memory.ModelSizes(7_625_709_056, 10_092_544, shape, 2, quantizable=6_525_288_448)
    # 4 x 2048 tokens without checkpointing: no single change fits, two pairs do
    fits = memory.alternatives(sizes, 4, 2048, False, "fp16", RTX_4090_GIB)
    names = [overrides for overrides, _ in fits]
    # in the order of cost (checkpointing before 4-bit before a smaller micro-batch), fewer changes
    # first; nothing that only adds to a set that fits
    assert names == [
        "model.gradient_checkpointing=true batch.per_device=1",
        "model.quantization=4bit batch.per_device=1",
    ]
    single = memory.alternatives(sizes, 8, 1024, False, "fp16", RTX_4090_GIB)
    assert [n for n, _ in single] == ["batch.per_device=1"]  # fits alone: no pair with it is named
    for a in names:
        assert not any(set(b.split()) < set(a.split()) for b in names), (a, names)
    assert all(gib <= RTX_4090_GIB for _, gib in fits)
    warning = memory.check_memory(sizes, 4, 2048, False, "fp16", RTX_4090_GIB, "RTX 4090").warning
    assert warning.startswith("the estimated training memory") and "\n" not in warning
    assert f"{names[0]} fits (~" in warning and warning.endswith("or lower data.max_length")
    # a full fine-tune (nothing quantizable) is never told to quantize
    full = memory.ModelSizes(sizes.params, sizes.params, shape, 2)
    assert all("quantization" not in n for n, _ in memory.alternatives(full, 4, 1024, False, "fp16", 80))
    # a loaded 4-bit model (its rest in float32, peft's doing) is not told to load 16-bit weights
    loaded = memory.ModelSizes(sizes.params, sizes.trainable, shape, 4, sizes.quantizable, "4bit")
    told = memory.check_memory(loaded, 8, 4096, False, "fp16", RTX_4090_GIB, "RTX 4090").warning
    assert told and "model.dtype" not in told and "model.quantization" not in told
    # nothing fits: the levers as before
    none = memory.check_memory(full, 1, 1024, True, "fp16", 1.0, "a 1 GiB card").warning
    assert none.endswith(": lower data.max_length")


@pytest.fixture
def caches(private_caches, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _plan(tmp_path: Path, machines_dir: Path, capsys, size: str, *overrides: str) -> str:
    from xtrain.cli import main

    folder = tmp_path / f"qwen-{size}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN[size]))  # the config only: no weights
    job = tmp_path / "job.yaml"
    job.write_text(
        f"model:\n  name_or_path: {folder.as_posix()}\n  task: causal-lm\n  gradient_checkpointing: true\n"
        "data:\n  train: builtin:tiny-stories\n  max_length: 1024\nbatch:\n  per_device: 1\n"
    )
    facts = machines_dir / "windows-2x4090.json"
    assert main(["train", str(job), *overrides, "--dry-run", "--facts", str(facts)]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_on_two_4090s_14b_needs_4bit_and_7b_fits_in_16bit(caches, tmp_path, machines_dir, capsys):
    out = _plan(tmp_path, machines_dir, capsys, "14b")
    # 16-bit weights with checkpointing (the chunked loss by default): over the card; the warning
    # says what fits, pasteable
    assert "Memory: ~31.6 GiB a process (estimate; NVIDIA GeForce RTX 4090: 24 GiB)" in out
    assert "warning: the estimated training memory (31.6 GiB a process) exceeds" in out
    assert "model.quantization=4bit fits (~14.8 GiB)" in out
    out = _plan(tmp_path, machines_dir, capsys, "14b", "model.quantization=4bit")
    assert "Memory: ~14.8 GiB a process" in out and "warning" not in out
    out = _plan(tmp_path, machines_dir, capsys, "7b")
    assert "Memory: ~16.5 GiB a process" in out and "warning" not in out
    # the plain loss: 1024 tokens x 152,064 logits x 10 bytes more, less one chunk
    out = _plan(tmp_path, machines_dir, capsys, "7b", "model.chunked_loss=off")
    assert "Memory: ~17.7 GiB a process" in out and "Loss: the model's own, every position" in out


def test_a_real_4bit_model_counts_as_the_plan_does(caches):
    """tiny-llama loaded in 4 bits by transformers + bitsandbytes on the CPU, LoRA by peft on
    xtrain's targets: its live sizes (the 4-bit weights by their unpacked shape) equal the plan's."""
    pytest.importorskip("bitsandbytes")
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from xtrain import builtin
    from xtrain.tasks.sizes import live_sizes, offline_sizes

    cfg = load_config(None, ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm",
                             "model.quantization=4bit", "data.train=builtin:tiny-stories"])  # fmt: skip
    planned = offline_sizes(cfg)
    folder = builtin.ensure_builtin_model("builtin:tiny-llama")
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=nf4, device_map={"": "cpu"})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    targets = lora_layers.find_target_modules(model)
    model = get_peft_model(model, LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, target_modules=targets))
    live = live_sizes(model, cfg=cfg)
    assert live.quantization == planned.quantization == "4bit"
    assert live == planned and live.quantizable == planned.quantizable > 0
    packed = sum(p.numel() for p in model.parameters() if type(p).__name__ == "Params4bit")
    assert packed * 2 == live.quantizable  # two 4-bit weights a byte


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", "data.train=builtin:tiny-stories"],
        [
            "model.name_or_path=builtin:tiny-qwen2-vl",
            "model.task=vision-language",
            "data.train=builtin:shapes-vqa",
        ],
    ],  # fmt: skip
    ids=["causal-lm", "vision-language"],
)
def test_xtrains_own_4bit_build_counts_as_the_plan_does(caches, overrides):
    """The task's quantized load (``model.quantization=4bit``: its skip list, peft's preparation,
    LoRA) has the counts the plan gave from the config: the vision tower stays unquantized."""
    pytest.importorskip("bitsandbytes")
    from support.workloads import build_workload

    from xtrain.tasks.sizes import _unquantized, live_sizes, offline_sizes

    cfg = load_config(None, [*overrides, "model.quantization=4bit", "data.eval=null", "data.max_length=32"])
    planned = offline_sizes(cfg)
    model = build_workload(cfg).model
    live = live_sizes(model, _unquantized(cfg), cfg)
    assert live == planned and live.quantization == "4bit"
    assert live.quantizable == planned.quantizable > 0
    packed = sum(p.numel() for p in model.parameters() if type(p).__name__ == "Params4bit")
    assert packed * 2 == live.quantizable  # exactly the weights bitsandbytes holds in 4 bits


def test_8bit_optimizer_moments_are_what_bitsandbytes_allocates():
    """``optim.name=adamw_8bit``: the estimate's optimizer state equals the bytes of a real
    bitsandbytes ``AdamW8bit`` state after one step on the CPU (two uint8 moments and a float32
    absmax a block of 256 each; float32 moments for a tensor under ``min_8bit_size``)."""
    bnb = pytest.importorskip("bitsandbytes")
    import torch

    sizes = [300 * 256 + 7, 4096, 4095, 64]  # blocks with a partial one, the bounds, a norm
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    optimizer = bnb.optim.AdamW8bit(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    moments = ("state1", "state2", "absmax1", "absmax2")
    state = sum(optimizer.state[p][k].nbytes for p in params for k in moments if k in optimizer.state[p])
    small = sum(n for n in sizes if n < memory.MIN_8BIT_SIZE)
    trainable = sum(sizes)
    # the estimate: the weight and its gradient (8 bytes) plus the moments
    assert memory.trained_bytes(trainable, True, small) - 8 * trainable == pytest.approx(state, abs=8)
    assert memory.trained_bytes(trainable, False) == 16 * trainable


def test_the_plan_counts_8bit_moments_and_the_tensors_too_small_for_them(caches):
    """tiny-llama's default LoRA (r=8 on 64-wide layers: 512-weight matrices) keeps float32
    moments under adamw_8bit; with r=64 the larger matrices get 8-bit ones (the k/v projections'
    lora_B, 32 x 64, stays float32). The estimate drops by the moments saved."""
    from xtrain.tasks.sizes import offline_sizes

    base = ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm"]
    base.append("data.train=builtin:tiny-stories")
    for r in (8, 64):
        plain = offline_sizes(load_config(None, [*base, f"lora.r={r}"]))
        eight = offline_sizes(load_config(None, [*base, f"lora.r={r}", "optim.name=adamw_8bit"]))
        assert (plain.moments_8bit, eight.moments_8bit) == (False, True)
        if r == 8:
            assert eight.small_trainable == eight.trainable
        else:
            assert 0 < eight.small_trainable < eight.trainable
        gib = {s: memory.check_memory(s, 1, 64, False, None, 80, "H100").estimate_gib for s in (plain, eight)}
        saved = (eight.trainable - eight.small_trainable) * (8 - memory.MOMENT_BYTES_8BIT)
        assert gib[plain] - gib[eight] == pytest.approx(1.1 * saved / memory.GIB)
    paged = offline_sizes(load_config(None, [*base, "optim.name=paged_adamw_8bit"]))
    assert paged.moments_8bit
