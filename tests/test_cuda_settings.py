"""TF32 goes through torch's current API, and through the old flags on an old torch (no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from xtrain.train.distributed.cuda_settings import apply_tf32, set_tf32


@pytest.fixture
def restore_tf32():
    matmul = torch.backends.cuda.matmul.fp32_precision
    conv = torch.backends.cudnn.conv.fp32_precision
    yield
    torch.backends.cuda.matmul.fp32_precision = matmul
    torch.backends.cudnn.conv.fp32_precision = conv


def test_set_tf32_uses_fp32_precision_on_this_torch(restore_tf32) -> None:
    set_tf32(True)
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    set_tf32(False)
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_new_api_is_used_alone(restore_tf32) -> None:
    assert apply_tf32(torch.backends, True) == "fp32_precision"


class _OldMatmul:
    """torch < 2.9: only allow_tf32; unknown attributes raise AttributeError."""

    def __init__(self) -> None:
        self.allow_tf32 = False


def test_old_torch_gets_allow_tf32() -> None:
    old = SimpleNamespace(cuda=SimpleNamespace(matmul=_OldMatmul()), cudnn=SimpleNamespace(allow_tf32=False))
    assert apply_tf32(old, True) == "allow_tf32"
    assert old.cuda.matmul.allow_tf32 is True and old.cudnn.allow_tf32 is True
    apply_tf32(old, False)
    assert old.cuda.matmul.allow_tf32 is False and old.cudnn.allow_tf32 is False
