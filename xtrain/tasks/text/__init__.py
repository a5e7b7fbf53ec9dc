"""Text tasks: ``causal-lm`` (plain text, prompt/response, chat) and ``seq-cls``."""
