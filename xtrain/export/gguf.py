"""A merged model written as one GGUF file by xtrain itself, in Python, through the ``gguf``
package's ``GGUFWriter``, tensor-name maps and numpy quantizers: no llama.cpp checkout to build.

The file is written in one pass with little memory beyond the model: every tensor's name, shape
and type is planned first (``plan_tensors``, from shapes alone), the header and tensor table are
written, then each tensor is converted (``families.convert_tensor``), quantized and written in
turn, one at a time. Types follow llama.cpp: ``f16``/``bf16`` write every matrix in that type,
``q8_0`` every matrix whose rows divide into its 32-value blocks (others f16), as its converter
does; ``q4_0``, ``q4_k_m``, ``q5_k_m`` and ``q6_k`` mix types per tensor as its ``llama-quantize``
does (``kquants.choose_type``; the K-quants are written by ``kquants``, the others by the gguf
package); 1-D weights (norms, biases) and rope factors stay float32. The file appears under its
name only when complete (``NAME.tmp``, then replaced).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.export import families, kquants
from xtrain.export.vocab import read_vocab, write_vocab

if TYPE_CHECKING:
    from types import ModuleType

    import numpy as np
    from torch import Tensor
    from torch.nn import Module
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

TYPES = tuple(kquants.DEFAULT)  # f16 bf16 q8_0 q4_0 q4_k_m q5_k_m q6_k
INSTALL = 'pip install "gguf>=0.10"'  # the package itself: `xtrain` on the index is another project

Progress = Callable[[int, int], None]  # (bytes written, bytes in all)


def require_gguf() -> ModuleType:
    """The ``gguf`` package, or one line saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise XtrainError("xtrain export --to gguf/ollama needs the gguf package", INSTALL) from None
    return gguf


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the file: its GGUF name, where it comes from, its shape and type."""

    name: str
    source: str | None  # the model's state_dict key; None: an extra tensor (rope factors)
    shape: tuple[int, ...]
    qtype: str  # F32 | F16 | BF16 | Q8_0 | Q4_K ... (gguf.GGMLQuantizationType member names)

    @property
    def nbytes(self) -> int:
        return kquants.nbytes(self.shape, self.qtype)


@dataclass(frozen=True)
class Written:
    """One tensor as the writer meant it: what the file must hold under its name (type, shape, the
    bytes' sha256) and, for a quantized type, how the format's own reader (the ``gguf`` package's
    dequantizer) reads those bytes back."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    digest: str
    error: float | None = None  # relative rms error against the merged weights (quantized types)
    differs_at: int | None = None  # K-quants: the first value read back unlike xtrain's quantizer's


def digest(data: np.ndarray) -> str:
    import numpy as np

    return hashlib.sha256(memoryview(np.ascontiguousarray(data)).cast("B")).hexdigest()


def read_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Every tensor of a GGUF file as the ``gguf`` package's reader finds it: name -> (type, shape
    in the model's order, the bytes' sha256)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {
        t.name: (t.tensor_type.name, tuple(int(n) for n in reversed(t.shape.tolist())), digest(t.data))
        for t in reader.tensors
    }


def plan_tensors(model: Module, kind: str) -> tuple[list[PlannedTensor], dict[str, np.ndarray]]:
    """Every tensor the file holds, in order, and the extra arrays (rope factors) by name."""
    gguf = require_gguf()
    config = model.config
    family = families.family_of(config)
    arch = gguf.MODEL_ARCH[family.arch]
    names = gguf.get_tensor_name_map(arch, int(config.num_hidden_layers))
    extra = families.rope_tensors(config, family)
    planned = [PlannedTensor(name, None, tuple(a.shape), "F32") for name, a in extra.items()]
    placed: list[tuple[str, str, tuple[int, ...]]] = []
    for key, weight in model.state_dict().items():
        if families.skipped(key, config):
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise XtrainError(
                f"GGUF export cannot place the weight {key} of this {family.name} model",
                "export it with --to merged (safetensors)",
            )
        placed.append((name, key, tuple(weight.shape)))
    tied = "output.weight" not in {name for name, _, _ in placed}
    layers = int(config.num_hidden_layers)
    for name, key, shape in placed:
        planned.append(PlannedTensor(name, key, shape, kquants.choose_type(name, shape, kind, layers, tied)))
    return planned, extra


