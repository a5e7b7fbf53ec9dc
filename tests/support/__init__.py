"""What the tests share (imported as ``support.*``; pytest puts tests/ on the path):

- ``jobs``: a tiny training job on disk, offline environments, running ``xtrain.run`` in its own
  process group, comparing two runs' results;
- ``docs_commands``: reading, classifying and running the commands in docs/ and README.md;
- ``ps_syntax``: the PowerShell syntax check for the lines xtrain prints;
- ``warm``: ``python -m xtrain ...`` subprocesses forked from a warm interpreter (imports done).
- ``decoding``: the decode loop's tests' tiny LoRA model and left-padded prompts.
"""
