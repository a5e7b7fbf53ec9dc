"""CUDA math settings that are process-wide flags (no GPU needed to set them).

TF32: torch >= 2.9 has ``torch.backends.cuda.matmul.fp32_precision`` and
``torch.backends.cudnn.conv.fp32_precision`` ("tf32" | "ieee"); the old ``allow_tf32`` flags are
deprecated there, and reading an old flag after the new one was set raises ("used mix of the
legacy and new APIs", seen with torch 2.13). So the new API is used alone where it exists.
"""

from __future__ import annotations

from typing import Any


def _has_new_api(backends: Any) -> bool:
    conv = getattr(getattr(backends, "cudnn", None), "conv", None)
    try:
        return hasattr(backends.cuda.matmul, "fp32_precision") and hasattr(conv, "fp32_precision")
    except RuntimeError:  # an old torch's __getattr__ may raise instead of AttributeError
        return False


def apply_tf32(backends: Any, enabled: bool) -> str:
    """Set TF32 on ``torch.backends`` (or a stand-in); returns which API was used."""
    if _has_new_api(backends):
        value = "tf32" if enabled else "ieee"
        backends.cuda.matmul.fp32_precision = value
        backends.cudnn.conv.fp32_precision = value
        return "fp32_precision"
    backends.cuda.matmul.allow_tf32 = enabled
    backends.cudnn.allow_tf32 = enabled
    return "allow_tf32"


def set_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and cuDNN convolutions: on (Ampere+ speed) or off (full fp32)."""
    import torch

    apply_tf32(torch.backends, enabled)