def _array(
    model_state: dict[str, Tensor], t: PlannedTensor, config: PretrainedConfig, family: families.Family
) -> tuple[np.ndarray, Written]:
    """The tensor's data, converted for llama.cpp and in its file type, and the record of it
    (``Written``; a quantized type read back by the gguf package: ``kquants.read_back``)."""
    data = model_state[t.source].detach().float().cpu().numpy()
    data = families.convert_tensor(t.source or "", data, config, family)
    if t.qtype == "F32":
        data = data.astype("float32")
        return data, Written(t.name, t.qtype, t.shape, digest(data))
    quantized, meant = kquants.quantize_meant(data, t.qtype)
    if t.qtype in ("F16", "BF16"):
        return quantized, Written(t.name, t.qtype, t.shape, digest(quantized))
    error, differs_at = kquants.read_back(data, quantized, t.qtype, meant)
    return quantized, Written(t.name, t.qtype, t.shape, digest(quantized), error, differs_at)


_FILE_TYPES = {
    "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0",
    "q4_k_m": "MOSTLY_Q4_K_M", "q5_k_m": "MOSTLY_Q5_K_M", "q6_k": "MOSTLY_Q6_K",
}  # fmt: skip


def estimate_bytes(model: Module, kind: str) -> int:
    """The file's size, near enough for the disk check: its tensors (metadata is small)."""
    planned, _ = plan_tensors(model, kind)
    return sum(t.nbytes for t in planned)


def write_gguf(
    model: Module,
    tokenizer: PreTrainedTokenizerBase,
    path: Path,
    kind: str,
    template: str | None,
    eot: int | None,
    name: str,
    progress: Progress | None = None,
    chat_bos: bool | None = None,
) -> list[Written]:
    """``model`` (merged, any dtype) with ``tokenizer`` and the chat ``template`` as one GGUF file
    at ``path``; ``eot``: the template's end-of-turn token, ``chat_bos``: whether it writes the
    bos token (``read_vocab``). Returns every tensor as it was meant (``Written``), for the check
    of the file read back (``parity.written``)."""
    gguf = require_gguf()
    config = model.config
    family = families.family_of(config)
    planned, extra = plan_tensors(model, kind)
    vocab = read_vocab(tokenizer, int(config.vocab_size), eot, chat_bos)
    writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[family.arch]])
    writer.add_type("model")
    writer.add_name(name)
    for method, value in families.hyperparameters(config, family):
        getattr(writer, method)(value)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[kind]]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_vocab(writer, vocab)
    if template:
        writer.add_chat_template(template)
    for t in planned:  # the tensor table from shapes alone: nothing converted yet
        byte_shape = gguf.quants.quant_shape_to_byte_shape(t.shape, gguf.GGMLQuantizationType[t.qtype])
        dtype = {"F32": "float32", "F16": "float16"}.get(t.qtype, "uint8")
        shape = t.shape if dtype != "uint8" else byte_shape
        writer.add_tensor_info(t.name, shape, _np_dtype(dtype), t.nbytes, gguf.GGMLQuantizationType[t.qtype])
    tmp = path.with_name(path.name + ".tmp")
    total, done = sum(t.nbytes for t in planned), 0
    written: list[Written] = []
    state = model.state_dict()
    try:
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in planned:
            if t.source is None:
                data = extra[t.name]
                record = Written(t.name, t.qtype, t.shape, digest(data))
            else:
                data, record = _array(state, t, config, family)
            written.append(record)
            writer.write_tensor_data(data)
            done += t.nbytes
            if progress is not None:
                progress(done, total)
        writer.close()
        atomic.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return written


def _np_dtype(name: str) -> np.dtype:
    import numpy as np

    return np.dtype(name)


def free_bytes(folder: Path) -> int:
    import shutil

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(folder: Path, need: int) -> None:
    """Refuse before writing when ``folder``'s disk holds less than ``need`` bytes (+5%)."""
    free = free_bytes(folder)
    if free < need * 1.05:
        raise XtrainError(
            f"{folder} has {free / 2**30:.1f} GiB free; the export needs about {need / 2**30:.1f} GiB",
            "free some space or pass --output on a disk with room",
        )


def gguf_name(output: Path, kind: str) -> Path:
    """The GGUF file of an ``--output`` folder: ``model-<kind>.gguf`` inside it."""
    return output / f"model-{kind}.gguf"
