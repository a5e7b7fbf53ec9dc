"""Gradient checks: the gradients xtrain computes at its first optimizer step against a plain
reference built from the same weights (tests/test_gradients.py; tests/gpu/test_gradients_gpu.py).

xtrain's side is the real loop (``xtrain.train.loop.train``) with no seam added to it: torch's
global optimizer-step pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``)
copies every trained parameter's gradient where the optimizer would read it (after the
accumulation, the all-reduce and the clipping) and ends the run there; a forward pre-hook on the
model records what each training forward got (its keyword arguments and the random generators'
states the loop seeded for its dropout).

The reference knows nothing of xtrain: the model's class built from its config (no quantization),
peft's ``get_peft_model`` with the same adapter config, every weight as xtrain's model held it
when built (4-bit and 8-bit weights dequantized with bitsandbytes' own functions), the recorded
inputs through it in training mode with the LoRA dropout masks xtrain's run drew, the step's loss
written out (every token's cross-entropy summed over the step's trained tokens; a sequence loss's
mean), backward.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

RngStates = tuple[torch.Tensor, "torch.Tensor | None"]  # the CPU generator's, this GPU's


class FirstStep(Exception):
    """Raised by the optimizer-step hook: the gradients are read, the run ends there."""


@dataclass
class Capture:
    """What one run showed: the model, its weights as built, each training forward's inputs with
    the generators' states, and the gradients at the first optimizer step (None: no gradient)."""

    model: Any = None
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    inputs: list[tuple[dict[str, Any], RngStates]] = field(default_factory=list)
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    evaluated: int = 0  # forwards seen in eval mode or without gradients (evaluations)
    # each training forward's logits width: 0 under the chunked loss (no logits made), else the
    # vocabulary or the classes; -1: no logits
    widths: list[int] = field(default_factory=list)
    # each LoRA dropout's masks, one a training forward, in order (``ReplayedDropout``)
    masks: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    in_forward: bool = False  # inside a training forward (not a checkpoint's recompute in backward)


def _dequantized(model: Any) -> dict[str, torch.Tensor]:
    """``{parameter name: float weight}`` of the bitsandbytes 4/8-bit layers of ``model``."""
    if "bitsandbytes" not in sys.modules:
        return {}
    import bitsandbytes.functional as F
    from bitsandbytes.nn import Linear4bit, Linear8bitLt

    out = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, Linear4bit):
            out[f"{name}.weight"] = F.dequantize_4bit(module.weight.data, module.weight.quant_state)
        elif isinstance(module, Linear8bitLt):
            cb = module.state.CB if module.state.CB is not None else module.weight.CB
            scb = module.state.SCB if module.state.SCB is not None else module.weight.SCB
            out[f"{name}.weight"] = F.int8_vectorwise_dequant(cb, scb)
    return out


