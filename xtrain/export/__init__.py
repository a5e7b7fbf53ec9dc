"""``xtrain export``: a trained run (or any adapter + base, or a full fine-tune's output) as a model
people run: merged safetensors, a GGUF file, an Ollama Modelfile. See ``run.py`` for the order of
the steps and ``docs/export.md``."""
