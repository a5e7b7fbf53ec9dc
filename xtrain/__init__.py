"""xtrain: one short path to multi-GPU LoRA training on Windows, WSL2, Linux and clusters."""

__version__ = "0.1.0"
