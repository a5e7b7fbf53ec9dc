"""A task's model sized for the memory estimate (``memory.ModelSizes``), without loading its weights.

- ``offline_sizes(cfg, ...)``: before launching (``xtrain train``'s plan). The config is read only
  where it already is (a local folder, a built-in, the Hugging Face cache: never a download, never
  a repository's custom code); the model is built on the meta device (``init_empty_weights`` +
  the task's Auto class ``from_config``: shapes, no memory), and LoRA is counted on the layers
  the task's own chooser picks (``r x (in + out)`` each, plus a copy of each module trained whole):
  both counts are exact, without importing peft (seconds). Anything that stops it returns the
  reason instead (the plan skips the estimate; the run itself reports real problems).
- ``live_sizes(model)``: the training loop's model as it is (real counts, real dtypes; a 4-bit
  weight, which bitsandbytes stores packed two to a byte, is counted by its unpacked shape).
- ``step_stacks``: how each stack of layers a training step runs trains (the activation term):
  the task's stacks (``Task.stacks``) read from a model that is not wrapped by peft, with the
  adapters on each site of a layer (``activations.site_of``) and whether their own weights train.

Both count the weights that ``model.quantization`` stores in 4 or 8 bits (``quantizable``): the
Linear layers but the output head, the modules trained whole and the task's ``unquantized``
modules (a vision tower), as the task's quantized load skips them (transformers' default: the
output head). A full fine-tune has none: 4-bit weights cannot train. The task-free counting is
``xtrain.model.size``'s.

``other_sizes``: the models a task holds frozen beside the trained one (``Task.other_models``: a
distillation teacher), sized from their configs on the meta device as they load (4-bit, 8-bit or in
``model.dtype``); both estimates add their weights.

Imports transformers and accelerate: the CLI imports this module only when the plan needs
the estimate (a CUDA machine).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.config.schema import TrainConfig
from xtrain.model import activations, lora_layers, memory
from xtrain.model.configs import read_config_offline
from xtrain.model.size import (
    _tied_count,
    loaded_quantization,
    moments_8bit,
    quantizable_count,
    skeleton,
    small_count,
    weight_count,
)
from xtrain.tasks import stacks as task_stacks

if TYPE_CHECKING:
    from torch.nn import Module

    from xtrain.tasks.contract import OtherModel


def train_only(model: Module, whole: list[str]) -> None:
    """Freeze ``model`` (on the meta device) but the modules kept whole (by name or its last parts,
    as peft matches them): what trains besides the adapters."""
    keep = {id(p) for q, m in model.named_modules() if any(q == k or q.endswith("." + k) for k in whole)
            for p in m.parameters()}  # fmt: skip
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def _under(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def step_stacks(model: Module, cfg: TrainConfig, adapted: list[str]) -> tuple[activations.Stack, ...]:
    """The task's stacks of ``model`` (``Task.stacks``, not wrapped by peft) with how each trains:
    ``lora`` with its adapters a layer on each site (``adapted``: the Linear layers that carry
    adapters), ``full`` when its own Linear weights train (a module nested in it that is a stack
    of its own, a VLM's merger inside its vision tower, is that stack's), else ``frozen``. Empty
    when the task's hook cannot read the model (the per-token rule estimates it)."""
    import torch

    task = tasks.get(cfg.model.task)
    try:
        found = task.stacks(model, cfg) if task.stacks is not None else task_stacks.text_stacks(model, cfg)
    except Exception:  # noqa: BLE001 - advisory: an estimate must never stop a launch
        return ()
    found = [s for s in found if s.layers > 0 and s.hidden > 0 and s.positions > 0]
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    linears = [(n, m) for n, m in linears if "lora_" not in n and "original_module" not in n]
    out = []
    for stack in found:
        inner = [o.module for o in found if o.module != stack.module and _under(o.module, stack.module)]

        def mine(name: str, stack: activations.Stack = stack, inner: list[str] = inner) -> bool:
            return _under(name, stack.module) and not any(_under(name, o) for o in inner)

        sites = Counter(activations.site_of(q) for q in adapted if mine(q))
        sites.pop(None, None)
        per_layer = {site: max(1, round(n / stack.layers)) for site, n in sites.items()}
        trained = any(m.weight.requires_grad for n, m in linears if mine(n))
        trains = "lora" if per_layer else "full" if trained else "frozen"
        out.append(activations.with_training(stack, trains, per_layer))
    return tuple(out)


