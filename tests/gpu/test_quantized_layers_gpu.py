"""One bitsandbytes layer on CUDA against ``F.linear`` on its dequantized weight in float32: the
forward and the input's gradient (what a LoRA adapter below the layer learns through), in the
shapes a training step gives (M = tokens of a micro-batch). Seconds, no xtrain run: when
tests/gpu/test_gradients_gpu.py finds a whole model off, this says whether one layer already is.

Why: bitsandbytes 0.50 computes a 4-bit training forward (``MatMul4Bit.forward``) with its
``gemm_4bit`` op, which on CUDA picks a fused dequantize + GEMM kernel for up to 1536 tokens
(``backends/cuda/ops.py``, ``_gemm_4bit_use_custom_cuda``; bitsandbytes#1949, whose training-loss
regression #1971 fixed one cause) and ``dequantize + F.linear`` above; LLM.int8 rounds the
activations to 8 bits per row. Each 4-bit case runs with the kernel bitsandbytes chooses and with
the fused kernel switched off, so a difference between the two names the kernel. (The whole-model
check's 13% on an H100 was the reference's dropout masks: docs/reliability.md, "Not covered yet".)

Tolerances, relative to the norm: bf16 rounds each input and output to 8 bits of mantissa (the
float32 accumulation adds little): 1e-2 with room; LLM.int8 rounds the activations to 8 bits per
row: 4e-2."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

BF16 = 1e-2
INT8 = 4e-2
TOKENS = (1, 8, 192, 2048)  # one token (generation), a few, a tiny model's micro-batch, a long one
SHAPES = ((64, 64), (1024, 512))  # (out, in): the tiny Llama's projections, a wider one


def _weight(out_features: int, in_features: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(out_features * 7 + in_features)
    return torch.randn(out_features, in_features, generator=generator) * 0.02


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def _forward_and_input_grad(layer: torch.nn.Module, weight: torch.Tensor, tokens: int) -> tuple[float, float]:
    """(forward, input gradient) off the float32 reference, relative to the norm; the input comes
    in float32, as a Llama's normed hidden states do under autocast."""
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, weight.shape[1], generator=generator).cuda().requires_grad_(True)
    grad_out = torch.randn(tokens, weight.shape[0], generator=generator).cuda()
    out = layer(x)
    out.backward(grad_out.to(out.dtype))
    got_grad = x.grad.detach().clone()
    x.grad = None
    want = torch.nn.functional.linear(x, weight)
    want.backward(grad_out)
    return _relative(out.detach(), want.detach()), _relative(got_grad, x.grad)


@pytest.fixture(params=["as-chosen", "fused-off"])
def gemm_choice(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """bitsandbytes' own choice of 4-bit GEMM, or its ``dequantize + F.linear`` fallback forced."""
    if request.param == "fused-off":
        import bitsandbytes.backends.cuda.ops as cuda_ops

        monkeypatch.setattr(cuda_ops, "_gemm_4bit_use_custom_fn", lambda *args: False)
    return request.param


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_a_4bit_layer_computes_its_dequantized_weight_in_bf16(shape, tokens, gemm_choice):
    import bitsandbytes.functional as F
    from bitsandbytes.nn import Linear4bit

    out_features, in_features = shape
    layer = Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.bfloat16,
                       compress_statistics=True, quant_type="nf4")  # fmt: skip
    with torch.no_grad():
        layer.weight.data.copy_(_weight(out_features, in_features))
    layer = layer.cuda()  # quantized here, as transformers' nf4 + double quantization loads it
    weight = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    forward, grad = _forward_and_input_grad(layer, weight, tokens)
    off = f"{gemm_choice}: forward off by {forward:.3g}, input grad by {grad:.3g}"
    assert forward <= BF16 and grad <= BF16, off


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_an_8bit_layer_computes_its_dequantized_weight(shape, tokens):
    import bitsandbytes.functional as F
    from bitsandbytes.nn import Int8Params, Linear8bitLt

    out_features, in_features = shape
    layer = Linear8bitLt(in_features, out_features, bias=False, has_fp16_weights=False, threshold=6.0)
    layer.weight = Int8Params(_weight(out_features, in_features), requires_grad=False, has_fp16_weights=False)
    layer = layer.cuda()  # quantized here (row-wise int8, as transformers loads LLM.int8)
    weight = F.int8_vectorwise_dequant(layer.weight.CB, layer.weight.SCB).float()
    forward, grad = _forward_and_input_grad(layer, weight, tokens)
    assert forward <= INT8 and grad <= INT8, f"forward off by {forward:.3g}, input grad by {grad:.3g}"
