"""Row readers: what a row of a data file holds and how it becomes a model's inputs:
``formats.py`` (which rows causal-lm reads; alpaca and sharegpt mapped), ``chat.py`` (conversations
and chat templates), ``vision_chat.py`` and ``vision_rows.py`` (image + text conversations),
``images.py`` and ``audio.py`` (media read lazily, within the run's limits)."""
