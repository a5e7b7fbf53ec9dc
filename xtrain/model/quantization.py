"""``model.quantization``: the base weights loaded in 4 or 8 bits through bitsandbytes (QLoRA).

One place decides all of it:

- ``bnb_settings``: the ``BitsAndBytesConfig`` keywords, a pure function of the setting, the run's
  precision and the device type (4bit: NF4 with double quantization, compute in bf16/fp16 under
  mixed precision on CUDA, float32 elsewhere; 8bit: LLM.int8);
- ``backend_problem``: the refusals (MPS; bitsandbytes missing, too old, or without a library
  for this device), a pure function of what ``check_backend`` reads off the installed package;
- ``load_kwargs``: what ``from_pretrained`` gets, each process on its own device
  (``device_map={"": <this process's device>}``: never all ranks on GPU 0);
- ``prepare``: peft's ``prepare_model_for_kbit_training`` without its gradient checkpointing
  (``lora.enable_gradient_checkpointing`` does that once, with input grads, when configured);
- ``keep_training_layout``: a model being trained keeps its 4-bit weights in the layout training
  computes with, through evaluations (bitsandbytes' CPU inference repack breaks gradients);
- ``predict_kwargs``: the same load for ``xtrain predict`` of a quantized run's adapter (a merged
  model is made from a fresh unquantized base: ``model/merge.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.machine.quant_support import MIN_BITSANDBYTES  # the one floor (pyproject pins it too)
from xtrain.runtime.quiet import quiet_bitsandbytes

if TYPE_CHECKING:
    import torch
    from torch.nn import Module

    from xtrain.config.schema import TrainConfig

# the package itself: the `xtrain` on the public index is an unrelated project (pyproject's
# `quantization` extra asks for the same, for installs from the checkout: pip install -e ".[quantization]")
INSTALL = f'pip install "bitsandbytes>={MIN_BITSANDBYTES}"'
UPGRADE = f'pip install -U "bitsandbytes>={MIN_BITSANDBYTES}"'
# what the weights become, for the run banner and the docs
DESCRIPTION = {
    "4bit": "4-bit NF4 with double quantization (bitsandbytes)",
    "8bit": "8-bit LLM.int8 (bitsandbytes)",
}
_COMPUTE_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
# Output heads kept in their dtype: the LM heads (lm_head; Whisper's proj_out; fairseq-style
# output_projection; GPT-NeoX's embed_out) and the classifier heads peft trains whole
HEADS = ("lm_head", "proj_out", "output_projection", "embed_out", "classifier", "score", "qa_outputs")


def describe(quantization: str | None) -> str | None:
    """One line on what the base weights are loaded as (None: not quantized)."""
    if quantization is None:
        return None
    return f"base weights loaded as {DESCRIPTION[quantization]}; LoRA adapters train in float32"


def bnb_settings(
    quantization: str,
    precision: str | None,
    device_type: str,
    skip: Sequence[str] = (),
    fsdp: bool = False,
) -> dict[str, Any]:
    """The ``BitsAndBytesConfig`` keywords. ``skip``: module-name patterns left unquantized
    (bitsandbytes' ``llm_int8_skip_modules``; empty: transformers' defaults). ``fsdp``: the run
    shards its weights with FSDP, which shards 4-bit weights only when they are stored in the
    dtype it gathers in (``bnb_4bit_quant_storage`` = the run's precision; bitsandbytes' default
    uint8 storage stays whole on every rank, and another dtype would be cast by FSDP's mixed
    precision, corrupting the packed bytes: docs/fitting-big-models.md, "FSDP with 4-bit weights")."""
    if quantization == "4bit":
        compute = _COMPUTE_DTYPE.get(precision or "no", "float32") if device_type == "cuda" else "float32"
        settings: dict[str, Any] = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": compute,
        }
        if fsdp:
            settings["bnb_4bit_quant_storage"] = _COMPUTE_DTYPE.get(precision or "no", "float32")
    elif quantization == "8bit":
        settings = {"load_in_8bit": True}
    else:
        raise ValueError(f"unknown quantization {quantization!r}")
    if skip:
        settings["llm_int8_skip_modules"] = list(skip)
    return settings


def skip_patterns(names: Sequence[str]) -> list[str]:
    """bitsandbytes skip patterns for the heads (``HEADS``) and the modules named ``names``, at
    any depth (transformers matches a pattern from the start of the qualified name).

    The heads are named because transformers' own default misses them: it keeps the module of
    the model's last parameter, but strips only ``.weight`` from its name, so a head whose last
    parameter is its bias (BERT's ``classifier``) got quantized (transformers 5.24), and peft
    cannot train a copy of a 4-bit layer (``modules_to_save``)."""
    either = "|".join(sorted({*HEADS, *names}))
    return [rf"(?:.*\.)?(?:{either})"]


@dataclass(frozen=True)
class Backend:
    """What the installed bitsandbytes offers (``check_backend`` reads it)."""

    version: str | None  # None: not installed
    devices: frozenset[str] = frozenset()  # bitsandbytes.supported_torch_devices
    gpu_library: bool = False  # its CUDA/ROCm native library loaded
    gpu_error: str = ""  # why not, in bitsandbytes' words (first line)
    torch_cuda: str | None = None  # torch.version.cuda
    import_error: str = ""  # installed, but ``import bitsandbytes`` failed: why


def backend_problem(quantization: str, device_type: str, backend: Backend) -> XtrainError | None:
    """Why ``quantization`` cannot run on ``device_type`` with ``backend`` (None: it can)."""
    key = f"model.quantization={quantization}"
    if device_type == "mps":
        return XtrainError(
            f"{key} does not run on Apple MPS (bitsandbytes' 4/8-bit training needs CUDA or the CPU)",
            "set model.quantization=null (LoRA on the 16-bit weights)",
        )
    return bnb_problem(key, device_type, backend, "set model.quantization=null")


def bnb_problem(key: str, device_type: str, backend: Backend, instead: str) -> XtrainError | None:
    """Why the setting ``key`` (``model.quantization=4bit``, ``optim.name=adamw_8bit``), which
    needs bitsandbytes, cannot run on ``device_type`` with ``backend`` (None: it can);
    ``instead``: the setting that needs no bitsandbytes, named in the fixes."""
    from packaging.version import Version

    if backend.version is None:
        return XtrainError(f"{key} needs bitsandbytes, which is not installed", f"{INSTALL}, or {instead}")
    if backend.import_error:
        return XtrainError(
            f"bitsandbytes {backend.version} is installed but does not import: {backend.import_error}"[:400],
            f"{UPGRADE} --force-reinstall --no-deps",
        )
    if Version(backend.version) < Version(MIN_BITSANDBYTES):
        return XtrainError(
            f"{key} needs bitsandbytes >= {MIN_BITSANDBYTES}; {backend.version} is installed", UPGRADE
        )
    if device_type not in backend.devices:
        return XtrainError(f"bitsandbytes {backend.version} has no {device_type} backend for {key}", UPGRADE)
    if device_type == "cuda" and not backend.gpu_library:
        cuda = f"CUDA {backend.torch_cuda}" if backend.torch_cuda else "this GPU"
        reason = f": {backend.gpu_error}" if backend.gpu_error else ""
        return XtrainError(
            f"bitsandbytes {backend.version} has no working library for {cuda}{reason}"[:400],
            f"{UPGRADE} --force-reinstall --no-deps (its wheels carry the CUDA libraries; --no-deps keeps "
            f"your CUDA torch), or {instead}",
        )
    return None


def read_backend() -> Backend:
    """The installed bitsandbytes, as ``backend_problem`` reads it (imports torch)."""
    import importlib.metadata

    import torch

    try:
        version = importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        return Backend(version=None)
    quiet_bitsandbytes()  # importing it logs a hint about an optional package on some CPUs
    try:
        import bitsandbytes
        from bitsandbytes import cextension
    except Exception as e:  # a broken install: say it as bitsandbytes did
        return Backend(version=version, import_error=_first_line(e))
    lib = getattr(cextension, "lib", None)
    gpu_library = type(lib).__name__ == "CudaBNBNativeLibrary"  # only a CUDA/ROCm build loads as this
    error = getattr(lib, "error_msg", "") or ""
    return Backend(
        version=version,
        devices=frozenset(getattr(bitsandbytes, "supported_torch_devices", ())),
        gpu_library=gpu_library,
        gpu_error=_first_line(error) if error else "",
        torch_cuda=torch.version.cuda,
    )


def _first_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def check_backend(quantization: str | None, device_type: str) -> None:
    """Refuse in one line when ``quantization`` cannot run on ``device_type`` here."""
    if quantization is None:
        return
    if device_type == "mps":  # said before bitsandbytes is imported
        problem = backend_problem(quantization, device_type, Backend(version=None))
    else:
        problem = backend_problem(quantization, device_type, read_backend())
    if problem is not None:
        raise problem


def load_kwargs(
    cfg: TrainConfig, device: str, precision: str, fsdp: bool = False, unquantized: Sequence[str] = ()
) -> dict[str, Any]:
    """``from_pretrained`` keywords for ``cfg.model.quantization`` ({} when off): the
    ``quantization_config`` and this process's ``device`` (``Run.device``: each rank its own
    GPU, never GPU 0 for every rank) as the whole model's ``device_map``, the 4-bit compute dtype
    from ``precision`` (``Run.precision``), FSDP's storage dtype when ``fsdp``.
    Kept in their dtype: the heads, ``unquantized`` (a task's vision tower) and
    ``lora.modules_to_save`` (trained whole: a 4-bit layer cannot be)."""
    quantization = cfg.model.quantization
    if quantization is None:
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    where = torch.device(device)
    check_backend(quantization, where.type)
    whole = [name.rsplit(".", 1)[-1] for name in cfg.lora.modules_to_save or []]
    skip = skip_patterns([*unquantized, *whole])
    settings = bnb_settings(quantization, precision, where.type, skip, fsdp=fsdp)
    # each rank loads its own copy on its own device (accelerate refuses a 4/8-bit model elsewhere)
    return {"quantization_config": BitsAndBytesConfig(**settings), "device_map": {"": _device_map(where)}}


def _device_map(where: torch.device) -> str | torch.device:
    return "cpu" if where.type == "cpu" else where


def predict_kwargs(
    quantization: str | None, device: torch.device, unquantized: Sequence[str] = (), whole: Sequence[str] = ()
) -> dict[str, Any]:
    """``from_pretrained`` keywords that load a quantized run's base for ``xtrain predict`` as
    its training did ({} when it was not quantized): the same ``bnb_settings`` and kept modules
    (the heads, the task's ``unquantized``, the adapter's ``modules_to_save`` ``whole``), the
    whole model on ``device``. A GPU computes 4-bit layers in bf16 where it has it, else fp16; the
    CPU in float32. Where bitsandbytes cannot run it, a GPU refuses in one line
    (``check_backend``) and the CPU loads the 16-bit base ({}), which the adapter loads onto too."""
    if quantization is None:
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    if device.type == "cpu":  # no usable bitsandbytes: the CPU can hold the 16-bit base instead
        if backend_problem(quantization, "cpu", read_backend()) is not None:
            return {}
    else:
        check_backend(quantization, device.type)
    precision = None
    if device.type == "cuda":
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    skip = skip_patterns([*unquantized, *(name.rsplit(".", 1)[-1] for name in whole)])
    settings = bnb_settings(quantization, precision, device.type, skip)
    where: str | int = "cpu"
    if device.type != "cpu":  # a GPU by its index ("cuda" alone names the current one)
        where = device.index if device.index is not None else torch.cuda.current_device()
    return {"quantization_config": BitsAndBytesConfig(**settings), "device_map": {"": where}}


def is_quantized(model: Module) -> bool:
    """A model (or a peft model around one) whose weights bitsandbytes loaded in 4 or 8 bits."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def prepare(model: Module) -> Module:
    """peft's k-bit preparation: the base frozen, its non-quantized half-precision weights (norms,
    embeddings, head) in float32. Gradient checkpointing and input grads are left to
    ``lora.enable_gradient_checkpointing`` (switched on once, only when configured)."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def keep_training_layout(model: Module) -> int:
    """Keep every bitsandbytes ``Linear4bit`` of ``model`` in its training layout for the whole
    run; returns how many layers were switched (0: no 4-bit layer, nothing imported).

    bitsandbytes 0.50 on a CPU with AVX512-BF16 repacks a ``Linear4bit``'s weight for its CPU
    inference kernel at the layer's first forward in eval mode under ``no_grad`` (an evaluation),
    in place (``quant_state.packing_format_for_cpu``); every later forward then goes through
    ``gemv_4bit``, which has no autograd kernel: the gradient to the layer's input is None, so
    the adapters below it stop learning but through the residual stream, and the outputs move by
    about 1e-2 (its scales are rounded to bf16). Its inverse (``_convert_weight_packed_for_cpu_inverse``)
    is best-effort: the weights come back moved by about 2e-4. So the repack must not happen:
    the layer's own switch, ``support_avx512bf16_for_cpu`` (read in ``Linear4bit.forward``), is
    turned off, and an evaluation computes what training computes (dequantize + matmul). A
    weight already repacked (a custom task that ran it in eval mode) is unpacked by that inverse.
    CUDA and 8-bit layers are untouched: nothing there changes state on an evaluation
    (docs/fitting-big-models.md, "4-bit training and evaluation")."""
    import sys

    if "bitsandbytes" not in sys.modules:  # no bitsandbytes layer can exist
        return 0
    from bitsandbytes.nn import Linear4bit

    switched = 0
    for module in model.modules():
        if not isinstance(module, Linear4bit):
            continue
        module.support_avx512bf16_for_cpu = False
        weight = module.weight
        if getattr(weight.quant_state, "packing_format_for_cpu", False):
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse as unpack

            weight.data, weight.quant_state = unpack(weight.data, weight.quant_state)
        switched += 1
    return switched
