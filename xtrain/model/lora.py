"""LoRA through peft: ``target_modules: auto`` finds the attention projections of common
architectures; gradient checkpointing is switched on before the adapter is added."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.model.lora_layers import _linear_types, find_target_modules, layers_matching, linear_layers
from xtrain.model.quantization import INSTALL

if TYPE_CHECKING:
    from peft import PeftModel
    from torch.nn import Module

    from xtrain.config.schema import LoraConfig as LoraSection
    from xtrain.config.schema import TrainConfig


def enable_gradient_checkpointing(model: Module, with_lora: bool) -> None:
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


def apply_lora(model: Module, lora: LoraSection, task_type: str | None) -> PeftModel:
    """``get_peft_model`` with the config's settings and the task's peft ``task_type`` (peft's
    ``SEQ_CLS`` trains the head whole: it puts ``classifier``/``score`` in ``modules_to_save``)."""
    targets: str | list[str] = lora.target_modules
    if targets == "auto":
        targets = find_target_modules(model)
    try:
        return _peft_model(model, lora, targets, lora.modules_to_save, task_type)
    except ValueError as e:
        if "not found" in str(e) or "Target module" in str(e):
            available = ", ".join(sorted(set(linear_layers(model).values()))[:16])
            raise XtrainError(
                f"lora.target_modules {targets} not found in the model",
                f"Linear layers it has: {available}",
            ) from None
        raise


def trainable_fp32(peft_model: PeftModel) -> PeftModel:
    """Trained weights stay in float32 even when the base model was loaded in half precision
    (mixed precision autocasts the compute; a half-precision trainable weight breaks the scaler)."""
    import torch

    for p in peft_model.parameters():
        if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16):
            p.data = p.data.float()
    return peft_model


def apply_lora_matching(model: Module, lora: LoraSection, pattern: str, where: str) -> PeftModel:
    """``get_peft_model`` on the Linear layers whose full module name matches ``pattern`` (a
    regex): how encoder-decoder and multimodal tasks pick their halves. ``where`` names the part
    in the one-line error when nothing matches."""
    return adapt(model, lora, pattern, lora.modules_to_save, where)


def adapt(
    model: Module, lora: LoraSection, targets: str | list[str], whole: list[str] | None, where: str
) -> PeftModel:
    """``get_peft_model`` with adapters on ``targets`` (a regex on qualified names, or the
    qualified names) and the ``whole`` modules trained whole; nothing matched is one line naming
    ``where`` and the Linear layers the model has."""
    matched = layers_matching(model, targets) if isinstance(targets, str) else targets
    if not matched:
        available = ", ".join(sorted(set(linear_layers(model).values()))[:16])
        raise XtrainError(
            f"lora.target_modules {lora.target_modules} matched no layer of the {where}",
            f"Linear layers it has: {available}",
        )
    return _peft_model(model, lora, targets, whole, None)


# -- LoRA variants: DoRA, rsLoRA and how the adapters start (peft's init_lora_weights) -------------
# lora.init_weights -> peft's init_lora_weights. loftq starts from peft's default and is then fitted
# to the 4-bit base by replace_lora_weights_loftq (see _fit_loftq).
PEFT_INIT: dict[str, bool | str] = {
    "default": True,
    "gaussian": "gaussian",
    "pissa": "pissa",
    "olora": "olora",
    "loftq": True,
}
# Inits that move part of each base weight into the adapter (W = W_res + B0 A0): the adapter
# trained on W_res is converted at save time so that it loads onto the original base.
BASE_CHANGING = ("pissa", "olora")
# The adapter as it started, kept on the model for that conversion (see save_pretrained).
INITIAL_ADAPTER = "xtrain_initial_adapter"


def _need_bitsandbytes(what: str) -> None:
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise XtrainError(f"{what} needs bitsandbytes, which is not installed", INSTALL)


def lora_config_kwargs(
    lora: LoraSection, targets: str | list[str], whole: list[str] | None, task_type: str | None
) -> dict[str, Any]:
    """The keyword arguments of peft's ``LoraConfig`` for the config's ``lora`` section: the one
    place each LoRA setting becomes a peft setting. ``task_type``: a peft ``TaskType`` name."""
    from peft import TaskType

    return {
        "task_type": TaskType[task_type] if task_type else None,
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        "modules_to_save": whole or None,
        "use_dora": lora.use_dora,
        "use_rslora": lora.use_rslora,
        "init_lora_weights": PEFT_INIT[lora.init_weights],
    }


def targeted_layers(model: Module, targets: str | list[str]) -> dict[str, Module]:
    """Qualified name -> module of the Linear-like layers ``targets`` selects, matched as peft
    matches: a regex on the whole name, or names equal to or ending in ``.NAME``."""
    import re

    kinds = _linear_types()
    found = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, kinds):
            continue
        if isinstance(targets, str):
            hit = re.fullmatch(targets, name) is not None
        else:
            hit = any(name == t or name.endswith("." + t) for t in targets)
        if hit:
            found[name] = mod
    return found


def _check_layers(model: Module, lora: LoraSection, targets: str | list[str]) -> None:
    """Checks that need the model's layers: peft's OLoRA init ignores ``fan_in_fan_out``, so on
    GPT-2-style Conv1D layers it builds adapters of the wrong shape (seen with peft 0.21)."""
    if lora.init_weights != "olora":
        return
    from transformers.pytorch_utils import Conv1D

    conv = [n for n, m in targeted_layers(model, targets).items() if isinstance(m, Conv1D)]
    if conv:
        raise XtrainError(
            f"lora.init_weights=olora does not work on Conv1D layers like {conv[0]} (GPT-2 style)",
            "use lora.init_weights=pissa or default for this model",
        )


def _peft_model(
    model: Module, lora: LoraSection, targets: str | list[str], whole: list[str] | None, task_type: str | None
) -> PeftModel:
    """``get_peft_model`` with the variant settings, trained weights in float32, LoftQ fitted and
    the starting adapter of PiSSA/OLoRA kept for the conversion at save time."""
    from peft import LoraConfig, get_peft_model

    _check_layers(model, lora, targets)
    config = LoraConfig(**lora_config_kwargs(lora, targets, whole, task_type))
    decompose = lora.init_weights in BASE_CHANGING
    if decompose:
        config.init_lora_weights = True  # decomposed below, layer by layer (on a GPU if there is one)
    peft_model = get_peft_model(model, config)
    if decompose:
        decompose_layers(peft_model, lora.init_weights)
        peft_model.peft_config["default"].init_lora_weights = PEFT_INIT[lora.init_weights]
    peft_model = trainable_fp32(peft_model)
    if lora.init_weights == "loftq":
        _fit_loftq(peft_model)
    if decompose:
        keep_initial_adapter(peft_model)
    return peft_model


def decompose_layers(peft_model: PeftModel, init: str) -> None:
    """PiSSA/OLoRA start: peft's own ``pissa_init`` (full SVD) or ``olora_init`` (QR) on every
    adapted layer, as ``get_peft_model`` would run them, but with a CUDA GPU each layer is moved
    there for it and back. The model is still on the CPU here (accelerate places it later), and
    a full SVD of one 4096x4096 weight took 170 s on 2 CPU cores: a 7B model would take hours.
    One layer at a time keeps the GPU memory needed to one layer's weights."""
    import torch
    from peft.tuners.lora import LoraLayer

    gpu = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    for module in peft_model.modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        home = module.get_base_layer().weight.device
        if gpu is not None:
            module.to(gpu)
        if init == "pissa":
            module.pissa_init("default", PEFT_INIT[init])
        else:
            module.olora_init("default")
        if gpu is not None:
            module.to(home)