def lora_fields(cfg: TrainConfig, model: Module, stacks: tuple[activations.Stack, ...]) -> dict[str, Any]:
    """The ``ModelSizes`` fields of the activation term: the stacks, whether the output head
    trains, LoRA's rank and dropout; and generation's KV cache where the task generates in
    training (``Task.kv_cache_tokens``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    generates = tasks.get(cfg.model.task).kv_cache_tokens
    kv_tokens = generates(cfg) if generates is not None else 0
    return {
        "stacks": stacks,
        "head_trains": bool(stacks) and weight is not None and bool(weight.requires_grad),
        "lora_rank": cfg.lora.r if cfg.lora.enabled else 0,
        "lora_dropout": cfg.lora.enabled and cfg.lora.dropout > 0,
        "kv_tokens": kv_tokens,
        "kv_values": memory.kv_values(getattr(model, "config", None)) if kv_tokens else 0,
    }


def adapted_layers(model: Module, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(the Linear layers that get adapters, the modules trained whole) as the task's builder picks
    them, with the task's own chooser (``Task.lora_plan``); peft itself is not imported (seconds)."""
    task = tasks.get(cfg.model.task)
    if task.lora_plan is not None:
        return task.lora_plan(model, cfg)
    layers = lora_layers.linear_layers(model)  # qualified name -> leaf name
    whole = list(cfg.lora.modules_to_save or [])
    names = cfg.lora.target_modules
    if task.peft_task_type == "SEQ_CLS":
        whole += ["classifier", "score"]  # peft's SEQ_CLS trains the head whole, whatever else is named
    if lora_layers.is_all_linear(names):  # peft's own expansion, which apply_lora leaves to peft
        return lora_layers.all_linear_layers(model, task.peft_task_type), whole
    if isinstance(names, str):  # auto: lora.apply_lora's own choice
        names = lora_layers.find_target_modules(model) if names == "auto" else [names]
    return [q for q, leaf in layers.items() if leaf in names or q in names], whole


def _trained_tensors(model: Module, cfg: TrainConfig) -> tuple[int, list[int]]:
    """(parameters LoRA adds, the sizes of the tensors that train) for ``cfg.lora``: ``r x in``
    and ``out x r`` for each adapted layer, and a trained copy of each module kept whole (peft's
    ``modules_to_save``); a full fine-tune's trained parameters."""
    if not cfg.lora.enabled:
        full_fine_tune = tasks.get(cfg.model.task).full_fine_tune
        if full_fine_tune is not None:  # the task's own freezing, as its build does it
            full_fine_tune(model, cfg)
            return 0, [p.numel() for p in model.parameters() if p.requires_grad]
        return 0, [p.numel() for p in model.parameters()]
    targets, whole = adapted_layers(model, cfg)
    modules = dict(model.named_modules())
    # lora_A (r x in) and lora_B (out x r) of each layer, Linear and Conv1D alike
    adapters = [cfg.lora.r * int(d) for q in targets for d in modules[q].weight.shape]
    # peft matches a kept module by its name or its name's last parts
    kept = [m for q, m in modules.items() if any(q == k or q.endswith("." + k) for k in whole)]
    copies = [p.numel() for m in kept for p in m.parameters()]
    return sum(adapters) + sum(copies), adapters + copies


