"""The model: ``load.py`` (transformers classes, tokenizers and processors), ``configs.py`` (a
model's config.json where it already is), ``lora.py`` (adapters), ``quantization.py`` (4/8-bit
loading), ``attention.py`` (which attention implementation), ``neftune.py``, ``sharding.py`` (how
accelerate split the weights), and the memory estimate's pure parts: ``size.py`` (counts),
``estimate.py`` (bytes per GPU), ``memory.py`` (the check against the card, its warning and the
changes that fit), ``activations.py`` (what autograd keeps a layer). Nothing here reads the task
registry: a task's parts come in as arguments."""
