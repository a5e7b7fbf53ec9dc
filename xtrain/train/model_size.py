"""A model's sizes for the memory estimate (``memory.ModelSizes``), without loading its weights.

- ``offline_sizes(cfg)``: before launching (``xtrain train``'s plan). The config is read only
  where it already is (a local folder, a built-in, the Hugging Face cache: never a download, never
  a repository's custom code); the model is built on the meta device (``init_empty_weights`` +
  the task's Auto class ``from_config``: shapes, no memory), and LoRA is counted on the layers
  the task's own chooser picks (``r x (in + out)`` each, plus a copy of each module trained whole):
  both counts are exact, without importing peft (seconds). Anything that stops it returns the
  reason instead (the plan skips the estimate; the run itself reports real problems).
- ``live_sizes(model)``: the training loop's model as it is (real counts, real dtypes; a 4-bit
  weight, which bitsandbytes stores packed two to a byte, is counted by its unpacked shape).

Both count the weights that ``model.quantization`` stores in 4 or 8 bits (``quantizable``): the
Linear layers but the output head, the modules trained whole and the task's ``unquantized``
modules (a vision tower), as the task's quantized load skips them (transformers' default: the
output head). A full fine-tune has none: 4-bit weights cannot train.

Imports transformers and accelerate: the CLI imports this module only when the plan needs
the estimate (a CUDA machine).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.train import lora, memory, tasks
from xtrain.train.config.schema import TrainConfig
from xtrain.train.stack_sizes import lora_fields, step_stacks, train_only


def read_config_offline(cfg: TrainConfig) -> Any | str:
    """The model's ``AutoConfig`` from a local folder, a built-in or the hub cache; else why not."""
    from transformers import AutoConfig

    from xtrain.train import models

    name = cfg.model.name_or_path
    if cfg.model.trust_remote_code:
        return "the model's config runs custom code (model.trust_remote_code)"
    if builtin.is_builtin(name):
        try:
            source = str(builtin.ensure_builtin_model(name))  # the run builds the same folder
        except XtrainError as e:
            return e.message
    elif Path(name).expanduser().is_dir():
        source = str(Path(name).expanduser())
    elif models.looks_like_hub_id(name):
        source = name
    else:
        return f"{name} not found"
    try:  # local_files_only: the hub cache at most, no network
        return AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except Exception:
        return f"{name} is not downloaded yet"


# the dtypes a checkpoint's config.json names (torch_dtype before transformers 4.56, dtype after)
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")


def dtype_in_config(data: dict[str, Any]) -> str | None:
    """The dtype a ``config.json`` says its weights are saved in: ``dtype`` or ``torch_dtype`` at
    its top level, else in its text model's config (composite configs such as Qwen2-VL's); None
    when it names none of float32/bfloat16/float16."""
    for where in (data, data.get("text_config"), data.get("decoder")):
        if not isinstance(where, dict):
            continue
        for key in ("dtype", "torch_dtype"):
            value = str(where.get(key) or "").removeprefix("torch.")
            if value in CHECKPOINT_DTYPES:
                return value
    return None


def checkpoint_dtype(cfg: TrainConfig) -> str | None:
    """The dtype the model's checkpoint is saved in, from its ``config.json`` where that is on this
    machine (a local folder, a built-in already built, the hub cache: ``model_checks.config_path``;
    never a download; plain JSON, so no repository code runs); None: unknown (the plan then decides
    from the GPU alone). Read once per process by the caller of ``planning.resolve`` (machine I/O
    stays out of the rules)."""
    from xtrain.train import model_checks

    data = model_checks.config_json(cfg.model.name_or_path)
    return dtype_in_config(data) if data is not None else None


