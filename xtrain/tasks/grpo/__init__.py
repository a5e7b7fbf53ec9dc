"""GRPO: reinforcement learning with verifiable rewards on a causal LM (the grpo task)."""
