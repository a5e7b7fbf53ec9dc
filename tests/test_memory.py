"""The memory estimate: the pure rules (Qwen2-VL 2B/7B on a 24 GiB RTX 4090), the sizes read from a
config on the meta device (equal to the built model's), the training loop's check with the card's
memory injected, and the train plan on saved machine snapshots (estimate; warning on a tiny GPU)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from xtrain.model import memory
from xtrain.tasks.validation import load_config

RTX_4090_GIB = 24564 / 1024  # what torch reports for a 4090 (the 2x4090 snapshots)


def _qwen2_vl(hidden: int, intermediate: int, vocab: int) -> SimpleNamespace:
    """A Qwen2-VL-style config: the language model under text_config (what model_shape reads)."""
    text = SimpleNamespace(
        hidden_size=hidden,
        num_hidden_layers=28,
        intermediate_size=intermediate,
        hidden_act="silu",
        vocab_size=vocab,
    )
    return SimpleNamespace(text_config=text, vision_config=SimpleNamespace(depth=32, embed_dim=1280))


# Qwen2-VL-2B/7B-Instruct: the parameters as published (2.21B, 8.29B: the meta-device count of
# their configs gives the same, see test_offline_sizes_of_a_downloaded_config_need_no_weights) plus
# LoRA r=16 on every projection of the language model (trained)
LORA = {"2b": 18_464_768, "7b": 40_370_176}
QWEN2_VL = {
    "2b": memory.ModelSizes(
        2_208_985_600 + LORA["2b"], LORA["2b"], memory.model_shape(_qwen2_vl(1536, 8960, 151936)), 2
    ),
    "7b": memory.ModelSizes(
        8_291_375_616 + LORA["7b"], LORA["7b"], memory.model_shape(_qwen2_vl(3584, 18944, 152064)), 2
    ),
}


def test_qwen2_vl_7b_without_checkpointing_does_not_fit_a_4090_and_2b_with_it_does():
    check = memory.check_memory(QWEN2_VL["7b"], 1, 1024, False, "bf16", RTX_4090_GIB, "RTX 4090", images=True)
    assert check.estimate_gib > RTX_4090_GIB and check.warning
    assert "RTX 4090 (24 GiB)" in check.warning and "\n" not in check.warning
    # it names what the config does not do yet: bf16 weights and per_device 1 are there already
    assert "model.gradient_checkpointing=true" in check.warning and "model.dtype" not in check.warning
    assert "batch.per_device" not in check.warning and "data.max_pixels / data.max_length" in check.warning
    with_ckpt = memory.check_memory(QWEN2_VL["7b"], 1, 1024, True, "bf16", RTX_4090_GIB, "RTX 4090")
    assert 16 < with_ckpt.estimate_gib < RTX_4090_GIB and with_ckpt.warning is None  # tight, fits
    small = memory.check_memory(QWEN2_VL["2b"], 1, 1024, True, "bf16", RTX_4090_GIB, "RTX 4090")
    assert small.warning is None and small.estimate_gib < 10
    assert "GiB a process (estimate; RTX 4090: 24 GiB)" in small.summary()
    # float32 weights: 7B does not fit even with checkpointing, and the warning says bf16
    fp32 = memory.ModelSizes(*[getattr(QWEN2_VL["7b"], f) for f in ("params", "trainable", "shape")], 4)
    warning = memory.check_memory(fp32, 2, 1024, True, "no", RTX_4090_GIB, "RTX 4090").warning
    assert warning and "bf16/fp16 (model.dtype)" in warning and "batch.per_device=1" in warning


def test_model_shape_reads_vlm_encoder_decoder_and_gpt2_configs():
    assert memory.model_shape(_qwen2_vl(3584, 18944, 152064)) == memory.Shape(3584, 28, 18944, 152064)
    gelu = SimpleNamespace(hidden_size=768, num_hidden_layers=12, intermediate_size=3072, hidden_act="gelu")
    assert memory.model_shape(gelu) == memory.Shape(768, 12, None, 0)  # not gated: the 34 x hidden rule
    whisper = SimpleNamespace(
        d_model=512, encoder_layers=6, decoder_layers=6, num_hidden_layers=6, vocab_size=51865
    )
    assert memory.model_shape(whisper) == memory.Shape(512, 12, None, 51865)
    ved = SimpleNamespace(
        encoder=SimpleNamespace(hidden_size=384, num_hidden_layers=12),
        decoder=SimpleNamespace(d_model=256, decoder_layers=6, vocab_size=64044),
    )
    assert memory.model_shape(ved) == memory.Shape(384, 18, None, 64044)
    assert memory.model_shape(SimpleNamespace(n_embd=768, n_layer=12)) == memory.Shape(768, 12)
    assert memory.model_shape(SimpleNamespace(foo=1)) is None


def test_weight_and_activation_bytes_and_the_smallest_planned_gpu():
    assert memory.weight_bytes("auto", "torch.bfloat16") == 2 and memory.weight_bytes("auto", "None") == 4
    assert memory.weight_bytes("float32", "bfloat16") == 4 and memory.weight_bytes("float16", None) == 2
    assert memory.activation_bytes("bf16", 4) == 2 and memory.activation_bytes("no", 4) == 4
    gpus = [(0, "A6000", 49140), (1, "RTX 4090", 24564)]
    assert memory.smallest_gpu(gpus, None) == ("RTX 4090", 24564 / 1024)
    assert memory.smallest_gpu(gpus, [0]) == ("A6000", 49140 / 1024)
    assert memory.smallest_gpu([(0, "unknown", 0)], None) is None


# ---------------------------------------------------------------------------------------------
# Sizes from a model (transformers, torch: small models only)


@pytest.fixture
def caches(private_caches, monkeypatch):
    # conftest's session cache: the built-in models are built once for every module
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_offline_sizes_equal_the_built_model_and_the_run_time_check_warns(caches, tmp_path):
    from support.workloads import build_workload

    from xtrain.builtin import vision_language as builtin_vl
    from xtrain.tasks.sizes import check_live_model, live_sizes, offline_sizes

    root = tmp_path / "vqa"
    (root / "img").mkdir(parents=True)
    rng = random.Random(0)
    builtin_vl.draw_shape("circle", "red", rng).save(root / "img" / "0.png")
    row = builtin_vl.conversation("img/0.png", "circle", "red", rng)
    (root / "train.jsonl").write_text(json.dumps(row) + "\n")
    cfg = load_config(
        None,
        [
            "model.name_or_path=builtin:tiny-qwen2-vl",
            "model.task=vision-language",
            "lora.projector=true",
            f"data.train={root / 'train.jsonl'}",
            "data.eval=null",
            "data.max_length=64",
            "batch.per_device=2",
        ],
    )
    planned = offline_sizes(cfg)  # before any weight exists: the meta device
    model = build_workload(cfg).model
    assert planned == live_sizes(model, cfg=cfg)  # exact: LoRA, the projector copy, the stacks as they train
    # the loop's decision on CUDA, with the card's memory injected
    assert check_live_model(model, cfg, "bf16", 24 * memory.GIB, "RTX 4090").warning is None
    tiny = check_live_model(model, cfg, "bf16", 2**20, "a 1 MiB card")
    assert tiny.warning and "a 1 MiB card" in tiny.warning and tiny.estimate_gib > 2**20 / memory.GIB


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", "data.train=builtin:tiny-stories"],
        ["model.name_or_path=builtin:tiny-bert", "model.task=seq-cls", "data.train=builtin:sentiment"],
        [
            "model.name_or_path=builtin:tiny-qwen2-vl",
            "model.task=vision-language",
            "data.train=builtin:shapes-vqa",
            "lora.vision_blocks=true",
        ],
        [
            "model.name_or_path=builtin:tiny-qwen2-vl",
            "model.task=vision-language",
            "data.train=builtin:shapes-vqa",
            "lora.enabled=false",
        ],
    ],  # fmt: skip
    ids=["causal-lm", "seq-cls-head", "vlm-vision-blocks", "vlm-full"],
)
def test_offline_counts_are_the_built_models_for_each_task(caches, overrides):
    """LoRA counted without peft on the task's own targets equals peft's model (the heads kept
    whole for seq-cls, adapters in the vision blocks, a full fine-tune without the vision tower)."""
    from support.workloads import build_workload

    from xtrain.tasks.sizes import live_sizes, offline_sizes

    cfg = load_config(None, [*overrides, "data.eval=null", "data.max_length=32"])
    assert offline_sizes(cfg) == live_sizes(build_workload(cfg).model, cfg=cfg)


def test_the_recipe_notes_the_warning_on_a_cuda_card_and_says_nothing_on_the_cpu(monkeypatch):
    """``Recipe._check_memory`` as the loop calls it after ``prepare``, the card's memory injected
    (CUDA itself is not needed: the device is only compared and passed to the properties call)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.train.levers import Levers
    from xtrain.train.loop import Recipe
    from xtrain.train.report import ListReporter

    model = LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=2, vocab_size=100)
    )  # fmt: skip
    cards = {"tiny": SimpleNamespace(total_memory=2**20, name="a 1 MiB card"),
             "big": SimpleNamespace(total_memory=24 * memory.GIB, name="RTX 4090")}  # fmt: skip
    cfg = load_config(None, ["model.task=causal-lm", "batch.per_device=2", "data.max_length=128"])
    for card, warns in (("tiny", True), ("big", False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, c=cards[card]: c)
        rep = ListReporter()
        recipe = SimpleNamespace(device=torch.device("cuda", 0), cfg=cfg, settings=SimpleNamespace(
            precision="bf16", sequence=1), rep=rep, levers=Levers())  # fmt: skip
        check = Recipe._check_memory(recipe, model)
        assert check is not None and check.estimate_gib > 0
        notes = [m for kind, m in rep.events if kind == "note"]
        assert (notes == [check.warning] and "a 1 MiB card" in notes[0]) if warns else notes == []
        assert not warns or "max_pixels" not in notes[0]  # a text model: no image setting to lower
    cpu = SimpleNamespace(device=torch.device("cpu"), cfg=cfg, settings=None, rep=ListReporter())
    assert Recipe._check_memory(cpu, model) is None and cpu.rep.events == []


def test_offline_sizes_of_a_downloaded_config_need_no_weights(caches, tmp_path):
    from transformers import Qwen2VLConfig

    from xtrain.tasks.sizes import offline_sizes

    text = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})  # fmt: skip
    vision = dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4)
    # Qwen2-VL-2B-Instruct's config.json, nothing else
    config = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, dtype="bfloat16")
    config.save_pretrained(tmp_path / "qwen2-vl-2b")
    base = ["model.task=vision-language", "lora.r=16"]
    sizes = offline_sizes(load_config(None, [f"model.name_or_path={tmp_path / 'qwen2-vl-2b'}", *base]))
    counts = replace(sizes, stacks=(), head_trains=False, lora_rank=0, lora_dropout=False)
    assert counts == QWEN2_VL["2b"]  # 2.21B as published, the LoRA count, bf16 from the config
    missing = offline_sizes(load_config(None, ["model.name_or_path=nobody/not-downloaded", *base]))
    assert missing == "nobody/not-downloaded is not downloaded yet"  # no download was tried