def _fit_loftq(peft_model: PeftModel) -> None:
    """LoftQ on a 4-bit base: peft's ``replace_lora_weights_loftq`` reads the unquantized weights
    from the model's safetensors files and starts A and B where they cancel most of the
    quantization error. (``init_lora_weights="loftq"`` would instead replace the base weights
    of an unquantized model by their quantized values: the adapter would not fit the original.)"""
    from pathlib import Path

    import torch
    from peft import replace_lora_weights_loftq
    from peft.tuners.lora import Linear4bit

    quantized = [m for m in peft_model.modules() if isinstance(m, Linear4bit)]
    if not quantized:
        raise XtrainError(
            "lora.init_weights=loftq found no 4-bit layers among the LoRA targets",
            "load the model with model.quantization=4bit, or use lora.init_weights=default",
        )
    device = quantized[0].weight.device
    if device.type != "cuda":
        # peft 0.21's _loftq_init_new computes on "cuda" (or XPU) whatever the model's device
        raise XtrainError(
            f"lora.init_weights=loftq computes on a CUDA GPU (peft), and the model is on {device.type}",
            "train on a CUDA GPU, or use lora.init_weights=default",
        )
    name = str(getattr(peft_model.get_base_model(), "name_or_path", "") or "")
    folder = name if name and Path(name).is_dir() else None  # else: the hub cache, offline
    try:
        with torch.cuda.device(device):  # peft's "cuda" is the current device: this rank's
            replace_lora_weights_loftq(peft_model, model_path=folder)
    except (ValueError, OSError, KeyError) as e:
        raise XtrainError(
            f"lora.init_weights=loftq could not read the unquantized weights of {name or 'the model'} ({e})",
            "point model.name_or_path at a local folder with model.safetensors, "
            "or use lora.init_weights=default",
        ) from None


