"""The model families ``xtrain export --to gguf`` writes, and what each needs in a GGUF file: the
llama.cpp architecture, its hyperparameter keys, and how a transformers weight becomes a GGUF one.
The facts come from llama.cpp's own converter (``convert_hf_to_gguf.py``: its ``LlamaModel``,
``Qwen2Model``, ``Gemma2Model``, ``Phi3MiniModel``) and are checked against transformers' GGUF
reader (``modeling_gguf_pytorch_utils.py``), which undoes each of them:

- Llama and Mistral (llama.cpp's ``llama`` architecture): rotary embeddings on interleaved
  pairs, so the q and k projections' rows are permuted from transformers' half-split layout
  (``permute_rotary``); Llama 3.1's rope scaling becomes a ``rope_freqs`` tensor (the ratio of
  the plain to the scaled inverse frequencies, as transformers computes them).
- Qwen2/2.5: neox-style rotary (no permutation); q/k/v carry biases, which the tensor map names.
- Gemma 2: ``1 + weight`` in every RMSNorm, so the norm weights are written plus one; the
  embedding scale (sqrt(hidden)) is applied by llama.cpp's graph as by transformers', so the
  weights stay; attention and final logit soft-capping and the sliding window are keys.
- Phi-3: fused ``qkv_proj`` and ``gate_up_proj`` are written as they are (``attn_qkv``,
  ``ffn_up``); long-context rope (``longrope``) becomes two factor tensors and an attention factor.

Everything here is a pure function of the model's config (plain data in, plain data out), so it
is tested without writing a file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class Family:
    """One family: the transformers ``model_type``s it covers and how they map onto llama.cpp."""

    name: str  # what users call it, in refusals and docs
    model_types: tuple[str, ...]
    arch: str  # gguf.MODEL_ARCH member name: LLAMA, QWEN2, GEMMA2, PHI3
    permute_qk: bool = False  # llama.cpp's non-neox rotary layout
    norm_plus_one: bool = False  # Gemma's RMSNorm multiplies by (1 + weight)
    extra: Callable[[PretrainedConfig], list[tuple[str, Any]]] = field(default=lambda config: [])


def _get(config: PretrainedConfig, name: str, default: Any = None) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def rope(config: PretrainedConfig) -> dict[str, Any]:
    """The config's rope settings as one dict (transformers 5 ``rope_parameters``; older configs
    ``rope_scaling`` + ``rope_theta``)."""
    found = dict(_get(config, "rope_parameters", None) or _get(config, "rope_scaling", None) or {})
    found.setdefault("rope_theta", _get(config, "rope_theta", 10000.0))
    kind = found.get("rope_type", found.get("type", "default"))
    found["rope_type"] = str(kind).lower()
    return found


def head_dim(config: PretrainedConfig) -> int:
    return int(_get(config, "head_dim", 0) or config.hidden_size // config.num_attention_heads)


def _gemma2(config: PretrainedConfig) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [
        ("add_key_length", head_dim(config)),
        ("add_value_length", head_dim(config)),
    ]
    if _get(config, "attn_logit_softcapping") is not None:
        out.append(("add_attn_logit_softcapping", float(config.attn_logit_softcapping)))
    if _get(config, "final_logit_softcapping") is not None:
        out.append(("add_final_logit_softcapping", float(config.final_logit_softcapping)))
    if _get(config, "sliding_window") is not None:
        out.append(("add_sliding_window", int(config.sliding_window)))
    return out


def _phi3(config: PretrainedConfig) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("add_sliding_window", int(_get(config, "sliding_window", 0)))]
    original = _get(config, "original_max_position_embeddings")
    if original is not None:
        out.append(("add_rope_scaling_orig_ctx_len", int(original)))
    return out


FAMILIES = (
    Family("Llama", ("llama",), "LLAMA", permute_qk=True),
    Family("Mistral", ("mistral",), "LLAMA", permute_qk=True),  # llama.cpp runs Mistral as llama
    Family("Qwen2/2.5", ("qwen2",), "QWEN2"),
    Family("Gemma 2", ("gemma2",), "GEMMA2", norm_plus_one=True, extra=_gemma2),
    Family("Phi-3", ("phi3",), "PHI3", extra=_phi3),
)


def supported() -> str:
    return ", ".join(f.name for f in FAMILIES)


def family_of(config: PretrainedConfig) -> Family:
    """The family of a model config; any other is refused in one line naming the supported ones."""
    model_type = _get(config, "model_type", "")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    vision = _get(config, "vision_config") is not None
    what = "a vision-language model" if vision else f"a {model_type or 'model of unknown type'}"
    raise XtrainError(
        f"GGUF export writes {supported()} models; this is {what}",
        "export it with --to merged (safetensors): Ollama imports those for more families",
    )


def hyperparameters(config: PretrainedConfig, family: Family) -> list[tuple[str, Any]]:
    """The ``GGUFWriter.add_*`` calls (method name, value) of the model's hyperparameters."""
    heads = int(config.num_attention_heads)
    kv = int(_get(config, "num_key_value_heads", heads))
    dim = head_dim(config)
    partial = float(_get(config, "partial_rotary_factor", 1.0))
    out: list[tuple[str, Any]] = [
        ("add_context_length", int(config.max_position_embeddings)),
        ("add_embedding_length", int(config.hidden_size)),
        ("add_block_count", int(config.num_hidden_layers)),
        ("add_feed_forward_length", int(config.intermediate_size)),
        ("add_head_count", heads),
        ("add_head_count_kv", kv),
        ("add_layer_norm_rms_eps", float(config.rms_norm_eps)),
        ("add_rope_freq_base", float(rope(config)["rope_theta"])),
        ("add_rope_dimension_count", int(dim * partial)),
        ("add_vocab_size", int(config.vocab_size)),
    ]
    if dim != config.hidden_size // heads and family.arch != "GEMMA2":
        out += [("add_key_length", dim), ("add_value_length", dim)]
    out += rope_scaling(config, family)
    return out + family.extra(config)