def _tensors(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by every name it has (tied weights under each name)."""
    return {
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),
    }


def float_state(model: Any) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer of ``model`` by name, the 4/8-bit weights dequantized."""
    dequantized = _dequantized(model)
    return {name: dequantized.get(name, t).detach().clone() for name, t in _tensors(model).items()}


def _rng_states(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _record(capture: Capture, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    if not (module.training and torch.is_grad_enabled()):
        capture.evaluated += 1
        return
    assert not args, "the loop calls the model with keyword arguments only"
    device = next(v.device for v in kwargs.values() if torch.is_tensor(v))
    inputs = {k: v.detach().clone() if torch.is_tensor(v) else _copy(v) for k, v in kwargs.items()}
    capture.inputs.append((inputs, _rng_states(device)))
    capture.in_forward = True


def _copy(value: Any) -> Any:
    """A copy of a non-tensor input; a KV cache (GRPO's completions continue their prompt's, in the
    graph: no copy protocol) as it is."""
    return value if hasattr(value, "batch_repeat_interleave") else copy.deepcopy(value)


def _width(capture: Capture, module: Any, args: tuple, output: Any) -> None:
    capture.in_forward = False
    if module.training and torch.is_grad_enabled():
        logits = getattr(output, "logits", None)
        capture.widths.append(int(logits.shape[-1]) if logits is not None else -1)


def _at_step(capture: Capture, optimizer: Any, args: Any, kwargs: Any) -> None:
    def grad(p: torch.Tensor) -> torch.Tensor | None:
        g = p.grad
        if g is None:
            return None
        g = g.full_tensor() if hasattr(g, "full_tensor") else g  # FSDP2: a DTensor shard
        return g.detach().float().cpu().clone()

    capture.grads = {n: grad(p) for n, p in capture.model.named_parameters() if p.requires_grad}
    raise FirstStep


def _mask(capture: Capture, name: str, module: Any, args: tuple, output: torch.Tensor) -> None:
    """A LoRA dropout's mask in a training forward (where its output is not zero; an input that
    is zero gives zero either way)."""
    if capture.in_forward and module.training and torch.is_grad_enabled():
        capture.masks.setdefault(name, []).append((output != 0).detach().clone())


class ReplayedDropout(torch.nn.Module):
    """The reference's LoRA dropout: the masks xtrain's run drew, in order, so the reference does
    not depend on how the device draws them. On CUDA a mask depends on the input's dtype (the
    dropout kernel's vector width), and peft's bitsandbytes LoRA layers drop out the input in the
    autocast dtype (a bf16 attention output) where the reference sees float32. The wrapped dropout
    still runs, so the generator moves as in xtrain's run for whatever draws next."""

    def __init__(self, dropout: torch.nn.Dropout, masks: list[torch.Tensor]) -> None:
        super().__init__()
        self.dropout = dropout
        self.masks = list(masks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dropout(x)  # (the generator's draws)
        return x * (self.masks.pop(0).to(x.dtype) * (1.0 / (1.0 - self.dropout.p)))


def xtrain_gradients(cfg: Any, plan: Any = None, on_workload: Callable[[Any], None] | None = None) -> Capture:
    """Run xtrain's loop on ``cfg`` up to its first optimizer step (in this process) and return
    what it computed there; ``on_workload(workload)`` sees the built workload first (a test
    that records the batches its ``Workload.forward`` gets, or moves weights)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.tasks import build_workload
    from xtrain.train.loop import train

    capture = Capture()

    def build(run: Any, main_process_first: Any) -> Any:
        workload = build_workload(run, main_process_first)
        if on_workload is not None:
            on_workload(workload)
        capture.model = workload.model
        capture.initial = float_state(workload.model)
        workload.model.register_forward_pre_hook(partial(_record, capture), with_kwargs=True)
        workload.model.register_forward_hook(partial(_width, capture))  # (before the loop's own hooks)
        for name, module in workload.model.named_modules():
            if ".lora_dropout." in name and isinstance(module, torch.nn.Dropout):
                module.register_forward_hook(partial(_mask, capture, name))
        return workload

    handle = register_optimizer_step_pre_hook(partial(_at_step, capture))
    try:
        train(cfg, plan or make_plan(Facts(torch_version="2.13.0", gloo_available=True)), build=build)
    except FirstStep:
        pass
    else:
        raise AssertionError("the run ended without an optimizer step")
    finally:
        handle.remove()
    return capture


def reference_model(capture: Capture, device: torch.device | str = "cpu") -> Any:
    """A plain model of the captured model's class and config, with the same adapters (peft),
    every weight set to the captured model's as built, training what it trained."""
    model = capture.model
    peft_config = getattr(model, "peft_config", None)
    base = model.get_base_model() if peft_config else model
    config = copy.deepcopy(base.config)
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    ref = type(base)(config)
    if peft_config:
        from peft import get_peft_model

        adapter = copy.deepcopy(peft_config["default"])
        adapter.init_lora_weights = True  # every adapter weight is set below (PiSSA's residual too)
        ref = get_peft_model(ref, adapter)
    tensors = _tensors(ref)
    assert tensors.keys() == capture.initial.keys(), sorted(tensors.keys() ^ capture.initial.keys())[:8]
    with torch.no_grad():
        for name, t in tensors.items():
            t.copy_(capture.initial[name])
    for name, masks in capture.masks.items():
        parent, key = name.rsplit(".", 1)
        holder = ref.get_submodule(parent)
        holder[key] = ReplayedDropout(holder[key], masks)
    trained = {id(p) for name, p in ref.named_parameters(remove_duplicate=False) if name in capture.grads}
    for p in ref.parameters():
        p.requires_grad_(id(p) in trained)  # (a tied weight trains under any of its names)
    return ref.to(device)


def token_losses(logits: torch.Tensor, labels: torch.Tensor, shift: int) -> tuple[torch.Tensor, int]:
    """(the summed cross-entropy of ``logits`` against ``labels``, the labels that count): every
    label not -100, position t's logits predicting label t + ``shift`` (1: a decoder-only model's
    next token; 0: an encoder-decoder's decoder positions), in float32 as transformers' loss takes it."""
    labels = labels.to(logits.device)
    logits = logits[..., : logits.shape[-2] - shift, :].float()
    target = labels[..., shift:]
    summed = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return summed, int((target != -100).sum())


def reference_gradients(
    capture: Capture,
    adjust: Callable[[Any], None] | None = None,
    max_grad_norm: float | None = None,
    autocast: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """The reference's gradients of the step's loss over the captured micro-batches, written out
    plainly: with a label per token, the sum of every token's cross-entropy over all of them
    divided by their number (``token_losses``: shifted by one unless the model is an
    encoder-decoder, transformers' convention); with a label per sequence, the mean of the
    micro-batches' own ``.loss`` (each holds as many sequences). The generators as the loop had
    them; ``adjust(model)`` adds what the reference must do by hand (NEFTune's noise);
    ``max_grad_norm`` clips as torch's ``clip_grad_norm_`` does; ``autocast``: the forwards under
    torch's autocast in that dtype (the same arithmetic as a mixed-precision run, to tell its
    rounding from a wrong path)."""
    device = next(v.device for v in capture.inputs[0][0].values() if torch.is_tensor(v))
    ref = reference_model(capture, device)
    if adjust is not None:
        adjust(ref)
    ref.train()
    per_token = all(torch.is_tensor(k.get("labels")) and k["labels"].dim() > 1 for k, _ in capture.inputs)
    shift = 0 if getattr(ref.config, "is_encoder_decoder", False) else 1
    total = sum(int((k["labels"][..., shift:] != -100).sum()) for k, _ in capture.inputs) if per_token else 0
    for kwargs, (cpu_state, cuda_state) in capture.inputs:
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)
        with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            out = ref(**kwargs)
            if per_token:
                loss = token_losses(out.logits, kwargs["labels"], shift)[0] / max(total, 1)
            else:
                loss = out.loss / len(capture.inputs)
        loss.backward()
    trained = [p for p in ref.parameters() if p.requires_grad]
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(trained, max_grad_norm)
    return {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}


def assert_same_gradients(
    got: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor], rtol: float = 1e-4
) -> None:
    """Every trained parameter has a gradient equal to the reference's: within ``rtol`` of each
    element, or of the tensor's largest element (for the elements near zero)."""
    missing = sorted(n for n, g in got.items() if g is None)
    assert not missing, f"no gradient for {len(missing)} trained parameters: {missing[:4]}"
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())[:8]
    assert any(bool(g.abs().max() > 0) for g in want.values()), "the reference's gradients are all zero"
    for name, expected in want.items():
        scale = float(expected.abs().max())
        close = torch.isclose(got[name], expected, rtol=rtol, atol=rtol * scale + 1e-12)
        worst = float((got[name] - expected).abs().max())
        off = int((~close).sum())
        assert not off, f"{name}: {off} of {close.numel()} differ, by up to {worst:.3g} (scale {scale:.3g})"


def assert_close_gradients(
    got: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor], rel: float
) -> None:
    """For half-precision and int8 arithmetic (the GPU): every trained parameter's gradient is
    within ``rel`` of the reference's in norm (``|got - want| <= rel * |want|``, per tensor); a
    missing or cut gradient is off by about 1."""
    missing = sorted(n for n, g in got.items() if g is None)
    assert not missing, f"no gradient for {len(missing)} trained parameters: {missing[:4]}"
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())[:8]
    offs = relative_offsets(got, want)
    bad = sorted(((off, name) for name, off in offs.items() if off > rel), reverse=True)
    table = ", ".join(f"{name}: {off:.3g}" for off, name in bad[:6])
    assert not bad, f"{len(bad)} of {len(offs)} off by more than {rel} of the norm, worst first: {table}"


