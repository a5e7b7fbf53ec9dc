"""The one way a LoRA adapter becomes a merged model: the saved adapter folder applied to a freshly
loaded base on the CPU, in the checkpoint's own dtype (bf16/fp16 for the checkpoints people bring,
never the 4-bit or 8-bit weights a QLoRA run trained on: merging into those would round the
merged weights to 4 bits), then peft's ``merge_and_unload``.

``run.save_merged`` (``train/checkpoint/outputs.py``) and ``xtrain export`` (``xtrain/export``)
both come here, so the model a run merges at its end and the one ``xtrain export --to merged``
writes later are the same weights. The adapter is read back from its folder rather than taken
from the trained model in memory: a PiSSA/OLoRA adapter is saved converted to fit the original
base (``lora.save_pretrained``), which is the base loaded here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.model import chain
from xtrain.model.start import start_of

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PretrainedConfig, PreTrainedModel

    from xtrain.model.load import ModelClass

# the keys of a quantized model's config that a fresh, unquantized load must not see
_QUANTIZED_KEYS = ("quantization_config", "_pre_quantization_dtype")


def base_source(adapter: str | Path) -> str:
    """The base an adapter folder goes on (its record's ``base``, else peft's
    ``base_model_name_or_path``: ``model.start``), as a folder or a hub id ``from_pretrained``
    takes (a built-in's name resolved to its folder)."""
    from xtrain.model import load as models

    return models.resolve_model(start_of(str(adapter)).base)


def unquantized(config: PretrainedConfig) -> PretrainedConfig:
    """A copy of ``config`` without its quantization (a new head's labels and the rest kept) and
    without the dtype the trained model was loaded in, so that ``dtype="auto"`` reads the
    checkpoint's weights (a run on a CPU loads bf16 weights as float32)."""
    config = copy.deepcopy(config)
    for key in _QUANTIZED_KEYS:
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = None
    return config


def fresh_base(
    model_class: ModelClass,
    source: str,
    config: PretrainedConfig | None = None,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """The base loaded anew on the CPU in its checkpoint's dtype (``dtype="auto"``: bf16 weights
    stay bf16; a float32 checkpoint stays float32). ``config``: the trained model's (its
    quantization taken out), else the checkpoint's own."""
    from xtrain.model import load as models

    # dtype "auto": the checkpoint's own (load_dtype's "auto" means float32 without a GPU: the
    # training rule, not this one)
    kwargs: dict[str, Any] = {
        models.dtype_kwarg(): "auto", "trust_remote_code": trust_remote_code, "device_map": {"": "cpu"},
    }  # fmt: skip
    if config is not None:
        kwargs["config"] = unquantized(config)
    try:
        return model_class.from_pretrained(source, **kwargs)
    except Exception as e:
        raise models.load_error("model", source, Path(source).exists(), e) from None


def with_adapter(base: PreTrainedModel, adapter: str | Path) -> PeftModel:
    """``base`` with the adapter saved at ``adapter`` applied, not merged, in eval mode: a chained
    result's earlier adapters first, in order (``model.chain``: base + every adapter is what the
    merged model must compute)."""
    return chain.load(base, start_of(str(adapter)))


def merge(model: PeftModel) -> PreTrainedModel:
    """The adapter merged into the base weights and the peft wrapper removed (in place)."""
    merged = model.merge_and_unload()
    merged.eval()
    return merged


def merged_from_adapter(
    adapter: str | Path,
    model_class: ModelClass,
    source: str | None = None,
    config: PretrainedConfig | None = None,
) -> PreTrainedModel:
    """The merged model of the adapter saved at ``adapter``: ``fresh_base`` (of ``source``, else the
    base the adapter names) + the adapter (a chain's every adapter, in order), merged."""
    base = fresh_base(model_class, source or base_source(adapter), config)
    return merge(with_adapter(base, adapter))