# rope types llama.cpp reads from keys (linear) or extra tensors (llama3, longrope)
_ROPE_TENSORS = {"llama3": ("LLAMA",), "longrope": ("PHI3",), "su": ("PHI3",)}


def rope_scaling(config: PretrainedConfig, family: Family) -> list[tuple[str, Any]]:
    """The rope scaling keys; a scaling this export cannot write is refused in one line."""
    found = rope(config)
    kind = found["rope_type"]
    if kind == "default":
        return []
    if kind == "linear":
        import gguf

        return [
            ("add_rope_scaling_type", gguf.RopeScalingType.LINEAR),
            ("add_rope_scaling_factor", float(found["factor"])),
        ]
    if family.arch in _ROPE_TENSORS.get(kind, ()):
        if kind == "llama3":
            return []  # rope_freqs carries it (rope_tensors)
        scale = config.max_position_embeddings / config.original_max_position_embeddings
        factor = math.sqrt(1 + math.log(scale) / math.log(config.original_max_position_embeddings))
        return [("add_rope_scaling_attn_factors", factor if scale > 1.0 else 1.0)]
    raise XtrainError(
        f"GGUF export does not write {family.name} models with '{kind}' rope scaling",
        "export it with --to merged (safetensors); llama.cpp's own converter may take it",
    )


def rope_tensors(config: PretrainedConfig, family: Family) -> dict[str, Any]:
    """Extra float32 tensors (GGUF name -> numpy array) that carry the rope scaling."""
    import numpy as np

    found = rope(config)
    kind = found["rope_type"]
    if kind == "llama3" and family.arch == "LLAMA":
        import torch
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        dim = head_dim(config)
        theta = float(found["rope_theta"])
        plain = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
        return {"rope_freqs.weight": (plain / scaled.float()).numpy().astype(np.float32)}
    if kind in ("longrope", "su") and family.arch == "PHI3":
        return {
            "rope_factors_long.weight": np.asarray(found["long_factor"], dtype=np.float32),
            "rope_factors_short.weight": np.asarray(found["short_factor"], dtype=np.float32),
        }
    return {}


def permute_rotary(weight: Tensor, heads: int) -> Tensor:
    """transformers' rotary layout (each head's first half, then its second) -> llama.cpp's
    interleaved pairs, for the rows of a q or k projection (weight or bias) of ``heads`` heads."""
    shape = weight.shape
    return weight.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def convert_tensor(name: str, weight: Tensor, config: PretrainedConfig, family: Family) -> Tensor:
    """One transformers weight (a float32 numpy array) as llama.cpp expects it."""
    if family.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
        return permute_rotary(weight, int(config.num_attention_heads))
    if family.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
        heads = int(_get(config, "num_key_value_heads", config.num_attention_heads))
        return permute_rotary(weight, heads)
    if family.norm_plus_one and name.endswith("norm.weight"):
        return weight + 1
    return weight


def skipped(name: str, config: PretrainedConfig) -> bool:
    """Weights a GGUF does not hold: a head tied to the embeddings, rotary caches."""
    if name == "lm_head.weight" and bool(_get(config, "tie_word_embeddings", False)):
        return True
    return name.endswith("rotary_emb.inv_freq")
