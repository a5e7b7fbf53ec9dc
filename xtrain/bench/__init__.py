"""`xtrain bench`: how fast does training run here, and how well does it scale?

A short LoRA (or full) fine-tune of a llama-style causal LM built from a config, sized for the
device (``pick_size``), run through the real launch path (``xtrain.launch.launcher.launch`` of
``python -m xtrain.run --config C``, exactly what ``xtrain train`` does) first with one process,
then with every planned process. The global batch stays the same in both runs (``per_device x
processes``; the one-process run accumulates), as it does when a user adds GPUs to an xtrain job.

Rates come from the loop itself: it records every logging window (steps, seconds, samples,
tokens) in ``train_result.json``. The first window (first CUDA kernels, allocator warm-up, DDP's
first bucket pass) is left out, so the figures are the steady state a long run sees; start-up
(imports, model, data) is never in them. Without windows the loop's whole-session rate from
``train_result.json`` is used instead, and the result says so.

- ``sizes.py``: the model sizes and ``pick_size``.
- ``flops.py``: ``flops_per_token``, the peak table (``peak_tflops``), ``mfu``, ``scaling``.
- ``rates.py``: the loop's logging windows, ``steady_rates``, one run's ``RunFigures``.
- ``job.py``: the job on disk (model, data, the config of each run).
- ``runner.py``: ``run_bench``, the runs through the launcher, the all-reduce.
- ``result.py``: ``BenchResult`` and the machine it ran on.

Pure pieces (sizes, flops, rates) are tested without training. Library code: no printing;
``xtrain/commands/bench.py`` renders.
"""