def offline_sizes(cfg: TrainConfig) -> memory.ModelSizes | str:
    """Exact parameter counts from a model built on the meta device; or why there is no estimate."""
    from accelerate import init_empty_weights

    model_class = tasks.get(cfg.model.task).model_class
    if model_class is None:
        return f"task {cfg.model.task} builds its own model"
    config = read_config_offline(cfg)
    if isinstance(config, str):
        return config
    if cfg.model.num_labels:  # a classifier's new head, as the task's build sizes it
        config.num_labels = cfg.model.num_labels
    shape = memory.model_shape(config)
    if shape is None:
        return f"the config of {cfg.model.name_or_path} names no hidden size or layer count"
    try:
        bare = skeleton(model_class, config)
        with init_empty_weights():  # LoRA's layers on the meta device too
            tied = _tied_count(bare, config)
            added, trained = _trained_tensors(bare, cfg)
            kept_whole = adapted_layers(bare, cfg)[1] if cfg.lora.enabled else []
            quantizable = quantizable_count(bare, _unquantized(cfg), kept_whole) if cfg.lora.enabled else 0
            targets = adapted_layers(bare, cfg)[0] if cfg.lora.enabled else []
            if cfg.lora.enabled:  # as the build leaves it: frozen but the modules kept whole
                train_only(bare, kept_whole)
            stacks = step_stacks(bare, cfg, targets)
    except Exception as e:  # noqa: BLE001 - advisory: an estimate must never stop a launch
        # a model of another task, LoRA targets that match nothing: the run says so in one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        return f"cannot build {cfg.model.name_or_path} for {cfg.model.task}: {reason}"
    params = sum(p.numel() for p in bare.parameters()) - tied + added
    checkpoint_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return memory.ModelSizes(
        params=params,
        trainable=sum(trained),
        shape=shape,
        weight_bytes=memory.weight_bytes(cfg.model.dtype, str(checkpoint_dtype)),
        quantizable=quantizable,
        quantization=cfg.model.quantization,
        moments_8bit=moments_8bit(cfg),
        small_trainable=small_count(trained),
        **lora_fields(cfg, bare, stacks),
        **frozen_fields(cfg),
    )


def other_sizes(cfg: TrainConfig) -> list[tuple[OtherModel, float | str]]:
    """Each model the task holds frozen beside the trained one (``Task.other_models``) with the
    bytes of its weights as it loads (``OtherModel.quantization``: the Linear layers but the head in
    4 or 8 bits, the rest in ``model.dtype``, a checkpoint's own on a GPU under auto), or why they
    are not known here (its config not on this machine)."""
    others = tasks.get(cfg.model.task).other_models
    return [(o, frozen_bytes(cfg, o)) for o in (others(cfg) if others is not None else ())]


def frozen_bytes(cfg: TrainConfig, other: OtherModel) -> float | str:

    named = replace(cfg, model=replace(cfg.model, name_or_path=other.name))
    config = read_config_offline(named)
    if isinstance(config, str):
        return config
    shape = memory.model_shape(config)
    model_class = tasks.get(cfg.model.task).model_class or "AutoModelForCausalLM"
    try:
        bare = skeleton(model_class, config)
        params = sum(p.numel() for p in bare.parameters()) - _tied_count(bare, config)
        quantized = quantizable_count(bare) if other.quantization else 0
    except Exception as e:  # noqa: BLE001 - advisory: an estimate must never stop a launch
        return f"cannot build {other.name}: {(str(e).strip().splitlines() or [type(e).__name__])[0][:120]}"
    checkpoint_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    each = memory.weight_bytes(cfg.model.dtype, str(checkpoint_dtype))
    hidden = shape.hidden if shape is not None else 1
    packed = memory.quantized_bytes(quantized, other.quantization, hidden) if other.quantization else 0.0
    return float((params - quantized) * each + packed)


