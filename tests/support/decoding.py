"""The decode loop's tests' model (tests/test_decoding.py, tests/gpu/test_decoding_gpu.py): the
built-in tiny llama with random LoRA weights on q/v, and left-padded prompts of different
lengths."""

from __future__ import annotations

from typing import Any

import torch

PROMPTS = ["question: where did tom play with the cat? answer: ", "question: who? answer: ", "hi"]


def lora_lm(tmp_path_factory: Any, device: str = "cpu") -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """(peft model in eval mode, tokenizer, [3, P] left-padded prompt ids, their mask) on ``device``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from support.jobs import session_builtin

    folder = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora)
    enc = [tok(p)["input_ids"] for p in PROMPTS]
    width, pad = max(map(len, enc)), tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
    return model.eval(), tok, ids, mask
