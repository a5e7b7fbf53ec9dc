"""The chosen precision against the weights it trains: fp16 autocast over bf16 weights."""

from __future__ import annotations

from xtrain.machine.facts import Facts
from xtrain.planning.plan import Finding, Plan


def check_precision_weights(facts: Facts, plan: Plan) -> list[Finding]:
    """fp16 over weights in bf16 (``model.dtype``, else the checkpoint's own dtype): bf16-trained
    activations can exceed fp16's largest value (65504) and turn into inf/nan; the rules pick
    bf16 there by themselves, so this fires for an explicit choice (or a GPU without fast bf16)."""
    if plan.mixed_precision != "fp16" or plan.weights_half != "bf16":
        return []
    min_cc = min((g.cc for g in facts.gpus if plan.gpu_ids is None or g.index in plan.gpu_ids), default=0.0)
    if min_cc >= 8.0:
        fix = "# run.mixed_precision: bf16 in the config (or auto), or:\nxtrain train CONFIG --precision bf16"
    else:
        fix = (
            f"# these GPUs (compute capability {min_cc:.1f}) have no fast bf16; if the loss turns nan:\n"
            "xtrain train CONFIG --precision no"
        )
    return [
        Finding(
            "precision-fp16-bf16-weights",
            "warn",
            "fp16 autocast over bf16 weights: activations above 65504 overflow to inf (nan loss, "
            "every step skipped)",
            fix,
        )
    ]
