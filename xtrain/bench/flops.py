"""FLOPs per token, the GPU peak table, MFU and scaling: pure arithmetic, tested without training."""

from __future__ import annotations

import re
from dataclasses import dataclass


def flops_per_token(total_params: int, embedding_params: int, trainable_params: int) -> float:
    """Training FLOPs per token: ``4 N + 2 N_trainable``, N = parameters doing matmuls (all but the
    input embedding, which is a lookup): 2N forward, 2N backward through the activations, and 2 per
    trainable parameter for its weight gradient. Full fine-tuning gives the usual ``6 N``; LoRA
    about ``4 N``. Attention's sequence-length term is left out (as in the 6N rule)."""
    n = total_params - embedding_params
    return 4.0 * n + 2.0 * trainable_params


@dataclass(frozen=True)
class Peak:
    """Dense peak TFLOP/s of one GPU model (no sparsity)."""

    name: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float
    source: str


_NVIDIA = "NVIDIA datasheet, dense (half the sparse figure)"
_GEFORCE = "NVIDIA Ada/Ampere GA102 whitepapers, dense tensor FLOPS with FP32 accumulate (what autocast runs)"
# GeForce cards run fp16/bf16 tensor math with FP32 accumulation at half their "FP16 accumulate"
# headline (RTX 4090: 165.2 vs 330.3 dense); autocast accumulates in FP32, so that is the peak. On
# Ada fp16 and bf16 run at the same rate. TF32 tensor math is a quarter of it, equal to the FP32
# (non-tensor) rate. (An earlier table used 82.6 for every dtype on the 4090: MFU read 2x high.)
# Ordered: the first pattern that matches the lower-cased device name wins.
PEAKS: list[tuple[str, Peak]] = [
    (r"gh200", Peak("GH200", 989.4, 989.4, 494.7, 66.9, _NVIDIA)),
    (r"h200", Peak("H200", 989.4, 989.4, 494.7, 66.9, _NVIDIA)),
    (r"h100.*nvl", Peak("H100 NVL", 835.5, 835.5, 417.5, 60.0, _NVIDIA)),
    (r"h100.*pcie", Peak("H100 PCIe", 756.5, 756.5, 378.0, 51.0, _NVIDIA)),
    (r"h100", Peak("H100 SXM", 989.4, 989.4, 494.7, 66.9, _NVIDIA)),
    (r"a100|a800", Peak("A100", 312.0, 312.0, 156.0, 19.5, _NVIDIA)),
    (r"l40s", Peak("L40S", 362.1, 362.1, 183.0, 91.6, _NVIDIA)),
    (r"\bl40\b", Peak("L40", 181.0, 181.0, 90.5, 90.5, _NVIDIA)),
    (r"\bl4\b", Peak("L4", 121.0, 121.0, 60.0, 30.3, _NVIDIA)),
    (r"\ba10\b", Peak("A10", 125.0, 125.0, 62.5, 31.2, _NVIDIA)),
    (r"rtx 6000 ada", Peak("RTX 6000 Ada", 364.2, 364.2, 182.1, 91.1, _NVIDIA)),
    (r"rtx a6000", Peak("RTX A6000", 154.8, 154.8, 77.4, 38.7, _NVIDIA)),
    (r"v100", Peak("V100", None, 125.0, None, 15.7, _NVIDIA)),
    (r"\bt4\b", Peak("T4", None, 65.0, None, 8.1, _NVIDIA)),
    (r"rtx 5090", Peak("RTX 5090", 209.5, 209.5, 104.8, 104.8, _GEFORCE)),
    (r"rtx 4090", Peak("RTX 4090", 165.2, 165.2, 82.6, 82.6, _GEFORCE)),
    (r"rtx 4080", Peak("RTX 4080", 97.5, 97.5, 48.7, 48.7, _GEFORCE)),
    (r"rtx 3090 ti", Peak("RTX 3090 Ti", 80.0, 80.0, 40.0, 40.0, _GEFORCE)),
    (r"rtx 3090", Peak("RTX 3090", 71.0, 71.0, 35.6, 35.6, _GEFORCE)),
    (r"rtx 3080", Peak("RTX 3080", 59.5, 59.5, 29.8, 29.8, _GEFORCE)),
]


def find_peak(gpu_name: str | None) -> Peak | None:
    """The table entry for a device name as torch reports it (e.g. "NVIDIA GeForce RTX 4090"),
    or None ("unknown")."""
    if not gpu_name:
        return None
    name = gpu_name.lower()
    return next((peak for pattern, peak in PEAKS if re.search(pattern, name)), None)


def peak_tflops(gpu_name: str | None, precision: str, tf32: bool = False) -> float | None:
    """Dense peak TFLOP/s for the precision the run computes in (bf16, fp16; ``no`` means TF32
    matmuls when enabled, else FP32), or None when the GPU or the dtype is not in the table."""
    peak = find_peak(gpu_name)
    if peak is None:
        return None
    if precision == "bf16":
        return peak.bf16
    if precision == "fp16":
        return peak.fp16
    return peak.tf32 if tf32 and peak.tf32 else peak.fp32


def mfu(tokens_per_s: float, flops_per_tok: float, processes: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation of one device: achieved FLOP/s per process over its peak."""
    if not peak or processes < 1 or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / processes / (peak * 1e12)


def scaling(rate_one: float, rate_n: float, processes: int) -> tuple[float | None, float | None]:
    """(speedup, scaling efficiency) of ``processes`` processes over one: speedup = rate_n /
    rate_one, efficiency = speedup / processes (1.0 is perfect)."""
    if rate_one <= 0 or processes < 1:
        return None, None
    speedup = rate_n / rate_one
    return speedup, speedup / processes