def relative_offsets(got: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """``|got - want| / |want|`` per tensor (a missing gradient: 1; both zero: 0, as LoRA's A is
    before B has moved), every tensor: a failure shows where the difference starts."""
    offs = {}
    for name, expected in want.items():
        actual = got[name]
        size = float(expected.norm())
        if actual is None:
            offs[name] = 1.0
        elif size == 0.0:
            offs[name] = 0.0 if float(actual.norm()) <= 1e-6 else float("inf")
        else:
            offs[name] = float((actual - expected).norm()) / size
    return offs


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def record_forward(workload: Any, batches: list[dict[str, Any]]) -> None:
    """A task's ``Workload.forward`` (GRPO's: its micro-batches built in ``step_start``) that keeps
    a copy of each micro-batch it runs in ``batches``, with every LoRA B matrix set to seeded
    random values first (B starts at 0: then every adapter weight has a gradient)."""
    forward = workload.forward
    with torch.no_grad():
        for name, p in workload.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)

    def recorded(model: Any, batch: dict[str, Any]) -> Any:
        batches.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in batch.items()})
        return forward(model, batch)

    workload.forward = recorded


def grpo_token_loss(
    ref: Any,
    batch: dict[str, Any],
    advantages: torch.Tensor,
    temperature: float,
    beta: float,
    reference: Any = None,
) -> torch.Tensor:
    """GRPO's loss per completion token by hand over the plain ``ref`` model (one update per
    generation: the ratio is 1, its gradient the log-prob's), the KL (k3) weighted by ``beta`` to
    ``reference`` (a plain model: a chained stage's start), else to ``ref`` with its adapters off:
    [N, width] over the batch's last ``completion_mask`` columns, each row's positions counted
    from its first token."""
    width = batch["completion_mask"].size(1)
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    def logps(model: Any) -> torch.Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions).logits
        logits = logits[:, -width - 1 : -1] / temperature
        return logits.log_softmax(-1).gather(-1, batch["input_ids"][:, -width:].unsqueeze(-1)).squeeze(-1)

    policy = logps(ref)
    with torch.no_grad(), ref.disable_adapter() if reference is None else contextlib.nullcontext():
        start = logps(ref if reference is None else reference)
    kl = torch.exp(start - policy) - (start - policy) - 1
    assert float(kl.detach().abs().max()) > 1e-4 or beta == 0, "the policy differs from its reference"
    return -torch.exp(policy - policy.detach()) * advantages.unsqueeze(1) + beta * kl


def dapo_gradients(
    model: Any, batches: list[dict[str, Any]], per_token: Callable[[dict[str, Any]], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The gradients of dapo's loss over ``batches`` (a step's micro-batches) by hand: each
    batch's ``per_token(batch)`` losses summed over its completion tokens, over every completion
    token of the global batch, back-propagated through ``model``."""
    sums, tokens = [], 0.0
    for batch in batches:
        mask = batch["completion_mask"].float()
        sums.append((per_token(batch) * mask).sum())
        tokens += float(mask.sum())
    (sum(sums) / tokens).backward()
    return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}


def keep_group(accelerator: Any) -> None:
    """The loop's ``release`` without ``end_training`` (which destroys the process group): a
    torchrun worker that runs the loop on several configs in one process group sets
    ``xtrain.train.loop.release`` to this (tests/test_sequence_parallel.py)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
