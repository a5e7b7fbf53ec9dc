"""The data a run trains on: ``sources.py`` (files, folders, hub ids, built-ins read as datasets),
``tokenize.py`` (text rows to token ids, cached), ``packing.py`` (whole examples packed into rows),
``labels.py`` (a classifier's label names and ids), ``collate.py`` (rows to batches),
``sampler.py`` (the global-batch data order), and ``rows/`` (the row readers: formats, chat,
vision chat, images, audio)."""