def keep_initial_adapter(peft_model: PeftModel) -> None:
    """Keep a CPU copy of the adapter as it starts (after PiSSA/OLoRA moved part of the base
    into it). Resume rebuilds the same start: both inits are deterministic (full SVD, QR) on the
    same device."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model)
    setattr(peft_model, INITIAL_ADAPTER, {k: v.detach().to("cpu", copy=True) for k, v in state.items()})


def save_pretrained(model: Module, folder: str) -> None:
    """``model.save_pretrained(folder)`` for a peft adapter or a whole model. A PiSSA/OLoRA
    adapter is converted by peft (``path_initial_model_for_weight_conversion``) to a plain LoRA of
    rank 2r that loads onto the ORIGINAL base model: delta W = B A - B0 A0. Its
    adapter_config.json then says ``init_lora_weights: true`` and twice ``r`` and ``lora_alpha``."""
    initial = getattr(model, INITIAL_ADAPTER, None)
    if initial is None:
        model.save_pretrained(folder, **saved_adapters(model))
        return
    from pathlib import Path

    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file, save_file

    with atomic.temporary_folder("xtrain-lora-") as tmp:
        start = Path(tmp) / "initial"  # peft writes its adapter_config.json next to the weights
        start.mkdir()
        save_file(initial, str(start / "adapter_model.safetensors"))
        model.save_pretrained(folder, path_initial_model_for_weight_conversion=str(start))
    # peft's conversion keeps only lora_A/lora_B: put back the weights trained whole
    # (modules_to_save, e.g. a classifier head), which do not depend on the base.
    weights = Path(folder) / "adapter_model.safetensors"
    saved = load_file(str(weights))
    dropped = {
        k: v.detach().cpu().contiguous()
        for k, v in get_peft_model_state_dict(model).items()
        if k not in saved and "lora_" not in k
    }
    if dropped:
        save_file({**saved, **dropped}, str(weights), metadata={"format": "pt"})


def saved_adapters(model: Module) -> dict[str, Any]:
    """``save_pretrained``'s keywords: a chained model (``model.chain``) saves the adapter it
    trains alone (its earlier ones are copied beside it, its reference copy is not kept)."""
    from xtrain.model.chain import TRAINED, chain_of

    return {"selected_adapters": [TRAINED]} if chain_of(model) is not None else {}


def check_variants(cfg: TrainConfig) -> None:
    """Config-only checks of ``lora.use_dora``, ``lora.use_rslora`` and ``lora.init_weights``
    against ``lora.enabled`` and ``model.quantization``; the first misfit raises (one line).

    Called by ``tasks/validation.py``; checks that need the model (the layer types) are made
    when the adapters are added (``_check_layers``)."""
    lora, quant = cfg.lora, cfg.model.quantization
    init = lora.init_weights
    if not lora.enabled:
        for key, on in (
            ("lora.use_dora", lora.use_dora),
            ("lora.use_rslora", lora.use_rslora),
            ("lora.init_weights", init != "default"),
            ("lora.continue_adapter", lora.continue_adapter),
        ):
            if on:
                raise XtrainError(
                    f"{key} is a LoRA setting and lora.enabled=false",
                    f"set lora.enabled=true, or leave out {key}",
                )
    if init in BASE_CHANGING and lora.use_dora:
        # peft's conversion to a plain adapter (subtract_mutated_init) keeps lora_A/lora_B only,
        # and a DoRA magnitude learnt against W_res does not carry over to W.
        raise XtrainError(
            f"lora.init_weights={init} with lora.use_dora=true cannot be saved as an adapter "
            "of the original model",
            "leave out lora.use_dora, or use lora.init_weights=default",
        )
    if init in BASE_CHANGING and quant:
        raise XtrainError(
            f"lora.init_weights={init} rewrites the base weights, which a {quant} base cannot hold exactly",
            "use lora.init_weights=loftq (4bit) or default, or leave out model.quantization",
        )
    if init == "loftq":
        if quant != "4bit":
            raise XtrainError(
                "lora.init_weights=loftq fits the adapters to the error of a 4-bit base "
                "and needs model.quantization=4bit",
                "set model.quantization=4bit, or use lora.init_weights=default or pissa",
            )
        if lora.use_dora:
            # replace_lora_weights_loftq swaps A and B after DoRA measured its magnitudes from them
            raise XtrainError(
                "lora.init_weights=loftq with lora.use_dora=true would start DoRA from stale magnitudes",
                "leave out lora.use_dora, or use lora.init_weights=default",
            )
        _need_bitsandbytes("lora.init_weights=loftq")
