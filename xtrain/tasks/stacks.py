"""What the tasks' ``Task.stacks`` hooks share: a stack of layers read from a model and its config
(``activations.Stack``: positions a sample, depth, widths, heads, eager attention), found by
module (the model is built on the meta device for the plan, or loaded, never wrapped by peft).
How each stack trains is ``model_size``'s part, from the same model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain.model.activations import Stack
from xtrain.model.memory import GATED_ACTS

if TYPE_CHECKING:
    from torch.nn import Module
    from transformers import PretrainedConfig

    from xtrain.config.schema import TrainConfig

LAYER_LISTS = ("layers", "layer", "blocks", "h")
DROPOUTS = ("dropout", "hidden_dropout_prob", "hidden_dropout", "resid_pdrop")


def first(config: PretrainedConfig, *names: str) -> int | None:
    """The first of ``names`` that ``config`` sets to a positive int."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def name_of(model: Module, module: Module) -> str:
    """``module``'s qualified name inside ``model`` ("" for the model itself)."""
    return next((n for n, m in model.named_modules() if m is module), "")


def layer_count(model: Module, prefix: str) -> int:
    """The length of the first list of layers under ``prefix`` (``layers``, ``layer``, ``blocks``,
    GPT-2's ``h``); 0 when there is none."""
    import torch

    for name, module in model.named_modules():
        inside = not prefix or name.startswith(prefix + ".")
        if inside and isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in LAYER_LISTS:
            return len(module)
    return 0


def eager(model: Module, prefix: str, cfg: TrainConfig) -> bool:
    """Whether the stack's attention is eager: ``model.attn_implementation: eager``, or a module
    whose class has no sdpa/flash kernel (TrOCR's decoder) and was built with eager."""
    if cfg.model.attn_implementation == "eager":
        return True
    module = model.get_submodule(prefix) if prefix else model
    config = getattr(module, "config", None) or getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == "eager"


def dropout_on(config: PretrainedConfig) -> bool:
    """The model's own dropout after attention and MLP is on in training (TrOCR's 0.1, BERT's)."""
    return any(isinstance(getattr(config, n, None), float) and getattr(config, n) > 0 for n in DROPOUTS)


def from_config(
    part: str,
    model: Module,
    prefix: str,
    config: PretrainedConfig,
    positions: int,
    cfg: TrainConfig,
    **extra: Any,
) -> Stack:
    """A stack of ``positions`` a sample with the widths of a (text or vision) ``config``
    (``extra``: fields it gets wrong, e.g. a vision tower's width)."""
    hidden = extra.get("hidden") or first(config, "hidden_size", "d_model", "n_embd", "embed_dim", "dim") or 0
    ffn = first(config, "intermediate_size", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim", "ffn_dim")
    ratio = getattr(config, "mlp_ratio", None)
    if ffn is None and isinstance(ratio, (int, float)):
        ffn = int(hidden * ratio)
    heads = first(config, "num_attention_heads", "decoder_attention_heads", "num_heads", "n_head") or 1
    values: dict[str, Any] = {
        "layers": layer_count(model, prefix),
        "hidden": hidden,
        "intermediate": ffn or 4 * hidden,
        "heads": heads,
        "module": prefix,
        "gated": getattr(config, "hidden_act", None) in GATED_ACTS,
        "rms_norm": hasattr(config, "rms_norm_eps"),
        "eager": eager(model, prefix, cfg),
        "dropout": dropout_on(config),
    }
    return Stack(part, positions, **{**values, **extra})


def text_stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The default: the model's text layers at ``data.max_length`` positions (causal-lm, seq-cls)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    prefix = layers_owner(model)
    return [from_config("model", model, prefix, config, cfg.data.max_length, cfg, embeds=True, text=True)]


def layers_owner(model: Module) -> str:
    """The module that holds the model's list of layers (``model``, ``transformer``, ``bert.encoder``)."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in LAYER_LISTS:
            return name.rsplit(".", 1)[0] if "." in name else ""
    return ""


def patches(config: PretrainedConfig) -> int:
    """Positions of a ViT-style encoder: (image / patch)^2, rectangles too, and its class token
    (DeiT: and its distillation token)."""

    def pair(value: Any) -> tuple[int, int]:
        return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))

    (height, width), (ph, pw) = pair(config.image_size), pair(config.patch_size)
    tokens = 2 if getattr(config, "model_type", "") == "deit" else 1
    return (height // ph) * (width // pw) + tokens


def patch_stem(config: PretrainedConfig) -> int:
    """Values a position a trained patch embedding keeps: its input pixels (channels x patch area)."""
    size = config.patch_size
    area = size * size if isinstance(size, int) else int(size[0]) * int(size[1])
    return (first(config, "num_channels") or 3) * area
