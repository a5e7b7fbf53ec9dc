"""Benchmarks through lm-evaluation-harness (the ``eval`` extra): what ``xtrain eval`` and a run's
``eval.benchmarks`` share. ``harness`` (lm-eval itself: imported, quieted, ``simple_evaluate``
called), ``benchmarks`` (``--tasks``: lm-eval's task names, the user's task YAML files and
folders, checked before any model loads), ``models`` (a result as lm-eval's HF model: the base and
its adapter, a chain's one adapter, a merged folder, a plain model; a GGUF file in llama.cpp),
``scores`` (lm-eval's results as rows: task, metric, value, stderr; deltas against a reference),
``processes`` (the process group lm-eval's data-parallel mode runs in) and ``worker`` (the entry
``xtrain eval`` launches on every planned process: ``python -m xtrain.evaluate.worker JOB``)."""
