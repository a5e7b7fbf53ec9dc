"""The 4/5/6-bit K-quants of GGUF (Q4_K, Q5_K, Q6_K) written in numpy, and which type each tensor
of a ``q4_0`` / ``q4_k_m`` / ``q5_k_m`` / ``q6_k`` file gets.

The ``gguf`` package quantizes Q4_0..Q8_0 but only reads the K-quants. What is written here
follows the format's definition in llama.cpp (``ggml/src/ggml-quants.c``: ``quantize_row_q4_K_ref``,
``_q5_K_ref``, ``_q6_K_ref`` and their ``make_qkx2_quants`` / ``make_qx_quants``; the block layouts
of ``ggml-common.h``), computed for every block of a tensor at once instead of block by block:

- a super-block is 256 values of one row. Q4_K/Q5_K split it into 8 sub-blocks of 32, each with
  a scale and a min found by a weighted least-squares search over 21 (Q4_K) / 16 (Q5_K) candidate
  scales; the 8 scales and 8 mins are themselves quantized to 6 bits against one f16 ``d`` and
  ``dmin``, and the values requantized with those. Q6_K: 16 sub-blocks of 16, signed 6-bit
  values, an int8 scale each against one f16 ``d``.
- layouts (bytes): Q4_K ``d, dmin, scales[12], qs[128]`` (144); Q5_K ``d, dmin, scales[12],
  qh[32], qs[128]`` (176); Q6_K ``ql[128], qh[64], scales[16], d`` (210).

The reference round-to-nearest (llama.cpp's ``nearest_int``, ties to even) is ``np.rint``. The
package's own dequantizer (``gguf.quants.dequantize``) reads what this writes: that round trip is
the test (tests/test_export_quants.py).

The type choice per tensor (``choose_type``) is llama.cpp's ``llama_tensor_get_type``
(``src/llama-quant.cpp``) for these four file types and the families xtrain writes: the output
head (and the token embedding when the head is tied to it) in Q6_K; in ``q4_k_m``/``q5_k_m``,
``attn_v`` (and a fused ``attn_qkv``) and ``ffn_down`` in Q6_K in the layers its ``use_more_bits``
picks (the first and last eighth and every third between, about half); the rest in the file's
type. A row whose width is not a multiple of the type's block falls back as llama.cpp does
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; F16 when even that does not divide; Q4_0 -> F16,
where llama.cpp's quantizer stops). llama.cpp's rules for Falcon, mixture-of-experts models and
70B Llamas' ``attn_v`` are not here: xtrain exports none of those.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

QK_K = 256  # values per K-quant super-block

# (values per block, bytes per block) of every type a file here can hold: gguf's GGML_QUANT_SIZES
SIZES = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_K": (QK_K, 144),
    "Q5_K": (QK_K, 176),
    "Q6_K": (QK_K, 210),
}

# the file's --type -> the type most of its matrices get (llama.cpp's llama_ftype_get_default_type)
DEFAULT = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K",
           "q5_k_m": "Q5_K", "q6_k": "Q6_K"}  # fmt: skip
# a row too narrow for a type's block: what llama.cpp writes instead (tensor_type_fallback)
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q4_0": "F16", "Q8_0": "F16"}
_LAYER = re.compile(r"^blk\.(\d+)\.")


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's pick of the layers whose ``attn_v``/``ffn_down`` get Q6_K in a ``*_k_m`` file."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def fits(qtype: str, width: int) -> bool:
    return width % SIZES[qtype][0] == 0


def choose_type(name: str, shape: tuple[int, ...], kind: str, layers: int, tied: bool) -> str:
    """The GGUF type of the tensor ``name`` (a GGUF name: ``blk.3.attn_v.weight``) of ``shape`` in a
    ``kind`` file (``DEFAULT``'s keys) of a model with ``layers`` blocks; ``tied``: the file has no
    ``output.weight`` (the token embedding is the head)."""
    if len(shape) < 2:
        return "F32"  # norms, biases: llama.cpp quantizes only matrices
    base = DEFAULT[kind]
    if kind in ("f16", "bf16"):
        return base
    width = shape[-1]
    chosen = base
    is_head = name == "output.weight" or (tied and name == "token_embd.weight")
    if is_head:
        # the head is the tensor most sensitive to quantization: Q6_K unless the file is Q8_0
        chosen = "Q8_0" if not fits(base, width) else "Q6_K" if base != "Q8_0" else base
    elif kind in ("q4_k_m", "q5_k_m") and re.search(r"\.(attn_v|attn_qkv|ffn_down)\.weight$", name):
        found = _LAYER.match(name)
        if found is not None and use_more_bits(int(found.group(1)), layers):
            chosen = "Q6_K"
    return _fall_back(chosen, width)


def _fall_back(qtype: str, width: int) -> str:
    while not fits(qtype, width):
        qtype = FALLBACK.get(qtype, "F16")
    return qtype


def nbytes(shape: tuple[int, ...], qtype: str) -> int:
    """The bytes a tensor of ``shape`` takes in ``qtype``."""
    count = 1
    for n in shape:
        count *= n
    block, size = SIZES[qtype]
    return count // block * size


# -- the quantizers --------------------------------------------------------------------------------

_VALUES_AT_ONCE = 1 << 20  # values quantized per numpy pass (a few MiB of temporaries)


def quantize(data: np.ndarray, qtype: str) -> np.ndarray:
    """``data`` (float32, last axis the rows) as the bytes of ``qtype``: uint8 of shape
    (rows..., width // block * block bytes), what ``GGUFWriter`` writes. Q4_K/Q5_K/Q6_K here,
    the other types by the ``gguf`` package."""
    return quantize_meant(data, qtype)[0]


def quantize_meant(data: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(``quantize``'s bytes, the values they are meant to read back as): for the K-quants written
    here, each value as this quantizer computed it from its own scales and levels before packing
    them (float32, ``data``'s shape), which the format's reader must give back exactly; None for
    the types the ``gguf`` package quantizes itself."""
    import numpy as np

    if qtype not in _BLOCKS:
        import gguf

        return gguf.quants.quantize(data, gguf.GGMLQuantizationType[qtype]), None
    data = np.ascontiguousarray(data, dtype=np.float32)
    width = data.shape[-1]
    if width % QK_K:
        raise ValueError(f"rows of {width} values do not divide into {qtype}'s blocks of {QK_K}")
    blocks = data.reshape(-1, QK_K)
    step = max(1, _VALUES_AT_ONCE // QK_K)
    parts = [_BLOCKS[qtype](blocks[i : i + step]) for i in range(0, len(blocks), step)]
    packed = np.concatenate([p for p, _ in parts])
    values = np.concatenate([v for _, v in parts]).reshape(data.shape)
    return packed.reshape(*data.shape[:-1], width // QK_K * SIZES[qtype][1]), values


def read_back(
    data: np.ndarray, quantized: np.ndarray, qtype: str, meant: np.ndarray | None = None
) -> tuple[float, int | None]:
    """``quantized`` (``qtype``'s bytes of ``data``) read by the ``gguf`` package's dequantizer, a
    few rows at a time (no float32 copy of the whole tensor): (its relative rms error against
    ``data``: sqrt(sum (read - data)^2 / sum data^2), 0 for an all-zero tensor read back as zeros;
    the flat index of the first value that differs from ``meant``, None when all are equal or
    nothing is meant)."""
    import gguf
    import numpy as np

    rows = data.reshape(-1, data.shape[-1])
    packed = quantized.reshape(len(rows), -1)
    expected = None if meant is None else meant.reshape(len(rows), -1)
    step = max(1, _VALUES_AT_ONCE // rows.shape[1])
    wrong = total = 0.0
    first = None
    for i in range(0, len(rows), step):
        back = gguf.quants.dequantize(packed[i : i + step], gguf.GGMLQuantizationType[qtype])
        part = rows[i : i + step].astype(np.float32)
        wrong += float(np.square(back - part, dtype=np.float64).sum())
        total += float(np.square(part, dtype=np.float64).sum())
        if expected is not None and first is None:
            differs = np.flatnonzero(back.reshape(-1) != expected[i : i + step].reshape(-1))
            first = int(differs[0]) + i * rows.shape[1] if len(differs) else None
    if total == 0:
        return (0.0 if wrong == 0 else float("inf")), first
    return (wrong / total) ** 0.5, first


def error(data: np.ndarray, quantized: np.ndarray, qtype: str) -> float:
    """The relative rms error of ``quantized`` as the ``gguf`` package reads it (``read_back``)."""
    return read_back(data, quantized, qtype)[0]


def _f16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the f16 bytes of ``values``, their value back in float32): what the block holds and reads."""
    import numpy as np

    half = values.astype(np.float16)
    return half.reshape(-1, 1).view(np.uint8), half.astype(np.float32)


def _qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """``make_qkx2_quants`` (squared error) on every row of ``x`` at once: each row's (scale,
    min >= 0, levels 0..nmax) with ``x ~ scale * L - min``, the best of ``nstep + 1`` candidate
    scales by a weighted least-squares fit of scale and min to each candidate's levels. As in the
    reference, a candidate is rounded against the best min found so far."""
    import numpy as np

    lo = np.minimum(x.min(axis=1), 0)
    hi = x.max(axis=1)
    flat = hi == lo
    span = np.where(flat, 1, hi - lo)
    sum_w = w.sum(axis=1)
    sum_x = (w * x).sum(axis=1)
    scale = span / nmax
    levels = np.clip(np.rint((nmax / span)[:, None] * (x - lo[:, None])), 0, nmax)
    best = (w * (scale[:, None] * levels + lo[:, None] - x) ** 2).sum(axis=1)
    low = lo.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in range(nstep + 1):
            room = hi - low
            iscale = np.float32(rmin + rdelta * step + nmax) / np.where(room > 0, room, 1)
            aux = np.clip(np.rint(iscale[:, None] * (x - low[:, None])), 0, nmax)
            weighted = w * aux
            sum_l = weighted.sum(axis=1)
            sum_l2 = (weighted * aux).sum(axis=1)
            sum_xl = (weighted * x).sum(axis=1)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            this_min = np.where(positive, 0, this_min)
            error = (w * (this_scale[:, None] * aux + this_min[:, None] - x) ** 2).sum(axis=1)
            better = (det > 0) & (room > 0) & (error < best)
            levels = np.where(better[:, None], aux, levels)
            best = np.where(better, error, best)
            scale = np.where(better, this_scale, scale)
            low = np.where(better, this_min, low)
    scale = np.where(flat, 0, scale).astype(np.float32)
    levels = np.where(flat[:, None], 0, levels)
    return scale, (-low).astype(np.float32), levels


def _scale_min_k4(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """The Q4_K/Q5_K super-block: (d and dmin bytes, the 12 packed scale bytes, the levels)."""
    import numpy as np

    n = len(x)
    sub = x.reshape(n * 8, 32)
    weights = np.sqrt((sub * sub).mean(axis=1, dtype=np.float32))[:, None] + np.abs(sub)
    scales, mins, levels = _qkx2(sub, weights, nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale = np.maximum(scales.max(axis=1), 0)
    max_min = np.maximum(mins.max(axis=1), 0)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, np.float32(63) / max_scale, 0).astype(np.float32)
        inv_min = np.where(max_min > 0, np.float32(63) / max_min, 0).astype(np.float32)
    ls = np.clip(np.rint(inv_scale[:, None] * scales), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(inv_min[:, None] * mins), 0, 63).astype(np.uint8)
    packed = np.concatenate(
        [
            ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
            lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
            (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4),
        ],
        axis=1,
    )
    d_bytes, d = _f16(max_scale / np.float32(63))
    m_bytes, dmin = _f16(max_min / np.float32(63))
    # requantize every value against the scales and mins as the file stores them
    step = (d[:, None] * ls).reshape(n * 8, 1)
    shift = (dmin[:, None] * lm).reshape(n * 8, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(np.rint((sub + shift) / step), 0, nmax)
    levels = np.where(step != 0, again, levels).astype(np.uint8).reshape(n * 8, 32)
    values = (step * levels.astype(np.float32) - shift).reshape(n, QK_K)  # the reader's arithmetic
    return np.concatenate([d_bytes, m_bytes, packed], axis=1), levels.reshape(n, 8, 32), values


def _q4_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    head, levels, values = _scale_min_k4(x, 15, -1.0, 0.1, 20)
    pairs = levels.reshape(len(x), 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(len(x), 128)
    return np.concatenate([head, qs], axis=1), values


def _q5_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    head, levels, values = _scale_min_k4(x, 31, -0.5, 0.1, 15)
    pairs = levels.reshape(len(x), 4, 2, 32)
    qs = ((pairs[:, :, 0] & 0xF) | ((pairs[:, :, 1] & 0xF) << 4)).reshape(len(x), 128)
    high = (levels.reshape(len(x), 8, 32) >> 4).astype(np.uint8)  # sub-block j's fifth bit: bit j
    qh = np.zeros((len(x), 32), dtype=np.uint8)
    for j in range(8):
        qh |= high[:, j] << j
    return np.concatenate([head, qh, qs], axis=1), values


def _qx(x: np.ndarray, nmax: int):
    """``make_qx_quants`` with squared weights (``rmse_type`` 1) on every row of ``x`` at once: each
    row's scale and signed levels -nmax..nmax-1 (stored + nmax), the best of 19 candidate scales."""
    import numpy as np

    at = np.abs(x).argmax(axis=1)
    peak = np.take_along_axis(x, at[:, None], axis=1)[:, 0]
    zero = np.abs(peak) < 1e-15
    peak = np.where(zero, 1, peak)
    w = x * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        levels = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)
        return levels, (w * x * levels).sum(axis=1), (w * levels * levels).sum(axis=1)

    levels, sumlx, suml2 = fit(np.float32(-nmax) / peak)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 > 0, sumlx / suml2, 0).astype(np.float32)
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            aux, lx, l2 = fit(-np.float32(nmax + 0.1 * step) / peak)
            better = (l2 > 0) & (lx * lx > best * l2)
            levels = np.where(better[:, None], aux, levels)
            scale = np.where(better, lx / l2, scale)
            best = np.where(better, scale * lx, best)
    scale = np.where(zero, 0, scale).astype(np.float32)
    levels = np.where(zero[:, None], -nmax, levels)
    return scale, levels


def _q6_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    n = len(x)
    sub = x.reshape(n * 16, 16)
    scales, levels = _qx(sub, 32)
    scales = scales.reshape(n, 16)
    at = np.abs(scales).argmax(axis=1)
    max_scale = np.take_along_axis(scales, at[:, None], axis=1)[:, 0]
    empty = np.abs(max_scale) < 1e-15
    with np.errstate(divide="ignore"):
        iscale = np.where(empty, 0, np.float32(-128) / np.where(empty, 1, max_scale)).astype(np.float32)
        d_bytes, d = _f16(np.where(empty, 0, np.float32(1) / np.where(empty, 1, iscale)))
    small = np.minimum(127, np.rint(iscale[:, None] * scales)).astype(np.int8)
    step = (d[:, None] * small.astype(np.float32)).reshape(n * 16, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(np.rint(sub / step), -32, 31)
    levels = (np.where(step != 0, again, levels) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    levels[empty] = 0  # an all-zero super-block is all zero bytes
    d_bytes = np.where(empty[:, None], 0, d_bytes).astype(np.uint8)
    small = np.where(empty[:, None], 0, small).astype(np.int8)
    # what the block stores, as the reader computes it: d x scale x (level - 32)
    scale = (d_bytes.view(np.float16).astype(np.float32) * small.astype(np.float32)).reshape(n, 16, 1)
    signed = (levels.reshape(n, 16, 16).astype(np.int8) - np.int8(32)).astype(np.float32)
    values = (scale * signed).reshape(n, QK_K)
    low = levels & 0xF
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    high = levels >> 4
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    packed = np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), small.view(np.uint8), d_bytes], axis=1)
    return packed, values


_BLOCKS = {"Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
