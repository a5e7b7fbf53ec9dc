"""The bench's model sizes: llama-style decoders with random weights, and which fits a device."""

from __future__ import annotations

from dataclasses import dataclass

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


# -- model sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSize:
    """A llama-style decoder built from a ``LlamaConfig`` (random weights) and its bench batch."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    seq_len: int
    per_device: int

    def param_counts(self, lora_r: int | None) -> tuple[int, int, int]:
        """(all parameters, input-embedding parameters, trainable parameters) of this model
        with LoRA rank ``lora_r`` on q/k/v/o, or fully trained when ``lora_r`` is None.
        (Untied embeddings, no biases, RMSNorm weights: as ``LlamaForCausalLM`` builds it.)"""
        h, i, v = self.hidden, self.intermediate, self.vocab
        per_layer = 4 * h * h + 3 * h * i + 2 * h  # attention, MLP, two norms
        base = self.layers * per_layer + h + 2 * v * h  # + final norm, embedding, lm_head
        if lora_r is None:
            return base, v * h, base
        adapters = self.layers * 4 * lora_r * (h + h)  # A (r x in) + B (out x r) per projection
        return base + adapters, v * h, adapters


SIZES: dict[str, ModelSize] = {
    # CPU and small devices: a few ms to tens of ms per step.
    "tiny": ModelSize("tiny", hidden=128, layers=4, heads=4, intermediate=352, vocab=1000, seq_len=128,
                      per_device=8),
    # GPUs with less than 12 GiB.
    "small": ModelSize("small", hidden=512, layers=8, heads=8, intermediate=1408, vocab=16000,
                       seq_len=512, per_device=8),
    # Bigger GPUs: ~110M parameters, 1024-token sequences.
    "base": ModelSize("base", hidden=768, layers=12, heads=12, intermediate=2048, vocab=16000,
                      seq_len=1024, per_device=8),
}  # fmt: skip
SMALL_GPU_MIB = 12 * 1024


def pick_size(device: str, gpu_memory_mib: int | None) -> str:
    """The size that fills the device without running out of memory: ``tiny`` without CUDA,
    ``small`` on a GPU under 12 GiB, ``base`` (~110M parameters) above."""
    if device != "cuda":
        return "tiny"
    if gpu_memory_mib is not None and gpu_memory_mib < SMALL_GPU_MIB:
        return "small"
    return "base"