def test_a_flat_hub_config_ties_the_head_from_its_top_level(caches, tmp_path):
    """Qwen2-VL-2B-Instruct's config.json as published: flat, ``tie_word_embeddings`` at the top
    level only (the text config has no such key); the head is counted once."""
    import json

    from xtrain.tasks.sizes import offline_sizes

    flat = {
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {
            "depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16, "mlp_ratio": 4,
        },
    }  # fmt: skip
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "config.json").write_text(json.dumps(flat))
    base = ["model.task=vision-language", "lora.r=16"]
    sizes = offline_sizes(load_config(None, [f"model.name_or_path={tmp_path / 'flat'}", *base]))
    assert sizes.params == QWEN2_VL["2b"].params  # 2.21B: not 2.46B (the head twice)


# ---------------------------------------------------------------------------------------------
# The train plan (xtrain train --dry-run --facts SNAPSHOT)


def _plan(tmp_path: Path, facts: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    from xtrain.cli import main

    config = tmp_path / "vlm.yaml"
    config.write_text(
        "model:\n  name_or_path: builtin:tiny-qwen2-vl\n  task: vision-language\n"
        "data:\n  train: builtin:shapes-vqa\n  max_length: 64\nbatch:\n  per_device: 4\n"
    )
    assert main(["train", str(config), *overrides, "--dry-run", "--facts", str(facts)]) == 0
    return capsys.readouterr().out


def test_plan_on_two_4090s_shows_the_estimate_and_a_tiny_gpu_warns(caches, machines_dir, tmp_path, capsys):
    out = _plan(tmp_path, machines_dir / "wsl2-2x4090.json", capsys)
    lines = out.splitlines()
    assert lines[0].startswith("Plan: 2 processes, on cuda [0, 1]")
    # under the plan: the precision and why, the loaders, the attention kernels, the loss, the estimate
    heads = ["Precision", "Data loading", "Attention", "Loss", "Memory"]
    assert [line.split(":")[0] for line in lines[1:6]] == heads
    assert lines[4] == ("Loss: chunked cross-entropy over the trained tokens (model.chunked_loss=auto: the "
                        "task's loss is a cross-entropy over the vocabulary)")  # fmt: skip
    assert lines[5].startswith("Memory: ~") and "(estimate; NVIDIA GeForce RTX 4090: 24 GiB)" in lines[5]
    assert "warning" not in out
    small = json.loads((machines_dir / "wsl2-2x4090.json").read_text())
    for gpu in small["gpus"]:
        gpu["memory_mib"] = 1  # a 1 MiB card: the tiny model does not fit
    (tmp_path / "tiny-gpu.json").write_text(json.dumps(small))
    out = " ".join(_plan(tmp_path, tmp_path / "tiny-gpu.json", capsys).split())
    assert (
        "warning: the estimated training memory" in out and "exceeds NVIDIA GeForce RTX 4090 (1 MiB)" in out
    )
    # no CUDA in the plan (a CPU machine): no estimate, and transformers is not needed for it
    assert "Memory:" not in _plan(tmp_path, machines_dir / "linux-cpu.json", capsys)
    # the levers as the config sets them: the plain loss, offloaded activations in host memory
    out = _plan(tmp_path, machines_dir / "wsl2-2x4090.json", capsys, "model.chunked_loss=off",
                "model.activation_offload=true")  # fmt: skip
    lines = out.splitlines()
    assert lines[4] == "Loss: the model's own, every position (model.chunked_loss=off)"
    assert lines[5] == "Activations: saved for the backward pass in host memory (model.activation_offload)"
    assert lines[6].startswith("Memory: ~") and lines[6].endswith("of activations in host memory")


def test_facts_need_a_dry_run(tmp_path, machines_dir, capsys):
    from xtrain.cli import main

    config = tmp_path / "job.yaml"
    config.write_text("model:\n  name_or_path: builtin:tiny-llama\n")
    assert main(["train", str(config), "--facts", str(machines_dir / "linux-cpu.json")]) == 2
    assert "add --dry-run" in capsys.readouterr().err


def test_a_plan_without_cuda_makes_no_estimate_and_imports_no_peft(machines_dir):
    """No memory estimate on a CPU plan: peft stays out. (The data check reads the data with
    datasets and tokenizes its first rows: those two are imported; the dry run's LoRA line builds
    the model's skeleton on the meta device with transformers, issue 60.)"""
    import subprocess
    import sys

    from support.jobs import REPO

    code = (
        "import contextlib, io, sys, xtrain.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = xtrain.cli.main(['train', 'examples/seq-cls.yaml', '--dry-run', '--facts', "
        f"{str(machines_dir / 'linux-cpu.json')!r}])\n"
        "print(code, [m for m in ('transformers', 'peft', 'datasets') if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert r.stdout.strip() == "0 ['transformers', 'datasets']"


# -- the memory levers: the chunked loss, activation offloading ----------------------------------------
def test_the_levers_in_the_estimate_and_in_the_warnings_order_of_cost():
    """Qwen2.5-7B-shaped LoRA, 2048 tokens, fp16 on a 24 GiB card: the chunked loss leaves one
    chunk of logits, offloading moves the activations to host memory (held against its RAM), and
    the warning offers the levers cheapest first."""
    shape = memory.Shape(3584, 28, 18944, 152064)
    sizes = memory.ModelSizes(7_625_709_056, 10_092_544, shape, 2, quantizable=6_525_288_448)
    plain = memory.check_memory(sizes, 1, 2048, False, "fp16", RTX_4090_GIB, "RTX 4090")
    chunked = memory.check_memory(sizes, 1, 2048, False, "fp16", RTX_4090_GIB, "RTX 4090",
                                  levers=memory.MemoryLevers(chunked=True))  # fmt: skip
    logits = 2048 * 152064 * 10 - memory.chunked_logits_bytes(2048, 152064, 3584, 2)
    assert plain.estimate_gib - chunked.estimate_gib == pytest.approx(1.1 * logits / memory.GIB)
    assert memory.chunk_rows(152064) == 220 and memory.chunked_logits_bytes(100, 152064, 3584, 2) < (
        memory.chunked_logits_bytes(2048, 152064, 3584, 2)
    )
    ram = memory.MemoryLevers(chunkable=True, host_gib=64.0, processes=2)
    fits = [names for names, _ in memory.alternatives(sizes, 4, 2048, False, "fp16", RTX_4090_GIB, ram)]
    order = ["model.chunked_loss=auto", "model.gradient_checkpointing=true", "model.activation_offload=true",
             "model.quantization=4bit", "batch.per_device=1"]  # fmt: skip
    for names in fits:  # each set in the order of cost
        ranks = [order.index(n) for n in names.split()]
        assert ranks == sorted(ranks)
    ranked = [max(order.index(n) for n in names.split()) for names in fits]
    assert ranked == sorted(ranked) and fits  # the sets whose costliest change is cheapest first
    moved = memory.MemoryLevers(chunked=True, offload=True, host_gib=64.0)
    offloaded = memory.check_memory(sizes, 1, 2048, False, "fp16", RTX_4090_GIB, "RTX 4090", levers=moved)
    assert offloaded.estimate_gib < chunked.estimate_gib and offloaded.host_gib > 0
    assert offloaded.warning is None and "in host memory" in offloaded.summary()
    # with checkpointing only the checkpoints move: the layer recomputed in the backward stays
    ckpt = memory.check_memory(sizes, 1, 2048, True, "fp16", RTX_4090_GIB, "RTX 4090",
                               levers=memory.MemoryLevers(chunked=True))  # fmt: skip
    ckpt_moved = memory.check_memory(sizes, 1, 2048, True, "fp16", RTX_4090_GIB, "RTX 4090", levers=moved)
    inputs = 2048 * 28 * 2 * 3584  # each layer's input, 16-bit
    recomputed = 2048 * (17 * 3584 + 8 * 18944)
    assert memory.activation_term(2048, 3584, 28, True, 2, 18944, None) == inputs + recomputed
    moved_bytes = inputs * (1 - memory.OFFLOAD_LAYERS / 28)
    assert ckpt.estimate_gib - ckpt_moved.estimate_gib == pytest.approx(1.1 * moved_bytes / memory.GIB)
    assert ckpt_moved.host_gib == pytest.approx(inputs / memory.GIB)
    small = memory.MemoryLevers(chunked=True, offload=True, host_gib=offloaded.host_gib, processes=2)
    short = memory.check_memory(sizes, 1, 2048, False, "fp16", RTX_4090_GIB, "RTX 4090", levers=small)
    assert short.warning and "activations in host memory (2 process(es))" in short.warning
    no_ram = memory.MemoryLevers(chunkable=True)  # the machine's RAM unknown: offloading is not offered
    assert all("offload" not in n for n, _ in memory.alternatives(sizes, 4, 2048, False, "fp16", 24, no_ram))
