"""Counting a model's weights as the memory estimate counts them: a 4-bit weight by its unpacked
shape (``weight_count``), the Linear layers 4/8-bit loading replaces (``quantizable_count``),
weights tied on load (``_tied_count``), how a built model was loaded (``loaded_quantization``),
the model of a task on the meta device (``meta_model``). ``xtrain.tasks.sizes`` puts them together
for a task's model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain.config.schema import TrainConfig
from xtrain.config.values import BNB_OPTIMIZERS
from xtrain.model import memory
from xtrain.model.quantization import skip_patterns

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module
    from transformers import PretrainedConfig, PreTrainedModel


def moments_8bit(cfg: TrainConfig) -> bool:
    """Whether ``optim.name`` keeps AdamW's moments in 8 bits (bitsandbytes)."""
    return cfg.optim.name in BNB_OPTIMIZERS


def small_count(sizes: list[int]) -> int:
    """The weights in tensors too small for bitsandbytes' 8-bit optimizer state."""
    return sum(n for n in sizes if n < memory.MIN_8BIT_SIZE)


# peft's modules_to_save wrapper: the frozen original and the trained copy, both kept as they are
_KEPT = ("original_module", "modules_to_save")


def quantizable_count(
    model: Module, unquantized: tuple[str, ...] = (), kept_whole: list[str] | None = None
) -> int:
    """Weights of the Linear layers that 4-bit/8-bit loading replaces: those transformers
    converts under the task's skip list (``quantization.skip_patterns``: the heads and
    ``unquantized``, matched by transformers' own ``should_convert_module``), not the output
    head, not a module kept whole (by name or its name's last parts, as peft matches them), not
    LoRA's own layers. A 4-bit weight counts as its unpacked shape."""
    import torch
    from transformers.quantizers.quantizers_utils import should_convert_module

    patterns = skip_patterns(unquantized)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    whole = list(kept_whole or [])
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        parts = set(name.split("."))
        if parts & {*_KEPT, "lora_A", "lora_B"} or any(name == k or name.endswith("." + k) for k in whole):
            continue
        if should_convert_module(name.removesuffix(".base_layer"), patterns):
            count += weight_count(module.weight)
    return count


def weight_count(weight: Tensor) -> int:
    """Elements of a weight; bitsandbytes' 4-bit ``Params4bit`` keeps the unpacked shape in its
    quantization state (the tensor itself holds two weights a byte, or more in a wider
    ``bnb_4bit_quant_storage``)."""
    state = getattr(weight, "quant_state", None)
    shape = getattr(state, "shape", None)
    if shape is not None:
        n = 1
        for d in shape:
            n *= int(d)
        return n
    return weight.numel()


def total_weights(model: Module) -> int:
    """The weights of ``model``, a 4-bit one counted unpacked (the run banner's and
    ``train_result.json``'s ``total_params``: the same count as the unquantized model's)."""
    return sum(weight_count(p) for p in model.parameters())


def loaded_quantization(model: Module) -> str | None:
    """How a built model's weights were loaded: 4bit (bitsandbytes ``Params4bit``), 8bit
    (``Int8Params``), None; told by class name, so bitsandbytes is not imported."""
    kinds = {type(p).__name__ for p in model.parameters()}
    return "4bit" if "Params4bit" in kinds else "8bit" if "Int8Params" in kinds else None


def skeleton(model_class: str, config: PretrainedConfig) -> PreTrainedModel:
    """``model_class`` (an Auto class or a model class of transformers) built from ``config`` on
    the meta device: module names and shapes, no memory, and no weight initialization (on meta
    tensors it runs torch's Python reference ops: ~1 s for a 7B model's skeleton, every dry run)."""
    import transformers
    from accelerate import init_empty_weights

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights

    auto = getattr(transformers, model_class)
    with init_empty_weights(), no_init_weights():
        # Auto classes build from a config with from_config, model classes with their constructor
        return auto.from_config(config) if hasattr(auto, "from_config") else auto(config)


def meta_model(cfg: TrainConfig, task: Any, config: PretrainedConfig) -> PreTrainedModel | str:
    """The task's model built from ``config`` on the meta device (module names and shapes, no
    memory); or why it cannot be built."""
    try:
        return skeleton(task.model_class, config)
    except Exception as e:  # noqa: BLE001 - advisory: the run itself loads the model and says why
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        return f"cannot build {cfg.model.name_or_path} for {cfg.model.task}: {reason}"


def _tied_count(model: Module, config: PretrainedConfig) -> int:
    """Parameters that loading ties to another (an output head sharing the input embedding:
    ``tie_word_embeddings``); a model built from its config on the meta device keeps them apart."""
    keys = getattr(model, "_tied_weights_keys", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # A composite config (Qwen2-VL) keeps the flag at its top level, its text config has none.
    tie = getattr(text, "tie_word_embeddings", None)
    if tie is None:
        tie = getattr(config, "tie_word_embeddings", False)
    if not isinstance(keys, dict) or not tie:
        return 0
    params = dict(model.named_parameters())
    pairs = [(params.get(k), params.get(src)) for k, src in keys.items()]
    return sum(a.numel() for a, b in pairs if a is not None and b is not None and a is not b)
