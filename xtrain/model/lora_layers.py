"""Which Linear layers LoRA adapts: by the model type's attention names (``KNOWN_TARGETS``), by
name or a name pattern (``layers_matching``, ``exact_pattern``), or peft's ``all-linear`` (every
Linear but the output head: ``all_linear_layers``); ``find_target_modules`` is ``auto``. Pure
reading of a model's modules: it runs on a meta-device model for the plan's exact counts too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from torch.nn import Module

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


# peft's shorthand for every Linear layer but the output head (INCLUDE_LINEAR_LAYERS_SHORTHAND)
ALL_LINEAR = "all-linear"


# peft's SEQ_CLS_HEAD_NAMES: the classifier heads all-linear leaves out of a model without output
# embeddings (peft/utils/constants.py; named here so that counting does not import peft)
PEFT_SEQ_CLS_HEADS = ("score", "classifier")


def _linear_types() -> tuple[type, ...]:
    import torch
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


def linear_layers(model: Module) -> dict[str, str]:
    """Qualified name -> leaf name of every Linear-like layer (nn.Linear, GPT-2's Conv1D)."""
    kinds = _linear_types()
    return {name: name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, kinds)}


def layers_matching(model: Module, pattern: str) -> list[str]:
    """Qualified names of the Linear-like layers that ``pattern`` matches whole (as peft matches
    a ``target_modules`` regex)."""
    import re

    return [q for q in linear_layers(model) if re.fullmatch(pattern, q)]


def _head_layers(model: Module) -> set[str]:
    """Qualified names of the heads: known head names, and the output embeddings whatever their name."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {
        name
        for name, mod in model.named_modules()
        if (out is not None and mod is out) or any(p in HEAD_NAMES for p in name.split("."))
    }


def is_all_linear(targets: object) -> bool:
    """``lora.target_modules: all-linear`` (peft compares it case-insensitively)."""
    return isinstance(targets, str) and targets.lower() == ALL_LINEAR


def all_linear_layers(model: Module, task_type: str | None = None) -> list[str]:
    """Qualified names of the layers peft's ``all-linear`` adapts (tuners_utils
    ``_maybe_include_all_linear_layers``): every ``nn.Linear``/``Conv1D`` but the output embeddings
    (the LM head), and for a ``SEQ_CLS`` model without them its classifier head (``score`` or
    ``classifier``). What ``apply_lora`` passes on to peft, counted the same way for the plan."""
    layers = list(linear_layers(model))
    excluded: set[str] = set()
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None:
        excluded |= {name for name, mod in model.named_modules() if mod is out}
    elif task_type == "SEQ_CLS":
        for attr in PEFT_SEQ_CLS_HEADS:
            head = getattr(model, attr, None)
            if head is not None:
                excluded |= {name for name, mod in model.named_modules() if mod is head}
                break
    return [q for q in layers if q not in excluded]


def body_layers(model: Module) -> dict[str, str]:
    """Qualified name -> leaf name of the Linear-like layers that are not heads (``_head_layers``:
    the output embeddings, classifiers, poolers): ``all-linear`` for the tasks that choose their
    own layers (one half of an encoder-decoder, a language model inside a vision-language one)."""
    heads = _head_layers(model)
    return {q: leaf for q, leaf in linear_layers(model).items() if q not in heads}


def exact_pattern(names: list[str]) -> str:
    """A peft ``target_modules`` regex matching exactly these qualified names (none: matches nothing)."""
    import re

    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$" if names else r"^(?!)$"


def find_target_modules(model: Module) -> list[str]:
    """The LoRA targets for ``target_modules: auto``.

    1. xtrain's table of common architectures (llama/mistral/qwen: q,k,v,o; gpt2: c_attn;
       bert/roberta: query,key,value; t5: q,k,v,o; ...), keeping the names present in the model;
    2. peft's own table for other known model types;
    3. otherwise every Linear layer inside an attention block (a name containing "attn" or
       "attention"), and failing that every Linear layer, except the heads.
    """
    layers = linear_layers(model)
    leaves = set(layers.values())
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    names = [n for n in KNOWN_TARGETS.get(model_type, []) if n in leaves]
    if names:
        return names  # (peft is not imported for the common architectures: a CPU dry run stays light)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TABLE

    names = [n for n in PEFT_TABLE.get(model_type, []) if n in leaves]
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


def adapted_modules(model: Module) -> list[str]:
    """The qualified names of the layers that carry LoRA adapters in a peft-wrapped ``model``."""
    return [name for name, module in model.named_modules() if getattr(module, "lora_A", None)]


def _leaves(adapted: list[str]) -> list[str]:
    """The adapted layers' names within a layer, in the model's order (``q_proj``, ``v_proj``)."""
    return list(dict.fromkeys(q.rsplit(".", 1)[-1] for q in adapted))


def described(adapted: list[str], whole: list[str] | None = None) -> str:
    """Adapted layers in a line, by their names in a layer (in the model's order) and how many:
    ``q_proj, v_proj (8 layers)``; ``whole``: the modules trained whole besides."""
    leaves = _leaves(adapted)
    line = f"{', '.join(leaves)} ({len(adapted)} layer{'s' * (len(adapted) != 1)})" if adapted else "no layer"
    return line + (f"; trained whole: {', '.join(whole)}" if whole else "")


def adapted_record(adapted: list[str]) -> dict[str, object]:
    """What a run records of its adapted layers (``train_result.json``'s ``run_info``; the report's
    plan): their names in a layer and how many; {} without adapters."""
    if not adapted:
        return {}
    return {"lora_targets": _leaves(adapted), "lora_layers": len(adapted)}