def adapted_layers(model: Any, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(the Linear layers that get adapters, the modules trained whole) as the task's builder picks
    them, with the task's own chooser (``Task.lora_plan``); peft itself is not imported (seconds)."""
    task = tasks.get(cfg.model.task)
    if task.lora_plan is not None:
        return task.lora_plan(model, cfg)
    layers = lora.linear_layers(model)  # qualified name -> leaf name
    whole = list(cfg.lora.modules_to_save or [])
    names = cfg.lora.target_modules
    if task.peft_task_type == "SEQ_CLS":
        whole += ["classifier", "score"]  # peft's SEQ_CLS trains the head whole, whatever else is named
    if lora.is_all_linear(names):  # peft's own expansion, which apply_lora leaves to peft
        return lora.all_linear_layers(model, task.peft_task_type), whole
    if isinstance(names, str):  # auto: lora.apply_lora's own choice
        names = lora.find_target_modules(model) if names == "auto" else [names]
    return [q for q, leaf in layers.items() if leaf in names or q in names], whole


def _trained_tensors(model: Any, cfg: TrainConfig) -> tuple[int, list[int]]:
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


def moments_8bit(cfg: TrainConfig) -> bool:
    """Whether ``optim.name`` keeps AdamW's moments in 8 bits (bitsandbytes)."""
    from xtrain.train.optim import BNB_OPTIMIZERS

    return cfg.optim.name in BNB_OPTIMIZERS


def small_count(sizes: list[int]) -> int:
    """The weights in tensors too small for bitsandbytes' 8-bit optimizer state."""
    return sum(n for n in sizes if n < memory.MIN_8BIT_SIZE)


def offline_sizes(cfg: TrainConfig) -> memory.ModelSizes | str:
    """Exact parameter counts from a model built on the meta device; or why there is no estimate."""
    import transformers
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
    auto = getattr(transformers, model_class)
    try:
        with init_empty_weights():
            # Auto classes build from a config with from_config, model classes with their constructor
            bare = auto.from_config(config) if hasattr(auto, "from_config") else auto(config)
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
    )


def _unquantized(cfg: TrainConfig) -> tuple[str, ...]:
    """The module names the task's quantized load leaves as they are (``Task.unquantized``)."""
    return tuple(getattr(tasks.get(cfg.model.task), "unquantized", ()) or ())


# peft's modules_to_save wrapper: the frozen original and the trained copy, both kept as they are
_KEPT = ("original_module", "modules_to_save")


def quantizable_count(
    model: Any, unquantized: tuple[str, ...] = (), kept_whole: list[str] | None = None
) -> int:
    """Weights of the Linear layers that 4-bit/8-bit loading replaces: those transformers
    converts under the task's skip list (``quantization.skip_patterns``: the heads and
    ``unquantized``, matched by transformers' own ``should_convert_module``), not the output
    head, not a module kept whole (by name or its name's last parts, as peft matches them), not
    LoRA's own layers. A 4-bit weight counts as its unpacked shape."""
    import torch
    from transformers.quantizers.quantizers_utils import should_convert_module

    from xtrain.train.quantization import skip_patterns

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


def weight_count(weight: Any) -> int:
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


def total_weights(model: Any) -> int:
    """The weights of ``model``, a 4-bit one counted unpacked (the run banner's and
    ``train_result.json``'s ``total_params``: the same count as the unquantized model's)."""
    return sum(weight_count(p) for p in model.parameters())


def loaded_quantization(model: Any) -> str | None:
    """How a built model's weights were loaded: 4bit (bitsandbytes ``Params4bit``), 8bit
    (``Int8Params``), None; told by class name, so bitsandbytes is not imported."""
    kinds = {type(p).__name__ for p in model.parameters()}
    return "4bit" if "Params4bit" in kinds else "8bit" if "Int8Params" in kinds else None


def meta_model(cfg: TrainConfig, task: Any, config: Any) -> Any | str:
    """The task's model built from ``config`` on the meta device (module names and shapes, no
    memory); or why it cannot be built."""
    import transformers
    from accelerate import init_empty_weights

    auto = getattr(transformers, task.model_class)
    try:
        with init_empty_weights():
            return auto.from_config(config) if hasattr(auto, "from_config") else auto(config)
    except Exception as e:  # noqa: BLE001 - advisory: the run itself loads the model and says why
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        return f"cannot build {cfg.model.name_or_path} for {cfg.model.task}: {reason}"


def _tied_count(model: Any, config: Any) -> int:
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


def live_sizes(
    model: Any, unquantized: tuple[str, ...] = (), cfg: TrainConfig | None = None
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
    model: Any, cfg: TrainConfig, precision: str, total_bytes: int, gpu_name: str
) -> memory.MemoryCheck | None:
    """The training loop's check on its CUDA device (``total_bytes``: the card's memory)."""
    sizes = live_sizes(model, _unquantized(cfg), cfg)
    if sizes is None:
        return None
    if not cfg.lora.enabled and sizes.quantization is None:
        sizes = replace(sizes, quantizable=0)  # a full fine-tune cannot train 4-bit weights
    sizes = replace(sizes, moments_8bit=moments_8bit(cfg))
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
    )
