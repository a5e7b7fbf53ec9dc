"""LoRA through peft: ``target_modules: auto`` finds the attention projections of common
architectures; gradient checkpointing is switched on before the adapter is added."""

from __future__ import annotations

from typing import Any

from xtrain.errors import XtrainError

_LLAMA_LIKE = ["q_proj", "k_proj", "v_proj", "o_proj"]
# model_type -> the Linear layers of its attention blocks that LoRA adapts.
KNOWN_TARGETS: dict[str, list[str]] = {
    **{
        t: _LLAMA_LIKE
        for t in (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "gemma",
            "gemma2",
            "gemma3",
            "gemma3_text",
            "olmo",
            "olmo2",
            "granite",
            "starcoder2",
            "cohere",
            "deepseek_v2",
            "internlm2",
            "yi",
            "stablelm",
            "smollm3",
            "ministral",
            "helium",
            "glm",
            "exaone",
        )
    },  # fmt: skip
    "phi": ["q_proj", "k_proj", "v_proj", "dense"],
    "phi3": ["qkv_proj", "o_proj"],
    "gpt2": ["c_attn"],
    "gpt_bigcode": ["c_attn"],
    "gpt_neox": ["query_key_value"],
    "falcon": ["query_key_value"],
    "bloom": ["query_key_value"],
    "gptj": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "gpt_neo": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "opt": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "bart": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "mbart": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "mpt": ["Wqkv"],
    "t5": ["q", "k", "v", "o"],
    "mt5": ["q", "k", "v", "o"],
    "bert": ["query", "key", "value"],
    "roberta": ["query", "key", "value"],
    "xlm-roberta": ["query", "key", "value"],
    "camembert": ["query", "key", "value"],
    "electra": ["query", "key", "value"],
    "modernbert": ["Wqkv", "Wo"],
    "distilbert": ["q_lin", "k_lin", "v_lin"],
    "deberta": ["in_proj"],
    "deberta-v2": ["query_proj", "key_proj", "value_proj"],
    "albert": ["query", "key", "value"],
}
# Heads that are never LoRA targets (they are trained whole through modules_to_save, or frozen).
HEAD_NAMES = {"lm_head", "classifier", "score", "qa_outputs", "cls", "pooler", "embed_out"}


def _linear_types() -> tuple[type, ...]:
    import torch
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


def linear_layers(model: Any) -> dict[str, str]:
    """Qualified name -> leaf name of every Linear-like layer (nn.Linear, GPT-2's Conv1D)."""
    kinds = _linear_types()
    return {name: name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, kinds)}


def layers_matching(model: Any, pattern: str) -> list[str]:
    """Qualified names of the Linear-like layers that ``pattern`` matches whole (as peft matches
    a ``target_modules`` regex)."""
    import re

    return [q for q in linear_layers(model) if re.fullmatch(pattern, q)]


def _head_layers(model: Any) -> set[str]:
    """Qualified names of the heads: known head names, and the output embeddings whatever their name."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {
        name
        for name, mod in model.named_modules()
        if (out is not None and mod is out) or any(p in HEAD_NAMES for p in name.split("."))
    }


def find_target_modules(model: Any) -> list[str]:
    """The LoRA targets for ``target_modules: auto``.

    1. xtrain's table of common architectures (llama/mistral/qwen: q,k,v,o; gpt2: c_attn;
       bert/roberta: query,key,value; t5: q,k,v,o; ...), keeping the names present in the model;
    2. peft's own table for other known model types;
    3. otherwise every Linear layer inside an attention block (a name containing "attn" or
       "attention"), and failing that every Linear layer, except the heads.
    """
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TABLE

    layers = linear_layers(model)
    leaves = set(layers.values())
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for table in (KNOWN_TARGETS, PEFT_TABLE):
        names = [n for n in table.get(model_type, []) if n in leaves]
        if names:
            return names
    heads = _head_layers(model)
    body = {q: leaf for q, leaf in layers.items() if q not in heads}
    attention = sorted({leaf for q, leaf in body.items() if "attn" in q.lower() or "attention" in q.lower()})
    if attention:
        return attention
    everything = sorted(set(body.values()))
    if everything:
        return everything
    raise XtrainError(
        f"found no Linear layers for LoRA in this {model_type or 'model'}",
        "set lora.target_modules to the module names to adapt, or lora.enabled=false",
    )


def enable_gradient_checkpointing(model: Any, with_lora: bool) -> None:
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise XtrainError(
            f"{type(model).__name__} does not support gradient checkpointing",
            "set model.gradient_checkpointing=false",
        )
    # Non-reentrant checkpointing works with frozen inputs; input grads keep the reentrant
    # variant (and older models) working when the embeddings are frozen under LoRA.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if with_lora and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    if hasattr(model, "config"):
        model.config.use_cache = False


def apply_lora(model: Any, lora: Any, task_type: str | None) -> Any:
    """``get_peft_model`` with the config's settings and the task's peft ``task_type`` (peft's
    ``SEQ_CLS`` trains the head whole: it puts ``classifier``/``score`` in ``modules_to_save``)."""
    from peft import LoraConfig, TaskType, get_peft_model

    targets: str | list[str] = lora.target_modules
    if targets == "auto":
        targets = find_target_modules(model)
    config = LoraConfig(
        task_type=TaskType[task_type] if task_type else None,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=lora.modules_to_save,
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:
        if "not found" in str(e) or "Target module" in str(e):
            available = ", ".join(sorted(set(linear_layers(model).values()))[:16])
            raise XtrainError(
                f"lora.target_modules {targets} not found in the model",
                f"Linear layers it has: {available}",
            ) from None
        raise
    return trainable_fp32(peft_model)


def trainable_fp32(peft_model: Any) -> Any:
    """Trained weights stay in float32 even when the base model was loaded in half precision
    (mixed precision autocasts the compute; a half-precision trainable weight breaks the scaler)."""
    import torch

    for p in peft_model.parameters():
        if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16):
            p.data = p.data.float()
    return peft_model


def apply_lora_matching(model: Any, lora: Any, pattern: str, where: str) -> Any:
    """``get_peft_model`` on the Linear layers whose full module name matches ``pattern`` (a
    regex): how encoder-decoder and multimodal tasks pick their halves. ``where`` names the part
    in the one-line error when nothing matches."""
    return adapt(model, lora, pattern, lora.modules_to_save, where)


def adapt(model: Any, lora: Any, targets: str | list[str], whole: list[str] | None, where: str) -> Any:
    """``get_peft_model`` with adapters on ``targets`` (a regex on qualified names, or the
    qualified names) and the ``whole`` modules trained whole; nothing matched is one line naming
    ``where`` and the Linear layers the model has."""
    from peft import LoraConfig, get_peft_model

    matched = layers_matching(model, targets) if isinstance(targets, str) else targets
    if not matched:
        available = ", ".join(sorted(set(linear_layers(model).values()))[:16])
        raise XtrainError(
            f"lora.target_modules {lora.target_modules} matched no layer of the {where}",
            f"Linear layers it has: {available}",
        )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=whole or None,
    )
    return trainable_fp32(get_peft_model(model, config))
