"""Gradients on CUDA against the plain reference (tests/support/gradients.py: xtrain's loop read
at its first optimizer step; the model's class, peft and the dequantized weights for the
reference, in float32): 16-bit LoRA under bf16, 4-bit (bitsandbytes' CUDA kernels: gemv_4bit for
one-token inputs without gradients, MatMul4Bit's dequantize + matmul in training) and 8-bit
(LLM.int8's MatMul8bitLt in training and evaluation), each after an evaluation; and evaluations
leave the trained adapter as it was. Skipped without CUDA (tests/gpu/conftest.py).

Read from bitsandbytes 0.50's source: on CUDA nothing changes a layer's state on an evaluation
(``Linear4bit.forward`` repacks on the CPU only; ``Linear8bitLt`` keeps ``state.CB``/``SCB`` when
its weights are int8, ``has_fp16_weights=False`` as transformers loads them). The tolerances are
per tensor, relative to its norm: bf16 keeps 8 bits of mantissa, LLM.int8 rounds the activations
to 8 bits in its forward, TF32 (on for float32 matmuls in xtrain's CUDA runs) 10 bits; a cut
gradient is off by about 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.gradients import assert_close_gradients, reference_gradients, relative_offsets, xtrain_gradients
from support.jobs import make_job, session_builtin

from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

# relative to the gradient's norm: the arithmetic's precision, with room (see the docstring)
TOLERANCE = {"bf16": 5e-2, "no": 1e-2}
INT8 = 1e-1


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    model = str(session_builtin(tmp_path_factory, "builtin:tiny-llama"))
    return make_job(tmp_path_factory.mktemp("gpu-gradients"), model=model)


def _plan():
    from xtrain.machine.probe import collect
    from xtrain.planning.rules import make_plan

    return make_plan(collect(quick=True))


def _cfg(job, out: Path, *overrides: str):
    return load_config(job.config, [f"run.output_dir={out}", "run.max_steps=1", "optim.max_grad_norm=null",
                                    "optim.warmup_steps=0", "run.tensorboard=false", *overrides])  # fmt: skip


@pytest.mark.parametrize(
    ("quantization", "precision"),
    [(None, "bf16"), ("4bit", "bf16"), ("4bit", "no"), ("8bit", "bf16")],
)
def test_gradients_after_an_evaluation_equal_the_reference(job, tmp_path, quantization, precision):
    """The reference replays the run's LoRA dropout masks (support/gradients.py,
    ``ReplayedDropout``): on CUDA a mask depends on its input's dtype, and peft's bitsandbytes
    LoRA layers drop out a bf16 input under autocast where the reference's is float32. A failure
    lists every tensor off, and how far each is from the reference under the run's autocast."""
    if quantization:
        pytest.importorskip("bitsandbytes")
    cfg = _cfg(job, tmp_path / "run", f"model.quantization={quantization or 'null'}",
               f"run.mixed_precision={precision}", "run.eval_at_start=true")  # fmt: skip
    capture = xtrain_gradients(cfg, _plan())
    assert capture.evaluated > 0 and len(capture.inputs) == 2  # an evaluation, then 2 micro-batches
    assert next(iter(capture.inputs[0][0].values())).device.type == "cuda"
    want = reference_gradients(capture)
    try:
        assert_close_gradients(capture.grads, want, INT8 if quantization == "8bit" else TOLERANCE[precision])
    except AssertionError as e:
        if precision == "no":
            raise
        same = relative_offsets(capture.grads, reference_gradients(capture, autocast=torch.bfloat16))
        worst = sorted(same.items(), key=lambda kv: -kv[1])[:6]
        table = ", ".join(f"{name}: {off:.3g}" for name, off in worst)
        raise AssertionError(f"{e}\nvs the reference under bf16 autocast: {table}") from None


@pytest.mark.parametrize("quantization", [None, "4bit"])
def test_evaluations_leave_the_trained_adapter_as_it_was(job, tmp_path, quantization):
    """Evaluations at the start and after each step: the adapter of the run without them (within
    1e-5: some CUDA backward kernels are not bitwise deterministic between runs)."""
    if quantization:
        pytest.importorskip("bitsandbytes")
    from safetensors.torch import load_file

    from xtrain.train.loop import train

    adapters = []
    for name, evals in (("plain", ()), ("evaluated", ("run.eval_at_start=true", "run.eval_every=1"))):
        cfg = _cfg(job, tmp_path / name, f"model.quantization={quantization or 'null'}", "run.max_steps=3",
                   "run.mixed_precision=bf16", *evals)  # fmt: skip
        result = train(cfg, _plan())
        adapters.append(load_file(str(Path(result.outputs["adapter"]) / "adapter_model.safetensors")))
    plain, evaluated = adapters
    assert plain.keys() == evaluated.keys()
    for k in plain:
        torch.testing.assert_close(evaluated[k], plain[k], rtol=1e-5, atol=1e-6)