def frozen_fields(cfg: TrainConfig) -> dict[str, Any]:
    """The ``ModelSizes`` fields of the frozen models beside the trained one (``other_sizes``):
    their bytes as they load, and where some of them are not in 4 bits, the overrides that would
    load them so and their bytes then."""
    found = [(o, b) for o, b in other_sizes(cfg) if isinstance(b, float)]
    if not found:
        return {}
    total = sum(b for _, b in found)
    changed = [o for o, _ in found if o.quantization != "4bit" and o.quantization_key]
    if not changed:
        return {"frozen_bytes": total}
    four = [frozen_bytes(cfg, replace(o, quantization="4bit")) for o in changed]
    if not all(isinstance(b, float) for b in four):
        return {"frozen_bytes": total}
    kept = sum(b for o, b in found if o not in changed)
    overrides = " ".join(f"{o.quantization_key}=4bit" for o in changed)
    return {"frozen_bytes": total, "frozen_4bit": (overrides, kept + sum(four))}


def with_others(sizes: memory.ModelSizes, cfg: TrainConfig) -> memory.ModelSizes:
    """``sizes`` of a built model with the frozen models beside it (``other_sizes``) added."""
    fields = frozen_fields(cfg)
    return replace(sizes, **fields) if fields else sizes


def _unquantized(cfg: TrainConfig) -> tuple[str, ...]:
    """The module names the task's quantized load leaves as they are (``Task.unquantized``)."""
    return tuple(getattr(tasks.get(cfg.model.task), "unquantized", ()) or ())


def live_sizes(
    model: Module, unquantized: tuple[str, ...] = (), cfg: TrainConfig | None = None
) -> memory.ModelSizes | None:
    """The sizes of a built model: counts (a 4-bit weight by its unpacked shape), the bytes of
    its frozen weights that are not quantized, as loaded, and the quantized ones; the trained
    weights in tensors too small for 8-bit optimizer state (``moments_8bit`` is the config's:
    ``check_live_model``); with ``cfg``, the task's stacks as they train in this model."""
    shape = memory.model_shape(getattr(model, "config", None))
    if shape is None:
        return None
    quantization = loaded_quantization(model)
    params = trainable = frozen = frozen_bytes = 0
    trained: list[int] = []
    for p in model.parameters():
        n = weight_count(p)
        params += n
        if p.requires_grad:
            trainable += n
            trained.append(n)
        elif quantization is None or type(p).__name__ not in ("Params4bit", "Int8Params"):
            frozen += n
            frozen_bytes += n * p.element_size()
    weight_bytes = 2 if frozen and frozen_bytes / frozen < 3 else 4
    quantizable = quantizable_count(model, unquantized)
    extra: dict[str, Any] = {}
    if cfg is not None:
        bare = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper
        adapted = [n for n, m in bare.named_modules() if getattr(m, "lora_A", None)]
        extra = lora_fields(cfg, bare, step_stacks(bare, cfg, adapted))
    return memory.ModelSizes(
        params,
        trainable,
        shape,
        weight_bytes,
        quantizable,
        quantization,
        small_trainable=small_count(trained),
        **extra,
    )


def check_live_model(
    model: Module,
    cfg: TrainConfig,
    precision: str,
    total_bytes: int,
    gpu_name: str,
    levers: memory.MemoryLevers = memory.MemoryLevers(),
) -> memory.MemoryCheck | None:
    """The training loop's check on its CUDA device (``total_bytes``: the card's memory;
    ``levers``: the chunked loss and activation offloading as the run has them)."""
    sizes = live_sizes(model, _unquantized(cfg), cfg)
    if sizes is None:
        return None
    if not cfg.lora.enabled and sizes.quantization is None:
        sizes = replace(sizes, quantizable=0)  # a full fine-tune cannot train 4-bit weights
    sizes = with_others(replace(sizes, moments_8bit=moments_8bit(cfg)), cfg)
    return memory.check_memory(
        sizes,
        cfg.batch.per_device,
        cfg.data.max_length,
        cfg.model.gradient_checkpointing,
        precision,
        total_bytes / memory.GIB,
        gpu_name,
        images=tasks.get(cfg.model.task).image_tokens,
        windows=sys.platform == "win32",
        levers=levers,
    )
