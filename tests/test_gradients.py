"""Gradients proven, not assumed: for every training path, the gradients of xtrain's first
optimizer step equal a plain reference's built from the same weights (tests/support/gradients.py:
the real loop read at its optimizer step; the model's class, peft and the dequantized weights
alone for the reference), also after an evaluation. And evaluation never changes training: a
run with evaluations ends with the same adapter as the run without them, in 16 and 4 bits.

"The loss falls" and "two runs agree" do not prove a training path: a 4-bit run whose adapters
below each quantized layer got no gradient after its first evaluation passed both
(docs/fitting-big-models.md, "4-bit training and evaluation")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl, reference_gradients, xtrain_gradients

from xtrain import builtin
from xtrain.train.config.loading import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each task's few rows (train.jsonl + eval.jsonl per task folder), made once."""
    return tmp_path_factory.mktemp("gradient-data")


def _stories(root: Path) -> tuple[Path, Path]:
    rows = builtin.story_examples(12, seed=3)
    return jsonl(root / "stories" / "train.jsonl", rows[:8]), jsonl(root / "stories" / "eval.jsonl", rows[8:])


def _cfg(out: Path, *overrides: str):
    return load_config(
        None,
        [*overrides, f"run.output_dir={out}", "run.report_to=none", "run.max_steps=1",
         "optim.max_grad_norm=null", "optim.warmup_steps=0"],
    )  # fmt: skip


def _causal(data: Path, out: Path, *extra: str):
    train, eval_ = _stories(data)
    return _cfg(
        out,
        "model.name_or_path=builtin:tiny-llama",
        "model.task=causal-lm",
        f"data.train={train}",
        f"data.eval={eval_}",
        "data.max_length=32",
        "batch.per_device=2",
        "batch.global_batch=4",  # 2 micro-batches: accumulation
        "lora.dropout=0.1",  # dropout on: the reference replays the loop's seeded generator
        *extra,
    )


def _check(cfg, rtol: float = 1e-4, adjust=None, micro_batches: int | None = None, evaluated: bool = False):
    capture = xtrain_gradients(cfg)
    if micro_batches is not None:
        assert len(capture.inputs) == micro_batches
    if evaluated:
        assert capture.evaluated > 0, "no evaluation ran before the step"
    want = reference_gradients(capture, adjust, cfg.optim.max_grad_norm)
    assert_same_gradients(capture.grads, want, rtol)
    return capture


# -- the reproduction: 4-bit, one evaluation, then a training step -----------------------------------
def test_4bit_gradients_after_an_evaluation_equal_the_dequantized_reference(data, tmp_path):
    """bitsandbytes 0.50 on a CPU with AVX512-BF16 repacks a Linear4bit for inference at its
    first eval-mode no-grad forward; afterwards the layer passes no gradient to its input, so
    every adapter below a quantized layer got a wrong one (xtrain before the fix: this failed)."""
    pytest.importorskip("bitsandbytes")
    cfg = _causal(data, tmp_path / "q4", "model.quantization=4bit", "run.eval_at_start=true")
    capture = _check(cfg, micro_batches=2, evaluated=True)
    layers = [m for m in capture.model.modules() if type(m).__name__ == "Linear4bit"]
    assert layers and not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers)


def test_a_4bit_layer_keeps_its_input_gradient_after_an_eval_forward():
    """The layer itself: an eval-mode no-grad forward, then a training forward and backward; the
    input's gradient is the dequantized weight's, and torch's "no autograd kernel" never fires."""
    pytest.importorskip("bitsandbytes")
    import warnings

    import bitsandbytes.functional as F
    from bitsandbytes.nn import Linear4bit

    from xtrain.train.quantization import keep_training_layout

    torch.manual_seed(0)
    layer = Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4").to("cpu")
    weight = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).clone()
    assert keep_training_layout(torch.nn.Sequential(layer)) == 1
    layer.eval()
    with torch.no_grad():
        evaluated = layer(torch.randn(3, 64))
    layer.train()
    x = torch.randn(3, 64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(x).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.ones(3, 64) @ weight)
    torch.testing.assert_close(F.dequantize_4bit(layer.weight.data, layer.weight.quant_state), weight)
    assert evaluated.shape == (3, 64)
