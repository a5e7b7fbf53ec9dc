"""docs/fitting-big-models.md's table is xtrain's own estimate: the published config.json values of
Qwen2-VL-2B/7B-Instruct and Qwen2.5-7B/14B-Instruct, sized on the meta device by
``offline_sizes`` (as ``xtrain train --dry-run`` does) and estimated by
``memory.check_memory`` for one RTX 4090 under each option. ``python tests/test_memory_fitting.py``
prints the table; the test checks that the page holds exactly it."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "fitting-big-models.md"
CARD_GIB = 24564 / 1024  # what torch reports for an RTX 4090
CARD = "RTX 4090 (24 GB)"
PER_DEVICE, MAX_LENGTH, PRECISION = 1, 1024, "fp16"  # the 4090 plan's fp16 autocast

_QWEN2 = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0, torch_dtype="bfloat16")
_VISION = dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, in_chans=3, patch_size=14,
               spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
_MROPE = {"type": "mrope", "mrope_section": [16, 24, 24]}
# (name, task, config.json as published on the Hugging Face hub: the keys that size the model)
MODELS = [
    ("Qwen2-VL-2B-Instruct", "vision-language", dict(
        _QWEN2, architectures=["Qwen2VLForConditionalGeneration"], model_type="qwen2_vl",
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_scaling=_MROPE,
        max_position_embeddings=32768, vision_config=dict(_VISION, hidden_size=1536))),
    ("Qwen2-VL-7B-Instruct", "vision-language", dict(
        _QWEN2, architectures=["Qwen2VLForConditionalGeneration"], model_type="qwen2_vl",
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, rope_scaling=_MROPE,
        max_position_embeddings=32768, vision_config=dict(_VISION, hidden_size=3584))),
    ("Qwen2.5-7B-Instruct", "causal-lm", dict(
        _QWEN2, architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584,
        intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        vocab_size=152064, tie_word_embeddings=False, max_position_embeddings=32768)),
    ("Qwen2.5-14B-Instruct", "causal-lm", dict(
        _QWEN2, architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=5120,
        intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
        vocab_size=152064, tie_word_embeddings=False, max_position_embeddings=32768)),
]  # fmt: skip
# (column, model.quantization, model.gradient_checkpointing)
OPTIONS = [
    ("16-bit LoRA", None, False),
    ("16-bit LoRA + checkpointing", None, True),
    ("4-bit QLoRA", "4bit", False),
    ("4-bit QLoRA + checkpointing", "4bit", True),
    ("8-bit LoRA", "8bit", False),
    ("8-bit LoRA + checkpointing", "8bit", True),
]


def table(folder: Path) -> str:
    """The page's table, computed: a row a model, a column an option (GiB a process; over the
    card in bold with "over", above 90 % of it "tight"). Quantized, the vision-language task
    keeps its vision tower and projector as they are (``Task.unquantized``). The loss is the
    default's (``model.chunked_loss=auto``: the chunked loss for these tasks)."""
    from xtrain.model import memory
    from xtrain.tasks.sizes import offline_sizes
    from xtrain.tasks.validation import load_config

    chunked = memory.MemoryLevers(chunked=True)
    rows = []
    for name, task, config in MODELS:
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps(config), encoding="utf-8")
        base = [f"model.name_or_path={(folder / name).as_posix()}", f"model.task={task}"]
        sizes = offline_sizes(load_config(None, base))
        assert not isinstance(sizes, str), sizes
        cells = [name, f"{sizes.params / 1e9:.2f}B"]  # LoRA adapters included
        for _, quantization, checkpointing in OPTIONS:
            gib = memory.check_memory(replace(sizes, quantization=quantization), PER_DEVICE, MAX_LENGTH,
                                      checkpointing, PRECISION, CARD_GIB, CARD,
                                      levers=chunked).estimate_gib  # fmt: skip
            tight = gib > memory.TIGHT * CARD_GIB  # the plan says "tight" above 90 % of the card
            cell = f"{gib:.1f} tight" if tight else f"{gib:.1f}"
            cells.append(f"**{gib:.1f}** over" if gib > CARD_GIB else cell)
        rows.append(cells)
    head = ["model", "parameters (with LoRA)", *(label for label, _, _ in OPTIONS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def test_the_page_holds_the_estimate_of_each_published_model(private_caches, tmp_path):
    want = table(tmp_path)
    page = PAGE.read_text(encoding="utf-8")
    assert want in page, f"docs/fitting-big-models.md's table should read:\n{want}"


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as folder:
        sys.stdout.write(table(Path(folder)) + "\n")
