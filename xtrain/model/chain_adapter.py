"""A chain of plain LoRA adapters saved as ONE peft adapter on the original base (``adapter-chain/``
beside a chained result's ``adapter/``), for tools that know only peft (``PeftModel.from_pretrained``,
vLLM, llama.cpp's LoRA loading).

Adapters on the same layers add: ``W + s1 B1 A1 + s2 B2 A2 = W + [B1 B2] [s1 A1; s2 A2]``, one LoRA
of rank r1 + r2 whose A rows carry each adapter's scaling and whose own scaling is 1
(``lora_alpha = r``, no rsLoRA: peft's ``add_weighted_adapter(..., "cat")`` does the same but copies
the first adapter's config, so with rsLoRA its scaling would be r / sqrt(r), FIELD_NOTES turn 7). A
layer an adapter does not touch gets zero rows and columns from it. Written from the saved
files alone (exact: no arithmetic but the scaling of A), so it is the chain as its folders hold it.

Not exact, and so not written (``inexact`` says why; the run then saves the merged model instead):
DoRA (its magnitudes do not concatenate), per-layer ranks or alphas, biases or other layer kinds
than plain Linear LoRA (embeddings, ``target_parameters``), adapters of different layouts
(``fan_in_fan_out``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from xtrain.model.start import ADAPTER_CONFIG, ADAPTER_WEIGHTS, Start

FOLDER = "adapter-chain"  # beside the run's adapter/
_A, _B = ".lora_A.weight", ".lora_B.weight"


def _config(path: str) -> dict[str, Any]:
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text(encoding="utf-8"))


def inexact(configs: list[dict[str, Any]]) -> str | None:
    """Why adapters of these peft configs (``adapter_config.json``'s keys, in chain order) do not
    concatenate exactly into one plain LoRA; None when they do."""
    for c in configs:
        kind = str(c.get("peft_type")).rsplit(".", 1)[-1]
        if kind != "LORA":
            return f"a {kind} adapter is not LoRA"
        if c.get("use_dora"):
            return "DoRA's magnitudes do not add up across adapters"
        if c.get("rank_pattern") or c.get("alpha_pattern"):
            return "per-layer ranks or alphas"
        if c.get("lora_bias") or c.get("target_parameters") or c.get("trainable_token_indices"):
            return "LoRA biases, parameter targets or trained tokens"
    kinds = {str(c.get("task_type")).rsplit(".", 1)[-1] for c in configs}  # (peft's enum, or its text)
    if len(kinds) > 1:  # a reward model's head on an SFT adapter
        return "the adapters are of different kinds (peft task types: a causal LM's and a classifier's)"
    if len({bool(c.get("fan_in_fan_out")) for c in configs}) > 1:
        return "the adapters' layouts differ (fan_in_fan_out)"
    return None


def _scaling(config: dict[str, Any]) -> float:
    r, alpha = config["r"], config["lora_alpha"]
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def write(start: Start, folder: Path) -> None:
    """The adapters of ``start`` concatenated into one adapter in ``folder`` (``inexact`` is None):
    adapter_config.json (rank the sum, alpha the same, the adapted layers by their full names)
    and adapter_model.safetensors (modules trained whole copied as they are)."""
    import torch
    from safetensors.torch import load_file, save_file

    configs = [_config(a.path) for a in start.adapters]
    weights = [load_file(str(Path(a.path) / ADAPTER_WEIGHTS)) for a in start.adapters]
    layers = sorted({k[: -len(_A)] for w in weights for k in w if k.endswith(_A)})
    ranks = [c["r"] for c in configs]
    out: dict[str, torch.Tensor] = {}
    for layer in layers:
        parts_a, parts_b = [], []
        some = next(w for w in weights if layer + _A in w)
        (_, fan_in), (fan_out, _) = some[layer + _A].shape, some[layer + _B].shape
        for w, c, r in zip(weights, configs, ranks, strict=True):
            if layer + _A in w:
                parts_a.append(w[layer + _A].float() * _scaling(c))
                parts_b.append(w[layer + _B].float())
            else:  # this adapter leaves the layer alone: zero rows and columns
                parts_a.append(torch.zeros(r, fan_in))
                parts_b.append(torch.zeros(fan_out, r))
        out[layer + _A] = torch.cat(parts_a, 0).contiguous()
        out[layer + _B] = torch.cat(parts_b, 1).contiguous()
    for w in weights:  # modules trained whole (a head, a projector): one adapter holds each
        out.update({k: v.contiguous() for k, v in w.items() if ".lora_" not in k})
    rank = sum(ranks)
    whole = sorted({m for c in configs for m in c.get("modules_to_save") or ()})
    config = {
        **configs[-1],
        "r": rank,
        "lora_alpha": rank,  # scaling 1: each adapter's own is in its rows of A
        "use_rslora": False,
        "target_modules": [layer.removeprefix("base_model.model.") for layer in layers],
        "modules_to_save": whole or None,
        "base_model_name_or_path": configs[-1].get("base_model_name_or_path"),
        "inference_mode": True,
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(out, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
